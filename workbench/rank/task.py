"""The callable submitit runs once per rank, and what it does around the training loop: signals,
the rank's status file, the process group, and the requeue after an agreed preemption stop.

``RankTask`` is pickled by its module path: the launcher imports it from here."""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import signal
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench import jobs, schema
from workbench.config.run_config import RunConfig
from workbench.errors import ScriptError, ScriptExit
from workbench.ports import free_port
from workbench.rank import distributed
from workbench.rank.loop import train
from workbench.rank.preemption import PreemptionSignal
from workbench.rank.script import run_script_rank, script_label
from workbench.store.files import rank_file, write_json


@dataclass(frozen=True)
class RankTask:
    """The callable submitit runs once per rank (pickled with its config)."""

    config: RunConfig
    run_dir: str
    run_id: str
    master_port: int | None
    attempt: int = 0
    #: A script run: the caller's working directory, where ``python train.py`` would run.
    cwd: str = "."
    #: A run on the warm pool: the caller's environment at launch (the workers started before
    #: it, from a template that may serve other processes); other executors' ranks inherit it.
    environ: Mapping[str, str] | None = None

    def __call__(self) -> dict[str, Any]:
        """Run this rank as the job's environment (submitit's) says who it is."""
        return self.run(distributed.RankEnv.from_job(self.master_port))

    def run(self, env: distributed.RankEnv) -> dict[str, Any]:
        """Run this rank as ``env`` says who it is, recording its status (running, then
        completed, preempted or failed with the traceback) in its rank file; returns its
        summary."""
        if self.environ:
            os.environ.update(self.environ)
        stop = PreemptionSignal().install()
        # `kill -USR1 <pid>` (the launcher does it to a hung rank) prints every thread's stack.
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        state_path = rank_file(Path(self.run_dir), env.rank)
        base = {
            "rank": env.rank,
            "local_rank": env.local_rank,
            "host": env.host,
            "pid": os.getpid(),
            "attempt": self.attempt,
            "job_id": env.job_id,
            # where this attempt's ranks met (torch's MASTER_ADDR:MASTER_PORT)
            "rendezvous": f"{env.master_addr}:{env.master_port}",
        }
        try:
            device = distributed.pick_device(self.config.device, env.local_rank)
            base["device_facts"] = distributed.device_facts(device)
            write_json(state_path, {**base, "status": "running", "started_at": time.time()})
            if self.config.is_script:
                summary = run_script_rank(
                    self.config,
                    env,
                    device,
                    Path(self.run_dir),
                    self.run_id,
                    self.attempt,
                    self.cwd,
                )
            else:
                summary = run_rank(
                    self.config, env, device, Path(self.run_dir), self.run_id, self.attempt, stop
                )
        except BaseException as exc:
            write_json(
                state_path,
                {
                    **base,
                    "status": "failed",
                    "ended_at": time.time(),
                    "exception": explain(exc, self.config),
                    "traceback": traceback.format_exc(),
                },
            )
            raise
        status = "preempted" if summary["preempted"] else "completed"
        write_json(
            state_path, {**base, "status": status, "ended_at": time.time(), "summary": summary}
        )
        if summary["preempted"] and env.rank == 0:
            stop.requeue()  # submitit: checkpoint() below, requeue, exit
        return summary

    def checkpoint(self) -> Any:
        """submitit's requeue hook: the same task, next attempt, a fresh rendezvous port (a
        stale store from the previous attempt must never be joined)."""
        # Runs on global rank 0, which is on the master host: a port free here is free there.
        return jobs.resubmission(
            dataclasses.replace(self, attempt=self.attempt + 1, master_port=free_port())
        )


#: What torch says when a layer's input width is not the data's (linear, conv, embedding, norm).
_SHAPE_ERRORS = (
    "shapes cannot be multiplied",
    "size mismatch",
    "Expected input batch_size",
    "channels, but got",
    "normalized_shape",
    "index out of range in self",
)


def explain(exc: BaseException, config: RunConfig) -> str:
    """The exception as recorded for the failure report. A shape error from a model that does
    not fit its dataset (a plug-in's width differs from the data's) also names both and what
    has to agree, instead of torch's bare "mat1 and mat2 shapes cannot be multiplied"."""
    text = f"{type(exc).__name__}: {exc}"
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
