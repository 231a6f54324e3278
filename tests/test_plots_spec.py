"""Figures as plotly's plain spec: what the report writes unvalidated is what plotly's validator
makes of it (plotly is the reference, not our code), and the layout helpers do what plotly's own
do (that the report builds no plotly figure object at all: tests/test_report.py)."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest
from plotly.subplots import make_subplots

from workbench.ui.catalogue import CATALOGUE, available_figures, draw, figure_context
from workbench.ui.plots import Figure, message_figure
from workbench.ui.plots.figure import subplots

from .frames import scaling_sweep


def plain(value: Any) -> Any:
    """A figure's JSON with plotly's typed arrays decoded to lists of floats."""
    if isinstance(value, dict):
        if "bdata" in value:
            raw = base64.b64decode(value["bdata"])
            array = np.frombuffer(raw, dtype=np.dtype(value["dtype"])).astype("float64")
            if "shape" in value:
                array = array.reshape([int(s) for s in value["shape"].split(",")])
            return array.tolist()
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def as_written(fig: Figure) -> Any:
    """What a page gets: ``plotly.io.to_json`` of the spec, unvalidated."""
    return plain(json.loads(pio.to_json(fig, validate=False)))


def as_validated(fig: Figure) -> Any:
    """What plotly makes of the same spec: validated into ``go.Figure``, then written."""
    return plain(json.loads(pio.to_json(go.Figure(fig.spec))))


@pytest.fixture(scope="module")
def drawn() -> dict[str, Figure]:
    """Every catalogue figure of the standard sweep (ws4: 4 ranks, every figure drawn)."""
    runs, steps, evals = scaling_sweep()
    ctx = figure_context(runs, steps, evals, focus="ws4")
    assert len(available_figures(ctx)) == len(CATALOGUE)
    return {spec.key: draw(spec.key, ctx) for spec in CATALOGUE}


def test_every_figure_written_unvalidated_is_what_plotly_validates(drawn) -> None:
    for key, fig in drawn.items():
        assert isinstance(fig, Figure) and fig._fig is None, key  # never validated so far
        written = as_written(fig)
        assert written == as_validated(fig), key
        assert written["data"] and written["layout"]["title"]["text"], key
    message = message_figure("nothing here")
    assert as_written(message) == as_validated(message)


def test_the_heatmap_colours_are_plotlys_viridis_not_the_name(drawn) -> None:
    """plotly's validator turns "Viridis" into plotly.py's ten colours; plotly.js's own
    "Viridis" has other stops: the spec carries the ten."""
    scale = drawn["heatmap"].spec["data"][0]["colorscale"]
    validated = go.Figure(go.Heatmap(colorscale="Viridis")).data[0].colorscale
    assert scale == [list(stop) for stop in validated]
    assert [c for _, c in scale][:2] == ["#440154", "#482878"] and scale[-1] == [1.0, "#fde725"]


def test_plotlys_api_on_a_figure_validates_it_once_and_goes_on_as_that_object() -> None:
    fig = Figure([{"type": "bar", "x": ["a"], "y": [1.0]}], {"title": {"text": "t"}})
    assert fig.data[0].y == (1.0,)  # plotly's API: the validated figure
    validated = fig.figure()
    assert fig.layout is validated.layout and fig._fig is validated  # built once
    fig.update_layout(title={"text": "u"})  # later edits go to the object
    assert validated.layout.title.text == "u" and fig.value("title", "text") == "u"
    assert fig.to_plotly_json()["layout"]["title"]["text"] == "u"


def test_update_layout_merges_as_plotly_does() -> None:
    ours = Figure(layout={"title": {"text": "t", "subtitle": {"text": "s", "font": {"size": 9}}}})
    theirs = go.Figure(
        layout={"title": {"text": "t", "subtitle": {"text": "s", "font": {"size": 9}}}}
    )
    for update in (
        {"title": {"subtitle": {"text": None}}, "margin": {"t": 60}},  # None unsets
        {"title": {"y": 1}, "height": 500},  # merged key by key
        {"legend": {"title": {"text": ""}}},
    ):
        ours.update_layout(update)
        theirs.update_layout(update)
    assert ours._fig is None
    want = plain(json.loads(pio.to_json(theirs)))["layout"]
    del want["template"]  # plotly's default, which a figure of ours names itself
    assert as_written(ours)["layout"] == want
    ours.update_layout(title_x=0.5)  # plotly's magic underscores: plotly's own update
    assert ours._fig is not None and ours.layout.title.x == 0.5


@pytest.mark.parametrize("titles", [("a",), ("a", "b"), ("a", "b", "c")])
def test_subplots_lay_out_as_make_subplots(titles: tuple[str, ...]) -> None:
    ours = subplots(titles)
    theirs = make_subplots(rows=1, cols=len(titles), subplot_titles=titles)
    for col in range(1, len(titles) + 1):
        trace = {"type": "scatter", "x": [col], "y": [col]}
        ours.add_trace(trace, row=1, col=col)
        theirs.add_trace(trace, row=1, col=col)
        ours.update_yaxes(title={"text": f"y{col}"}, row=1, col=col)
        theirs.update_yaxes(title_text=f"y{col}", row=1, col=col)
    ours.update_xaxes(type="category")  # every x axis, as plotly's without row and col
    theirs.update_xaxes(type="category")
    want = plain(json.loads(pio.to_json(theirs)))
    del want["layout"]["template"]
    assert as_written(ours) == want
