"""Reproducible sweeps: a YAML grid of RunConfigs, one papermill-executed notebook per grid point.

A sweep spec (``experiments/sweeps/*.yaml``) names the sweep (its folder in the store), the
notebook, the executor, the RunConfig fields every point shares (``fixed``) and the fields to vary
(``grid``: the Cartesian product gives the points). Everything is validated before anything runs:
a misspelled name is an error listing the valid names, and every point's RunConfig is built up
front so that all problems are reported at once, each naming its point.

Each point gets a deterministic run id: a readable part from its grid values (``w2_b64_bf16``:
world size 2, per-device batch 64, bf16) and a short hash of its full configuration, so a re-run
of the same spec finds its points. A point is complete when its ``run.json`` says ``completed``
and its executed notebook sits beside the results as ``notebook.ipynb``; that file is renamed
into place last, so an interrupted point (Ctrl-C, a dead kernel, a timeout) never looks complete.
A re-run skips complete points and runs the others again from an empty folder.

The only module that imports papermill.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import schema
from .config import RunConfig, init_field_names
from .errors import ConfigError, Problem
from .store import atomic_write_bytes, read_json, update_run, write_json

DEFAULT_NOTEBOOK = "notebooks/02_scaling_sweep.ipynb"
NOTEBOOK_FILE = "notebook.ipynb"
#: The executed notebook while it runs; renamed to NOTEBOOK_FILE only when the point succeeded.
PARTIAL_NOTEBOOK_FILE = "notebook.partial.ipynb"
#: The executed notebook of a point that failed (kept for its tracebacks; never counts as done).
FAILED_NOTEBOOK_FILE = "notebook.failed.ipynb"
POINT_FILE = "sweep_point.json"
SUMMARY_FILE = "summary.csv"
REPORT_FILE = "report.html"
#: The parameters the sweep passes to its notebook for each point.
NOTEBOOK_PARAMETERS = ("output_dir", "sweep", "run_name", "config", "executor", "executor_options")
#: Fields the sweep sets itself: the store folder, the run id and the store root.
RESERVED_FIELDS = ("sweep", "run_name", "output_dir")
#: Beyond the run's own time limit, what a notebook cell gets for imports, tables and figures.
CELL_TIMEOUT_MARGIN_S = 300.0
#: ...and, on a scheduler, for the job to wait in its queue (set ``cell_timeout_s`` to choose).
SCHEDULER_QUEUE_S = 24 * 3600.0
#: Short names used in run ids ("" means the value alone, e.g. ``bf16``); others use the full name.
RUN_ID_ABBREVIATIONS = {
    "world_size": "w",
    "nodes": "n",
    "tasks_per_node": "tpn",
    "per_device_batch_size": "b",
    "global_batch_size": "gb",
    "gradient_accumulation_steps": "ga",
    "learning_rate": "lr",
    "max_steps": "steps",
    "model": "",
    "precision": "",
    "optimizer": "",
}
_READABLE_MAX = 60
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


def _spec_keys() -> list[str]:
    return [f.name for f in dataclasses.fields(SweepSpec) if f.name != "source"]


@dataclass(frozen=True, kw_only=True)
class SweepPoint:
    """One grid point: its index in the grid, its grid values, its RunConfig and run folder."""

    index: int
    values: dict[str, Any]
    config: RunConfig
    run_id: str
    path: Path


@dataclass(frozen=True, kw_only=True)
class SweepSpec:
    """A sweep: RunConfig fields shared by every point (``fixed``) and the fields to vary
    (``grid``: field -> list of values, the Cartesian product gives the points, the last field
    varying fastest). Invalid specs raise one ConfigError listing every problem."""

    name: str
    """the sweep: a folder of the store, and every point's ``RunConfig.sweep``"""
    grid: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    """RunConfig field -> list of values"""
    fixed: Mapping[str, Any] = field(default_factory=dict)
    """RunConfig fields shared by every point"""
    include: Sequence[Mapping[str, Any]] = ()
    """extra points after the grid's, each a mapping of RunConfig fields (for comparisons that
    are not a full product, e.g. single device at 1 rank next to DDP at 1 and 2)"""
    notebook: str = DEFAULT_NOTEBOOK
    """the notebook executed per point (relative: to the current folder, else to the spec file's
    folder or one of its parents)"""
    executor: str = "local"
    """``launch`` executor for every point"""
    executor_options: Mapping[str, Any] = field(default_factory=dict)
    """options of that executor"""
    output_dir: str = "experiments/results"
    """root of the result store (relative: to the current folder)"""
    description: str = ""
    """free text, shown in the report's title"""
    cell_timeout_s: float | None = None
    """per-cell time limit in seconds; default: the point's ``timeout_min`` plus 5 minutes (plus
    a day of queueing on a scheduler)"""
    source: str | None = None
    """the YAML file this spec came from (not a spec key)"""

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "grid",
            {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in dict(self.grid).items()},
        )
        object.__setattr__(self, "fixed", dict(self.fixed))
        object.__setattr__(
            self, "include", [dict(e) if isinstance(e, Mapping) else e for e in self.include]
        )
        object.__setattr__(self, "executor_options", dict(self.executor_options))
        problems = self._problems()
        # Points are only worth building when their field names are right (else every point
        # repeats the same unknown name); then their problems join the others in one error.
        if not any(
            pr.field.split(".")[0].split("[")[0] in ("name", "fixed", "grid", "include")
            for pr in problems
        ):
            try:
                self.points()
            except ConfigError as exc:
                problems += exc.problems
        if problems:
            raise ConfigError(problems, what=self._what())

    def _what(self) -> str:
        return f"sweep spec {self.source or self.name!r}"

    def _problems(self) -> list[Problem]:
        from .launch import EXECUTOR_OPTIONS, EXECUTORS

        p: list[Problem] = []
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            p.append(
                Problem("name", self.name, "a folder name: letters, digits, '_', '-', '.', '+'")
            )
        valid = [n for n in init_field_names() if n not in RESERVED_FIELDS]
        sections: list[tuple[str, Mapping[str, Any]]] = [("fixed", self.fixed), ("grid", self.grid)]
        for i, entry in enumerate(self.include):
            if isinstance(entry, Mapping):
                sections.append((f"include[{i}]", entry))
            else:
                p.append(Problem(f"include[{i}]", entry, "a mapping of RunConfig fields"))
        for section, mapping in sections:
            for key in mapping:
                if key in RESERVED_FIELDS:
                    p.append(
                        Problem(
                            f"{section}.{key}",
                            mapping[key],
                            "set by the sweep itself (use the top-level name / output_dir; "
                            "run ids are generated)",
                        )
                    )
                elif key not in valid:
                    p.append(
                        Problem(
                            f"{section}.{key}",
                            mapping[key],
                            f"unknown RunConfig field; valid: {', '.join(valid)}",
                        )
                    )
        for key in sorted(set(self.fixed) & set(self.grid)):
            p.append(Problem(f"grid.{key}", self.grid[key], "also in fixed: give it in one place"))
        for key, values in self.grid.items():
            if not isinstance(values, list) or not values:
                p.append(
                    Problem(
                        f"grid.{key}",
                        values,
                        "a non-empty list of values (a single value belongs in fixed)",
                    )
                )
                continue
            canonical = [json.dumps(v, sort_keys=True, default=str) for v in values]
            if len(set(canonical)) != len(canonical):
                p.append(Problem(f"grid.{key}", values, "lists a value twice"))
        if not isinstance(self.notebook, str) or not self.notebook.endswith(".ipynb"):
            p.append(Problem("notebook", self.notebook, "a path to an .ipynb file"))
        if self.executor not in EXECUTORS:
            p.append(Problem("executor", self.executor, f"must be one of {', '.join(EXECUTORS)}"))
        else:
            allowed = EXECUTOR_OPTIONS[self.executor]
            for key in sorted(set(self.executor_options) - set(allowed)):
                p.append(
                    Problem(
                        f"executor_options.{key}",
                        self.executor_options[key],
                        f"not an option of the {self.executor} executor; "
                        f"valid: {', '.join(allowed) or '(none)'}",
                    )
                )
        if not isinstance(self.output_dir, str) or not self.output_dir:
            p.append(Problem("output_dir", self.output_dir, "a folder path"))
        if not isinstance(self.description, str):
            p.append(Problem("description", self.description, "text"))
        t = self.cell_timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0):
            p.append(Problem("cell_timeout_s", t, "a number of seconds > 0, or omitted"))
        return p

    # -- loading
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str | None = None) -> SweepSpec:
        """Build from a mapping (a parsed YAML file); unknown keys are an error listing the
        valid ones."""
        what = f"sweep spec {source!r}" if source else "sweep spec"
        if not isinstance(data, Mapping):
            raise ConfigError([Problem("(top level)", data, "a mapping of spec keys")], what=what)
        valid = _spec_keys()
        problems = [
            Problem(k, data[k], f"unknown sweep spec key; valid: {', '.join(valid)}")
            for k in sorted(set(data) - set(valid), key=str)
        ]
        if data.get("name") is None:
            problems.append(Problem("name", None, "required: the sweep's folder in the store"))
        for key in ("fixed", "grid", "executor_options"):
            if key in data and not isinstance(data[key], Mapping):
                problems.append(Problem(key, data[key], "a mapping of names to values"))
        if problems:
            raise ConfigError(problems, what=what)
        # An empty YAML key (``fixed:`` with nothing under it) means the default.
        return cls(**{k: v for k, v in data.items() if v is not None}, source=source)

    @classmethod
    def from_yaml(cls, path: str | Path) -> SweepSpec:
        """Load and validate ``experiments/sweeps/X.yaml``."""
        import yaml

        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(
                [Problem("file", str(path), f"cannot read YAML: {exc}")], what="sweep spec"
            ) from exc
        return cls.from_dict(data if data is not None else {}, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        """The spec's keys as plain data (JSON-able; recorded beside every point)."""
        return {k: getattr(self, k) for k in _spec_keys()}

    # -- the grid
    @property
    def sweep_dir(self) -> Path:
        """``<output_dir>/<name>``, absolute (the summary and report live here)."""
        return Path(os.path.abspath(self.output_dir)) / self.name

    def points(self) -> list[SweepPoint]:
        """Every grid point, in grid order, with its validated RunConfig; one ConfigError names
        each bad point and its problems."""
        keys = list(self.grid)
        combos = [
            dict(zip(keys, c, strict=True))
            for c in itertools.product(*(self.grid[k] for k in keys))
        ]
        if self.include and not keys:
            combos = []  # only the listed points, not the one point of `fixed` alone
        combos += [dict(entry) for entry in self.include]
        out: list[SweepPoint] = []
        problems: list[Problem] = []
        for index, values in enumerate(combos):
            label = f"point {index} ({_label(values)})"
            try:
                base = RunConfig.from_dict(
                    {
                        **self.fixed,
                        **values,
                        "sweep": self.name,
                        "output_dir": os.path.abspath(self.output_dir),
                    }
                )
            except ConfigError as exc:
                problems += [
                    Problem(f"{label}: {pr.field}", pr.value, pr.allowed) for pr in exc.problems
                ]
                continue
            except TypeError as exc:  # a value of a type RunConfig cannot take at all
                problems.append(Problem(label, values, str(exc)))
                continue
            run_id = point_run_id(values, base)
            out.append(
                SweepPoint(
                    index=index,
                    values=values,
                    config=base.replace(run_name=run_id),
                    run_id=run_id,
                    path=self.sweep_dir / run_id,
                )
            )
        seen: dict[str, int] = {}
        for point in out:
            if point.run_id in seen:
                problems.append(
                    Problem(
                        f"point {point.index} ({_label(point.values)})",
                        point.run_id,
                        f"the same run as point {seen[point.run_id]}",
                    )
                )
            seen.setdefault(point.run_id, point.index)
        if problems:
            raise ConfigError(problems, what=self._what())
        return out

    def notebook_path(self) -> Path:
        """The notebook to execute, found as the ``notebook`` key says (FileNotFoundError
        naming where it looked otherwise)."""
        given = Path(self.notebook)
        candidates = [given] if given.is_absolute() else [Path.cwd() / given]
        if not given.is_absolute() and self.source:
            here = Path(self.source).resolve().parent
            candidates += [folder / given for folder in (here, *here.parents)]
        for candidate in candidates:
            if candidate.is_file():
                return candidate.resolve()
        raise FileNotFoundError(
            f"notebook={self.notebook!r} not found; looked at: "
            + ", ".join(str(c) for c in candidates[:4])
        )


def _label(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in values.items()) or "no grid"


def _defaults() -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(RunConfig):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return json.loads(json.dumps(out, default=str))


def _hash_config(config: RunConfig) -> str:
    """A short hash of the run's full config (derived values included), but not of where it is
    stored. Fields at their default are left out: a field added to RunConfig later must not
    change every id, or a re-run would no longer find the points it completed."""
    data = json.loads(config.to_json())
    defaults = _defaults()
    for key in (*RESERVED_FIELDS, "derived"):
        data.pop(key, None)
    data = {k: v for k, v in data.items() if k not in defaults or v != defaults[k]}
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _token(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return re.sub(r"[^A-Za-z0-9.+-]", "", text)


def point_run_id(values: Mapping[str, Any], config: RunConfig) -> str:
    """The run id of a grid point: its grid values, shortened (``w2_b64_bf16``), then a hash of
    its full config, so that ids are readable, deterministic and distinct."""
    parts = []
    for key, value in values.items():
        prefix = RUN_ID_ABBREVIATIONS.get(key)
        parts.append(f"{prefix}{_token(value)}" if prefix is not None else f"{key}-{_token(value)}")
    readable = "_".join(p for p in parts if p)[:_READABLE_MAX].strip("_.+-") or "point"
    if not readable[0].isalnum():
        readable = "p" + readable
    return f"{readable}-{_hash_config(config)}"


# -- state of a point in the store


def point_state(path: Path) -> str:
    """``complete`` (run.json completed and notebook.ipynb present), ``missing`` (no folder) or
    ``stale`` (anything else: failed, interrupted, half-written)."""
    if not path.exists():
        return "missing"
    try:
        run = read_json(path / schema.RUN_FILE)
    except (OSError, ValueError):
        return "stale"
    done = run.get("ended_at") is not None and run.get("status") == "completed"
    return "complete" if done and (path / NOTEBOOK_FILE).is_file() else "stale"


def plan(spec: SweepSpec, force: bool = False) -> list[tuple[SweepPoint, str]]:
    """Each point and what ``run_sweep`` would do with it: ``skip`` or ``run``."""
    return [
        (p, "run" if force or point_state(p.path) != "complete" else "skip") for p in spec.points()
    ]


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


# -- running


@dataclass(frozen=True, kw_only=True)
class PointOutcome:
    """What happened to one point in this call: ``completed``, ``skipped`` or ``failed``."""

    index: int
    run_id: str
    path: Path
    status: str
    error: str | None = None
    seconds: float = 0.0


@dataclass(frozen=True, kw_only=True)
class SweepResult:
    """The outcome of :func:`run_sweep`: per point, and where the summary and report are."""

    name: str
    sweep_dir: Path
    outcomes: list[PointOutcome]
    summary_path: Path | None
    report_path: Path | None
    summary_error: str | None = None
    other_runs: list[str] = field(default_factory=list)
    """runs in the sweep's folder that are not points of this spec (an older version of it,
    say); the summary and report include them"""

    def _ids(self, status: str) -> list[str]:
        return [o.run_id for o in self.outcomes if o.status == status]

    @property
    def ran(self) -> list[str]:
        """Run ids executed (and completed) by this call."""
        return self._ids("completed")

    @property
    def skipped(self) -> list[str]:
        """Run ids already complete, left as they were."""
        return self._ids("skipped")

    @property
    def failed(self) -> dict[str, str]:
        """Run id -> why it failed."""
        return {o.run_id: o.error or "" for o in self.outcomes if o.status == "failed"}

    @property
    def ok(self) -> bool:
        return not self.failed

    def __str__(self) -> str:
        return (
            f"sweep {self.name}: {len(self.ran)} run, {len(self.skipped)} skipped, "
            f"{len(self.failed)} failed ({self.sweep_dir})"
        )


def _cell_timeout_s(spec: SweepSpec, config: RunConfig) -> int:
    """Every cell gets a limit: nbclient can miss the end of a cell (one that fills an Output
    widget, say) and would then wait for ever."""
    if spec.cell_timeout_s is not None:
        return int(spec.cell_timeout_s)
    queue = 0.0 if spec.executor in ("local", "debug") else SCHEDULER_QUEUE_S
    return int(config.timeout_min * 60 + CELL_TIMEOUT_MARGIN_S + queue)


def _pids_of_run(run_path: Path) -> list[int]:
    """Live processes started for this run (submitit's controller and ranks name the run's
    logs folder on their command line)."""
    marker = str(run_path / schema.LOGS_DIR)
    pids: list[int] = []
    proc_root = Path("/proc")
    if not proc_root.is_dir():
        return pids
    for proc in proc_root.iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and any(a == marker or a.startswith(marker + os.sep) for a in args):
            pids.append(int(proc.name))
    return pids


def _stop_point(run_path: Path, reason: str) -> None:
    """After a point's kernel went away early: end what it launched and record the run as
    cancelled, so nothing keeps writing into the folder and nothing reads as still running.

    Local ranks run in a session of their own (they outlive the kernel by design), and ranks
    still importing torch have not yet recorded their pids; so they are found by the run's logs
    folder on their command line, and killed until none is left (the controller may still be
    starting one)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = _pids_of_run(run_path)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.1)
    run_file = run_path / schema.RUN_FILE
    try:
        run = read_json(run_file) if run_file.exists() else None
    except (OSError, ValueError):
        run = None
    if run is None or run.get("ended_at") is not None:
        return
    try:
        from .launch import attach

        attach(run_path).cancel()  # a scheduler's job too, and the run's summary so far
    except Exception:  # the record below must be written whatever the handle could not do
        pass
    fields: dict[str, Any] = {"failure": {"rank": None, "exception": reason}}
    if read_json(run_file).get("ended_at") is None:
        fields.update(status="cancelled", ended_at=time.time())
    update_run(run_path, **fields)


def _parameters(spec: SweepSpec, point: SweepPoint) -> dict[str, Any]:
    # JSON round trip: papermill writes the values as Python literals, and JSON types are the
    # ones it renders faithfully (tuples, for one, are not).
    config = json.loads(point.config.to_json())
    return {
        "output_dir": str(point.config.output_dir),
        "sweep": spec.name,
        "run_name": point.run_id,
        "config": config,
        "executor": spec.executor,
        "executor_options": json.loads(json.dumps(spec.executor_options, default=str)),
    }


def _record_point(spec: SweepSpec, point: SweepPoint, notebook: Path) -> None:
    write_json(
        point.path / POINT_FILE,
        {
            "sweep": spec.name,
            "index": point.index,
            "points": len(spec.points()),
            "run_id": point.run_id,
            "values": point.values,
            "spec": spec.to_dict(),
            "spec_path": spec.source,
            "notebook": str(notebook),
            "notebook_sha256": hashlib.sha256(notebook.read_bytes()).hexdigest(),
            "parameters": _parameters(spec, point),
        },
    )


def _commit_notebook(partial: Path, final: Path) -> None:
    """Make the executed notebook durable, then rename it into place (the point's last write)."""
    with open(partial, "rb") as f:
        os.fsync(f.fileno())
    os.replace(partial, final)


def run_point(spec: SweepSpec, point: SweepPoint, notebook: Path) -> PointOutcome:
    """Execute the notebook for one point in an emptied run folder. Failures are returned as a
    ``failed`` outcome; KeyboardInterrupt stops the point's ranks and propagates."""
    import papermill

    start = time.monotonic()
    if point.path.exists():
        shutil.rmtree(point.path)  # a stale attempt: its files must not mix with the new ones
    point.path.mkdir(parents=True)
    _record_point(spec, point, notebook)
    partial = point.path / PARTIAL_NOTEBOOK_FILE
    error: str | None = None
    try:
        papermill.execute_notebook(
            str(notebook),
            str(partial),
            parameters=_parameters(spec, point),
            progress_bar=False,
            execution_timeout=_cell_timeout_s(spec, point.config),
            # The kernel's own start-up warnings (one per point) would bury the progress bar;
            # its errors still show, and the cells' output is in the executed notebook.
            extra_arguments=["--IPKernelApp.log_level=ERROR"],
            # Killed, not asked to stop: a kernel interrupted mid-cell would otherwise hold the
            # sweep for nbclient's grace period and print a traceback while going down.
            shutdown_kernel="immediate",
        )
    except KeyboardInterrupt:
        _stop_point(point.path, "sweep interrupted (KeyboardInterrupt)")
        raise
    except Exception as exc:  # a failed cell, a dead kernel, a timeout: this point only
        error = _describe(exc)
        _stop_point(point.path, f"the point's notebook did not finish: {error}")
    if error is None:
        state = point_state_after_run(point.path)
        if state is not None:
            error = state
    seconds = time.monotonic() - start
    if error is None:
        _commit_notebook(partial, point.path / NOTEBOOK_FILE)
        return PointOutcome(
            index=point.index,
            run_id=point.run_id,
            path=point.path,
            status="completed",
            seconds=seconds,
        )
    if partial.exists():
        os.replace(partial, point.path / FAILED_NOTEBOOK_FILE)
    return PointOutcome(
        index=point.index,
        run_id=point.run_id,
        path=point.path,
        status="failed",
        error=error,
        seconds=seconds,
    )


def _describe(exc: Exception) -> str:
    # papermill's own message is a whole traceback; the cell's exception is what to show.
    if hasattr(exc, "ename") and hasattr(exc, "evalue"):
        return f"{exc.ename}: {exc.evalue}".strip()
    lines = str(exc).strip().splitlines()  # a timeout's first line says it; then the cell
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()


def point_state_after_run(path: Path) -> str | None:
    """None when the notebook left a completed run in ``path``; else what is wrong."""
    run_file = path / schema.RUN_FILE
    if not run_file.exists():
        return (
            f"the notebook finished but left no run at {path} (does it pass run_name and "
            "output_dir to launch?)"
        )
    run = read_json(run_file)
    if run.get("ended_at") is None or run.get("status") != "completed":
        return f"the notebook finished but the run is {run.get('status')!r}"
    return None


def write_summary(spec: SweepSpec) -> tuple[Path | None, Path | None]:
    """``summary.csv`` (the scaling table) and ``report.html`` of every run in the sweep's
    folder; (None, None) when it holds no completed run with traces yet."""
    from .analysis import scaling_table
    from .store import load_runs, load_traces
    from .study import report_from_store

    runs = load_runs(spec.sweep_dir.parent, [spec.name])
    if runs.empty or not (runs["status"] == "completed").any():
        return None, None
    paths = list(runs.loc[runs["status"] == "completed", "path"])
    steps = load_traces(paths, "steps")
    if steps.empty:
        return None, None
    table = scaling_table(runs, steps, load_traces(paths, "eval"))
    summary = spec.sweep_dir / SUMMARY_FILE
    atomic_write_bytes(summary, table.to_csv(index=False).encode())
    title = f"Sweep {spec.name}" + (f": {spec.description}" if spec.description else "")
    report = report_from_store(spec.sweep_dir, spec.sweep_dir / REPORT_FILE, title=title)
    return summary, report


def run_sweep(spec: SweepSpec, force: bool = False, progress: bool = True) -> SweepResult:
    """Run every point that is not complete (all of them with ``force``), one after another,
    each by executing the sweep notebook with papermill; then write the summary and report.

    A failed point does not stop the sweep (see ``SweepResult.failed``). Ctrl-C stops it at
    once: the current point's ranks are ended and its folder never looks complete; completed
    points stay, and running the sweep again goes on from there.
    """
    from tqdm.auto import tqdm

    points = spec.points()
    notebook = spec.notebook_path()
    check_notebook(notebook)
    outcomes: list[PointOutcome] = []
    with tqdm(points, desc=f"sweep {spec.name}", unit="point", disable=not progress) as bar:
        for point in bar:
            bar.set_postfix_str(point.run_id)
            if not force and point_state(point.path) == "complete":
                outcomes.append(
                    PointOutcome(
                        index=point.index, run_id=point.run_id, path=point.path, status="skipped"
                    )
                )
                continue
            outcome = run_point(spec, point, notebook)
            if outcome.status == "failed":
                bar.write(
                    f"point {point.index} ({point.run_id}) failed: {outcome.error}\n"
                    f"  notebook: {point.path / FAILED_NOTEBOOK_FILE}"
                )
            outcomes.append(outcome)
    summary = report = None
    summary_error = None
    try:
        summary, report = write_summary(spec)
    except Exception as exc:  # the points' results stand even when the summary cannot be made
        summary_error = f"{type(exc).__name__}: {exc}"
    from .store import iter_run_dirs

    ids = {p.run_id for p in points}
    others = [
        d.name for d in iter_run_dirs(spec.sweep_dir.parent, [spec.name]) if d.name not in ids
    ]
    return SweepResult(
        name=spec.name,
        sweep_dir=spec.sweep_dir,
        outcomes=outcomes,
        summary_path=summary,
        report_path=report,
        summary_error=summary_error,
        other_runs=others,
    )


def load_spec(path: str | Path) -> SweepSpec:
    """Shorthand for :meth:`SweepSpec.from_yaml`."""
    return SweepSpec.from_yaml(path)


__all__ = [
    "NOTEBOOK_PARAMETERS",
    "PointOutcome",
    "SweepPoint",
    "SweepResult",
    "SweepSpec",
    "check_notebook",
    "load_spec",
    "plan",
    "point_run_id",
    "point_state",
    "run_point",
    "run_sweep",
    "write_summary",
]
