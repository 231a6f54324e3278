"""Fault injection for tests and drills: at the start of a chosen step of a chosen attempt, the
chosen rank raises, exits, is killed, gets the scheduler's preemption signal, or hangs."""

from __future__ import annotations

import os
import signal
import time

from workbench import jobs
from workbench.config.run_config import RunConfig
from workbench.errors import InjectedFault


def inject_fault(
    config: RunConfig, rank: int, step: int, attempt: int, phase: str = "start"
) -> None:
    """Do what ``config.fault`` asks if it names this rank, step, phase and attempt; else
    nothing.

    Kinds: ``raise`` (an ``InjectedFault``), ``exit`` (status 3, no clean-up), ``kill``
    (SIGKILL), ``preempt`` (the scheduler's warning signal, as before a time limit) and ``hang``
    (sleep forever: the collective timeout and the launcher's watchdog must notice)."""
    f = config.fault
    if f is None or f.rank != rank or f.step != step or f.attempt != attempt or f.phase != phase:
        return
    if f.kind == "raise":
        raise InjectedFault(f"injected fault on rank {rank} at step {step}")
    if f.kind == "exit":
        os._exit(3)
    if f.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if f.kind == "preempt":
        os.kill(os.getpid(), jobs.preemption_signal())
    if f.kind == "hang":
        while True:
            time.sleep(3600)
