"""Evaluation on one rank: predict (every rank its shard, or rank 0 everything), gather on rank 0,
compute the metric there, broadcast it; each part timed into one evaluation trace row."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workbench.config.run_config import RunConfig
from workbench.rank import distributed
from workbench.rank.data import eval_shard, fetch_batch
from workbench.rank.models import dict_batch, model_task, output_logits, takes_dict_batch
from workbench.trace.tracer import Tracer


@dataclass(frozen=True)
class EvalContext:
    """What an evaluation needs from the trainer.

    ``wrapped`` is the strategy wrapper (switched to eval mode and back), ``module`` the bare model
    that predicts, ``autocast`` makes the forward pass's precision context, ``group`` is the side
    group the metric is broadcast on (see ``distributed.new_eval_group``)."""

    wrapped: nn.Module
    module: nn.Module
    dataset: Any
    config: RunConfig
    env: distributed.RankEnv
    device: torch.device
    autocast: Callable[[], Any]
    group: Any


def _now(device: torch.device) -> float:
    """A timestamp after the device's queued work is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _shard(ctx: EvalContext) -> Iterable[list[int]]:
    """The batches of sample indices this rank predicts."""
    batch = ctx.config.eval_batch_size
    if ctx.config.eval_on == "all":
        return eval_shard(ctx.dataset, ctx.env.rank, ctx.env.world_size, batch)
    return eval_shard(ctx.dataset, 0, 1, batch) if ctx.env.rank == 0 else iter(())


def real_samples(n: int, rank: int, world_size: int) -> int:
    """The samples rank ``rank`` predicts out of ``n``, the sampler's padding left out: the
    unshuffled DistributedSampler deals position p of ``range(n)`` (padded with repeats from its
    start up to a multiple of ``world_size``) to rank ``p % world_size``; positions from ``n``
    on are the repeats."""
    return max(0, -(-(n - rank) // world_size))


def _predict(ctx: EvalContext) -> torch.Tensor:
    """This rank's rows, one per sample: (index, correct, count, loss sum)."""
    device = ctx.device
    rows = [torch.empty(0, 4, dtype=torch.float64, device=device)]
    for indices in _shard(ctx):
        inputs, targets = fetch_batch(ctx.dataset, indices)
        inputs, targets = inputs.to(device), targets.to(device)
        with ctx.autocast():
            if takes_dict_batch(ctx.module):
                output = ctx.module(**dict_batch(ctx.module, inputs, targets))
            else:
                output = ctx.module(inputs)
        logits = output_logits(output).float()
        if model_task(ctx.module) == "lm":
            loss = nn.functional.cross_entropy(
                logits.transpose(1, 2), targets, reduction="none"
            ).sum(1)
            correct = (logits.argmax(-1) == targets).sum(1).double()
            count = torch.full_like(correct, targets.shape[1])
        else:
            loss = nn.functional.cross_entropy(logits, targets, reduction="none")
            correct = (logits.argmax(-1) == targets).double()
            count = torch.ones_like(correct)
        idx = torch.as_tensor(indices, device=device, dtype=torch.float64)
        rows.append(torch.stack([idx, correct, count, loss.double()], dim=1))
    return torch.cat(rows)


def _metric(gathered: torch.Tensor | None) -> tuple[float, float]:
    """(metric, mean loss) over the gathered rows, each sample counted once; zeros where
    nothing was gathered (ranks other than 0)."""
    if gathered is None:
        return 0.0, 0.0
    order = torch.argsort(gathered[:, 0], stable=True)
    ids = gathered[order, 0]
    keep = torch.ones_like(ids, dtype=torch.bool)
    keep[1:] = ids[1:] != ids[:-1]  # the sampler's padding repeats samples; count each once
    unique = gathered[order][keep]
    metric = float(unique[:, 1].sum() / unique[:, 2].sum())
    loss_mean = float(unique[:, 3].sum() / unique[:, 2].sum())
    return metric, loss_mean


@torch.no_grad()
def evaluate(ctx: EvalContext, tracer: Tracer, epoch: int, step: int) -> float:
    """Predict, wait for every rank, gather on rank 0, metric on rank 0, wait, broadcast it;
    each timed (the waits together as ``wait_s``). With
    ``eval_on="all"`` every rank predicts its shard; with ``"rank0"`` rank 0 predicts everything
    and the others wait for the broadcast (on a side group whose timeout allows it).

    Rows gathered per sample: (index, correct, count, loss sum); ``count`` is 1 for a classifier
    and the number of tokens for a language model, so the metric is accuracy over samples or
    tokens. Returns the metric every rank received."""
    env, device = ctx.env, ctx.device
    ctx.wrapped.eval()
    everyone = ctx.config.eval_on == "all"
    t0 = _now(device)
    local = _predict(ctx)
    t1 = _now(device)
    # Barriers before the timed collectives: waiting for the slowest rank is wait_s, not
    # part of the gather or the broadcast.
    if everyone and env.world_size > 1:
        distributed.barrier()
    t1_arrived = _now(device)
    gathered = distributed.gather_rows(local, env.rank, env.world_size) if everyone else None
    if not everyone and env.rank == 0:
        gathered = local
    t2 = _now(device)
    metric, loss_mean = _metric(gathered)
    t3 = _now(device)
    if env.world_size > 1:
        distributed.barrier(ctx.group)  # the side group: its timeout allows rank 0's evaluation
    t3_arrived = _now(device)
    metric, loss_mean = distributed.broadcast_floats([metric, loss_mean], ctx.group)
    t4 = _now(device)
    n = len(ctx.dataset)
    samples = real_samples(n, env.rank, env.world_size) if everyone else n * (env.rank == 0)
    tracer.evaluation(
        epoch=epoch,
        step=step,
        t_start_s=tracer.since_t0(t0),
        predict_s=t1 - t0,
        wait_s=(t1_arrived - t1) + (t3_arrived - t3),
        gather_s=t2 - t1_arrived,
        metric_s=t3 - t2,
        broadcast_s=t4 - t3_arrived,
        eval_s=t4 - t0,
        samples=samples,
        metric_name="accuracy",
        metric_value=metric,
        loss=loss_mean,
    )
    ctx.wrapped.train()
    return metric
