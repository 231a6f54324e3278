"""What one training step of a script consumed, seen from outside: samples and tokens from the
batch (its first tensor's leading dimension; its element count where it holds token ids), the
loss the model returned or the one given to ``backward``, and what the script noted itself
(``workbench.trace.note``, which wins)."""

from __future__ import annotations

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


def batch_counts(batch: Any) -> tuple[int | None, int | None]:
    """(samples, tokens) of a batch: its first tensor's leading dimension; its element count
    where that tensor holds token ids (integers, two or more dimensions), else None."""
    kind = type(batch)
    first: torch.Tensor | None
    if (kind is tuple or kind is list) and batch and type(batch[0]) is torch.Tensor:
        first = batch[0]  # the usual (inputs, targets): no search
    else:
        first = leading_tensor(batch)
    if first is None or first.ndim == 0:
        return None, None
    tokens = first.numel() if first.ndim >= 2 and not first.is_floating_point() else None
    return int(first.shape[0]), tokens


def output_loss(output: Any) -> torch.Tensor | None:
    """The loss a model returned: ``output.loss`` (a ``ModelOutput``) or ``output["loss"]``."""
    if type(output) is torch.Tensor:
        return None  # logits: the loss is computed outside the model
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, Mapping):
        loss = output.get("loss")
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None


class StepCounts:
    """What one step consumed, as measured (by the primary DDP's forwards or else the fetches)
    and as the script noted it (``workbench.trace.note``, which wins)."""

    def __init__(self) -> None:
        self.forward_samples: int | None = None
        self.forward_tokens: int | None = None
        self.fetch_samples: int | None = None
        self.fetch_tokens: int | None = None
        self.noted_samples: int | None = None
        self.noted_tokens: int | None = None
        self.noted_loss: Any = None
        self.model_losses: list[torch.Tensor] = []
        self.backward_losses: list[torch.Tensor] = []

    @staticmethod
    def _add(total: int | None, value: int | None) -> int | None:
        if value is None:
            return total
        return value if total is None else total + value

    def forward(self, batch: Any) -> None:
        samples, tokens = batch_counts(batch)
        self.forward_samples = self._add(self.forward_samples, samples)
        self.forward_tokens = self._add(self.forward_tokens, tokens)

    def fetched(self, batch: Any) -> None:
        samples, tokens = batch_counts(batch)
        self.fetch_samples = self._add(self.fetch_samples, samples)
        self.fetch_tokens = self._add(self.fetch_tokens, tokens)

    def note(self, samples: int | None, tokens: int | None, loss: Any) -> None:
        self.noted_samples = self._add(self.noted_samples, samples)
        self.noted_tokens = self._add(self.noted_tokens, tokens)
        if loss is not None:
            self.noted_loss = loss.detach() if isinstance(loss, torch.Tensor) else float(loss)

    def samples(self) -> int | None:
        for value in (self.noted_samples, self.forward_samples, self.fetch_samples):
            if value is not None:
                return value
        return None

    def tokens(self) -> int | None:
        for value in (self.noted_tokens, self.forward_tokens, self.fetch_tokens):
            if value is not None:
                return value
        return None

    def loss(self) -> Any:
        """The noted loss; else the mean of the model's losses over the micro-batches; else the
        sum of the backward roots (scripts divide those by their accumulation steps)."""
        if self.noted_loss is not None:
            return self.noted_loss
        # One micro-batch (the usual case): the tensor itself, no arithmetic launched per step.
        losses = self.model_losses or self.backward_losses
        if len(losses) == 1:
            return losses[0]
        if self.model_losses:
            return sum(self.model_losses) / len(self.model_losses)
        if self.backward_losses:
            return sum(self.backward_losses)
        return None
