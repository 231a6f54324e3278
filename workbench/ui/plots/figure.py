"""A figure as plotly's plain spec, built without plotly's validators.

Every figure function of :mod:`workbench.ui.plots` returns a :class:`Figure`: a ``data`` list of
trace dicts and a ``layout`` dict, as plotly.js draws them. Validating a figure into plotly's
objects costs milliseconds per property (about 1 s for a report's 12 figures); a page that only
writes the figure out (the report) never pays it: :meth:`Figure.to_plotly_json` hands the spec to
``plotly.io`` as it is. Anything else of plotly's API (``fig.data``, ``fig.layout``, ``show()``,
``update_traces``, a widget) builds the validated ``go.Figure`` from the spec once, and the
figure goes on as that object: the same figure, checked by plotly. No torch.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    import plotly.graph_objects as go

#: Keys whose arrays plotly.js takes as they are, never as typed arrays (plotly's own list).
_PLAIN_KEYS = ("geojson", "layer", "layers", "range")
#: Keys whose values hold no array of numbers (a template: thousands of small values).
_NO_ARRAYS = ("template",)


def merge(into: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``update`` merged into ``into`` as plotly's ``update`` does it for plain values: a dict into
    a dict key by key, anything else replaces, and None removes the key. Returns ``into``."""
    for key, value in update.items():
        if value is None:
            into.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(into.get(key), dict):
            merge(into[key], value)
        elif isinstance(value, Mapping):
            into[key] = merge({}, value)
        else:
            into[key] = value
    return into


def _encoded(value: Any, key: str = "") -> Any:
    """``value`` as plotly writes a validated figure: numbers in arrays as typed arrays (base64,
    what ``go.Figure.to_dict`` gives plotly.js), a copy; the spec itself is left as it is."""
    if key in _NO_ARRAYS:
        return value
    if isinstance(value, dict):
        return {k: _encoded(v, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encoded(v) for v in value]
    if isinstance(value, (np.ndarray, pd.Series, pd.Index)) and key not in _PLAIN_KEYS:
        from _plotly_utils.utils import to_typed_array_spec

        return to_typed_array_spec(value)
    return value


def _axes(layout: dict[str, Any], axis: str, row: int | None, col: int | None) -> list[str]:
    """The layout keys of the ``axis`` ("xaxis", "yaxis") axes an update with ``row``/``col``
    reaches: that subplot's (one row of subplots here), or every one the layout has."""
    if col is not None:
        return [axis if col == 1 else f"{axis}{col}"]
    if row not in (None, 1):
        raise ValueError(f"row={row!r}: the workbench's figures have one row of subplots")
    named = sorted((k for k in layout if k.startswith(axis) and k[len(axis) :].isdigit()))
    return [axis, *[k for k in named if k != f"{axis}1"]]


class Figure:
    """A plotly figure as its plain spec (``data``: trace dicts; ``layout``: a dict). The methods
    the workbench's figure functions use (``add_trace``, ``update_layout``, ``update_xaxes``,
    ``update_yaxes``) edit the spec; :meth:`figure` (and any other attribute of plotly's
    ``go.Figure``) validates it into that object once, and from then on the figure is that
    object."""

    def __init__(
        self, data: list[dict[str, Any]] | None = None, layout: Mapping[str, Any] | None = None
    ) -> None:
        self._data: list[dict[str, Any]] = [dict(t) for t in data or []]
        self._layout: dict[str, Any] = merge({}, layout or {})
        self._fig: go.Figure | None = None

    # -- the spec
    @property
    def spec(self) -> dict[str, Any]:
        """``{"data": [...], "layout": {...}}``: the spec (once validated, the object's dict)."""
        if self._fig is not None:
            return self._fig.to_dict()
        return {"data": self._data, "layout": self._layout}

    def value(self, *path: str) -> Any:
        """The layout's value at ``path`` (``value("title", "subtitle", "text")``), None where
        it is not set."""
        node: Any = self.spec["layout"]
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return node

    def add_trace(
        self, trace: Mapping[str, Any], row: int | None = None, col: int | None = None
    ) -> Figure:
        """Append ``trace`` (a dict with its ``type``; None values left out); ``row``/``col``:
        in that subplot of a :func:`subplots` figure."""
        if self._fig is not None:
            self._fig.add_trace(dict(trace), row=row, col=col)
            return self
        kept = {k: v for k, v in trace.items() if v is not None}
        if col is not None:
            kept["xaxis"], kept["yaxis"] = ("x", "y") if col == 1 else (f"x{col}", f"y{col}")
        self._data.append(kept)
        return self

    def update_layout(self, update: Mapping[str, Any] | None = None, **kwargs: Any) -> Figure:
        """Merge ``update`` and ``kwargs`` into the layout (:func:`merge`). A key with plotly's
        magic underscores (``title_text``) goes to plotly's own ``update_layout``."""
        every = {**(update or {}), **kwargs}
        if self._fig is not None or any("_" in k for k in every):
            self.figure().update_layout(every)
            return self
        merge(self._layout, every)
        return self

    def update_xaxes(self, row: int | None = None, col: int | None = None, **kw: Any) -> Figure:
        """Merge ``kw`` into the x axes (of subplot ``col``, or all)."""
        return self._update_axes("xaxis", row, col, kw)

    def update_yaxes(self, row: int | None = None, col: int | None = None, **kw: Any) -> Figure:
        """Merge ``kw`` into the y axes (of subplot ``col``, or all)."""
        return self._update_axes("yaxis", row, col, kw)

    def _update_axes(
        self, axis: str, row: int | None, col: int | None, kw: dict[str, Any]
    ) -> Figure:
        if self._fig is not None or any("_" in k and k != "title_text" for k in kw):
            update = getattr(self.figure(), f"update_{axis[0]}axes")
            update(row=row, col=col, **kw)
            return self
        if "title_text" in kw:
            kw = {**kw, "title": {"text": kw.pop("title_text")}}
        for key in _axes(self._layout, axis, row, col):
            merge(self._layout.setdefault(key, {}), kw)
        return self

    # -- out
    def to_plotly_json(self) -> dict[str, Any]:
        """The figure as plotly.js takes it (numbers in typed arrays, as a validated figure
        writes them): what ``plotly.io.to_html`` and ``to_json`` write, unvalidated."""
        if self._fig is not None:
            return self._fig.to_dict()
        return {"data": _encoded(self._data), "layout": _encoded(self._layout)}

    def to_html(self, **kwargs: Any) -> str:
        """``plotly.io.to_html`` of the spec (unvalidated); the arguments are its."""
        import plotly.io as pio

        return str(pio.to_html(self, validate=False, **kwargs))

    def figure(self) -> go.Figure:
        """The validated ``go.Figure`` of the spec (built once; the figure is it from now on)."""
        if self._fig is None:
            import plotly.graph_objects as go

            self._fig = go.Figure({"data": self._data, "layout": self._layout})
        return self._fig

    def __getattr__(self, name: str) -> Any:
        # anything else of plotly's API: the validated figure's (``data``, ``layout``, ``show``)
        if name.startswith("__") or name in ("_data", "_layout", "_fig"):
            raise AttributeError(name)
        return getattr(self.figure(), name)

    def __deepcopy__(self, memo: dict[int, Any]) -> Figure:
        out = Figure()
        out._data, out._layout = copy.deepcopy(self._data, memo), copy.deepcopy(self._layout, memo)
        out._fig = copy.deepcopy(self._fig, memo)
        return out

    def _repr_mimebundle_(self, *args: Any, **kwargs: Any) -> Any:
        return self.figure()._repr_mimebundle_(*args, **kwargs)

    def _ipython_display_(self) -> None:
        self.figure()._ipython_display_()


def subplots(titles: tuple[str, ...]) -> Figure:
    """A figure of one row of ``len(titles)`` subplots, each titled, laid out as plotly's
    ``make_subplots(rows=1, cols=len(titles), subplot_titles=titles)`` lays them out (its
    default spacing: 0.2 of the width over the columns)."""
    cols = len(titles)
    gap = 0.2 / cols
    width = (1 - gap * (cols - 1)) / cols
    layout: dict[str, Any] = {"annotations": []}
    for i, title in enumerate(titles, start=1):
        start = (width + gap) * (i - 1)
        domain = [start, start + width]
        x, y = ("xaxis", "yaxis") if i == 1 else (f"xaxis{i}", f"yaxis{i}")
        layout[x] = {"anchor": "y" if i == 1 else f"y{i}", "domain": domain}
        layout[y] = {"anchor": "x" if i == 1 else f"x{i}", "domain": [0.0, 1.0]}
        layout["annotations"].append(
            {
                "font": {"size": 16},
                "showarrow": False,
                "text": title,
                "x": (domain[0] + domain[1]) / 2,
                "xanchor": "center",
                "xref": "paper",
                "y": 1.0,
                "yanchor": "bottom",
                "yref": "paper",
            }
        )
    return Figure(layout=layout)
