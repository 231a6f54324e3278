"""Executing a sweep point's notebook with papermill: its parameters checked up front, every cell
under a time limit, a failure told in one line. The only module that imports papermill."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.config.run_config import RunConfig
from workbench.errors import ConfigError, Problem
from workbench.run.backends import backend
from workbench.sweeps.spec import SweepSpec

#: The parameters the sweep passes to its notebook for each point.
NOTEBOOK_PARAMETERS = ("output_dir", "sweep", "run_name", "config", "executor", "executor_options")
#: Beyond the run's own time limit, what a notebook cell gets for imports, tables and figures.
CELL_TIMEOUT_MARGIN_S = 300.0


def check_notebook(notebook: str | Path) -> dict[str, Any]:
    """The notebook's parameters (papermill's ``inspect_notebook``); ConfigError listing them
    when it lacks one the sweep passes."""
    import papermill

    params = papermill.inspect_notebook(str(notebook))
    missing = [name for name in NOTEBOOK_PARAMETERS if name not in params]
    if missing:
        have = ", ".join(params) or "none: no cell is tagged 'parameters'"
        raise ConfigError(
            [
                Problem(
                    name,
                    None,
                    f"the sweep passes it but the notebook's parameters "
                    f"cell lacks it; the notebook has: {have}",
                )
                for name in missing
            ],
            what=f"notebook {str(notebook)!r}",
        )
    return dict(params)


def cell_timeout_s(spec: SweepSpec, config: RunConfig) -> int:
    """Every cell gets a limit: nbclient can miss the end of a cell (one that fills an Output
    widget, say) and would then wait for ever. By default: the run's time limit, a margin, and
    what the executor's queue may hold the job."""
    if spec.cell_timeout_s is not None:
        return int(spec.cell_timeout_s)
    queue_s = backend(spec.executor).queue_s
    return int(config.timeout_min * 60 + CELL_TIMEOUT_MARGIN_S + queue_s)


def describe(exc: BaseException) -> str:
    """A failed execution in one line: the cell's exception, or the first line of the error."""
    # papermill's own message is a whole traceback; the cell's exception is what to show.
    if hasattr(exc, "ename") and hasattr(exc, "evalue"):
        return f"{exc.ename}: {exc.evalue}".strip()
    lines = str(exc).strip().splitlines()  # a timeout's first line says it; then the cell
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()


def execute_notebook(
    notebook: Path, output: Path, parameters: dict[str, Any], timeout_s: int
) -> str | None:
    """Execute ``notebook`` into ``output`` with ``parameters``, each cell within ``timeout_s``.
    None when every cell ran; else what went wrong (a failed cell, a dead kernel, a timeout).
    KeyboardInterrupt propagates."""
    import papermill

    for attempt in range(KERNEL_STARTS):
        try:
            papermill.execute_notebook(
                str(notebook),
                str(output),
                parameters=parameters,
                progress_bar=False,
                execution_timeout=timeout_s,
                # The kernel's own start-up warnings (one per point) would bury the progress
                # bar; its errors still show, and the cells' output is in the executed notebook.
                extra_arguments=["--IPKernelApp.log_level=ERROR"],
                # Killed, not asked to stop: a kernel interrupted mid-cell would otherwise hold
                # the sweep for nbclient's grace period and print a traceback while going down.
                shutdown_kernel="immediate",
            )
        except Exception as exc:  # this point only; the sweep goes on
            if attempt + 1 < KERNEL_STARTS and kernel_did_not_start(exc):
                continue  # no cell ran: the point is started again, whole
            return describe(exc)
        return None
    return None


#: Kernel starts a point gets: jupyter_client picks a kernel's ports by binding port 0 and
#: letting it go, and any other process (gloo opens many connections) may take one before the
#: kernel binds it ("Address already in use"); the kernel then never answers.
KERNEL_STARTS = 2


def kernel_did_not_start(exc: BaseException) -> bool:
    """Whether ``exc`` says the kernel never came up (so no cell ran)."""
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "Kernel didn't respond" in text or "Kernel died before replying" in text
    )
