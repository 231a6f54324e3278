"""What people look at: plotly figures (never shown by themselves), the figure catalogue, tables,
the offline HTML report and the notebook widgets. No torch at import time.

Notebooks use ``from workbench.ui import Dashboard, LaunchPanel, RunMonitor`` and
``from workbench.ui import plots``."""

from workbench.ui.dashboard import Dashboard
from workbench.ui.launch_panel import LaunchPanel
from workbench.ui.monitor import RunMonitor

__all__ = ["Dashboard", "LaunchPanel", "RunMonitor"]
