"""The scaling model and prediction, one family: the base point (model_base), per-step and
per-sample compute (batch_cost), the network fit (network) and a cluster's two link classes
(cluster_network, per curve: curve_links), one step's time (step_model), the model over a sweep
(scaling_model) and predict; the strategies (DDP or FSDP): memory per rank and FSDP's traffic
from the parameters' layout (memory), a curve as another strategy's model reads it
(strategy_base), each strategy at each size (strategies) and in words (strategy_words).
Imports the throughput and measured floors (and below)."""
