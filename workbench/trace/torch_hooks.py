"""Training the workbench did not write, traced from outside: hooks on torch, never on the script.

``ScriptHooks.install()`` runs in a rank before the user's script. From then on:

- every ``DistributedDataParallel`` the script builds has its forward timed (through a patch
  of the class's ``forward``, not module hooks: a training forward's start and end, the batch's
  sample and token counts, the loss where the model returns one) and, for the first one built
  (the *primary*), DDP's own communication timer (``comm_timing.DDPCommSampler``: backward
  compute, communication span, exposed communication, gradient bytes and buckets);
- ``torch.autograd.backward`` (what ``loss.backward()`` calls) is timed, and its root kept as
  the loss where the model returned none (unscaled, where a ``GradScaler`` scaled it);
- every DataLoader fetch (``__next__`` of its iterator, with gradients enabled) is timed;
- torch's global optimizer step hooks end a step: a step is everything from the first event
  after the previous step to its last optimizer step (several optimizers stepped back to back
  are one step; ``step_events`` turns the events into phases);
- ``torch.distributed.init_process_group`` gets the run's collective timeout where the script
  gives none (a rank that never arrives is named within it instead of after gloo's 30
  minutes), and then a barrier on a gloo side group, after which every rank sets its trace
  clock's zero (as the built-in loop does after its barrier);
- ``torch.multiprocessing.spawn`` and ``start_processes`` raise ``ScriptError``: the workbench
  starts one process per rank itself, as torchrun does;
- the objects alive when the hooks are installed (torch's, the rank's) are frozen out of the
  garbage collector's passes (``gc.freeze``) until ``close()``: the buffered trace rows would
  otherwise trigger full passes over them, about 10 us a step.

The run's DDP settings (``ddp_kwargs``: ``bucket_cap_mb``, ``gradient_as_bucket_view``,
``static_graph`` where the run gives them) are passed to every ``DistributedDataParallel`` the
script builds, over the script's own arguments, and ``on_ddp`` (the run's comm hook) is called
on each: what ``workbench tune`` tries reaches the script's DDP with no change to the script.

Stated behaviours: gradient accumulation (several forwards and backwards per optimizer step)
sums the micro-batches' samples and phases into one step; a model without DDP (one process)
gets steps from its optimizer, its forward from the end of the fetch to the backward; with
several DDP modules every training forward is timed, but samples, loss and communication come
from the primary; a script that never steps an optimizer records no steps (said in the rank's
``measurement_warnings``); evaluation forwards (no gradients, or a module in eval mode) are not
steps, and fetches under ``torch.no_grad()`` are not data time.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils.data import dataloader

import workbench.trace as trace_api
from workbench.errors import ScriptError
from workbench.trace.comm_timing import CommFields, DDPCommSampler, warn
from workbench.trace.step_counts import StepCounts, output_loss
from workbench.trace.step_events import (
    BACKWARD,
    BACKWARD_END,
    FETCH,
    FETCH_END,
    FORWARD,
    OPTIMIZER,
    OPTIMIZER_END,
    Event,
    StepEvents,
)
from workbench.trace.tracer import Tracer

_clock = time.perf_counter
_NO_COMM = CommFields(None, None, None)
#: The mark, in a DDP module's ``__dict__``, of one built under the hooks.
_TRACED = "_workbench_traced"


class ScriptHooks:
    """Hooks on torch that trace a user's script into ``tracer`` (see the module docstring).
    ``install()`` before the script, ``close()`` after it (writes the last step, removes every
    hook and patch)."""

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
    ) -> None:
        self.tracer = tracer
        # DDP settings the run gives (tune's candidates), over the script's own arguments
        self.ddp_kwargs = dict(ddp_kwargs or {})
        self.on_ddp = on_ddp  # e.g. registers the run's comm hook on every DDP built
        # called with the primary DDP once the script's training is over, on every rank (e.g.
        # the network micro-benchmark at its buckets), its result kept in ``measured``: before
        # the script ends its process group, or when it returns (``finish``). Never before
        # its first step: clocks such as the HF Trainer's run from before it builds its DDP.
        self.at_end = at_end
        self.measured: Any = None
        self.script, self.rank, self.world_size = script, rank, world_size
        self.warmup_steps = warmup_steps
        self.comm_every_steps = comm_every_steps
        self.collective_timeout_s = collective_timeout_s
        self.events: list[Event] = []
        self.previous_end: float | None = None
        self.step_ended = False  # an optimizer step ended: the step closes at the next event
        self.steps = 0
        self.counts = StepCounts()
        self.primary: DistributedDataParallel | None = None
        self.sampler: DDPCommSampler | None = None
        self.ddp_modules = 0
        self.synced_forwards = 0
        self.comm: CommFields = _NO_COMM
        self.lr: float | None = None
        self.joined_group = False
        self.warnings: list[str] = []
        self._backward_depth = 0
        self._scaled: tuple[Any, Any] | None = None  # GradScaler.scale's (output, input)
        self._undo: list[Callable[[], None]] = []

    # -- events and steps
    def _event(self, kind: int) -> None:
        now = _clock()
        if self.step_ended and kind < OPTIMIZER:  # any event but an optimizer's closes it
            self._end_step()
        self.events.append((kind, now))

    def _end_step(self) -> None:
        """Write the step that the last optimizer step ended (its phases are worked out from
        its events when the tracer flushes)."""
        self.step_ended = False
        step = StepEvents(tuple(self.events), self.previous_end)
        self.events.clear()
        self.previous_end = step.events[-1][1]
        counts, self.counts = self.counts, StepCounts()
        comm, self.comm = self.comm, _NO_COMM
        self.steps += 1
        self.tracer.step(
            epoch=0,
            step=self.steps,
            warmup=self.steps <= self.warmup_steps,
            t_start_s=self.tracer.since_t0(step.start),
            phases=step,
            comm_s=comm.comm_s,
            comm_bytes=comm.comm_bytes,
            comm_buckets=comm.comm_buckets,
            samples=counts.samples(),  # type: ignore[arg-type]
            loss=counts.loss(),
            lr=self.lr,  # type: ignore[arg-type]
            backward_compute_s=comm.backward_compute_s,
            comm_exposed_s=comm.comm_exposed_s,
            tokens=counts.tokens(),
        )

    def note(self, samples: int | None, tokens: int | None, loss: Any) -> None:
        """``workbench.trace.note`` while the script runs."""
        self.counts.note(samples, tokens, loss)

    def _drop_fetches(self) -> None:
        """An evaluation forward: the fetches since the last step fed it, not training."""
        if self.events and all(kind in (FETCH, FETCH_END) for kind, _ in self.events):
            self.events.clear()
            self.counts.fetch_samples = self.counts.fetch_tokens = None

    # -- DDP
    def _ddp_built(self, ddp: DistributedDataParallel) -> None:
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

    def _forward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """DDP's ``forward`` for every module, timed for those built under the hooks: a patch
        of the class, not module hooks, which send every call of the module down
        ``nn.Module``'s slow path (+8 us a forward on a 2-core host). A forward's end is no
        event: the time after it (the loss) is forward time too, up to the next event."""
        hooks = self
        is_grad_enabled = torch.is_grad_enabled

        def forward(ddp: Any, *args: Any, **kwargs: Any) -> Any:
            if _TRACED not in ddp.__dict__:  # built before the hooks
                return original(ddp, *args, **kwargs)
            if not (ddp.training and is_grad_enabled()):
                hooks._drop_fetches()  # an evaluation forward
                return original(ddp, *args, **kwargs)
            hooks._event(FORWARD)
            if hooks.primary is None or ddp is not hooks.primary:
                return original(ddp, *args, **kwargs)
            if ddp.require_backward_grad_sync:
                hooks.synced_forwards += 1
            hooks.counts.forward(args if args else kwargs)
            output = original(ddp, *args, **kwargs)
            loss = output_loss(output)
            if loss is not None:
                hooks.counts.model_losses.append(loss.detach())
            return output

        return forward

    def _take_comm(self) -> None:
        """After the backward of a step whose primary forward synchronised: DDP's figures."""
        if self.sampler is None or not self.synced_forwards:
            return
        self.sampler.iteration += self.synced_forwards - 1  # DDP counts every synced forward
        self.synced_forwards = 0
        self.comm = self.sampler.take()

    # -- optimizer, backward, fetches
    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        joined = self.joined_group or not (self.world_size > 1)
        if not joined and not (dist.is_available() and dist.is_initialized()):
            raise ScriptError(
                self.script,
                self.rank,
                f"it steps an optimizer on {self.world_size} ranks without having called "
                "torch.distributed.init_process_group(): each rank would train alone. Call it "
                "(the rank's environment has everything it needs, as under torchrun), or run "
                "with world_size=1",
            )
        first = not self.events or self.events[-1][0] != OPTIMIZER_END
        self._event(OPTIMIZER)
        if first:
            self._take_comm()
        if optimizer.param_groups:
            self.lr = float(optimizer.param_groups[0].get("lr", float("nan")))

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._event(OPTIMIZER_END)
        self.step_ended = True

    def _backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if self._backward_depth:  # a backward inside a backward (reentrant checkpointing)
                return original(tensors, *args, **kwargs)
            self._event(BACKWARD)
            if isinstance(tensors, torch.Tensor) and tensors.numel() == 1:
                root = tensors
                if self._scaled is not None and self._scaled[0] is tensors:
                    root = self._scaled[1]
                self.counts.backward_losses.append(root.detach())
            self._backward_depth += 1
            try:
                return original(tensors, *args, **kwargs)
            finally:
                self._backward_depth -= 1
                self._event(BACKWARD_END)

        return backward

    def _fetch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def __next__(iterator: Any) -> Any:
            if not torch.is_grad_enabled():
                return original(iterator)
            self._event(FETCH)
            try:
                batch = original(iterator)
            except StopIteration:
                self.events.pop()  # the end of an epoch: nothing was fetched
                raise
            self._event(FETCH_END)
            self.counts.fetched(batch)
            return batch

        return __next__

    def _scale(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def scale(scaler: Any, outputs: Any) -> Any:
            scaled = original(scaler, outputs)
            if isinstance(outputs, torch.Tensor):
                self._scaled = (scaled, outputs)
            return scaled

        return scale

    # -- process group, process spawning
    def _init_process_group(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("timeout") is None:
                kwargs["timeout"] = timedelta(seconds=self.collective_timeout_s)
            result = original(*args, **kwargs)
            # Every rank leaves this barrier together: their trace clocks agree from here.
            side = dist.new_group(backend="gloo")
            dist.barrier(group=side)
            self.tracer.set_t0()
            self.joined_group = True
            return result

        return init_process_group

    def _destroy_process_group(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            if not args and kwargs.get("group") is None:  # the default group: the run's
                self.finish()
            return original(*args, **kwargs)

        return destroy_process_group

    def finish(self) -> None:
        """The script's training is over (it returned, or it is ending its process group):
        ``at_end`` once, with the primary DDP, while the process group still exists."""
        if self.at_end is None or self.primary is None or self.measured is not None:
            return
        if dist.is_available() and dist.is_initialized():
            self.measured = self.at_end(self.primary)

    def _refuse_spawn(self, name: str) -> Callable[..., Any]:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise ScriptError(
                self.script,
                self.rank,
                f"it calls torch.multiprocessing.{name}() to start its own processes; the "
                "workbench starts one process per rank itself, as torchrun does, and gives each "
                "the environment init_process_group() reads. Call the per-process function "
                "directly (rank from the RANK variable) and set world_size in the run",
            )

        return refuse

    # -- install and remove
    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        original = getattr(owner, name)
        setattr(owner, name, replacement)
        self._undo.append(lambda: setattr(owner, name, original))

    def install(self) -> ScriptHooks:
        """Put every hook and patch in place (see the module docstring); returns self."""
        import torch.multiprocessing as mp
        from torch.distributed import distributed_c10d

        hooks = self
        ddp_init = DistributedDataParallel.__init__

        def __init__(ddp: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
            ddp_init(ddp, *args, **{**kwargs, **hooks.ddp_kwargs})
            if hooks.on_ddp is not None:
                hooks.on_ddp(ddp)
            hooks._ddp_built(ddp)

        self._patch(DistributedDataParallel, "__init__", __init__)
        forward = self._forward(DistributedDataParallel.forward)
        self._patch(DistributedDataParallel, "forward", forward)
        self._patch(torch.autograd, "backward", self._backward(torch.autograd.backward))
        iterator = dataloader._BaseDataLoaderIter
        self._patch(iterator, "__next__", self._fetch(iterator.__next__))
        self._patch(torch.amp.GradScaler, "scale", self._scale(torch.amp.GradScaler.scale))
        init = self._init_process_group(distributed_c10d.init_process_group)
        self._patch(distributed_c10d, "init_process_group", init)
        self._patch(dist, "init_process_group", init)
        destroy = self._destroy_process_group(distributed_c10d.destroy_process_group)
        self._patch(distributed_c10d, "destroy_process_group", destroy)
        self._patch(dist, "destroy_process_group", destroy)
        for name in ("spawn", "start_processes"):
            self._patch(mp, name, self._refuse_spawn(name))
        pre = register_optimizer_step_pre_hook(self._optimizer_pre)
        post = register_optimizer_step_post_hook(self._optimizer_post)
        self._undo += [pre.remove, post.remove]
        trace_api._recorder = self.note
        self._undo.append(lambda: setattr(trace_api, "_recorder", None))
        # The heap so far (torch's ~300 k import-time objects) out of the collector's sight:
        # the full collections that the buffered rows' survivors trigger would scan it every
        # few thousand steps, about 10 us a step on a 2-core host. Those objects live as long
        # as the process anyway; what the script allocates is collected as before.
        gc.freeze()
        self._undo.append(gc.unfreeze)
        return self

    def close(self) -> None:
        """Write the last step, remove every hook and patch (in reverse order)."""
        try:
            if self.step_ended:
                self._end_step()
        finally:
            while self._undo:
                self._undo.pop()()
        if not self.steps:
            self.warnings.append(
                warn(
                    f"{self.script} stepped no optimizer (torch.optim) on rank {self.rank}: "
                    "no steps were traced (a step ends at an optimizer step)"
                )
            )
