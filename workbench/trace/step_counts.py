"""What one training step of a script consumed, seen from outside: samples and tokens from the
batch (its first tensor's leading dimension; its element count where it holds token ids), and
the loss the model returned or the one given to ``backward`` (what the script notes itself,
``workbench.trace.note``, wins over both: ``step_log``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch


def leading_tensor(batch: Any) -> torch.Tensor | None:
    """The batch's first tensor: itself, the first of a tuple or list, ``input_ids`` or the
    first tensor value of a mapping (a dict batch, a ``BatchEncoding``)."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, (tuple, list)):
        for item in batch:
            if isinstance(item, torch.Tensor):
                return item
            if isinstance(item, Mapping):
                return leading_tensor(item)
        return None
    if isinstance(batch, Mapping):
        ids = batch.get("input_ids")
        if isinstance(ids, torch.Tensor):
            return ids
        for value in batch.values():
            if isinstance(value, torch.Tensor):
                return value
    return None


def batch_shape(batch: Any) -> tuple[torch.Size, torch.dtype] | None:
    """(shape, dtype) of a batch's first tensor (:func:`leading_tensor`), or None:
    what its samples and tokens are worked out from, later. The usual ``(inputs, targets)``
    without a search."""
    kind = type(batch)
    first: torch.Tensor | None
    if (kind is tuple or kind is list) and batch and type(batch[0]) is torch.Tensor:
        first = batch[0]
    else:
        first = leading_tensor(batch)
    return None if first is None else (first.shape, first.dtype)


def shape_counts(shape: torch.Size, dtype: torch.dtype) -> tuple[int | None, int | None]:
    """(samples, tokens) of a batch from its first tensor: the leading dimension; the element
    count where the tensor holds token ids (integers, two or more dimensions)."""
    if not shape:
        return None, None
    tokens = math.prod(shape) if len(shape) >= 2 and not dtype.is_floating_point else None
    return int(shape[0]), tokens


def output_loss(output: Any) -> torch.Tensor | None:
    """The loss a model returned: ``output.loss`` (a ``ModelOutput``) or ``output["loss"]``."""
    if type(output) is torch.Tensor:
        return None  # logits: the loss is computed outside the model
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, Mapping):
        loss = output.get("loss")
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None


def step_loss(model: list[Any] | None, backward: list[Any] | None) -> Any:
    """The mean of the model's losses over the micro-batches; else the sum of the backward
    roots (scripts divide those by their accumulation steps). One micro-batch (the usual
    case): the tensor itself, no arithmetic launched per step."""
    losses = model or backward
    if not losses:
        return None
    if len(losses) == 1:
        return losses[0]
    if model:
        return sum(model) / len(model)
    return sum(losses)
