"""Where lost scaling efficiency went: the step time a curve's largest world size lost against
ideal scaling, split into its measured causes, each as a share of that step.

Per run, the training step (the training window over its measured steps, evaluations and
checkpoints left out: ``samples per step / samples_per_s``) is the sum, averaged over ranks, of

- ``compute``: forward + backward compute (DDP's timer on its sampled steps, else backward less
  the exposed communication) + optimizer, less FSDP's exposed all-gathers and reduce-scatters
  (which FSDP2 calls inside forward and backward);
- ``exposed_transfer``: the allreduce that no backward compute hid, even on the last rank to
  reach it (:func:`workbench.analysis.throughput.comm.communication`);
- ``exposed_all_gather`` and ``exposed_reduce_scatter``: FSDP's collectives that no compute hid
  (:mod:`workbench.analysis.throughput.fsdp_comm`; any wait for the other ranks inside them
  included);
- ``wait``: waiting in the allreduce for the slowest rank;
- ``data``: loading the batch (``data_s``);
- ``gaps``: between steps (the training step less the traced ``step_s``);

and whatever the traces do not explain. Ideal scaling keeps each part at the base's value times
the per-device work ratio ``(samples per step at N / at base) x (base N / N)`` (1 for weak
scaling, ``base N / N`` for strong). The loss ``1 - efficiency = (T_N - ideal T) / T_N``; each
cause's share is its growth over its ideal value divided by ``T_N``; ``unexplained`` is the
rest, so the shares add up to the loss exactly. Pure pandas; no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from workbench.analysis.measured.stored import is_stored
from workbench.analysis.measured.windows import measured_steps
from workbench.trace.known import T95_BY_DF

#: The measured causes, in the order they are told.
CAUSES = (
    "compute",
    "exposed_transfer",
    "exposed_all_gather",
    "exposed_reduce_scatter",
    "wait",
    "data",
    "gaps",
)
#: The causes that are communication: none at one rank.
COMMUNICATION = ("exposed_transfer", "exposed_all_gather", "exposed_reduce_scatter", "wait")
#: The causes in words.
CAUSE_WORDS = {
    "compute": "compute grown",
    "exposed_transfer": "exposed allreduce transfer",
    "exposed_all_gather": "exposed all-gather",
    "exposed_reduce_scatter": "exposed reduce-scatter",
    "wait": "waiting for the slowest rank",
    "data": "data loading",
    "gaps": "time between steps",
    "unexplained": "unexplained",
}


def _mean(frame: pd.DataFrame, column: str) -> pd.Series:
    """Per run: the mean over ranks of each rank's mean (NaN rows skipped: sampled timers)."""
    if column not in frame.columns:
        return pd.Series(np.nan, index=pd.unique(frame["run_id"]), dtype="float64")
    per_rank = frame.groupby(["run_id", "rank"])[column].mean()
    return per_rank.groupby(level="run_id").mean()


def run_parts(steps: pd.DataFrame, comm: pd.DataFrame, per_run: pd.DataFrame) -> pd.DataFrame:
    """Per run of ``per_run`` (a run table): ``step_s`` (the training step), the
    :data:`CAUSES` in seconds per step, ``samples_per_step`` and ``ranks_per_host`` (the most
    ranks one host ran)."""
    cols = ["data_s", "forward_s", "backward_s", "optimizer_s", "step_s", "backward_compute_s"]
    if is_stored(steps):  # each rank's means from the engine: the same mean of means
        p = steps.measured_per_rank
        m = p[p["run_id"].isin(per_run["run_id"])]
        hosts = m[["run_id", "rank", "hosts"]].explode("hosts").rename(columns={"hosts": "host"})
    else:
        m = measured_steps(steps[steps["run_id"].isin(per_run["run_id"])], [*cols, "host"])
        hosts = m[["run_id", "rank", "host"]] if "host" in m.columns else None
    out = pd.DataFrame(index=pd.Index(per_run["run_id"], name="run_id"))
    samples_per_step = (per_run["samples"] / per_run["steps"]).to_numpy()
    out["samples_per_step"] = samples_per_step
    throughput = per_run["samples_per_s"].to_numpy(dtype="float64")
    with np.errstate(divide="ignore", invalid="ignore"):
        out["step_s"] = np.where(throughput > 0, samples_per_step / throughput, np.nan)
    fsdp = ["all_gather_exposed_s", "reduce_scatter_exposed_s"]
    cols = ["exposed_comm_s", "exposed_transfer_s", "wait_s", *fsdp]
    c = comm.reindex(columns=["run_id", *cols])
    c[cols] = c[cols].apply(pd.to_numeric, errors="coerce").astype("float64")
    c = c.groupby("run_id")[cols].mean().reindex(out.index)
    fsdp_exposed = c[fsdp].fillna(0.0).sum(axis=1)
    timer = _mean(m, "backward_compute_s").reindex(out.index)
    backward = _mean(m, "backward_s").reindex(out.index) - c["exposed_comm_s"].fillna(0.0)
    backward_compute = timer.where(timer.notna(), backward)
    out["compute"] = (
        _mean(m, "forward_s").reindex(out.index)
        + backward_compute
        + _mean(m, "optimizer_s").reindex(out.index)
        - fsdp_exposed
    )
    out["exposed_transfer"] = c["exposed_transfer_s"].fillna(0.0)
    out["exposed_all_gather"] = c["all_gather_exposed_s"].fillna(0.0)
    out["exposed_reduce_scatter"] = c["reduce_scatter_exposed_s"].fillna(0.0)
    out["wait"] = c["wait_s"].fillna(0.0)
    out["data"] = _mean(m, "data_s").reindex(out.index)
    out["gaps"] = out["step_s"] - _mean(m, "step_s").reindex(out.index)
    if hosts is not None and len(m):
        per_host = hosts.groupby(["run_id", "host"])["rank"].nunique()
        out["ranks_per_host"] = per_host.groupby(level="run_id").max().reindex(out.index)
    else:
        out["ranks_per_host"] = np.nan
    return out


def efficiency_loss(
    parts: pd.DataFrame,
    base_runs: Sequence[str],
    top_runs: Sequence[str],
    base_world_size: int,
    world_size: int,
    base_samples_per_s: float,
    samples_per_s: float,
) -> pd.DataFrame:
    """The causes of one point's lost efficiency against its base (means over each end's runs;
    the throughputs are the scaling table's means, so the loss is the table's). One row per
    cause (:data:`CAUSES`, then ``unexplained``): ``base_s`` and ``top_s`` (seconds per
    step), ``ideal_s`` (the base's scaled by the per-device work ratio), ``share`` (growth
    over ideal / the step at N) with its 95 % interval over the launches at each end
    (``share_low``, ``share_high``: NaN with one launch at an end, and for ``unexplained``)
    and, on every row, ``loss`` (1 - efficiency). Empty when either end lacks a
    measurement."""
    base = parts.loc[parts.index.isin(base_runs)]
    top = parts.loc[parts.index.isin(top_runs)]
    empty = pd.DataFrame(columns=["cause", "base_s", "top_s", "ideal_s", "share", "loss"])
    if base.empty or top.empty or not (base_samples_per_s > 0 and samples_per_s > 0):
        return empty
    sps0, sps = float(base["samples_per_step"].mean()), float(top["samples_per_step"].mean())
    step0, step = sps0 / base_samples_per_s, sps / samples_per_s
    work = (sps / sps0) * (base_world_size / world_size)
    if not (np.isfinite(step) and step > 0 and np.isfinite(work)):
        return empty
    rows = []
    for cause in CAUSES:
        b, t = float(base[cause].mean()), float(top[cause].mean())
        none_at_base = base_world_size == 1 and cause in COMMUNICATION
        if none_at_base:
            b = 0.0  # one rank neither communicates nor waits
        share = (t - b * work) / step
        half = _share_half_width(top[cause], None if none_at_base else base[cause], work) / step
        rows.append((cause, b, t, b * work, share, share - half, share + half))
    loss = (step - step0 * work) / step
    named = sum(r[4] for r in rows if np.isfinite(r[4]))
    rows.append(("unexplained", np.nan, np.nan, np.nan, loss - named, np.nan, np.nan))
    columns = ["cause", "base_s", "top_s", "ideal_s", "share", "share_low", "share_high"]
    return pd.DataFrame(rows, columns=columns).assign(loss=loss)


def _share_half_width(top: pd.Series, base: pd.Series | None, work: float) -> float:
    """The 95 % half-width, seconds per step, of a cause's growth ``mean(top) - work x
    mean(base)`` over the launches at each end (``base`` None: 0 by construction there):
    Student t on the launches' spread, its degrees of freedom the fewer launches' less one;
    NaN where an end has a single launch (one launch cannot show how launches differ)."""
    ends = [top.dropna()] + ([] if base is None else [base.dropna()])
    if min(len(e) for e in ends) < 2:
        return float("nan")
    variance = top.dropna().var(ddof=1) / len(ends[0])
    if base is not None:
        variance += work**2 * ends[1].var(ddof=1) / len(ends[1])
    df = min(len(e) for e in ends) - 1
    return T95_BY_DF.get(df, 1.96) * float(np.sqrt(variance))
