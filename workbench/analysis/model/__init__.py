"""The scaling model and prediction, one family: the base point (model_base), per-step and
per-sample compute (batch_cost), the network fit (network) and a cluster's two link classes
(cluster_network, per curve: curve_links), one step's time (step_model), the model over a sweep
(scaling_model) and predict. Imports the throughput and measured floors (and below)."""
