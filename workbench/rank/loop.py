"""The training loop of one rank, as named phases over one state object.

``train`` builds the trainer and the tracer, then runs the phases:

- ``train_epoch``: the steps of one epoch from where the state is, each a ``train_step``
  (fault injection, learning rate, optimizer step, non-finite check, trace row, profiler step;
  on CUDA the loss stays on the device and the tracer checks it when it flushes)
  followed, mid-epoch, by ``after_step`` (a checkpoint every N steps, the agreed preemption stop);
- ``end_of_epoch``: evaluate, then checkpoint (so a checkpoint implies its evaluation), then the
  agreed stop;
- ``finish``: the preemption checkpoint, or the evaluation at the end and the final checkpoint.

The phases read the parts of the run from a ``Loop`` and move a ``LoopState`` forward: step,
epoch, the step of the last evaluation, and whether the ranks agreed to stop for preemption.
Warm-up counts from each attempt's first step: a resumed attempt warms up again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch
from torch import nn

from workbench import schema
from workbench.config.run_config import RunConfig
from workbench.errors import NonFiniteLossError
from workbench.rank import distributed
from workbench.rank.data import train_batches
from workbench.rank.faults import inject_fault
from workbench.rank.flops import measure_step_flops
from workbench.rank.preemption import PreemptionSignal
from workbench.rank.profiling import step_profiler
from workbench.rank.trainer import Trainer
from workbench.rank.until_known import UntilKnown
from workbench.store.flight_file import AFTER, BETWEEN, DATA, EVALUATION, PHASES
from workbench.store.trace_files import consolidate, trim_for_resume
from workbench.trace import flight
from workbench.trace.phase_clock import PhaseClock
from workbench.trace.tracer import Tracer


@dataclass
class LoopState:
    """Where the loop is. ``step`` counts optimizer steps done (global, from 1 once one is
    done), ``epoch`` is the epoch being trained (from 0), ``last_eval_step`` the step of the
    last evaluation (or of the start), ``preempted`` whether the ranks agreed to stop early,
    ``known`` why they agreed to stop measuring early (measuring until known),
    ``attempt_start`` the step this attempt started after (the checkpoint's; 0 at first)."""

    step: int
    epoch: int
    last_eval_step: int
    preempted: bool = False
    attempt_start: int = 0
    known: str | None = None  # "known" or "time cap": the ranks stopped measuring early

    @property
    def stopped(self) -> bool:
        """Whether the ranks agreed to stop before the run's last step (preempted, or known)."""
        return self.preempted or self.known is not None


@dataclass(frozen=True)
class Loop:
    """The parts of a run the phases use and do not replace."""

    config: RunConfig
    env: distributed.RankEnv
    attempt: int
    stop: PreemptionSignal
    trainer: Trainer
    tracer: Tracer
    profiler: Any
    clock: PhaseClock
    sample_log: IO[str] | None
    until: UntilKnown


def train(
    config: RunConfig,
    env: distributed.RankEnv,
    device: torch.device,
    run_dir: Path,
    run_id: str,
    attempt: int,
    stop: PreemptionSignal,
) -> dict[str, Any]:
    """Train this rank to the end of the run (or to an agreed preemption stop) in a process
    group already joined; returns its summary. The DDP model is freed before returning, so the
    caller may tear the process group down."""
    trainer = Trainer(config, env, device, run_dir, attempt, before_wrap=first_step_flops)
    traces = run_dir / schema.TRACES_DIR
    traces.mkdir(parents=True, exist_ok=True)
    done = trainer.done_steps
    if done:
        trim_for_resume(traces, env.rank, done)
    state = LoopState(
        step=done,
        epoch=done // config.steps_per_epoch,
        last_eval_step=done,
        attempt_start=done,
    )
    with (
        _sample_log(config, traces, env.rank) as sample_log,
        Tracer(
            traces,
            run_id=run_id,
            rank=env.rank,
            local_rank=env.local_rank,
            host=env.host,
            world_size=int(config.world_size),  # type: ignore[arg-type]  # devices (DP: one process)
            attempt=attempt,
            flush_s=config.trace_flush_s,
            device=device,
        ) as tracer,
        step_profiler(
            config.profile_steps, done, run_dir / schema.PROFILES_DIR, env.rank, device
        ) as profiler,
    ):
        clock = PhaseClock(device)
        until = UntilKnown(config)
        loop = Loop(config, env, attempt, stop, trainer, tracer, profiler, clock, sample_log, until)
        trainer.phase = _phases(loop)
        distributed.barrier()
        tracer.set_t0()
        clock.anchor(tracer.t0)
        run_epochs(loop, state)
        finish(loop, state)
        network = None if state.preempted else trainer.measure_network()  # no first step waits
    summary = summarize(trainer.module, env, device, state.step, tracer)
    summary.update(outcome(trainer, tracer, state, until))
    measured = {"network": network, "step_flops": trainer.step_flops}  # None: not measured
    summary.update({k: v for k, v in measured.items() if v is not None})
    consolidate(traces, env.rank)
    del loop, trainer  # free the DDP model before the process group goes (distributed.teardown)
    return summary


def outcome(
    trainer: Trainer, tracer: Tracer, state: LoopState, until: UntilKnown
) -> dict[str, Any]:
    """What the rank's summary says of how the run went and how it was measured."""
    return {
        "preempted": state.preempted,
        "dropped_samples_per_epoch": trainer.dropped_per_epoch(),
        "comm_method": trainer.comm_method(),
        "measurement_warnings": trainer.measurement_warnings(),
        "memory_parts": memory_record(trainer, tracer),
        "until_known": until.record(state.step),
    }


def first_step_flops(trainer: Trainer) -> dict[str, Any] | None:
    """FLOPs of the attempt's first step (rank 0; None on the others), counted on the bare model
    before the strategy wraps it, before the first traced step."""
    epoch = trainer.done_steps // trainer.config.steps_per_epoch
    return measure_step_flops(trainer, trainer.env.rank, epoch)


def memory_record(trainer: Trainer, tracer: Tracer) -> dict[str, Any] | None:
    """This rank's memory in its parts (``memory_parts``: counted at the attempt's first step;
    None if it made none), with ``peak_bytes``, the CUDA allocator's peak the tracer reads (None
    on CPU, where the tracer's ``rss_bytes`` is the process's)."""
    if trainer.memory is None:
        return None
    return {**trainer.memory, "peak_bytes": tracer.memory(fresh=True)["mem_peak_bytes"]}


def _phases(loop: Loop) -> Callable[[int], None]:
    """What the trainer tells of each phase of a step: the flight recorder, and a fault
    planted in that phase (``FaultInjection.phase``)."""
    recorder, config = flight.active(), loop.config
    if config.fault is None or config.fault.phase == "start":
        return recorder.phase

    def phase(p: int) -> None:
        recorder.phase(p)
        name = PHASES[p].split()[0]  # "data loading" -> "data", "optimizer step" -> "optimizer"
        inject_fault(config, loop.env.rank, recorder.step, loop.attempt, name)

    return phase


def built_in_steps(config: RunConfig) -> int:
    """The steps the built-in loop makes (a script's are its own: None there)."""
    total = config.total_steps
    assert total is not None, "the built-in loop runs no script"
    return total


def _sample_log(
    config: RunConfig, traces: Path, rank: int
) -> contextlib.AbstractContextManager[IO[str] | None]:
    """The file of sample indices per step, when ``trace_sample_ids`` asks for it."""
    if not config.trace_sample_ids:
        return contextlib.nullcontext()
    return open(traces / f"samples-rank{rank:05d}.jsonl", "a")


def run_epochs(loop: Loop, state: LoopState) -> None:
    """Epoch after epoch until the run's last step or an agreed preemption stop."""
    while state.step < built_in_steps(loop.config):
        train_epoch(loop, state)
        if state.stopped:
            return
        end_of_epoch(loop, state)
        if state.stopped:
            return


def train_epoch(loop: Loop, state: LoopState) -> None:
    """The steps of ``state.epoch`` from ``state.step`` on; leaves early at the run's last step
    or on an agreed preemption stop."""
    config, env = loop.config, loop.env
    spe, accum = config.steps_per_epoch, config.gradient_accumulation_steps
    batches = train_batches(
        loop.trainer.train_set,
        env.rank,
        env.world_size,
        config.per_process_batch_size,
        config.seed,
        state.epoch,
    )
    loop.trainer.ddp.train()
    for s in range(state.step % spe, spe):
        train_step(loop, state, batches[s * accum : (s + 1) * accum])
        if state.step >= built_in_steps(config):
            return
        if s + 1 < spe:  # the epoch's last step is followed by end_of_epoch instead
            after_step(loop, state)
            if state.stopped:
                return


def train_step(loop: Loop, state: LoopState, micro: list[list[int]]) -> None:
    """The next optimizer step over the micro-batches ``micro``, traced."""
    state.step += 1
    step, tracer = state.step, loop.tracer
    flight.active().at(step, DATA)
    inject_fault(loop.config, loop.env.rank, step, loop.attempt)
    loop.trainer.phase(DATA)
    warmup = step - state.attempt_start <= loop.config.warmup_steps
    if loop.sample_log is not None:
        record = {"epoch": state.epoch, "step": step, "indices": sum(micro, [])}
        loop.sample_log.write(json.dumps(record) + "\n")
    loop.trainer.set_lr(step)
    fields = loop.trainer.step(micro, loop.clock)
    flight.active().phase(BETWEEN)
    loop.until.step_started(loop.clock.started_at, measured=not warmup)
    loss = fields["loss"]
    if isinstance(loss, float) and not math.isfinite(loss):  # a tensor: checked at the flush
        raise NonFiniteLossError(loop.env.rank, step, loss)
    tracer.step(
        epoch=state.epoch,
        step=step,
        warmup=warmup,
        t_start_s=tracer.since_t0(loop.clock.started_at),
        **fields,
    )
    loop.profiler.step()


def after_step(loop: Loop, state: LoopState) -> None:
    """Mid-epoch, after a step that is not the run's last: a checkpoint every
    ``checkpoint_every_steps``, then the agreed preemption stop."""
    every = loop.config.checkpoint_every_steps
    if every and state.step % every == 0:
        loop.trainer.save(state.step, loop.tracer)
        loop.until.interrupted()
    agreed_stop(loop, state)


def end_of_epoch(loop: Loop, state: LoopState) -> None:
    """After an epoch's steps: on a completed epoch, evaluate first, then checkpoint, so a
    checkpoint implies its evaluation; then move to the next epoch and check the agreed stop."""
    config = loop.config
    if state.step % config.steps_per_epoch == 0:
        if config.eval_every_epochs and (state.epoch + 1) % config.eval_every_epochs == 0:
            flight.active().phase(EVALUATION)
            loop.trainer.evaluate(loop.tracer, state.epoch, state.step)
            state.last_eval_step = state.step
            loop.until.interrupted()
        every = config.checkpoint_every_steps
        if every and state.step % every == 0 and state.step < built_in_steps(config):
            loop.trainer.save(state.step, loop.tracer)
            loop.until.interrupted()
    state.epoch += 1
    agreed_stop(loop, state)


def agreed_stop(loop: Loop, state: LoopState) -> None:
    """Before the last step, the ranks agree (one small allreduce) every
    ``stop_check_every_steps`` steps whether any of them got the preemption signal
    (``state.preempted`` on all of them if one did), and, measuring until known, every
    ``known.CHECK_EVERY`` steps whether every rank's throughput is known (``state.known``:
    "known"), or any rank's time is up ("time cap")."""
    every, until = loop.config.stop_check_every_steps, loop.until
    preemption = bool(every) and state.step % every == 0
    if state.step >= built_in_steps(loop.config) or not (preemption or until.due(state.step)):
        return
    local = until.look() if until.due(state.step) else None
    preempted, unknown, time_up = distributed.any_rank_flags(
        [
            preemption and loop.stop.requested,
            local is not None and local.stop != "known",
            local is not None and local.stop == "time cap",
        ],
        loop.trainer.device,
    )
    state.preempted = preempted
    if local is not None and (not unknown or time_up):
        state.known = until.stopped_by = "known" if not unknown else "time cap"


def finish(loop: Loop, state: LoopState) -> None:
    """After the last epoch: on an agreed stop, the checkpoint every rank takes at the same step;
    otherwise the evaluation at the end (unless the last step was just evaluated) and the final
    checkpoint, so a longer run can continue from here."""
    trainer, tracer = loop.trainer, loop.tracer
    flight.active().phase(AFTER)
    if state.preempted:
        trainer.save(state.step, tracer)
        return
    if loop.config.eval_at_end and state.last_eval_step != state.step:
        trainer.evaluate(tracer, max(state.epoch - 1, 0), state.step)
    if loop.config.checkpoint_every_steps:
        trainer.save(state.step, tracer)


def summarize(
    module: nn.Module, env: distributed.RankEnv, device: torch.device, step: int, tracer: Tracer
) -> dict[str, Any]:
    """What this rank returns to the caller: where it ended and a fingerprint of its parameters
    (whole: a sharded parameter is gathered first, on every rank, so the fingerprint is the
    model's, as with DDP)."""
    digest = hashlib.sha256()
    for p in module.parameters():
        whole = p.full_tensor() if hasattr(p, "full_tensor") else p
        digest.update(whole.detach().cpu().contiguous().numpy().tobytes())
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "rank": env.rank,
        "host": env.host,
        "device": str(device),
        "device_name": device_name,
        "steps": step,
        "param_sha256": digest.hexdigest(),
        "rss_bytes": tracer.memory(fresh=True)["rss_bytes"],
        "t0_unix": tracer.t0_unix,
    }
