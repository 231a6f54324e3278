"""Tracing one rank: the step rows (``tracer``), DDP's own communication timers
(``comm_timing``), memory (``memory_probe``) and, for training the workbench did not write,
hooks on torch that see its steps from outside (``torch_hooks``, ``step_log``,
``step_events``).

The built-in loop and a user's script write the same rows through the same ``Tracer``; the
loop stamps its phases itself, a script's phases come from the hooks.

:func:`note` is the one call a script may add, for what cannot be seen from outside. It imports
nothing heavy and does nothing outside a workbench rank, so a script that calls it still runs
under ``python`` or ``torchrun`` alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["note"]

#: Set by the hooks while a script runs in a workbench rank; None everywhere else.
_recorder: Callable[..., None] | None = None


def note(samples: int | None = None, tokens: int | None = None, loss: Any = None) -> None:
    """Tell the workbench what the current training step consumed and its loss, where the hooks
    cannot see it (a model called without DDP and without a DataLoader, a batch whose leading
    dimension is not its sample count, a loss computed outside the model). Each value given
    replaces the measured one for the step in progress (the one the next optimizer step ends);
    a second call in one step adds ``samples`` and ``tokens`` to the first and keeps the last
    ``loss``. Outside a workbench rank it does nothing.

    ``samples``: samples this rank trained on in the step; ``tokens``: tokens in them;
    ``loss``: a float or a 0-d tensor (read when the trace is written, never synchronising)."""
    recorder = _recorder
    if recorder is not None:
        recorder(samples=samples, tokens=tokens, loss=loss)
