"""The figure catalogue shared by the report and the dashboard, and the one table renderer."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workbench.ui.catalogue import (
    CATALOGUE,
    available_figures,
    dashboard_figures,
    draw,
    figure_context,
)
from workbench.ui.tables import scaling_columns, scaling_table_html

from .frames import make_runs, make_steps, scaling_sweep

#: The dashboard's dropdown as it was before the catalogue: labels, keys and order kept.
DASHBOARD_FIGURES = {
    "throughput per device": "throughput",
    "speedup (with ideal)": "speedup",
    "time per epoch": "epoch_time",
    "accuracy vs devices (trade-off)": "tradeoff",
    "phase breakdown (per run)": "phases",
    "phase breakdown (per rank of one run)": "phases_rank",
    "step-time heatmap (one run)": "heatmap",
    "memory per rank": "memory",
    "evaluation breakdown": "eval",
    "loss curves": "loss",
    "predicted vs measured": "predicted",
}


def two_precisions() -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, parts = [], []
    for precision, step_s in (("fp32", 1.0), ("fp16", 0.5)):
        for n in (1, 2):
            rows.append({"run_id": f"{precision}-{n}", "world_size": n, "precision": precision})
            parts.append(make_steps(f"{precision}-{n}", world_size=n, step_s=step_s))
    return make_runs(rows), pd.concat(parts, ignore_index=True)


def title(fig: object) -> str:
    return fig.layout.title.text  # type: ignore[attr-defined]


def test_dashboard_dropdown_keeps_its_labels_keys_and_order() -> None:
    assert list(dashboard_figures().items()) == list(DASHBOARD_FIGURES.items())


def test_each_figure_is_declared_once_with_a_unique_title() -> None:
    keys = [spec.key for spec in CATALOGUE]
    titles = [spec.title for spec in CATALOGUE]
    assert len(set(keys)) == len(keys)
    assert len(set(titles)) == len(titles)
    assert {s.fallback for s in CATALOGUE if s.fallback} <= set(keys)


def test_a_full_sweep_draws_every_figure_and_names_the_focus_run() -> None:
    runs, steps, evals = scaling_sweep()
    ctx = figure_context(runs, steps, evals, focus="ws4")
    figs = available_figures(ctx)
    headings = [h for h, _ in figs]
    assert headings == [spec.heading(ctx) for spec in CATALOGUE]
    assert "Phases per rank, run ws4" in headings and "Speedup" in headings
    assert "Peak memory per rank, run ws4" in headings
    assert all(len(fig.data) for _, fig in figs)


def test_missing_data_gives_a_message_or_the_fallback() -> None:
    runs, steps, _ = scaling_sweep(evals=False)
    ctx = figure_context(runs, steps, None, focus="ws1")
    assert title(draw("eval", ctx)) == "No evaluations in the selected runs"
    assert title(draw("tradeoff", ctx)) == "Quality against devices"  # the fallback
    assert "has one rank" in title(draw("compute_heatmap", ctx))
    ctx.focus = "gone"
    assert title(draw("heatmap", ctx)) == "No measured steps in run gone"
    assert "Accuracy against speed" not in [h for h, _ in available_figures(ctx)]
    empty = figure_context(runs.assign(status="failed"), steps, None, focus="ws1")
    assert title(draw("speedup", empty)) == "No completed run with measured steps selected"
    with pytest.raises(ValueError, match="valid names: throughput, speedup"):
        draw("pie", ctx)


def test_figures_use_the_explicit_grouping() -> None:
    runs, steps = two_precisions()
    default = figure_context(runs, steps, None)
    assert sorted(t.name for t in draw("throughput", default).data) == [
        "precision=fp16",
        "precision=fp32",
    ]
    by_model = figure_context(runs, steps, None, group_by=["model"])
    assert by_model.group_by == ["model"]
    assert [t.name for t in draw("throughput", by_model).data] == ["model=mlp"]
    assert by_model.table["runs"].tolist() == [2, 2]


def test_one_table_renderer_for_report_and_dashboard() -> None:
    runs, steps, evals = scaling_sweep()
    ctx = figure_context(runs, steps, evals)
    cols = scaling_columns(ctx.table, ctx.group_by)
    # One group: what its points share goes to the caption, not the thirty constant config
    # columns; world size, batch, speedup and efficiency first; no std from single runs.
    assert cols[:4] == ["world_size", "global_batch_size", "speedup", "efficiency"]
    assert "model" not in cols and "scaling" not in cols and "nodes" not in cols
    assert "incomplete" not in cols, "no incomplete run: no column"
    assert "ideal_speedup" not in cols and "time_to_quality_s" in cols
    text = scaling_table_html(ctx.table, ctx.group_by)
    assert "fixed: mlp, fp32, sgd, lr 0.1, " in text and ", weak scaling, " in text
    assert text.count("<th>") == len(cols) and "<td>12.8/s</td>" in text


def test_the_table_shows_the_group_columns_that_differ_and_std_where_there_is_one() -> None:
    runs, steps = two_precisions()
    again = make_steps("fp32-2b", world_size=2, step_s=0.8)
    runs = pd.concat([runs, make_runs([{"run_id": "fp32-2b", "world_size": 2, "seed": 1}])])
    ctx = figure_context(runs, pd.concat([steps, again]), None)
    cols = scaling_columns(ctx.table, ctx.group_by)
    assert cols[0] == "world_size" and "precision" in cols  # what differs between groups
    assert "model" not in cols  # the same in every row: in the caption
    assert "samples_per_s_std" in cols
    assert "speedup_std" not in cols  # every base is one run: no speedup spread anywhere
    row = ctx.table.set_index(["precision", "world_size"]).loc[("fp32", 2)]
    assert row["runs"] == 2 and row["samples_per_s_std"] == pytest.approx(
        np.std([16.0, 20.0], ddof=1)
    )
