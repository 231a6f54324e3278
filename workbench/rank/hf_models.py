"""Hugging Face models by name (``model="hf:distilbert"``), built offline from their
``transformers`` config class: tiny by default for a CPU, ``model_options`` overriding any field
of the config (``seq_len``, the length of the synthetic batches, is the one option that is not).

The model takes a dict batch (``input_ids``, ``attention_mask``, ``labels``) and returns a
``ModelOutput`` whose ``loss`` the loop trains on (``batch_format = "dict"``); a plug-in factory
may return any module that does the same. ``transformers`` is the optional extra ``[hf]``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from workbench.config.choices import HF_PREFIX

#: The synthetic batch's sequence length where ``model_options`` gives no ``seq_len``.
DEFAULT_SEQ_LEN = 32
SEQ_LEN = "seq_len"
#: name -> (config class, model class, task, the config fields that keep it tiny)
ARCHITECTURES: dict[str, tuple[str, str, str, dict[str, int]]] = {
    "distilbert": (
        "DistilBertConfig",
        "DistilBertForSequenceClassification",
        "classification",
        {
            "vocab_size": 1000,
            "dim": 64,
            "n_layers": 2,
            "n_heads": 2,
            "hidden_dim": 128,
            "max_position_embeddings": 64,
            "num_labels": 4,
        },
    ),
    "bert": (
        "BertConfig",
        "BertForSequenceClassification",
        "classification",
        {
            "vocab_size": 1000,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 128,
            "max_position_embeddings": 64,
            "num_labels": 4,
        },
    ),
    "gpt2": (
        "GPT2Config",
        "GPT2LMHeadModel",
        "lm",
        {
            "vocab_size": 1000,
            "n_embd": 64,
            "n_layer": 2,
            "n_head": 2,
            "n_positions": 64,
            "bos_token_id": 999,
            "eos_token_id": 999,
        },
    ),
}


#: name -> where its repeated layers are: the blocks ``strategy='fsdp'`` shards one by one
#: (embeddings, the final norm and the head stay with the root).
BLOCKS = {
    "distilbert": "distilbert.transformer.layer",
    "bert": "bert.encoder.layer",
    "gpt2": "transformer.h",
}


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(
            "model='hf:...' needs the transformers package: pip install 'workbench[hf]'"
        ) from exc
    return transformers


def hf_config(model: str, options: dict[str, Any]) -> Any:
    """The ``transformers`` config of ``model`` (``hf:<name>``) with ``options`` over its tiny
    defaults; a ValueError naming an option the config class has no field for."""
    config_class, _, _, tiny = ARCHITECTURES[model.removeprefix(HF_PREFIX)]
    cls = getattr(_transformers(), config_class)
    fields = {k: v for k, v in options.items() if k != SEQ_LEN}
    known = cls().to_dict()
    unknown = sorted(k for k in fields if k not in known)
    if unknown:
        raise ValueError(
            f"model_options {unknown} of model={model!r}: not fields of {config_class}; "
            f"valid: {SEQ_LEN} and the config's fields, e.g. {', '.join(sorted(tiny))}"
        )
    return cls(**{**tiny, **fields})


def build_hf_model(model: str, options: dict[str, Any]) -> nn.Module:
    """The model ``hf:<name>`` from its config class (random weights, nothing downloaded),
    marked as taking dict batches, with its task (``classification`` or ``lm``) and where its
    layers are (``blocks_path``, see :data:`BLOCKS`)."""
    name = model.removeprefix(HF_PREFIX)
    _, model_class, task, _ = ARCHITECTURES[name]
    config = hf_config(model, options)
    module = getattr(_transformers(), model_class)(config)
    module.task = task
    module.batch_format = "dict"
    module.blocks_path = BLOCKS[name]
    return module


def hf_data_options(model: str, options: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """What the synthetic data of ``hf:<name>`` is made like: the built-in generator to use
    (``transformer``: token ids and class labels; ``gpt``: token ids and next tokens) and its
    options (vocabulary, sequence length, classes), from the model's config."""
    _, _, task, _ = ARCHITECTURES[model.removeprefix(HF_PREFIX)]
    config = hf_config(model, options)
    seq_len = int(options.get(SEQ_LEN, DEFAULT_SEQ_LEN))
    data = {"vocab_size": int(config.vocab_size), "seq_len": seq_len}
    if task == "lm":
        return "gpt", data
    return "transformer", {**data, "num_classes": int(config.num_labels)}
