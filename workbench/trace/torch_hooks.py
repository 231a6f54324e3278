"""Training the workbench did not write, traced from outside: hooks on torch, never on the script.

``ScriptHooks.install()`` runs in a rank before the user's script. From then on:

- the model's training forwards are timed, and the batch of the root's counted
  (``forward_hooks``: DDP, FSDP2, compiled or plain, whatever wraps it); the first
  ``DistributedDataParallel`` built (the *primary*) also gets DDP's own communication timer
  (``comm_timing.DDPCommSampler``: backward compute, communication span, exposed
  communication, gradient bytes and buckets); every FSDP2 module's tree, from its first
  call, gets its all-gathers and reduce-scatters metered (``fsdp_comm``);
- ``torch.autograd.backward`` (what ``loss.backward()`` calls) is timed, and its root kept as
  the loss where the model returned none (unscaled, where a ``GradScaler`` scaled it);
- every DataLoader fetch (``__next__`` of its iterator, with gradients enabled) is timed (and
  its batch counted, until the root's forward counts them);
- torch's global optimizer step hooks end a step: a step is everything from the first event
  after the previous step to its last optimizer step (several optimizers stepped back to back
  are one step; ``step_events`` says which phase each interval is);
- each of these is an append or two to a log (``step_log.StepLog``); the steps are found in
  it, and their rows built, when the tracer's flush is due (checked after each optimizer
  step), every step of it at once;
- the script's ``init_process_group``, ``destroy_process_group`` and
  ``torch.multiprocessing``'s spawning are patched too (``script_group``);
- the objects alive when the hooks are installed are frozen out of the garbage collector's
  passes (``gc.freeze``) until ``close()``: the log's entries would otherwise trigger full
  passes over them, about 10 us a step.

The run's DDP settings (``ddp_kwargs``: ``bucket_cap_mb``, ``gradient_as_bucket_view``,
``static_graph`` where the run gives them) are passed to every ``DistributedDataParallel`` the
script builds, over the script's own arguments, and ``on_ddp`` (the run's comm hook) is called
on each: what ``workbench tune`` tries reaches the script's DDP with no change to the script.

Stated behaviours: gradient accumulation (several forwards and backwards per optimizer step)
sums the micro-batches' samples and phases into one step; with several models every training
forward is timed, but samples and loss come from the root and communication from the primary;
a step whose samples nothing counted, or a script that never steps an optimizer, is said in the
rank's ``measurement_warnings``; evaluation forwards (no gradients, or a module in eval mode)
are not steps, and fetches under ``torch.no_grad()`` are not data time.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils.data import dataloader

import workbench.trace as trace_api
from workbench import schema
from workbench.errors import ScriptError
from workbench.store import flight_file
from workbench.trace import flight, forward_hooks, phase_patches, script_group
from workbench.trace.comm_timing import CommFields, DDPCommSampler, warn
from workbench.trace.fsdp_comm import FSDPCommMeter
from workbench.trace.script_until_known import ScriptUntilKnown
from workbench.trace.step_events import (
    OPTIMIZER,
    OPTIMIZER_END,
)
from workbench.trace.step_log import (
    COMM,
    LR,
    MEMORY,
    NO_COMM,
    StepLog,
)
from workbench.trace.tracer import Tracer

_clock = time.perf_counter
#: Events logged at most between two flushes: the log stays small whatever ``flush_s`` is.
_MAX_EVENTS = 50_000
#: The mark, in a DDP module's ``__dict__``, of one built under the hooks.
_TRACED = "_workbench_traced"


class ScriptHooks:
    """Hooks on torch that trace a user's script into ``tracer`` (see the module docstring).
    ``install()`` before the script, ``close()`` after it (writes the last step, removes every
    hook and patch). ``backward_depth`` > 0: inside a backward (a reentrant checkpoint's runs
    one inside another)."""

    def __init__(
        self,
        tracer: Tracer,
        *,
        script: str,
        rank: int,
        world_size: int,
        warmup_steps: int,
        comm_every_steps: int,
        collective_timeout_s: float,
        ddp_kwargs: Mapping[str, Any] | None = None,
        on_ddp: Callable[[DistributedDataParallel], None] | None = None,
        at_end: Callable[[DistributedDataParallel], Any] | None = None,
        at_end_fsdp: Callable[[FSDPCommMeter], Any] | None = None,
        count_memory: Callable[[Any, Any, str | None], dict[str, Any]] | None = None,
        local_rank: int | None = None,
        local_world_size: int | None = None,
        rendezvous: tuple[str, int] | None = None,
        until_known: ScriptUntilKnown | None = None,
    ) -> None:
        self.tracer, self.until_known = tracer, until_known  # until known: steps, agreed stop
        # DDP settings the run gives (tune's candidates), over the script's own arguments
        self.ddp_kwargs = dict(ddp_kwargs or {})
        self.on_ddp = on_ddp  # e.g. registers the run's comm hook on every DDP built
        # with the primary DDP when the training is over, on every rank (the network benchmark
        # at its buckets: ``finish``), kept in ``measured``; never before the first step
        self.at_end, self.at_end_fsdp = at_end, at_end_fsdp  # the latter: FSDP's, without DDP
        self.measured: Any = None
        # (model, its optimizer, FSDP's gather dtype) -> the parts: once, at the first step
        self._count_memory = count_memory
        self.memory_parts: dict[str, Any] | None = None
        self.script, self.rank, self.world_size = script, rank, world_size
        self.warmup_steps, self.comm_every_steps = warmup_steps, comm_every_steps
        self.collective_timeout_s, self.backward_depth = collective_timeout_s, 0
        self.log, self.steps = StepLog(), 0
        self.flight, self.flight_step = flight.active(), 0  # where it is, read if it hangs
        self.primary: DistributedDataParallel | None = None
        self.sampler: DDPCommSampler | None = None
        self.fsdp: FSDPCommMeter | None = None  # FSDP2's collectives, from a module's first call
        self.ddp_modules = self.synced_forwards = 0
        self.forward_counts = False  # the root's forward has counted a batch
        #: The module whose outermost training forwards count a step's samples (the first
        #: watched one so called: ``forward_hooks``), and how deep in watched calls we are.
        self.root: Any = None
        self.depth = 0
        #: the plain modules' forwards under way: (module, whether it was logged)
        self.plain_open: list[tuple[Any, bool]] = []
        self.uncounted = self.counted = 0  # steps whose samples nothing counted, and others
        # where the rank's rendezvous is (MASTER_ADDR, MASTER_PORT): the script's own
        # init_process_group meets there whatever it set; then the hooks' own gloo group
        self.rendezvous, self.joined_group, self.side_group = rendezvous, False, None
        self.local_rank, self.local_world_size = local_rank, local_world_size
        self.warnings: list[str] = []
        # When the next memory sample and the next flush are due (the event clock).
        self._memory_due = self._due = -math.inf
        self._flush_due = _clock() + tracer.flush_s
        self._comm: CommFields = NO_COMM  # the last logged (see _optimizer_pre)
        self._lr: float | None = None  # the last logged
        self.scaled: tuple[Any, Any] | None = None  # GradScaler.scale's (output, input)
        self._undo: list[Callable[[], None]] = []

    # -- steps: taken out of the log at the flush
    def _tick(self, now: float) -> None:
        """After an optimizer step, when due: a memory sample into the log, steps out of it."""
        if now >= self._memory_due:
            self.log.extras.append((len(self.log.kinds), MEMORY, self.tracer.sample_memory()))
            self._memory_due = now + self.tracer.memory_every_s
        if now >= self._flush_due or len(self.log.kinds) > _MAX_EVENTS:
            self._flush_due = now + self.tracer.flush_s
            self.flush()
        self._due = min(self._memory_due, self._flush_due)

    def flush(self, final: bool = False) -> None:
        """Write the steps closed so far (``final``: the run is over, the last one too)."""
        taken = self.log.take(self.tracer.t0, final=final)
        if taken is None:
            return
        columns, memory = taken
        n = len(memory)
        uncounted = int(np.ma.count_masked(columns["samples"]))
        self.uncounted += uncounted
        self.counted += n - uncounted
        first = self.steps + 1
        self.steps += n
        numbers = list(range(first, first + n))
        columns["epoch"] = [0] * n
        columns["step"] = numbers
        columns["warmup"] = [i <= self.warmup_steps for i in numbers]
        self.tracer.write_step_columns(columns, memory)

    def note(self, samples: int | None, tokens: int | None, loss: Any) -> None:
        """``workbench.trace.note`` while the script runs."""
        self.log.note(samples, tokens, loss)

    def untraced_if_fails(self, what: str, call: Callable[..., Any], *args: Any) -> None:
        """``call(*args)``, tracing work of the workbench's own inside the script's training:
        an exception in it (an object the tracing does not understand: a proxy, an odd module
        subclass) is never raised into the script. What it would have traced stays untraced,
        and the rank's log and summary say so, once per ``what``."""
        try:
            call(*args)
        except Exception as exc:  # noqa: BLE001 - the script's training must go on
            said = f"the workbench could not {what}"
            if not any(w.startswith(said) for w in self.warnings):
                self.warnings.append(
                    warn(
                        f"{said} ({type(exc).__name__}: {exc}); left untraced, the script "
                        "runs on. This is the workbench's fault, not the script's: please "
                        "report it with the rank's log"
                    )
                )

    # -- DDP
    def ddp_built(self, ddp: DistributedDataParallel) -> None:
        self.ddp_modules += 1
        ddp.__dict__[_TRACED] = True  # not nn.Module's __setattr__: no parameter, no buffer
        if self.primary is not None:
            return
        self.primary = ddp
        gradient_bytes = sum(
            p.numel() * p.element_size() for p in ddp.module.parameters() if p.requires_grad
        )
        self.sampler = DDPCommSampler(ddp, self.comm_every_steps, gradient_bytes)
        self.warnings.extend(self.sampler.warnings)

    def fsdp_found(self, module: Any) -> None:
        """An FSDP2 module's first call: the collectives of its tree metered (``fsdp_comm``)."""
        if self.fsdp is None:
            self.fsdp = FSDPCommMeter.for_module(module)
        self.fsdp.attach(module)
        self.warnings.extend(w for w in self.fsdp.warnings if w not in self.warnings)

    def comm_method(self) -> str:
        """How the step's communication columns were measured, for the rank's summary."""
        if self.sampler is not None:
            return self.sampler.method
        return self.fsdp.method if self.fsdp is not None else "none"

    # -- optimizer, backward, fetches
    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.joined_group and self.world_size > 1:
            if not (dist.is_available() and dist.is_initialized()):
                raise ScriptError(
                    self.script,
                    self.rank,
                    f"it steps an optimizer on {self.world_size} ranks without having called "
                    "torch.distributed.init_process_group(): each rank would train alone. Call "
                    "it (the rank's environment has everything it needs, as under torchrun), "
                    "or run with world_size=1",
                )
        log = self.log
        first = not log.last_is_optimizer_end()  # the step's first optimizer step
        log.kinds.append(OPTIMIZER)
        log.times.append(now := _clock())
        if first:
            self.flight_step += 1
            self.flight.at(self.flight_step, flight_file.OPTIMIZER)
        if first and self.until_known is not None:
            self.until_known.step(now)
        # The step's communication and learning rate, logged where they differ from the last
        # logged (the log carries each on to the steps after it).
        if first:
            comm = NO_COMM
            if self.synced_forwards and self.sampler is not None:
                # After the backward of a step whose primary forward synchronised: DDP's
                # figures (DDP counts every synchronised forward).
                self.sampler.iteration += self.synced_forwards - 1
                self.synced_forwards = 0
                comm = self.sampler.take()
            if self.fsdp is not None:
                comm = comm._replace(**self.fsdp.take_fields())
            if comm is not self._comm:
                log.extras.append((len(log.kinds), COMM, comm))
                self._comm = comm
        if optimizer.param_groups:
            lr = float(optimizer.param_groups[0].get("lr", math.nan))
            if lr != self._lr:
                log.extras.append((len(log.kinds), LR, lr))
                self._lr = lr

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._count_memory is not None:  # in the step's optimizer phase, as a built-in run's
            self.untraced_if_fails("count the model's memory in its parts", self._memory, optimizer)
        now = _clock()
        self.log.kinds.append(OPTIMIZER_END)
        self.log.times.append(now)
        self.flight.phase(flight_file.BETWEEN)
        if now >= self._due:
            self._tick(now)

    def _model(self) -> Any:
        """The module the script trains, unwrapped from DDP and ``torch.compile`` in either
        order (an FSDP2 root is itself); None before its first training forward."""
        model = getattr(self.root, "_orig_mod", self.root)
        if isinstance(model, DistributedDataParallel):
            model = model.module
        return getattr(model, "_orig_mod", model)

    def _memory(self, optimizer: Any) -> None:
        """The model's memory in its parts, once ``optimizer`` has stepped its parameters."""
        model = self._model()
        first = next(model.parameters(), None) if model is not None else None
        if first is None or not any(
            p is first for group in optimizer.param_groups for p in group["params"]
        ):
            return
        count, self._count_memory = self._count_memory, None
        assert count is not None
        dtype = self.fsdp.dtypes[0] if self.fsdp is not None else None
        self.memory_parts = count(model, optimizer, dtype)

    def strategy(self) -> str:
        """What the script ran, as the config's ``strategy`` names it: ``fsdp`` where an FSDP2
        module trained, else ``ddp`` (a DDP, or the plain model a script wraps in DDP only
        when distributed: one curve with its DDP runs)."""
        return "fsdp" if self.fsdp is not None else "ddp"

    # -- the end of training
    def finish(self) -> None:
        """The script's training is over (it returned, or it is ending its process group):
        ``at_end`` once, with the primary DDP (else ``at_end_fsdp`` with the FSDP meter),
        while the process group still exists. Never before the first step: clocks such as the
        HF Trainer's run from before it builds its DDP, and would count the benchmark."""
        self.flight.phase(flight_file.AFTER)  # a rank that leaves early is seen to
        if self.measured is not None or not (dist.is_available() and dist.is_initialized()):
            return
        if self.at_end is not None and self.primary is not None:
            self.measured = self.at_end(self.primary)
        elif self.at_end_fsdp is not None and self.fsdp is not None:
            self.measured = self.at_end_fsdp(self.fsdp)

    # -- install and remove
    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        original = getattr(owner, name)
        setattr(owner, name, replacement)
        self._undo.append(lambda: setattr(owner, name, original))

    def on_remove(self, undo: Callable[[], None]) -> None:
        """Call ``undo`` when the hooks are removed (before what was put in place earlier)."""
        self._undo.append(undo)

    def install(self) -> ScriptHooks:
        """Put every hook and patch in place (see the module docstring); returns self."""
        forward_hooks.install(self, self._patch, _TRACED)
        self._patch(
            torch.autograd, "backward", phase_patches.backward(self, torch.autograd.backward)
        )
        iterator = dataloader._BaseDataLoaderIter
        self._patch(iterator, "__next__", phase_patches.fetch(self, iterator.__next__))
        scale = torch.amp.GradScaler.scale
        self._patch(torch.amp.GradScaler, "scale", phase_patches.scale(self, scale))
        script_group.install(self, self._patch)
        pre = register_optimizer_step_pre_hook(self._optimizer_pre)
        post = register_optimizer_step_post_hook(self._optimizer_post)
        self._undo += [pre.remove, post.remove]
        trace_api._recorder = self.note
        self._undo.append(lambda: setattr(trace_api, "_recorder", None))
        # The heap so far (torch's ~300 k import-time objects) out of the collector's sight:
        # full collections would scan it every few thousand steps, about 10 us a step on a
        # 2-core host. What the script allocates is collected as before (and is all that
        # ``forward_hooks.outermost`` looks through).
        gc.freeze()
        self._undo.append(gc.unfreeze)
        return self

    def remove(self) -> None:
        """Remove every hook and patch (in reverse order), keeping the steps logged so far:
        ``install()`` again goes on tracing into the same log."""
        while self._undo:
            self._undo.pop()()

    def _uncounted_text(self) -> str:
        return (
            f"{self.script}: {schema.SAMPLES_NOT_COUNTED} (no DataLoader batch, and no "
            "training forward "
            "of a DDP, FSDP, compiled module or of the module its optimizer steps, with a "
            "tensor first): its throughput is unknown, not 0. Tell it with one line in the "
            "training loop: workbench.trace.note(samples=BATCH_SIZE)"
        )

    def close(self) -> None:
        """Write the last step, remove every hook and patch (in reverse order)."""
        try:
            self.flush(final=True)
        finally:
            self.remove()
        if self.uncounted and not self.counted:  # else: steps that consumed nothing new
            self.warnings.append(warn(self._uncounted_text()))
        if not self.steps:
            self.warnings.append(
                warn(
                    f"{self.script} stepped no optimizer (torch.optim) on rank {self.rank}: "
                    "no steps were traced (a step ends at an optimizer step)"
                )
            )
