"""Memory per rank and FSDP's traffic at any world size, worked out from the parameters' layout a
run recorded (``memory_parts``' ``layout``: :mod:`workbench.rank.memory_parts`), per strategy.

A strategy's rule, per rank at ``n`` ranks (a parameter of ``dim0`` rows of ``row`` elements of
``e`` bytes; its optimizer state ``s`` bytes an element and ``f`` bytes besides):

- DDP (and one device): every parameter, its gradient and its optimizer state in full,
  ``dim0 x row x e`` each, ``s x dim0 x row + f`` for the state: constant in ``n``.
- FSDP2: the parameter's shard as FSDP2 stores it, dim 0 padded to a multiple of ``n``
  (``ceil(dim0 / n) x row x e`` on every rank); the gradients the same (each group's
  reduce-scatter output, viewed); the optimizer's state made from the unpadded shard, rank
  ``r``'s piece of ``torch.chunk`` (rank 0's the largest: the figure per rank is rank 0's).
  Gathered, a parameter takes ``ceil(dim0 / n) x n x row`` elements at the gather dtype.

The sharded parts are exact (counted the same way at the run); the working set a step adds
(FSDP's gathered parameters, DDP's bucket copy of the gradients) is an estimate, said as such;
activations are added by the strategies' model (``SourceCurve.activations_at``: the bytes a
sample saved for backward, measured, times the micro-batch a device runs). Pure Python; no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Bytes an element of FSDP's dtypes as RunConfig names them (``fsdp_param_dtype``, ...).
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
#: The strategies whose memory and traffic this module knows.
STRATEGIES = ("ddp", "fsdp")
#: The parts of a rank's memory, bytes: the counted three, the working set, their total.
MEMORY_COLUMNS = ("param_bytes", "grad_bytes", "optimizer_bytes", "working_set_bytes")


@dataclass(frozen=True)
class Param:
    """Parameters of one shape: ``count`` of them, ``dim0`` rows of ``row`` elements of
    ``element_bytes``; their optimizer state ``state_bytes`` an element, ``state_fixed`` besides."""

    dim0: int
    row: int
    element_bytes: int
    state_bytes: int
    state_fixed: int
    count: int

    @property
    def numel(self) -> int:
        """Elements of one such parameter."""
        return self.dim0 * self.row


@dataclass(frozen=True)
class Group:
    """One FSDP parameter group (a block, or the root: never resharded after forward)."""

    root: bool
    params: tuple[Param, ...]


@dataclass(frozen=True)
class Layout:
    """A model's parameters in FSDP's groups, as a run recorded them."""

    groups: tuple[Group, ...]

    @classmethod
    def of(cls, record: Sequence[dict[str, Any]]) -> Layout:
        """From ``memory_parts``' ``layout`` record; ValueError saying what is wrong."""
        try:
            groups = tuple(
                Group(bool(g["root"]), tuple(Param(*(int(v) for v in p)) for p in g["params"]))
                for g in record
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"a parameter layout that is not memory_parts' ({exc})") from exc
        if not groups:
            raise ValueError("an empty parameter layout: no parameter group")
        return cls(groups)

    @property
    def params(self) -> list[Param]:
        """Every group's parameters."""
        return [p for g in self.groups for p in g.params]

    @property
    def gradient_bytes(self) -> int:
        """Bytes of the gradients in full: what DDP's allreduce hands over a step."""
        return sum(p.numel * p.element_bytes * p.count for p in self.params)


def shard_rows(dim0: int, n: int) -> int:
    """Rows of a shard as FSDP2 stores it: dim 0 padded to a multiple of ``n``, over ``n``."""
    return math.ceil(dim0 / n)


def chunk_rows(dim0: int, n: int, rank: int) -> int:
    """Rows of rank ``rank``'s piece of dim 0 as ``torch.chunk`` cuts it into ``n``."""
    rows = math.ceil(dim0 / n)
    return max(0, min(rows, dim0 - rank * rows))


def gathered_group_bytes(group: Group, n: int, element_bytes: int | None) -> int:
    """Bytes of one group gathered at ``n`` ranks (padded), at ``element_bytes`` (None: the
    parameters' own): one all-gather's or reduce-scatter's whole buffer."""
    return sum(
        shard_rows(p.dim0, n) * n * p.row * (element_bytes or p.element_bytes) * p.count
        for p in group.params
    )


def memory_per_rank(
    layout: Layout,
    strategy: str,
    n: int,
    rank: int = 0,
    reshard_after_forward: bool = True,
    gather_bytes: int | None = None,
    bucket_view: bool = False,
) -> dict[str, int]:
    """Rank ``rank``'s memory at ``n`` ranks under ``strategy`` (see the module docstring):
    :data:`MEMORY_COLUMNS` and ``total_bytes``. The working set: DDP's bucket copy of the
    gradients (none with ``bucket_view``, gradient_as_bucket_view); FSDP's gathered parameters
    at ``gather_bytes`` an element (fsdp_param_dtype; None: their own), every group at once
    without ``reshard_after_forward``, else the root's and the two largest blocks' (the one
    computing and the one prefetched)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    if n < 1 or not 0 <= rank < n:
        raise ValueError(f"need 1 <= n and 0 <= rank < n, got n={n}, rank={rank}")
    params = layout.params
    if strategy == "ddp":
        full = sum(p.numel * p.element_bytes * p.count for p in params)
        state = sum((p.state_bytes * p.numel + p.state_fixed) * p.count for p in params)
        parts = [full, full, state, 0 if bucket_view else full]
    else:
        shard = sum(shard_rows(p.dim0, n) * p.row * p.element_bytes * p.count for p in params)
        state = sum(
            (p.state_bytes * chunk_rows(p.dim0, n, rank) * p.row + p.state_fixed) * p.count
            for p in params
        )
        parts = [
            shard,
            shard,
            state,
            fsdp_working_set(layout, n, reshard_after_forward, gather_bytes),
        ]
    out = dict(zip(MEMORY_COLUMNS, parts, strict=True))
    return {**out, "total_bytes": sum(parts)}


def fsdp_working_set(
    layout: Layout, n: int, reshard_after_forward: bool, gather_bytes: int | None
) -> int:
    """FSDP's gathered parameters held at once (see :func:`memory_per_rank`)."""
    sizes = [(g.root, gathered_group_bytes(g, n, gather_bytes)) for g in layout.groups]
    if not reshard_after_forward:
        return sum(b for _, b in sizes)
    blocks = sorted((b for root, b in sizes if not root), reverse=True)
    return sum(b for root, b in sizes if root) + sum(blocks[:2])


@dataclass(frozen=True)
class Traffic:
    """One step's FSDP collectives: bytes as nccl-tests counts a size (each call's whole
    buffer) and calls, per kind."""

    all_gather_bytes: float
    all_gather_calls: float
    reduce_scatter_bytes: float
    reduce_scatter_calls: float


def fsdp_traffic(
    layout: Layout,
    n: int,
    reshard_after_forward: bool = True,
    gather_bytes: int | None = None,
    reduce_bytes: int | None = None,
    micro_steps: int = 1,
) -> Traffic:
    """FSDP2's collectives in one optimizer step at ``n`` ranks: each micro-step's forward
    gathers every group and its backward re-gathers the blocks resharded after forward (the
    root never is); the last micro-step's backward reduce-scatters every group's gradients
    (no_sync on the others). Gathered at ``gather_bytes`` an element, reduced at
    ``reduce_bytes`` (None: the gather's)."""
    reduce_bytes = reduce_bytes or gather_bytes
    gathered = [gathered_group_bytes(g, n, gather_bytes) for g in layout.groups]
    again = [
        b
        for g, b in zip(layout.groups, gathered, strict=True)
        if reshard_after_forward and not g.root
    ]
    reduced = [gathered_group_bytes(g, n, reduce_bytes) for g in layout.groups]
    return Traffic(
        all_gather_bytes=float(micro_steps * (sum(gathered) + sum(again))),
        all_gather_calls=float(micro_steps * (len(gathered) + len(again))),
        reduce_scatter_bytes=float(sum(reduced)),
        reduce_scatter_calls=float(len(reduced)),
    )
