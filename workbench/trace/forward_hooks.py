"""The training forwards a script's steps are counted from, whatever wraps its model.

A step's samples come from the batch its model was called with: the outermost training
forward (gradients enabled, the module in training mode) of the *root*, the first module so
called among those the hooks watch:

- every ``DistributedDataParallel`` (a patch of the class's ``forward``);
- every FSDP2 module (``fully_shard`` turns a module's class into a ``FSDP<Cls>`` subclass of
  ``FSDPModule``; a ``__call__`` put on ``FSDPModule`` sees its calls, FSDP's own hooks
  included), from the first optimizer built after the script imported FSDP;
- every ``torch.compile``d module (``OptimizedModule.__call__``: outside the compiled code),
  from the script's first ``torch.compile`` call (neither FSDP nor dynamo is imported for a
  script that does not: 1.5-2 s each);
- a plain module: when an optimizer is built, the outermost modules that hold the parameters it
  steps (a container such as ``nn.ModuleList``, which has no forward, stands for its children)
  get a forward pre-hook, put before the script's own, and a forward hook.

Only the outermost call counts: a call inside another watched call (the model inside its
DDP, a compiled model's inner modules, FSDP's sharded blocks) is not logged. So the root is
the same module whether or not the script wraps it at this world size: a script that builds
DDP only when ``WORLD_SIZE > 1`` has its samples counted from the same batch at every size.

Under ``torch.compile`` none of this is traced: each wrapper first asks
``torch.compiler.is_compiling()`` and, compiling, only calls what it wraps, so dynamo sees no
clock and no log and adds no graph break (``tests/test_script_zoo.py``).
"""

from __future__ import annotations

import functools
import gc
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from workbench.store import flight_file
from workbench.trace.fsdp_comm import MARK as FSDP_MARK
from workbench.trace.step_counts import batch_shape, output_loss
from workbench.trace.step_events import FORWARD
from workbench.trace.step_log import FORWARD_BATCH, MODEL_LOSS

_clock = time.perf_counter
is_compiling = torch.compiler.is_compiling
#: The mark, in a plain module's ``__dict__``, of one watched (by hooks of its own).
WATCHED = "_workbench_forward"


def forward_starts(hooks: Any, module: Any, args: Any, kwargs: Any) -> bool:
    """A watched ``module``'s forward starts (outside every other watched one): logged where
    it is a training forward, its batch too where ``module`` is the root (the first module so
    called). Returns whether it was logged (then :func:`forward_ends` follows it)."""
    log = hooks.log
    if not (module.training and torch.is_grad_enabled()):
        log.drop_fetches()  # an evaluation forward
        return False
    kinds = log.kinds
    kinds.append(FORWARD)
    log.times.append(_clock())
    hooks.flight.at(hooks.flight_step + 1, flight_file.FORWARD)
    root = hooks.root
    if root is None:
        hooks.root = root = module
    if module is root:
        shape = batch_shape(args if args else kwargs)
        if shape is not None:
            log.extras.append((len(kinds), FORWARD_BATCH, shape))
            hooks.forward_counts = True
    return True


def forward_ends(hooks: Any, module: Any, output: Any) -> None:
    """A logged forward returned ``output``: the loss in it, where ``module`` is the root. Its
    end is no event: the time after it (the loss) is forward time too, up to the next event."""
    if module is hooks.root:
        loss = output_loss(output)
        if loss is not None:
            hooks.log.extras.append((len(hooks.log.kinds), MODEL_LOSS, loss.detach()))


def counted_call(hooks: Any, module: Any, call: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """``call(*args, **kwargs)``, the forward of ``module`` (a watched one, outside every
    other), logged as :func:`forward_starts` says; the watched calls inside it are not."""
    if not forward_starts(hooks, module, args[1:], kwargs):
        return call(*args, **kwargs)
    hooks.depth += 1
    try:
        output = call(*args, **kwargs)
    finally:
        hooks.depth -= 1
    forward_ends(hooks, module, output)
    return output


def ddp_forward(hooks: Any, original: Callable[..., Any], traced: str) -> Callable[..., Any]:
    """DDP's ``forward`` for every module, logged for those built under the hooks (marked
    ``traced`` in their ``__dict__``): a patch of the class, not module hooks, which send every
    call of the module down ``nn.Module``'s slow path (+8 us a forward on a 2-core host).
    :func:`counted_call` written out, as it is on every step of every DDP script: 2.19 us a
    call around a forward that does nothing, against 2.27 us for the patch before the root and
    depth were kept (the best of 6 interleaved runs each, a loaded 2-core host)."""
    log = hooks.log
    kinds, times, extras = log.kinds, log.times, log.extras
    is_grad_enabled, clock = torch.is_grad_enabled, _clock

    def forward(ddp: Any, *args: Any, **kwargs: Any) -> Any:
        if is_compiling() or hooks.depth or traced not in ddp.__dict__:
            return original(ddp, *args, **kwargs)
        if not (ddp.training and is_grad_enabled()):
            log.drop_fetches()  # an evaluation forward
            return original(ddp, *args, **kwargs)
        if ddp is hooks.primary and ddp.require_backward_grad_sync:
            hooks.synced_forwards += 1
        kinds.append(FORWARD)
        times.append(clock())
        hooks.flight.at(hooks.flight_step + 1, flight_file.FORWARD)
        root = hooks.root
        if root is None:
            hooks.root = root = ddp
        if ddp is root:
            shape = batch_shape(args if args else kwargs)
            if shape is not None:
                extras.append((len(kinds), FORWARD_BATCH, shape))
                hooks.forward_counts = True
        hooks.depth = 1
        try:
            output = original(ddp, *args, **kwargs)
        finally:
            hooks.depth = 0
        if ddp is root:
            loss = output_loss(output)
            if loss is not None:
                extras.append((len(kinds), MODEL_LOSS, loss.detach()))
        return output

    return forward


def _synchronises(hooks: Any, ddp: Any) -> None:
    """Count a training forward of the primary DDP that will synchronise its gradients (DDP's
    timer figures belong to the step of its backward: ``torch_hooks``)."""
    if ddp is hooks.primary and ddp.training and ddp.require_backward_grad_sync:
        if torch.is_grad_enabled():
            hooks.synced_forwards += 1


def outer_call(hooks: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """A ``__call__`` for a class whose every instance is watched (``OptimizedModule``,
    ``FSDPModule``): ``original(module, ...)`` logged as :func:`counted_call` says."""

    def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:
        if is_compiling() or hooks.depth:
            return original(module, *args, **kwargs)
        inner = module._modules.get("_orig_mod")  # a compiled module's own
        if inner is not None:
            _synchronises(hooks, inner)
        return counted_call(hooks, module, original, (module, *args), kwargs)

    return __call__


def _pre_hook(hooks: Any, module: nn.Module, args: Any, kwargs: Any) -> None:
    """A watched plain module's forward pre-hook (put first, before the script's own)."""
    if is_compiling():
        return
    logged = not hooks.depth and forward_starts(hooks, module, args, kwargs)
    hooks.plain_open.append((module, logged))
    hooks.depth += 1


def _post_hook(hooks: Any, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
    """Its forward hook (called even when the forward raises); one whose pre-hook did not run
    (dynamo traced it, and not this one) changes nothing."""
    if is_compiling():
        return
    opened = hooks.plain_open
    if not opened or opened[-1][0] is not module:
        return
    logged = opened.pop()[1]
    hooks.depth -= 1
    if logged:
        forward_ends(hooks, module, output)


#: Forwards that stand for none: a Lightning module's (its base class's pass-through) is never
#: what its ``training_step`` calls; its children are.
_NO_FORWARD = ("LightningModule.forward",)


def _callable(module: nn.Module) -> bool:
    forward = type(module).forward  # containers have no forward
    return forward is not nn.Module.forward and forward.__qualname__ not in _NO_FORWARD


def outermost(params: set[int], wrapped: tuple[type, ...]) -> list[nn.Module]:
    """The outermost live modules holding any parameter whose ``id`` is in ``params`` (a
    container without a forward stands for its children), leaving out the classes
    ``wrapped`` (watched by a class patch); from the garbage collector's objects, which hold
    only what was made since the hooks froze the rest (``gc.freeze``). Modules by their type:
    a weak proxy to a module (Lightning keeps some) passes ``isinstance`` but is no module."""
    modules = [o for o in gc.get_objects() if issubclass(type(o), nn.Module)]
    # its own parameters as nn.Module keeps them: a subclass's ``parameters`` may be anything
    holds = {id(m) for m in modules if any(id(p) in params for p in _own_parameters(m))}
    parents: dict[int, list[nn.Module]] = {}
    for m in modules:
        for child in _children(m):
            parents.setdefault(id(child), []).append(m)
    above: set[int] = set()  # every module that holds such a parameter, or contains one that does
    stack = [m for m in modules if id(m) in holds]
    while stack:
        m = stack.pop()
        if id(m) in above:
            continue
        above.add(id(m))
        stack.extend(parents.get(id(m), ()))
    tops = [m for m in modules if id(m) in above and not parents.get(id(m))]
    return [m for m in _callables(tops, above) if not isinstance(m, wrapped)]


def _own_parameters(module: nn.Module) -> list[Any]:
    return [p for p in module.__dict__.get("_parameters", {}).values() if p is not None]


def _children(module: nn.Module) -> list[Any]:
    return [c for c in module.__dict__.get("_modules", {}).values() if c is not None]


def _callables(tops: list[nn.Module], above: set[int]) -> Iterator[nn.Module]:
    for m in tops:
        if _callable(m):
            yield m
        else:
            yield from _callables([c for c in _children(m) if id(c) in above], above)


def watch_plain(hooks: Any, modules: list[nn.Module]) -> list[Callable[[], None]]:
    """Watch each of ``modules`` (not watched yet) with a forward pre-hook put before the
    script's own and a forward hook: only these modules take ``nn.Module``'s slow path (a few
    microseconds a forward), not the ones inside them. Returns what takes each off again."""
    undo: list[Callable[[], None]] = []
    for module in modules:
        if WATCHED in module.__dict__:
            continue
        pre = module.register_forward_pre_hook(
            functools.partial(_pre_hook, hooks), prepend=True, with_kwargs=True
        )
        post = module.register_forward_hook(
            functools.partial(_post_hook, hooks), with_kwargs=True, always_call=True
        )
        module.__dict__[WATCHED] = True
        undo.append(functools.partial(_unwatch, module, pre, post))
    return undo


def _unwatch(module: nn.Module, *handles: Any) -> None:
    module.__dict__.pop(WATCHED, None)
    for handle in handles:
        handle.remove()


def _watch_fsdp(hooks: Any, watched: list[type]) -> None:
    """Watch FSDP2's modules (a ``__call__`` on ``FSDPModule``, which ``fully_shard``'s
    ``FSDP<Cls>`` classes put first) once the script has imported FSDP: an optimizer over its
    sharded parameters comes after ``fully_shard``. Never imported here (about 2 s). The
    first call of each module not metered yet hands it to ``hooks.fsdp_found``."""
    module = sys.modules.get("torch.distributed.fsdp")
    fsdp = getattr(module, "FSDPModule", None)
    if fsdp is None or fsdp in watched or "__call__" in fsdp.__dict__:
        return

    def fsdp_call(module: Any, *args: Any, **kwargs: Any) -> Any:
        return super(fsdp, module).__call__(*args, **kwargs)

    counted = outer_call(hooks, fsdp_call)

    def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:
        # the first call of a module not metered yet (a root, before its first gather):
        # its tree's collectives metered from now on (``fsdp_comm``)
        if FSDP_MARK not in module.__dict__ and not is_compiling():
            hooks.untraced_if_fails("meter an FSDP module's collectives", hooks.fsdp_found, module)
        return counted(module, *args, **kwargs)

    fsdp.__call__ = __call__
    hooks.on_remove(lambda: delattr(fsdp, "__call__"))
    watched.append(fsdp)


def install(hooks: Any, patch: Callable[[Any, str, Any], None], traced: str) -> None:
    """The patches that see the model's forwards (``patch(owner, name, replacement)``, undone
    by ``hooks.remove()``): DDP's, FSDP2's and compiled modules' classes, and each optimizer
    built, whose plain modules are watched from then on. ``traced``: the mark, in a DDP's
    ``__dict__``, of one built under the hooks."""
    from torch.nn.parallel import DistributedDataParallel

    ddp_init = DistributedDataParallel.__init__

    def __init__(ddp: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
        ddp_init(ddp, *args, **{**kwargs, **hooks.ddp_kwargs})
        if hooks.on_ddp is not None:
            hooks.on_ddp(ddp)
        hooks.untraced_if_fails("time a DDP module's communication", hooks.ddp_built, ddp)

    patch(DistributedDataParallel, "__init__", __init__)
    patch(
        DistributedDataParallel,
        "forward",
        ddp_forward(hooks, DistributedDataParallel.forward, traced),
    )
    watched: list[type] = [DistributedDataParallel]
    original_compile = torch.compile

    def compile(*args: Any, **kwargs: Any) -> Any:
        """``torch.compile``: its modules watched from the first call on (dynamo imported
        where the script compiles, never before: about 1.5 s)."""
        from torch._dynamo.eval_frame import OptimizedModule

        if OptimizedModule not in watched:
            patch(OptimizedModule, "__call__", outer_call(hooks, OptimizedModule.__call__))
            watched.append(OptimizedModule)
        return original_compile(*args, **kwargs)

    patch(torch, "compile", compile)
    optimizer_init = torch.optim.Optimizer.__init__

    def watch(optimizer: Any) -> None:
        _watch_fsdp(hooks, watched)
        params = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for undo in watch_plain(hooks, outermost(params, tuple(watched))):
            hooks.on_remove(undo)

    def built(optimizer: Any, *args: Any, **kwargs: Any) -> None:
        optimizer_init(optimizer, *args, **kwargs)
        hooks.untraced_if_fails("watch the forwards of the modules it steps", watch, optimizer)

    patch(torch.optim.Optimizer, "__init__", built)
