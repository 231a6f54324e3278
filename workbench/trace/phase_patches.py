"""The patches that time a script's phases besides its forwards and optimizer steps: every
``torch.autograd.backward`` (what ``loss.backward()`` calls), every DataLoader fetch, and
``GradScaler.scale`` (so that a scaled loss is logged unscaled). Each appends to the hooks' log
(``step_log.StepLog``): an event kind and a time, and what the step consumed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from workbench.store import flight_file
from workbench.trace import forward_hooks
from workbench.trace.step_counts import batch_shape
from workbench.trace.step_events import BACKWARD, BACKWARD_END, FETCH, FETCH_END
from workbench.trace.step_log import BACKWARD_LOSS, FETCH_BATCH

_clock = time.perf_counter


def backward(hooks: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.autograd.backward`` timed, its root kept as the loss (unscaled, where a
    ``GradScaler`` scaled it)."""
    log = hooks.log
    kinds, times, extras = log.kinds, log.times, log.extras
    clock, tensor = _clock, torch.Tensor

    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        # compiled code, or a backward inside a backward (reentrant checkpointing)
        if forward_hooks.is_compiling() or hooks.backward_depth:
            return original(tensors, *args, **kwargs)
        kinds.append(BACKWARD)
        times.append(clock())
        hooks.flight.at(hooks.flight_step + 1, flight_file.BACKWARD)
        if isinstance(tensors, tensor) and tensors.numel() == 1:
            root = tensors
            scaled = hooks.scaled
            if scaled is not None and scaled[0] is tensors:
                root = scaled[1]
            extras.append((len(kinds), BACKWARD_LOSS, root.detach()))
        hooks.backward_depth += 1
        try:
            result = original(tensors, *args, **kwargs)
        finally:
            hooks.backward_depth -= 1
            kinds.append(BACKWARD_END)
            times.append(clock())
        # only once it returned: a backward that failed (DDP's all-reduce timed out) was in it
        hooks.flight.phase(flight_file.AFTER_BACKWARD)
        return result

    return backward


def fetch(hooks: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """A DataLoader fetch timed; its batch is counted only until the root's training forward
    has counted one (``forward_hooks``): from then on the forwards count (a step whose forward
    cannot has no samples). Once the ranks agree the run is known, a training fetch ends its
    epoch instead (``script_until_known``)."""
    kinds, times, extras = hooks.log.kinds, hooks.log.times, hooks.log.extras
    clock, is_grad_enabled = _clock, torch.is_grad_enabled

    until = hooks.until_known

    def __next__(iterator: Any) -> Any:
        if not is_grad_enabled():
            return original(iterator)
        if until is not None and until.refuse():  # the ranks agreed: known (script_until_known)
            raise StopIteration
        kinds.append(FETCH)
        times.append(clock())
        hooks.flight.at(hooks.flight_step + 1, flight_file.DATA)
        try:
            batch = original(iterator)
        except StopIteration:  # the end of an epoch: nothing was fetched
            kinds.pop()
            times.pop()
            raise
        kinds.append(FETCH_END)
        times.append(clock())
        if not hooks.forward_counts:
            shape = batch_shape(batch)
            if shape is not None:
                extras.append((len(kinds), FETCH_BATCH, shape))
        return batch

    return __next__


def scale(hooks: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """``GradScaler.scale``, its (output, input) kept: the backward's root unscaled."""

    def scale(scaler: Any, outputs: Any) -> Any:
        scaled = original(scaler, outputs)
        if isinstance(outputs, torch.Tensor):
            hooks.scaled = (scaled, outputs)
        return scaled

    return scale
