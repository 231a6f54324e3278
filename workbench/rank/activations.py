"""The activations a training step saves for its backward, counted from the tensors autograd
saves (``torch.autograd.graph.saved_tensors_hooks``), not sampled: what a rank holds at the end
of its forward beyond its parameters, gradients and optimizer state, and what usually decides an
out-of-memory.

What is counted: the distinct storages of the tensors saved for backward during one forward
(and its loss), each storage once, less the parameters' (a layer saves its weight as well as its
input: the weight is counted as a parameter already). A view is counted by its storage, so the
transposed weight a matmul saves is the parameter's and left out. Under FSDP2 the gathered
parameters a layer saves are parameters too (``nn.Parameter`` views of the gather's buffer):
they are the working set, not activations. Under activation checkpointing only the checkpoints'
inputs are saved in the forward: what checkpointing saves is what this counts.

Counted once, in the first training step (a few microseconds a saved tensor), and scaled by
the analysis with the per-device batch: activations grow with the samples a forward holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass
class SavedBytes:
    """The distinct storages saved so far, bytes by (device, address)."""

    params: set[tuple[str, int]]
    storages: dict[tuple[str, int], int] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if not _is_param(tensor):
            try:
                storage = tensor.untyped_storage()
                key = (str(tensor.device), storage.data_ptr())
                if key not in self.params:
                    self.storages[key] = storage.nbytes()
            except (RuntimeError, NotImplementedError):  # a tensor without storage (meta)
                pass
        return tensor


def _is_param(tensor: torch.Tensor) -> bool:
    """A parameter, or a view of one (its ``_base``), as autograd saves a layer's weight."""
    return isinstance(tensor, nn.Parameter) or isinstance(
        getattr(tensor, "_base", None), nn.Parameter
    )


def _storage_keys(model: nn.Module) -> set[tuple[str, int]]:
    keys = set()
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        keys.add((str(local.device), local.untyped_storage().data_ptr()))
    return keys


@contextlib.contextmanager
def saved_for_backward(model: nn.Module) -> Iterator[SavedBytes]:
    """Count the activations saved while inside (``.bytes`` once left)."""
    saved = SavedBytes(_storage_keys(model))
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, _unpack):
        yield saved


def _unpack(tensor: Any) -> Any:
    return tensor
