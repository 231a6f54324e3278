"""What a rank does around its training loop, in the rank's own process: its status file (running,
then completed, preempted or failed with the traceback), the device, the process group, the
training loop or the user's script, and the requeue after an agreed preemption stop.

Imported where a rank runs (a worker, a fresh interpreter), never by the launcher:
:class:`workbench.rank.task.RankTask` only names it, so that a notebook or the CLI launching on
the warm pool does not import torch (about 1.8 s on each sweep point's kernel)."""

from __future__ import annotations

import faulthandler
import os
import signal
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from workbench import schema
from workbench.config.run_config import RunConfig
from workbench.errors import ScriptError, ScriptExit
from workbench.rank import distributed
from workbench.rank.loop import train
from workbench.rank.preemption import PreemptionSignal
from workbench.rank.script import run_script_rank, script_label
from workbench.store.files import rank_file, write_json
from workbench.store.flight_file import flight_path
from workbench.trace import flight


class Task(Protocol):
    """What a rank is told (:class:`workbench.rank.task.RankTask`, frozen)."""

    @property
    def config(self) -> RunConfig: ...
    @property
    def run_dir(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def cwd(self) -> str: ...
    @property
    def environ(self) -> Mapping[str, str] | None: ...


def run_task(task: Task, env: distributed.RankEnv) -> dict[str, Any]:
    """Run ``task``'s rank as ``env`` says who it is, recording its status in its rank file;
    returns its summary, and on a preemption stop asks for the requeue (rank 0)."""
    if task.environ:
        os.environ.update(task.environ)
    stop = PreemptionSignal().install()
    # `kill -USR1 <pid>` (the launcher does it to a hung rank) prints every thread's stack.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    state_path = rank_file(Path(task.run_dir), env.rank)
    recorder = flight.start(flight_path(Path(task.run_dir) / schema.FLIGHT_DIR, env.rank))
    distributed.nccl_recorder(str(Path(task.run_dir) / schema.LOGS_DIR))  # a script's NCCL too
    base = {
        "rank": env.rank,
        "local_rank": env.local_rank,
        "host": env.host,
        "pid": os.getpid(),
        "attempt": task.attempt,
        "job_id": env.job_id,
        # where this attempt's ranks met (torch's MASTER_ADDR:MASTER_PORT)
        "rendezvous": f"{env.master_addr}:{env.master_port}",
    }
    try:
        device = distributed.pick_device(task.config.device, env.local_rank)
        base["device_facts"] = distributed.device_facts(device)
        base["started_at"] = time.time()  # kept in every later record: the run's device time
        write_json(state_path, {**base, "status": "running"})
        if task.config.is_script:
            summary = run_script_rank(
                task.config,
                env,
                device,
                Path(task.run_dir),
                task.run_id,
                task.attempt,
                task.cwd,
            )
        else:
            summary = run_rank(
                task.config, env, device, Path(task.run_dir), task.run_id, task.attempt, stop
            )
    except BaseException as exc:
        recorder.dump(exc)  # before the record that says it failed: the launcher reads both
        write_json(
            state_path,
            {
                **base,
                "status": "failed",
                "ended_at": time.time(),
                "exception": explain(exc, task.config),
                "traceback": traceback.format_exc(),
            },
        )
        raise
    finally:
        flight.stop()
    status = "preempted" if summary["preempted"] else "completed"
    write_json(state_path, {**base, "status": status, "ended_at": time.time(), "summary": summary})
    if summary["preempted"] and env.rank == 0:
        stop.requeue()  # submitit: checkpoint() below, requeue, exit
    return summary


#: What torch says when a layer's input width is not the data's (linear, conv, embedding, norm).
_SHAPE_ERRORS = (
    "shapes cannot be multiplied",
    "size mismatch",
    "Expected input batch_size",
    "channels, but got",
    "normalized_shape",
    "index out of range in self",
)


#: The exceptions of a programming error (the workbench raises none of them on purpose).
_BUG_TYPES = (AttributeError, TypeError, NameError, KeyError, AssertionError, ReferenceError)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _raised_in_workbench(exc: BaseException) -> str | None:
    """``file:line`` (relative to the package) where ``exc`` was raised, when that is the
    workbench's own code (its innermost frame) and the exception a programming error's (not
    one raised on purpose, nor a collective's failure seen through the workbench's call of
    it); else None."""
    if not isinstance(exc, _BUG_TYPES) or exc.__traceback__ is None:
        return None
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    path = os.path.abspath(tb.tb_frame.f_code.co_filename)
    if not path.startswith(_PACKAGE + os.sep):
        return None
    return f"{os.path.relpath(path, os.path.dirname(_PACKAGE))}:{tb.tb_lineno}"


def explain(exc: BaseException, config: RunConfig) -> str:
    """The exception as recorded for the failure report. A shape error from a model that does
    not fit its dataset (a plug-in's width differs from the data's) also names both and what
    has to agree, instead of torch's bare "mat1 and mat2 shapes cannot be multiplied"."""
    text = f"{type(exc).__name__}: {exc}"
    ours = _raised_in_workbench(exc)
    if ours is not None:
        return (
            f"the workbench's own code raised {text} at {ours}, not "
            f"{script_label(config) if config.is_script else 'the model'}: a workbench bug; "
            "please report it with the rank's log"
        )
    if config.is_script and not isinstance(exc, ScriptError | ScriptExit):
        return f"{script_label(config)} raised {text}"
    if isinstance(exc, RuntimeError | IndexError) and any(m in str(exc) for m in _SHAPE_ERRORS):
        text = (
            f"the model {config.model!r} does not take the inputs of the dataset "
            f"{config.dataset!r}: its first layer's input width (model_options "
            f"{dict(config.model_options)!r}) must equal the width of the dataset's items. " + text
        )
    return text


def run_rank(
    config: RunConfig,
    env: distributed.RankEnv,
    device: torch.device,
    run_dir: Path,
    run_id: str,
    attempt: int,
    stop: PreemptionSignal | None = None,
) -> dict[str, Any]:
    """Train on this rank (on ``device``, from :func:`distributed.pick_device`) and return its
    summary. Runs in a fresh process per rank."""
    torch.set_num_threads(config.threads_per_rank)
    distributed.init_process_group(
        env,
        config.backend,
        device,
        config.collective_timeout_s,
        dump_dir=str(run_dir / schema.LOGS_DIR),
    )
    summary = train(config, env, device, run_dir, run_id, attempt, stop or PreemptionSignal())
    # Only a rank that finished tears down with a barrier. A failing rank leaves without one: its
    # peers may be inside another collective, and its exit closes the sockets, which fails them
    # at once instead of after the collective timeout.
    distributed.teardown()
    return summary
