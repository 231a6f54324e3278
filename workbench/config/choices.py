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
    # Compute planted as sleeps (microseconds a step, and a sample), gradients of a chosen size:
    # a step that takes as long on a rank sharing the cores with seven others as on its own.
    "planted": {
        "layers": 4,
        "forward_us": 2000,
        "backward_us": 4000,
        "forward_us_per_sample": 0,
        "backward_us_per_sample": 0,
        "gradient_kib": 1024,
        "input_dim": 32,
        "num_classes": 4,
    },
}
#: Model options that may be 0 (every other one is a whole number >= 1).
ZERO_OPTIONS = frozenset({"forward_us_per_sample", "backward_us_per_sample"})
#: Size presets of the built-in models, named as the field names them: ``model_options={"size":
#: "distilbert"}`` fills in every option of the model, and options given beside ``size`` override
#: the preset's (``workbench.config.sizes``). The classifiers' presets keep seed 002's 6 classes
#: (the emotion data), so swapping one preset for another changes the model alone.
MODEL_SIZES: dict[str, dict[str, dict[str, int]]] = {
    "transformer": {
        "distilbert": {
            "vocab_size": 30522,
            "seq_len": 128,
            "d_model": 768,
            "num_heads": 12,
            "num_layers": 6,
            "ffn_dim": 3072,
            "num_classes": 6,
        },
        "bert-base": {
            "vocab_size": 30522,
            "seq_len": 128,
            "d_model": 768,
            "num_heads": 12,
            "num_layers": 12,
            "ffn_dim": 3072,
            "num_classes": 6,
        },
    },
    "gpt": {
        "gpt2-small": {
            "vocab_size": 50257,
            "seq_len": 1024,
            "d_model": 768,
            "num_heads": 12,
            "num_layers": 12,
        },
    },
}
#: Hugging Face architectures a run can name as ``model="hf:<name>"``: built by
#: ``workbench.rank.hf_models`` from their ``transformers`` config class (no download), tiny by
#: default, ``model_options`` overriding the config's fields (``seq_len``: the synthetic batch's).
HF_ARCHITECTURES = ("distilbert", "bert", "gpt2")
HF_PREFIX = "hf:"
#: The ``model_options`` key that names a preset of :data:`MODEL_SIZES`.
SIZE_OPTION = "size"
#: Models whose ``d_model`` is split over ``num_heads`` attention heads.
ATTENTION_MODELS = ("transformer", "gpt")
BUILTIN_DATASETS = ("synthetic", "parquet")
STRATEGIES = ("ddp", "fsdp", "dp", "single")
#: The dtypes FSDP may gather the parameters and reduce the gradients in.
FSDP_DTYPES = ("fp32", "bf16", "fp16")
COMM_HOOKS = ("allreduce", "fp16", "bf16", "powersgd")
COMM_TRACING = ("sampled", "hook", "off")
LR_SCALINGS = ("none", "linear", "sqrt")
EVAL_PLACEMENTS = ("all", "rank0")
PRECISIONS = ("fp32", "fp16", "bf16")
DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl")
OPTIMIZERS = ("sgd", "adamw")
FAULT_KINDS = ("raise", "exit", "hang", "kill", "preempt")
#: Where in its step a fault strikes (``start``: before anything of the step).
FAULT_PHASES = ("start", "data", "forward", "backward", "optimizer")
