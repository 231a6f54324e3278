"""What people look at: plotly figures (never shown by themselves), the figure catalogue, tables,
the offline HTML report and the notebook widgets. No torch at import time.

Notebooks use ``from workbench.ui import Dashboard, LaunchPanel, RunMonitor`` and
``from workbench.ui import plots``. The widgets are imported on first use: the report and the
CLI, which import ``workbench.ui.report``, never load ipywidgets (0.3 s)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.ui.dashboard import Dashboard
    from workbench.ui.launch_panel import LaunchPanel
    from workbench.ui.monitor import RunMonitor

_WIDGETS = {
    "Dashboard": "workbench.ui.dashboard",
    "LaunchPanel": "workbench.ui.launch_panel",
    "RunMonitor": "workbench.ui.monitor",
}


def __getattr__(name: str) -> Any:
    if name in _WIDGETS:
        return getattr(importlib.import_module(_WIDGETS[name]), name)
    raise AttributeError(f"module 'workbench.ui' has no attribute {name!r}")


__all__ = ["Dashboard", "LaunchPanel", "RunMonitor"]
