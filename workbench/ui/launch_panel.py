"""A launch form for notebooks: the main knobs of a run, validated before anything starts."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import ipywidgets as widgets

from workbench.config.run_config import MODEL_OPTIONS, PRECISIONS, RunConfig
from workbench.errors import ConfigError, PreflightError
from workbench.run.handle import RunHandle
from workbench.ui.monitor import RunMonitor


class LaunchPanel(widgets.VBox):
    """A form for the main knobs of a run. :meth:`config` builds and validates a RunConfig
    (problems are shown in the panel, not raised); the Launch button, or :meth:`launch`, starts
    it and shows a :class:`RunMonitor` below.

    ``base`` supplies every field the form does not show (dataset sizes, epochs, seed...).
    """

    def __init__(
        self, base: RunConfig | None = None, executor: str = "local", **executor_options: Any
    ) -> None:
        self.base = base or RunConfig(per_device_batch_size=32, max_steps=50)
        self.executor = executor
        self.executor_options = executor_options
        b = self.base
        style = {"description_width": "170px"}
        self.model = widgets.Dropdown(
            description="model",
            options=list(MODEL_OPTIONS),
            value=b.model if b.model in MODEL_OPTIONS else "mlp",
            style=style,
        )
        self.world_size = widgets.BoundedIntText(
            description="world_size", value=b.world_size, min=1, max=4096, style=style
        )
        self.per_device_batch_size = widgets.BoundedIntText(
            description="per_device_batch_size",
            value=b.per_device_batch_size,
            min=1,
            max=1 << 20,
            style=style,
        )
        self.max_steps = widgets.BoundedIntText(
            description="max_steps (0: epochs)",
            value=b.max_steps or 0,
            min=0,
            max=10**9,
            style=style,
        )
        self.precision = widgets.Dropdown(
            description="precision", options=list(PRECISIONS), value=b.precision, style=style
        )
        self.learning_rate = widgets.FloatText(
            description="learning_rate", value=b.learning_rate, style=style
        )
        self.sweep = widgets.Text(description="sweep", value=b.sweep, style=style)
        self.launch_button = widgets.Button(
            description="Launch", button_style="primary", icon="play"
        )
        self.errors = widgets.HTML()
        self.monitor_box = widgets.VBox()
        self.monitor: RunMonitor | None = None
        self.handle: RunHandle | None = None
        fields = [
            self.model,
            self.world_size,
            self.per_device_batch_size,
            self.max_steps,
            self.precision,
            self.learning_rate,
            self.sweep,
        ]
        for f in fields:
            f.observe(lambda _: self.config(), "value")
        self.launch_button.on_click(lambda _: self.launch())
        super().__init__([*fields, self.launch_button, self.errors, self.monitor_box])
        self.config()

    def _show_problems(self, title: str, problems: Sequence[Any]) -> None:
        items = "".join(f"<li>{html.escape(str(p))}</li>" for p in problems)
        self.errors.value = (
            f'<div style="color:#b00020"><b>{html.escape(title)}</b><ul>{items}</ul></div>'
        )

    def config(self) -> RunConfig | None:
        """The RunConfig the form describes, or None (the problems are shown in the panel)."""
        changes: dict[str, Any] = {
            "model": self.model.value,
            "world_size": self.world_size.value,
            "tasks_per_node": None,
            "nodes": 1,
            "per_device_batch_size": self.per_device_batch_size.value,
            "global_batch_size": None,
            "max_steps": self.max_steps.value or None,
            "precision": self.precision.value,
            "learning_rate": self.learning_rate.value,
            "sweep": self.sweep.value.strip(),
            "run_name": None,
        }
        if self.model.value != self.base.model:
            changes["model_options"] = {}  # another model's sizes would not fit this one
        try:
            config = self.base.replace(**changes)
        except ConfigError as exc:
            self._show_problems("Fix these before launching:", exc.problems)
            return None
        self.errors.value = (
            f"<span style='color:#555'>{config.total_steps} steps, global batch "
            f"{config.global_batch_size}, {config.train_samples} training samples</span>"
        )
        return config

    def launch(self) -> RunHandle | None:
        """Launch the form's config and show a live monitor below; None when it is invalid or
        the machine cannot run it (the problems are shown in the panel)."""
        from workbench.run.launch import launch

        config = self.config()
        if config is None:
            return None
        try:
            handle = launch(config, self.executor, **self.executor_options)
        except PreflightError as exc:
            self._show_problems("Cannot launch on this machine:", exc.problems)
            return None
        if self.monitor is not None:
            self.monitor.stop()
        self.handle = handle
        self.monitor = RunMonitor(handle)
        self.monitor_box.children = [self.monitor]
        self.monitor.start()
        return handle
