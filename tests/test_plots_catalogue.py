"""Every figure of the catalogue says what it shows: its definition in the subtitle, a title of
its own, and a short legend below the plot."""

from __future__ import annotations

import pytest

from workbench.ui.catalogue import CATALOGUE, available_figures, draw, figure_context
from workbench.ui.plots import definitions

from .frames import scaling_sweep


@pytest.fixture(scope="module")
def drawn() -> dict[str, object]:
    """Every catalogue figure of the standard sweep, by key (ws4 has 4 ranks: all are drawn)."""
    runs, steps, evals = scaling_sweep()
    ctx = figure_context(runs, steps, evals, focus="ws4")
    assert len(available_figures(ctx)) == len(CATALOGUE)
    return {spec.key: draw(spec.key, ctx) for spec in CATALOGUE}


def flat(text: str | None) -> str:
    """A subtitle as one line: wrapping only turned spaces into line breaks."""
    return (text or "").replace("<br>", " ")


def test_every_figure_has_a_definition_in_its_subtitle(drawn) -> None:
    for spec in CATALOGUE:
        assert len(spec.definition) > 40, spec.key
        assert spec.definition in flat(drawn[spec.key].layout.title.subtitle.text), spec.key


def test_definitions_name_the_window_sampling_and_formula_where_they_apply() -> None:
    by_key = {spec.key: spec.definition for spec in CATALOGUE}
    for key in ("throughput", "speedup", "epoch_time", "phases", "phases_rank", "heatmap"):
        assert definitions.WINDOW in by_key[key], key
    for key in ("phases", "phases_rank", "compute_heatmap", "predicted"):
        assert definitions.COMM_SAMPLING in by_key[key], key
    assert "samples of all ranks in the measured window" in by_key["throughput"]
    assert "dense tensor peak" in by_key["throughput"]  # MFU: which peak, named per point
    assert "compute = data_s + forward_s + optimizer_s" in by_key["compute_heatmap"]
    assert "exposed communication" in by_key["phases"]


def test_figure_titles_are_unique_across_the_catalogue(drawn) -> None:
    titles = [fig.layout.title.text for fig in drawn.values()]
    assert len(set(titles)) == len(titles), titles
    assert drawn["phases"].layout.title.text == "Where a step's time goes, per run"
    assert drawn["phases_rank"].layout.title.text == "Where a step's time goes, per rank"


def test_legends_are_short_and_below_the_plot(drawn) -> None:
    for key, fig in drawn.items():
        names = [t.name for t in fig.data if t.showlegend is not False and t.name]
        assert all(len(n) < 40 for n in names), (key, names)
        legend = fig.layout.legend
        assert legend.orientation == "h" and legend.y < 0, key


def test_the_subtitle_makes_room_for_itself(drawn) -> None:
    fig = drawn["phases"]
    lines = fig.layout.title.subtitle.text.count("<br>") + 1
    assert lines >= 3  # the breakdown's definition is long: wrapped, never one 600-char line
    assert all(len(line) <= 120 for line in fig.layout.title.subtitle.text.split("<br>"))
    assert fig.layout.margin.t == 50 + 14 * lines
