"""Sweep specs: a YAML grid of RunConfigs, validated before anything runs.

A sweep spec (``experiments/sweeps/*.yaml``) names the sweep (its folder in the store), the
notebook, the executor, the RunConfig fields every point shares (``fixed``) and the fields to vary
(``grid``: the Cartesian product gives the points). A misspelled name is an error listing the
valid names, and every point's RunConfig is built up front so that all problems are reported at
once, each naming its point.

Each point gets a deterministic run id: a readable part from its grid values (``w2_b64_bf16``:
world size 2, per-device batch 64, bf16) and a short hash of its full configuration, so a re-run
of the same spec finds its points (:mod:`workbench.sweeps.run_ids`). Running them is
:mod:`workbench.sweeps.runner`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.config.budget import budget_seconds
from workbench.config.names import folder_name_problem
from workbench.config.run_config import RunConfig, init_field_names
from workbench.errors import ConfigError, PreflightError, Problem
from workbench.run.backends import backend
from workbench.run.study import layout
from workbench.sweeps.run_ids import RESERVED_FIELDS, point_run_id

DEFAULT_NOTEBOOK = "notebooks/02_scaling_sweep.ipynb"


def _spec_keys() -> list[str]:
    """The keys a spec file may have."""
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
    budget_device_s: float | str | None = None
    """stop launching when a call of the sweep has held this many device-seconds (a number, or
    a text such as ``30 device-minutes``); the points left are said; default: no budget"""
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
        """What error messages call this spec."""
        return f"sweep spec {self.source or self.name!r}"

    def _problems(self) -> list[Problem]:
        """Every problem of the spec's own keys (its points' configs are checked apart)."""
        p: list[Problem] = []
        name = folder_name_problem("name", self.name)
        if name is not None:
            p.append(name)
        p += self._field_problems()
        p += self._grid_problems()
        if not isinstance(self.notebook, str) or not self.notebook.endswith(".ipynb"):
            p.append(Problem("notebook", self.notebook, "a path to an .ipynb file"))
        p += self._executor_problems()
        if not isinstance(self.output_dir, str) or not self.output_dir:
            p.append(Problem("output_dir", self.output_dir, "a folder path"))
        if not isinstance(self.description, str):
            p.append(Problem("description", self.description, "text"))
        if self.budget_device_s is not None:
            try:
                budget_seconds(self.budget_device_s)
            except ValueError as exc:
                p.append(Problem("budget_device_s", self.budget_device_s, str(exc)))
        t = self.cell_timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0):
            p.append(Problem("cell_timeout_s", t, "a number of seconds > 0, or omitted"))
        return p

    def _field_problems(self) -> list[Problem]:
        """RunConfig field names in fixed, grid and include: known, and not the sweep's own."""
        p: list[Problem] = []
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
                    why = (
                        "set by the sweep itself (use the top-level name / output_dir; "
                        "run ids are generated)"
                    )
                elif key not in valid:
                    why = f"unknown RunConfig field; valid: {', '.join(valid)}"
                else:
                    continue
                p.append(Problem(f"{section}.{key}", mapping[key], why))
        return p

    def _grid_problems(self) -> list[Problem]:
        """Each grid field: a non-empty list of distinct values, and not also in fixed."""
        p = [
            Problem(f"grid.{key}", self.grid[key], "also in fixed: give it in one place")
            for key in sorted(set(self.fixed) & set(self.grid))
        ]
        for key, values in self.grid.items():
            if not isinstance(values, list) or not values:
                why = "a non-empty list of values (a single value belongs in fixed)"
                p.append(Problem(f"grid.{key}", values, why))
                continue
            canonical = [json.dumps(v, sort_keys=True, default=str) for v in values]
            if len(set(canonical)) != len(canonical):
                p.append(Problem(f"grid.{key}", values, "lists a value twice"))
        return p

    def _executor_problems(self) -> list[Problem]:
        """A known executor, and only its options (the same check as ``launch``'s)."""
        try:
            back_end = backend(self.executor)
        except PreflightError as exc:
            return exc.problems
        return [
            Problem(f"executor_options.{pr.field}", pr.value, pr.allowed)
            for pr in back_end.option_problems(self.executor_options)
        ]

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

    def _combos(self) -> list[dict[str, Any]]:
        """Each point's grid values: the grid's product (last field fastest), then ``include``."""
        keys = list(self.grid)
        combos = [
            dict(zip(keys, c, strict=True))
            for c in itertools.product(*(self.grid[k] for k in keys))
        ]
        if self.include and not keys:
            combos = []  # only the listed points, not the one point of `fixed` alone
        return combos + [dict(entry) for entry in self.include]

    def _point(self, index: int, values: dict[str, Any]) -> SweepPoint:
        """One point, its config validated (ConfigError naming the point otherwise)."""
        label = f"point {index} ({_label(values)})"
        try:
            base = RunConfig.from_dict(
                {
                    **_laid_out({**self.fixed, **values}),
                    "sweep": self.name,
                    "output_dir": os.path.abspath(self.output_dir),
                }
            )
        except ConfigError as exc:
            problems = [
                Problem(f"{label}: {pr.field}", pr.value, pr.allowed) for pr in exc.problems
            ]
            raise ConfigError(problems, what=self._what()) from exc
        except TypeError as exc:  # a value of a type RunConfig cannot take at all
            raise ConfigError([Problem(label, values, str(exc))], what=self._what()) from exc
        run_id = point_run_id(values, base)
        return SweepPoint(
            index=index,
            values=values,
            config=base.replace(run_name=run_id),
            run_id=run_id,
            path=self.sweep_dir / run_id,
        )

    def points(self) -> list[SweepPoint]:
        """Every grid point, in grid order, with its validated RunConfig; one ConfigError names
        each bad point and its problems. Built once per spec (every point's config is hashed)."""
        cached = self.__dict__.get("_points")
        if cached is not None:
            return list(cached)
        out: list[SweepPoint] = []
        problems: list[Problem] = []
        for index, values in enumerate(self._combos()):
            try:
                out.append(self._point(index, values))
            except ConfigError as exc:
                problems += exc.problems
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
        problems += self._layout_problems(out)
        if problems:
            raise ConfigError(problems, what=self._what())
        object.__setattr__(self, "_points", out)  # frozen: a cache, not a field
        return list(out)

    def _layout_problems(self, points: list[SweepPoint]) -> list[Problem]:
        """What the executor cannot run of each point (several nodes on an executor of this
        machine, say), as ``launch`` would refuse it: found before the first point runs."""
        try:
            back_end = backend(self.executor)
        except PreflightError:
            return []  # the spec's own problems name the executor
        return [
            Problem(f"point {p.index} ({_label(p.values)}): {pr.field}", pr.value, pr.allowed)
            for p in points
            for pr in back_end.config_problems(p.config)
        ]

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


def _laid_out(fields: dict[str, Any]) -> dict[str, Any]:
    """A point's fields with its nodes filled in as ``workbench scale`` lays them out, where it
    gives ``world_size`` and ``tasks_per_node`` but not ``nodes``: a node is filled first
    (``world_size`` ranks on one node up to ``tasks_per_node``), then whole nodes. A world size
    above one node that is not a multiple of it is a ConfigError."""
    world, per_node = fields.get("world_size"), fields.get("tasks_per_node")
    counts = (world, per_node)
    if "nodes" in fields or not all(type(n) is int and n >= 1 for n in counts):
        return fields  # nothing to lay out, or RunConfig names what is wrong
    nodes, on_one = layout(world, per_node)  # type: ignore[arg-type]
    return {**fields, "nodes": nodes, "tasks_per_node": on_one}


def _label(values: Mapping[str, Any]) -> str:
    """A point's grid values as ``a=1, b='x'`` (in error messages)."""
    return ", ".join(f"{k}={v!r}" for k, v in values.items()) or "no grid"


def load_spec(path: str | Path) -> SweepSpec:
    """Shorthand for :meth:`SweepSpec.from_yaml`."""
    return SweepSpec.from_yaml(path)
