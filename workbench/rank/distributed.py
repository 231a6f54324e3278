"""The one module that touches torch.distributed: rank facts, process group, comm hook, teardown."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from workbench import jobs
from workbench.ports import publish_port, published_port, rendezvous_file
from workbench.trace.comm_timing import CommFields


@dataclass(frozen=True)
class RankEnv:
    """Who this process is in the job, built once from the scheduler's environment."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    host: str
    master_addr: str
    master_port: int
    job_id: str

    @classmethod
    def from_job(
        cls, master_port: int | None, run_dir: Path, attempt: int, timeout_s: float
    ) -> RankEnv:
        """From the job's environment (local, debug or Slurm; see ``jobs.job_facts``).
        ``master_port``: where the launcher picked one (a local run, or the user's own); else
        rank 0 picks one free on its node and publishes it in ``run_dir`` for this attempt, and
        the other ranks wait up to ``timeout_s`` for it (:func:`workbench.ports.publish_port`)."""
        facts = jobs.job_facts(master_port)
        if master_port is None:
            path = rendezvous_file(run_dir, facts.job_id, attempt)
            if facts.rank == 0:
                port = publish_port(path)
            else:
                port = published_port(path, timeout_s)
            facts = dataclasses.replace(facts, master_port=port)
        # Local and debug jobs run on this host; resolve by loopback so no DNS is needed.
        master = "127.0.0.1" if facts.num_nodes == 1 else facts.master_addr
        return cls(
            rank=facts.rank,
            local_rank=facts.local_rank,
            world_size=facts.world_size,
            local_world_size=facts.local_world_size,
            node_rank=facts.node_rank,
            host=socket.gethostname(),
            master_addr=master,
            master_port=facts.master_port,
            job_id=facts.job_id,
        )

    @classmethod
    def on_this_host(cls, rank: int, world_size: int, master_port: int, job_id: str) -> RankEnv:
        """From explicit values, for a rank of a one-node job started without a scheduler (the
        warm pool's workers): every rank on this host, meeting at 127.0.0.1:``master_port``."""
        return cls(
            rank=rank,
            local_rank=rank,
            world_size=world_size,
            local_world_size=world_size,
            node_rank=0,
            host=socket.gethostname(),
            master_addr="127.0.0.1",
            master_port=master_port,
            job_id=job_id,
        )

    def export(self) -> None:
        """Set the variables of ``init_method='env://'`` (user code may read them too)."""
        os.environ.update(
            MASTER_ADDR=self.master_addr,
            MASTER_PORT=str(self.master_port),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK=str(self.local_rank),
            LOCAL_WORLD_SIZE=str(self.local_world_size),
        )


def pick_device(requested: str, local_rank: int) -> torch.device:
    """The device for this rank. Every local task sees the same CUDA_VISIBLE_DEVICES, so the
    GPU is chosen by local rank."""
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("device='cuda' was requested but this rank sees no CUDA device")
    index = local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def device_facts(device: torch.device) -> dict[str, Any]:
    """What this rank runs on, as it sees it: the device and its name, and the torch, CUDA and
    NCCL versions. Read in the rank (which owns its CUDA context), never in the launcher."""
    facts: dict[str, Any] = {
        "device": str(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    if device.type == "cuda":
        facts["name"] = torch.cuda.get_device_name(device)
        facts["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
        try:
            facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # a build without NCCL: the rank still runs (gloo)
            facts["nccl"] = None
    return facts


def nccl_recorder(dump_dir: str) -> None:
    """PyTorch's flight recorder on NCCL: a bounded ring of the last collectives, dumped by
    NCCL's watchdog on a timeout into ``dump_dir`` (``nccl_trace_rank_<rank>``, which the
    launcher reads to explain a hang). Set before any process group; gloo ignores it."""
    os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", os.path.join(dump_dir, "nccl_trace_rank_"))


def init_process_group(
    env: RankEnv, backend: str, device: torch.device, timeout_s: float, dump_dir: str | None = None
) -> str:
    """Join the job's process group; returns the backend used. On NCCL, PyTorch's flight recorder
    is on by default (a bounded ring of the last collectives, dumped on a timeout into
    ``dump_dir``), so a hang shows the last collective each rank entered."""
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and dump_dir:
        nccl_recorder(dump_dir)
    env.export()
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{env.master_addr}:{env.master_port}",
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    return backend


def fully_shard_model(
    module: nn.Module,
    blocks: list[nn.Module],
    device: torch.device,
    reshard_after_forward: bool,
    param_dtype: torch.dtype | None,
    reduce_dtype: torch.dtype | None,
) -> nn.Module:
    """FSDP2 over the default group on a 1-D mesh of ``device``'s type: ``fully_shard`` on each
    of ``blocks`` (a parameter group each: one all-gather, one reduce-scatter) with
    ``reshard_after_forward``, then on ``module`` (the root: the parameters no block holds),
    which FSDP never reshards after forward; the same ``MixedPrecisionPolicy`` on all (None:
    the parameters' own dtype; a reduce dtype of None: the param dtype, FSDP's default). In
    place; returns ``module`` (now an ``FSDPModule``). Imported here, on first use: about 2 s."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # The mesh's device type is the run's (FSDP's default mesh takes CUDA whenever present).
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    # the root: FSDP's own choice (None: not resharded after forward, backward needs it first)
    fully_shard(module, mesh=mesh, reshard_after_forward=None, mp_policy=policy)
    return module


def barrier(group: Any = None) -> None:
    """Every rank of ``group`` (default: all) has arrived."""
    dist.barrier(group=group)


def broadcast_floats(values: list[float], group: Any = None) -> list[float]:
    """Rank 0's values on every rank (on CPU tensors: ``group`` may be a gloo side group)."""
    t = torch.tensor(values, dtype=torch.float64)
    dist.broadcast(t, src=0, group=group)
    return [float(v) for v in t]


def any_rank_flag(flag: bool, device: torch.device) -> bool:
    """True on every rank if ``flag`` is true on any rank (one small allreduce)."""
    return any_rank_flags([flag], device)[0]


def any_rank_flags(flags: Sequence[bool], device: torch.device, group: Any = None) -> list[bool]:
    """Each of ``flags``, true on every rank (of ``group``; None: the default group) if it is
    true on any rank (one small allreduce)."""
    t = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return [bool(v) for v in t.tolist()]


def gather_rows(rows: torch.Tensor, rank: int, world_size: int) -> torch.Tensor | None:
    """Gather equally shaped tensors on rank 0 (None elsewhere)."""
    bucket = [torch.empty_like(rows) for _ in range(world_size)] if rank == 0 else None
    dist.gather(rows, gather_list=bucket, dst=0)
    return torch.cat(bucket) if bucket is not None else None


class CommMeter:
    """A DDP communication hook that moves the gradients (plain averaging allreduce, fp16 or bf16
    compression, or PowerSGD) and records, per bucket, the time from launch to completion and
    the bytes handed to allreduce. ``take()`` returns and resets the step's totals.

    With ``timed=False`` (every CUDA device) it records bytes only: NCCL runs ``Future.then``
    callbacks as soon as the work is queued (see ``Work.get_future``), so a host clock around
    them would report the enqueue as the communication."""

    def __init__(self, kind: str = "allreduce", powersgd_rank: int = 1, timed: bool = True) -> None:
        self.kind = kind
        self.timed = timed
        self.active = False  # set once DDP runs the hook: without it there is nothing to report
        self._seconds = 0.0
        self._bytes = 0
        self._buckets = 0
        self._powersgd: Any = None
        self._dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(kind)  # compression
        if kind == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

            self._powersgd = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=powersgd_rank, start_powerSGD_iter=2
            )

    def _record(self, start: float, nbytes: int) -> None:
        if self.timed:
            self._seconds += time.perf_counter() - start
        self._bytes += nbytes
        self._buckets += 1

    # No annotations: DDP compares them to the real classes and this module's are strings.
    def hook(self, process_group, bucket):  # type: ignore[no-untyped-def]
        group = process_group if process_group is not None else dist.group.WORLD
        start = time.perf_counter()
        if self.kind == "powersgd":
            nbytes = self._powersgd_bytes(bucket)
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

            fut = powerSGD_hook.powerSGD_hook(self._powersgd, bucket)

            def done_powersgd(f: torch.futures.Future[Any]) -> torch.Tensor:
                self._record(start, nbytes)
                return f.value()

            return fut.then(done_powersgd)
        buffer = bucket.buffer()
        dtype = self._dtype
        sent = buffer if dtype is None else buffer.to(dtype)
        sent.div_(dist.get_world_size(group))
        nbytes = sent.numel() * sent.element_size()
        fut = dist.all_reduce(sent, group=group, async_op=True).get_future()

        def done(f: torch.futures.Future[Any]) -> torch.Tensor:
            self._record(start, nbytes)
            reduced = f.value()[0]
            if dtype is None:
                return reduced
            buffer.copy_(reduced)  # decompress into the bucket DDP reads
            return buffer

        return fut.then(done)

    def _powersgd_bytes(self, bucket: Any) -> int:
        """What PowerSGD sends for this bucket: everything before it starts compressing; then, per
        matrix-shaped gradient worth compressing, the factors P (n x r) and Q (m x r); other
        tensors uncompressed. Estimated from the shapes, as PowerSGD decides itself."""
        state = self._powersgd
        total = 0
        for grad in bucket.gradients():
            size = grad.element_size()
            if state.iter < state.start_powerSGD_iter or grad.ndim <= 1:
                total += grad.numel() * size
                continue
            n, m = grad.shape[0], grad.numel() // grad.shape[0]
            r = min(n, m, state.matrix_approximation_rank)
            compress = n * m >= (n + m) * r * state.min_compression_rate
            total += ((n + m) * r if compress else n * m) * size
        return total

    def take(self) -> CommFields:
        """The step's totals (all None if DDP never ran the hook); resets them."""
        if not self.active:
            return CommFields(None, None, None)
        out = CommFields(self._seconds if self.timed else None, self._bytes, self._buckets)
        self._seconds, self._bytes, self._buckets = 0.0, 0, 0
        return out


def time_all_reduce(tensor: torch.Tensor, iterations: int) -> float:
    """Seconds for ``iterations`` back-to-back sum-allreduces of ``tensor`` on the default group,
    from a barrier to the last one's completion (on CUDA, after synchronising), averaged over
    the ranks as nccl-tests does; the same value on every rank."""
    return time_collective("allreduce", tensor, iterations)


def world_size() -> int:
    """Ranks in the default group."""
    return dist.get_world_size()


#: The collectives :func:`time_collective` times, by the name nccl-tests gives them.
COLLECTIVES = ("allreduce", "all_gather", "reduce_scatter")


def time_collective(collective: str, tensor: torch.Tensor, iterations: int) -> float:
    """:func:`time_all_reduce` for any of :data:`COLLECTIVES`. ``tensor`` is the collective's
    whole buffer (nccl-tests' size): an all-gather's gathered output (each rank sends its
    1/n), a reduce-scatter's input (each rank keeps a reduced 1/n of it); its numel must be a
    multiple of the world size for those two."""
    if collective not in COLLECTIVES:
        raise ValueError(f"collective={collective!r}: must be one of {COLLECTIVES}")
    n = dist.get_world_size()
    # one rank's part: an all-gather's input, a reduce-scatter's output
    shard = tensor if collective == "allreduce" else tensor.new_zeros(tensor.numel() // n)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        _issue(collective, tensor, shard)
    if tensor.device.type == "cuda":
        torch.cuda.synchronize(tensor.device)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=tensor.device)
    dist.all_reduce(elapsed)
    return float(elapsed.item()) / n


def _issue(collective: str, whole: torch.Tensor, shard: torch.Tensor) -> None:
    """One call of ``collective`` on the default group: an allreduce of ``whole``, an
    all-gather of each rank's ``shard`` into ``whole``, or a reduce-scatter of ``whole`` into
    each rank's ``shard``."""
    if collective == "allreduce":
        dist.all_reduce(whole)
    elif collective == "all_gather":
        dist.all_gather_into_tensor(whole, shard)
    else:
        dist.reduce_scatter_tensor(shard, whole)


def call_once(collective: str, whole: torch.Tensor, shard: torch.Tensor) -> float:
    """One all-gather (each rank's ``shard`` into ``whole``) or reduce-scatter (``whole`` into
    each rank's ``shard``): its seconds on this rank from its start to its return, with no
    barrier before it (a rank that comes later is waited for, as in a training step)."""
    started = time.perf_counter()
    _issue(collective, whole, shard)
    if whole.device.type == "cuda":
        torch.cuda.synchronize(whole.device)
    return time.perf_counter() - started


def over_ranks(values: list[float], device: torch.device, how: str = "mean") -> list[float]:
    """Each of ``values`` agreed over the default group's ranks: their ``mean`` or ``max``;
    every rank must call it."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX if how == "max" else dist.ReduceOp.SUM)
    if how != "max":
        tensor /= dist.get_world_size()
    return [float(v) for v in tensor.tolist()]


def new_eval_group(timeout_s: float) -> Any:
    """A gloo group with its own, long timeout for waiting on an evaluation that runs on rank 0
    alone: the training group's timeout stays short enough to catch a hung rank."""
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))


def teardown() -> None:
    """Leave the process group. Callers free their DDP model first: freeing it after the group
    is destroyed deadlocks gloo in about half of runs; a barrier before destroying keeps
    every rank's last collective complete."""
    if not dist.is_initialized():
        return
    try:
        dist.barrier()
    finally:
        dist.destroy_process_group()
