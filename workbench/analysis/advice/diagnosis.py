"""One run's diagnosis and the scaling model's inputs, as a tune starts from them and the finding
words them: the run's parts and its largest cause (:func:`run_diagnosis`), the model's inputs
(:func:`model_inputs`, :func:`inputs_of`). The tune's own measurement (the interval of a gain from
interleaved pairs, its verdict, a run's throughput at its faster steps) is
:mod:`workbench.tune.measure`'s. Pure pandas/numpy; no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from workbench.analysis.advice.candidates import ModelInputs, diagnose, span_network
from workbench.analysis.advice.losses import run_parts
from workbench.analysis.measured.stored import StoredSteps, is_stored
from workbench.analysis.measured.windows import measured_steps, measured_window
from workbench.analysis.model.model_base import (
    CurveRows,
    calibrated_overlap,
    exposed_at_base,
    sampled_medians,
)
from workbench.analysis.model.network import NetworkModel, link_class, network_fit
from workbench.analysis.model.scaling_model import Base
from workbench.analysis.throughput.comm import communication
from workbench.analysis.throughput.scaling import run_table
from workbench.config.choices import COMM_HOOKS


def run_diagnosis(runs: pd.DataFrame, steps: pd.DataFrame | StoredSteps) -> dict[str, Any]:
    """One run's parts (seconds per step: ``step_s``, the causes and ``comm_span``, DDP's
    allreduce span on its sampled steps), ``cause`` and ``share``
    (:func:`~workbench.analysis.advice.candidates.diagnose`) and ``measured_steps``."""
    per_run = run_table(runs, steps)
    if per_run.empty:
        return {"cause": "unexplained", "share": float("nan"), "measured_steps": 0}
    comm = communication(steps, runs)
    parts = run_parts(steps, comm, per_run.drop_duplicates("run_id")).iloc[0].to_dict()
    if is_stored(steps):  # a row per sampled step, as the digest keeps them
        sampled = steps.comm_steps_of(list(pd.unique(per_run["run_id"])))
    else:
        sampled = measured_steps(steps, ["world_size", "comm_s", "comm_exposed_s"])
    _, span, _ = sampled_medians(sampled)
    parts["comm_span"] = span if math.isfinite(span) else 0.0
    cause, share = diagnose(parts)
    window = measured_window(steps).iloc[0]
    return {**parts, "cause": cause, "share": share, "measured_steps": int(window["steps"])}


def model_inputs(
    runs: pd.DataFrame, steps: pd.DataFrame | StoredSteps, config: dict[str, Any]
) -> ModelInputs | None:
    """The scaling model's base for one run at its own world size (as
    :func:`~workbench.analysis.model.scaling_model.predict_scaling` builds it): wall step, exposed
    communication on its sampled steps, gradient bytes and buckets, the calibrated overlap,
    and the network its own allreduce benchmark measured (else the one its measured span
    implies). ``None`` without measured steps."""
    windows = measured_window(steps)
    measured = windows[windows["steps"] > 0]
    if measured.empty:
        return None
    window = windows.iloc[0]
    spans = float(window["samples"] / window["steps"]), float(window["wall_step_s"])
    return inputs_of(steps, runs, list(measured["run_id"]), config, *spans)[0]


def inputs_of(
    steps: pd.DataFrame | StoredSteps,
    runs: pd.DataFrame,
    run_ids: Sequence[object],
    config: Mapping[str, Any],
    samples_per_step: float,
    step_s: float,
) -> tuple[ModelInputs, list[tuple[float, float]]]:
    """The scaling model's base for ``run_ids`` (repeats of one point, from a frame or the
    engine) at their own world size, with their ``samples_per_step`` and wall ``step_s``; and
    each sampled step's wall step and exposed communication (:func:`_sampled_steps`; none
    without an exposed timer): what a predicted gain's interval is computed from."""
    rows = CurveRows(steps, pd.Series(run_ids), pd.Series(run_ids))
    sampled = rows.base_sampled
    n = int(sampled["world_size"].max()) if len(sampled) else 1
    if is_stored(steps):
        p = steps.measured_per_rank
        n = int(p.loc[p["run_id"].isin([str(r) for r in run_ids]), "world_size"].max())
    exposed, span, measured = sampled_medians(sampled)
    overlap = calibrated_overlap(exposed, span, measured)
    exposed_b = exposed_at_base(exposed, span, measured, overlap) if n > 1 else 0.0
    exposed_b = exposed_b if math.isfinite(exposed_b) else 0.0
    nbytes = rows.multi_median("comm_bytes") if n > 1 else float("nan")
    nbytes = nbytes if math.isfinite(nbytes) else 0.0
    buckets = rows.multi_median("comm_buckets") if n > 1 else float("nan")
    base = Base(
        world_size=n,
        step_s=step_s,
        samples_per_step=samples_per_step,
        exposed_comm_s=exposed_b,
        gradient_bytes=nbytes,
        buckets=max(1, int(buckets)) if math.isfinite(buckets) else 1,
        backward_compute_s=rows.base_backward_compute(exposed_b),
    )
    mine = runs[runs["run_id"].isin(list(run_ids))] if "run_id" in runs.columns else runs
    link = link_class(config.get("nodes", 1))
    fit = network_fit(None, steps, mine, link=link) if n > 1 else None
    network: NetworkModel | None = fit.model if fit is not None else None
    if network is None:
        network = span_network(nbytes, n, span) or NetworkModel(
            name="none", bandwidth_bytes_per_s=1e30, latency_s=0.0
        )
    inputs = ModelInputs(
        base=base,
        network=network,
        overlap=overlap,
        bucket_cap_mb=_setting(config, "bucket_cap_mb", 25.0),
        # a script sets its own batch: NaN in its runs' config
        per_device_batch_size=int(_setting(config, "per_device_batch_size", 1)),
        gradient_accumulation_steps=int(_setting(config, "gradient_accumulation_steps", 1)),
        hook_time_s=_hook_times(mine) if n > 1 else {},
    )
    return inputs, _sampled_steps(sampled, measured, step_s) if n > 1 else []


def _setting(config: Mapping[str, Any], name: str, default: float) -> float:
    """A config value of the runs, ``default`` where missing, None or NaN."""
    try:
        value = float(config[name])
    except (KeyError, TypeError, ValueError):
        return default
    return value if math.isfinite(value) and value else default


def _hook_times(runs: pd.DataFrame) -> dict[str, float]:
    """Each comm hook's seconds a step on the runs' buckets (``network_hook_<hook>_s``, the
    median over the runs that timed it); hooks nobody timed are left out."""
    out = {}
    for hook in COMM_HOOKS:
        column = f"network_hook_{hook}_s"
        if column in runs.columns:
            values = pd.to_numeric(runs[column], errors="coerce").dropna()
            if len(values):
                out[hook] = float(values.median())
    return out


def _sampled_steps(
    sampled: pd.DataFrame, measured: bool, step_s: float
) -> list[tuple[float, float]]:
    """Each sampled step's ``(wall step, exposed communication)``: its exposed the smallest
    over ranks (as :func:`sampled_medians` takes it), its traced step the largest, moved by the
    window's gaps so that their median is the window's ``step_s``."""
    if not measured or sampled.empty or "step_s" not in sampled.columns:
        return []
    s = sampled if "attempt" in sampled.columns else sampled.assign(attempt=0)
    s = s[s["comm_s"].notna()]
    per_step = s.groupby(["run_id", "attempt", "step"], sort=True).agg(
        step_s=("step_s", "max"), exposed=("comm_exposed_s", "min")
    )
    per_step = per_step.dropna()
    if per_step.empty:
        return []
    gaps = step_s - float(per_step["step_s"].median())
    return [(float(t + gaps), float(e)) for t, e in per_step.itertuples(index=False)]
