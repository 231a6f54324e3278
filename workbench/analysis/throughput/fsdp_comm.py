"""FSDP's communication per run and rank: the all-gathers and reduce-scatters FSDP2 calls inside
forward and backward (trace schema 2, ``all_gather_*`` and ``reduce_scatter_*``), read as DDP's
allreduce is read (:mod:`workbench.analysis.throughput.comm`): seconds a step, exposed (what the
step waited for) and hidden, each as a share of the step, and bytes and calls a step.

Source, one rule whether the steps are a frame or the store's: each run's summary
(``run.json``'s ``mean_all_gather_s`` ..., written as the run ends by
:func:`workbench.analysis.throughput.summary.run_summary`: the mean over the run's measured
rows, every rank's), given to every rank of the run; the shares are of each rank's own mean
step. (The store's digests keep no FSDP column: the summary is what both paths have.) A run
without FSDP (DDP, a store of trace schema 1, or a run ended before its summary had them) has
them NaN, never 0; FSDP at one rank records 0, known. Pure pandas; no torch.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from workbench.analysis.measured.stored import is_stored
from workbench.analysis.measured.windows import measured_steps

#: FSDP2's collectives, as the trace names them, and in words.
KINDS = {"all_gather": "all-gather", "reduce_scatter": "reduce-scatter"}
#: Per kind, what the trace records a step.
MEASURES = ("bytes", "s", "exposed_s", "calls")
#: The trace's FSDP columns.
COLUMNS = tuple(f"{kind}_{what}" for kind in KINDS for what in MEASURES)
#: What :func:`fsdp_communication` adds per kind besides the traced means.
DERIVED = ("hidden_s", "share", "exposed_share")


def summary_key(column: str) -> str:
    """The run summary's key (and the runs frame's column) of a traced FSDP column's mean."""
    return f"mean_{column}"


def _from_runs(ranks: pd.DataFrame, runs: pd.DataFrame | None) -> pd.DataFrame:
    """Each rank of ``ranks`` (``run_id``, ``rank``) given its run's summary means (NaN where
    the runs frame has none)."""
    out = ranks[["run_id", "rank"]].copy()
    for column in COLUMNS:
        out[column] = np.nan
    if runs is None or "run_id" not in runs.columns:
        return out
    per_run = runs.drop_duplicates("run_id").set_index("run_id")
    for column in COLUMNS:
        key = summary_key(column)
        if key in per_run.columns:
            out[column] = _floats(out["run_id"].map(_floats(per_run[key])))
    return out


def _floats(values: pd.Series) -> pd.Series:
    """``values`` as float64, nulls (``None``, ``pd.NA``) NaN."""
    return pd.to_numeric(values, errors="coerce").astype("float64")


def fsdp_means(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per run and rank with measured steps: ``step_s`` (the mean traced step, what the shares
    are of) and each traced FSDP column's mean a step (:data:`COLUMNS`) as the run's summary
    has it (the runs frame's ``mean_<column>``; NaN without ``runs``). See the module's
    docstring."""
    if is_stored(steps):
        p = steps.measured_per_rank
        ranks = p[["run_id", "rank"]].assign(step_s=_floats(p["step_s"]))
    else:
        m = measured_steps(steps, ["step_s"])
        m = m.assign(step_s=_floats(m["step_s"]))
        ranks = m.groupby(["run_id", "rank"], sort=True)["step_s"].mean().reset_index()
    out = _from_runs(ranks, runs)
    out.insert(2, "step_s", ranks["step_s"].to_numpy())
    return out.reset_index(drop=True)


def fsdp_communication(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per run and rank: :func:`fsdp_means` and, per kind (``all_gather``, ``reduce_scatter``),
    ``<kind>_hidden_s`` (``<kind>_s - <kind>_exposed_s``: what forward or backward compute
    hid), ``<kind>_share`` (``<kind>_s`` over the step) and ``<kind>_exposed_share`` (the
    exposed part over the step); ``fsdp_exposed_s``, both kinds' exposed parts together (NaN
    where neither was traced). The exposed parts hold any wait for the other ranks inside the
    collective (not split off as DDP's allreduce's is: FSDP's calls are not sampled per step)."""
    out = fsdp_means(steps, runs)
    step = out["step_s"].where(out["step_s"] > 0)
    for kind in KINDS:
        out[f"{kind}_hidden_s"] = (out[f"{kind}_s"] - out[f"{kind}_exposed_s"]).clip(lower=0)
        out[f"{kind}_share"] = out[f"{kind}_s"] / step
        out[f"{kind}_exposed_share"] = out[f"{kind}_exposed_s"] / step
    exposed = out[[f"{kind}_exposed_s" for kind in KINDS]]
    out["fsdp_exposed_s"] = exposed.sum(axis=1, min_count=1)
    return out.drop(columns="step_s")


def has_fsdp(frame: pd.DataFrame) -> bool:
    """Whether any row of ``frame`` (:func:`fsdp_communication`'s, or a frame with its
    columns) measured FSDP's communication."""
    cols = [f"{kind}_s" for kind in KINDS if f"{kind}_s" in frame.columns]
    cols += [f"{kind}_bytes" for kind in KINDS if f"{kind}_bytes" in frame.columns]
    return bool(cols) and bool(frame[cols].notna().any().any())


def size(nbytes: float) -> str:
    """Bytes for people, in binary units, three significant digits: ``512 B``, ``9.43 KiB``,
    ``3.08 MiB``, ``2.31 GiB``, ``140 GiB``."""
    if not math.isfinite(nbytes):
        return "n/a"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            value = nbytes / scale
            return f"{value:,.0f} {unit}" if value >= 100 else f"{value:.3g} {unit}"
    return f"{nbytes:,.0f} B"
