"""A built-in model's options resolved: its defaults, then the preset that ``size`` names, then the
options given beside it. One place for the config's checks, the synthetic dataset and the model
factory, so all three see the same sizes. Pure: no torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workbench.config.choices import MODEL_OPTIONS, MODEL_SIZES, SIZE_OPTION
from workbench.config.fields import did_you_mean
from workbench.errors import ConfigError, Problem


def sizes_of(model: str) -> tuple[str, ...]:
    """The size presets of a built-in model (none for a model without presets or a plug-in)."""
    return tuple(MODEL_SIZES.get(model, {}))


def size_problem(model: str, size: Any) -> Problem | None:
    """The problem with ``model_options.size=size`` for the built-in ``model``, or None."""
    sizes = sizes_of(model)
    if isinstance(size, str) and size in sizes:
        return None
    field = f"model_options.{SIZE_OPTION}"
    if not sizes:
        having = ", ".join(f"{m}: {', '.join(sizes_of(m))}" for m in MODEL_SIZES)
        rule = f"model {model!r} has no size presets; give its options instead (sizes: {having})"
        return Problem(field, size, rule)
    rule = f"unknown size of model {model!r}; {did_you_mean(size, sizes)}valid: {', '.join(sizes)}"
    return Problem(field, size, rule)


def merged_options(model: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """A built-in model's defaults, then its preset (when ``size`` names one), then the explicit
    options; a plug-in's options as given. Never raises: an unknown size is left out (see
    :func:`size_problem`)."""
    if model not in MODEL_OPTIONS:
        return dict(options)
    explicit = {k: v for k, v in options.items() if k != SIZE_OPTION}
    size = options.get(SIZE_OPTION)
    preset = MODEL_SIZES.get(model, {}).get(size, {}) if isinstance(size, str) else {}
    return {**MODEL_OPTIONS[model], **preset, **explicit}


def resolve_model_options(model: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments a built-in model is built with (:func:`merged_options`); a ConfigError
    naming the valid sizes when ``size`` names none of this model's."""
    if model in MODEL_OPTIONS and SIZE_OPTION in options:
        problem = size_problem(model, options[SIZE_OPTION])
        if problem is not None:
            raise ConfigError([problem])
    return merged_options(model, options)
