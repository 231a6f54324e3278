"""What runs inside one rank: the task submitit calls, the training loop as named phases,
evaluation, the tracer, checkpoints, models and datasets. ``distributed`` is the only module of
the package that touches ``torch.distributed``. Never imports run, analysis, ui or sweeps."""
