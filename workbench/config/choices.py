"""The values a choice field may take, and the built-in models' options: data, no logic."""

from __future__ import annotations

from typing import Any

#: The knobs each built-in model takes, with their defaults (tiny, so a CPU runs them in ms).
MODEL_OPTIONS: dict[str, dict[str, Any]] = {
    "mlp": {"input_dim": 32, "hidden_dim": 64, "num_layers": 2, "num_classes": 4},
    "cnn": {"image_size": 16, "channels": 3, "width": 16, "blocks": 2, "num_classes": 4},
    "transformer": {
        "vocab_size": 256,
        "seq_len": 32,
        "d_model": 64,
        "num_heads": 4,
        "num_layers": 2,
        "ffn_dim": 128,
        "num_classes": 4,
    },
    "gpt": {"vocab_size": 128, "seq_len": 32, "d_model": 64, "num_heads": 4, "num_layers": 2},
}
#: Models whose ``d_model`` is split over ``num_heads`` attention heads.
ATTENTION_MODELS = ("transformer", "gpt")
BUILTIN_DATASETS = ("synthetic", "parquet")
STRATEGIES = ("ddp", "dp", "single")
COMM_HOOKS = ("allreduce", "fp16", "bf16", "powersgd")
COMM_TRACING = ("sampled", "hook", "off")
LR_SCALINGS = ("none", "linear", "sqrt")
EVAL_PLACEMENTS = ("all", "rank0")
PRECISIONS = ("fp32", "fp16", "bf16")
DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl")
OPTIMIZERS = ("sgd", "adamw")
FAULT_KINDS = ("raise", "exit", "hang", "kill", "preempt")
