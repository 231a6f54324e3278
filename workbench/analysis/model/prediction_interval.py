"""The 95 % interval of a predicted throughput: what the model does not know, and what the runs
it was fed did not pin down.

Relative half-width, in quadrature (independent parts):

- the model's error: ``Z95`` x its RMS relative error on the curve's own measured points
  beyond the base (``model_error``), at least :data:`MODEL_ERROR_FLOOR` (a study of one or two
  points cannot show a model error below it; where it shows none, the floor stands alone);
- the base point's throughput, known to +-``h_base`` (its launches pooled: the scaling
  table's ``samples_per_s_half_width``): the prediction scales with the base's compute;
- the largest measured point's, +-``h_top``, twice: once for the overlap and communication
  calibrated on it, once for the run that will be measured at the predicted size (a new run
  scatters as the measured ones did).

A run that recorded no interval of its own (a store written before runs did) adds nothing:
the interval is then the model's part only. Pure pandas."""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.analysis.measured.stored import is_stored
from workbench.analysis.model.scaling_model import predicted_vs_measured
from workbench.analysis.throughput.scaling import points_table

Z95 = 1.96
#: The least model error an interval assumes: held out on the emulated cluster the model's
#: median error was 1-3 % (BENCHMARKS.md), which one or two measured points cannot resolve.
MODEL_ERROR_FLOOR = 0.02
#: The least model error for a strategy the study never ran (FSDP from a DDP study): held
#: out, its error was 3-9 % (BENCHMARKS.md).
CROSS_STRATEGY_FLOOR = 0.04
#: What a prediction's note says where the model's error is the floor alone.
FLOOR = f"the interval takes the model's error as {MODEL_ERROR_FLOOR:.0%}"


def model_error(runs: pd.DataFrame, steps: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per curve: the RMS relative error of the model on its own measured points other than the
    base (each on the network its link class measured); NaN without such a point. It depends
    on neither the network asked about nor the world sizes: computed once per stored runs and
    grouping."""
    if not is_stored(steps):
        return model_error_of(runs, steps, keys)
    key = ("model_error", id(runs), tuple(keys))
    return steps.kept(key, (runs,), lambda: model_error_of(runs, steps, keys)).copy()


def model_error_of(runs: pd.DataFrame, steps: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """:func:`model_error`, computed."""
    own = predicted_vs_measured(runs, steps, None, group_by=keys)
    curve = [c for c in keys if c in own.columns]
    beyond = (own["world_size"] != own["base_world_size"]) | (own["nodes"] != own["base_nodes"])
    check = own[beyond].dropna(subset=["relative_error"])
    if check.empty:
        return pd.DataFrame(columns=[*curve, "model_error"])
    if not curve:  # one curve: every run is of it
        rms_all = float(np.sqrt(np.mean(np.square(check["relative_error"]))))
        return pd.DataFrame({"model_error": [rms_all]})
    rms = check.groupby(curve, dropna=False)["relative_error"].apply(
        lambda e: float(np.sqrt(np.mean(np.square(e))))
    )
    return rms.rename("model_error").reset_index()


def per_curve(
    rows: pd.DataFrame, values: pd.DataFrame, curve: list[str], column: str
) -> pd.DataFrame:
    """``rows`` with ``values``' ``column`` merged on the curve columns (one curve: its one
    value; none known: NaN)."""
    if curve and len(values):
        return rows.merge(values[[*curve, column]], on=curve, how="left")
    rows = rows.copy()
    rows[column] = float(values[column].iloc[0]) if len(values) else np.nan
    return rows


def runs_half_width(per_run: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per curve (``keys``): ``runs_half_width``, the part of the interval from the measured
    runs, hypot(h_base, h_top, h_top) (h_top 0 where the base is the only point)."""
    curve = [c for c in keys if c in per_run.columns]
    if "samples_per_s_half_width" not in per_run.columns or per_run.empty:
        return pd.DataFrame(columns=[*curve, "runs_half_width"])
    points = points_table(per_run, keys)
    rows = []
    for key, mine in points.groupby(curve or (lambda _: 0), dropna=False, sort=False):
        order = mine.sort_values(["world_size", *(["nodes"] if "nodes" in mine else [])])
        h = order["samples_per_s_half_width"].fillna(0.0).to_numpy()
        top = h[-1] if len(h) > 1 else 0.0
        key = key if isinstance(key, tuple) else (key,)
        rows.append(
            {
                **dict(zip(curve, key, strict=False)),
                "runs_half_width": float(np.sqrt(h[0] ** 2 + 2 * top**2)),
            }
        )
    return pd.DataFrame(rows, columns=[*curve, "runs_half_width"])


def half_width(
    model_error: pd.Series, runs_half: pd.Series, floor: float = MODEL_ERROR_FLOOR
) -> pd.Series:
    """The prediction's 95 % relative half-width from its curve's ``model_error`` (NaN: none
    measured, the ``floor``) and ``runs_half`` (NaN: the runs recorded none, nothing)."""
    model = Z95 * np.fmax(model_error.astype("float64"), floor)
    return np.hypot(model, runs_half.astype("float64").fillna(0.0))
