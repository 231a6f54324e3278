"""``workbench run / ls / report``: the terminal and batch-job front end."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workbench.config.run_config import RunConfig, field_help
from workbench.run.backends import BACKENDS

_ALIASES = {"max_steps": ["--steps"]}


def _field_type(f: dataclasses.Field[Any]) -> Any:
    hint = typing.get_type_hints(RunConfig)[f.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        hint = args[0]
    return hint


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _world_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers >= 1, e.g. 1,2,4; got {text!r}"
        )
    return sizes


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"expected JSON, got {text!r}: {exc}") from exc


def _add_config_options(parser: argparse.ArgumentParser, skip: Sequence[str] = ()) -> None:
    """One option per RunConfig field, with the field's own help: the CLI never lags the config."""
    helps = field_help()
    group = parser.add_argument_group("run configuration (RunConfig fields)")
    for f in dataclasses.fields(RunConfig):
        if not f.init or f.name in skip:
            continue
        kind = _field_type(f)
        convert: Any = {int: int, float: float, bool: _bool, str: str}.get(kind, _json)
        flags = [f"--{f.name.replace('_', '-')}"] + _ALIASES.get(f.name, [])
        default = f.default if f.default is not dataclasses.MISSING else "{}"
        group.add_argument(
            *flags,
            dest=f.name,
            type=convert,
            default=argparse.SUPPRESS,
            help=f"{helps[f.name]} (default: {default})",
        )


def _cmd_run(args: argparse.Namespace) -> int:
    from workbench.analysis.summary import per_rank_table
    from workbench.errors import ConfigError, PreflightError, RunFailedError
    from workbench.run.launch import launch
    from workbench.store.load import load_traces

    try:
        config = _config_from_args(args)
        handle = launch(config, executor=args.executor, resume=args.resume)
    except (ConfigError, PreflightError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"run {handle.run_id}: {config.world_size} rank(s), {config.total_steps} steps, "
        f"executor={args.executor}; results in {handle.path}"
    )
    try:
        handle.wait()
    except RunFailedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    _print_summary(handle.path)
    table = per_rank_table(load_traces(handle.path, "steps"))
    print(f"per rank:\n{table.to_string(float_format=lambda x: f'{x:.4g}')}")
    print(f"results: {handle.path}")
    return 0


def _print_summary(run_path: Path) -> None:
    from workbench.store.files import read_json

    s = read_json(run_path / "run.json").get("summary") or {}

    def fmt(key: str, unit: str = "", scale: float = 1.0) -> str:
        v = s.get(key)
        return "n/a" if v is None else f"{v * scale:.4g}{unit}"

    print(
        f"throughput: {fmt('samples_per_s', ' samples/s')} total, "
        f"{fmt('samples_per_s_per_device', ' samples/s')} per device "
        f"({s.get('measured_steps', 0)} measured steps, warm-up excluded)"
    )
    print(
        "step time (ms): "
        + ", ".join(
            f"{p.replace('_s', '')} {fmt('mean_' + p, '', 1000)}"
            for p in ("data_s", "forward_s", "backward_s", "optimizer_s", "comm_s", "step_s")
        )
    )
    rss, cuda = fmt("peak_rss_bytes", " MiB", 2**-20), fmt("peak_cuda_bytes", " MiB", 2**-20)
    print(f"peak memory: RSS {rss}, CUDA {cuda}")
    metric = s.get("final_metric_name", "metric")
    print(f"final loss {fmt('final_loss')}; {metric} {fmt('final_metric')}")


def _cmd_ls(args: argparse.Namespace) -> int:
    from workbench.store.load import load_runs

    runs = load_runs(args.output_dir, args.sweep or None)
    if runs.empty:
        print(f"no runs in {args.output_dir}")
        return 0
    cols = [
        c
        for c in (
            "sweep",
            "run_id",
            "status",
            "model",
            "world_size",
            "per_device_batch_size",
            "precision",
            "samples_per_s",
            "final_loss",
            "final_metric",
        )
        if c in runs.columns
    ]
    print(runs[cols].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    return 0


def _config_from_args(args: argparse.Namespace) -> RunConfig:
    fields = {f.name for f in dataclasses.fields(RunConfig) if f.init}
    values = {k: v for k, v in vars(args).items() if k in fields}
    if "per_device_batch_size" not in values and "global_batch_size" not in values:
        values["per_device_batch_size"] = 32
    return RunConfig(**values)


def _cmd_report(args: argparse.Namespace) -> int:
    from workbench.ui.report import report_from_store

    try:
        path = report_from_store(args.target, args.output, output_dir=args.output_dir)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(
            f"error: cannot write the report to {args.output}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 2
    print(f"report: {path}")
    return 0


def _cmd_scale(args: argparse.Namespace) -> int:
    from workbench.errors import ConfigError
    from workbench.run.study import run_study, scaling_configs
    from workbench.ui.report import report_from_store

    try:
        sizes = args.world_sizes
        config = _config_from_args(argparse.Namespace(**{**vars(args), "world_size": max(sizes)}))
        configs = scaling_configs(config, sizes)
    except (ValueError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    handles = run_study(configs, args.executor)
    for handle in handles:
        print(f"{handle.run_id}: {handle.status()}")
    report = args.report or str(Path(config.output_dir) / config.sweep / "report.html")
    path = report_from_store(config.sweep, report, output_dir=config.output_dir)
    print(f"results: {Path(config.output_dir) / config.sweep}")
    print(f"report: {path}")
    return 0 if all(h.status() == "completed" for h in handles) else 1


def _cmd_sweep(args: argparse.Namespace) -> int:
    from workbench.errors import ConfigError
    from workbench.sweeps.runner import check_notebook, plan, run_sweep
    from workbench.sweeps.spec import SweepSpec

    try:
        spec = SweepSpec.from_yaml(args.spec)
        if args.output_dir:
            spec = dataclasses.replace(spec, output_dir=args.output_dir)
        check_notebook(spec.notebook_path())
    except (ConfigError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        steps = plan(spec, force=args.force)
        print(f"sweep {spec.name}: {len(steps)} point(s) in {spec.sweep_dir}")
        for point, action in steps:
            values = ", ".join(f"{k}={v}" for k, v in point.values.items())
            print(f"  {point.index:>3}  {point.run_id}  {action:<4}  {values}")
        return 0
    try:
        result = run_sweep(spec, force=args.force, progress=not args.no_progress)
    except KeyboardInterrupt:
        # Completed points are kept; the interrupted one never looks complete.
        print(
            f"interrupted; completed points are kept in {spec.sweep_dir}; run the same command "
            "again to go on",
            file=sys.stderr,
        )
        return 130
    for outcome in result.outcomes:
        line = f"  {outcome.index:>3}  {outcome.run_id}  {outcome.status}"
        print(line + (f": {outcome.error}" if outcome.error else ""))
    print(result)
    if result.other_runs:
        print(
            f"note: {len(result.other_runs)} run(s) in {result.sweep_dir} are not points of this "
            "spec (an earlier version of it?); the summary and report include them"
        )
    if result.summary_error:
        print(f"error: summary not written: {result.summary_error}", file=sys.stderr)
    if result.summary_path:
        print(f"summary: {result.summary_path}")
        print(f"report: {result.report_path}")
    return 0 if result.ok and not result.summary_error else 1


def _cmd_repartition(args: argparse.Namespace) -> int:
    from workbench.store.row_groups import make_parquet_dataset, repartition, row_groups

    if not args.make and not Path(args.path).is_file():
        print(f"error: {args.path}: no such Parquet file (--make ROWS writes one)", file=sys.stderr)
        return 2
    try:
        if args.make:
            make_parquet_dataset(args.path, args.make, rows_per_group=args.rows_per_group or 256)
        else:
            repartition(
                args.path,
                args.output,
                row_groups_count=args.row_groups,
                rows_per_group=args.rows_per_group,
            )
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = args.output or args.path
    print(f"{out}: {row_groups(out)} row groups")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``workbench`` command and its sub-commands."""
    parser = argparse.ArgumentParser(
        prog="workbench", description=__doc__.splitlines()[0].strip("`")
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_run, _add_ls, _add_scale, _add_sweep, _add_repartition, _add_report):
        add(sub)
    return parser


def _add_run(sub: Any) -> None:
    """``workbench run``: one run, then its summary."""
    run = sub.add_parser(
        "run",
        help="launch one training run and print its summary",
        description="Launch one DDP training run, wait for it, print a summary table.",
    )
    run.add_argument(
        "--executor",
        default="local",
        choices=[name for name, b in BACKENDS.items() if b.on_this_machine],
        help="local: one subprocess per rank; debug: world size 1 in this process",
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue the run named by --run-name from its latest checkpoint",
    )
    _add_config_options(run)
    run.set_defaults(func=_cmd_run)


def _add_ls(sub: Any) -> None:
    """``workbench ls``: the runs in the store."""
    ls = sub.add_parser("ls", help="list runs in the store", description="List runs in the store.")
    ls.add_argument("--output-dir", default="experiments/results", help="root of the result store")
    ls.add_argument("--sweep", action="append", help="only this sweep (repeatable)")
    ls.set_defaults(func=_cmd_ls)


def _add_scale(sub: Any) -> None:
    """``workbench scale``: one config at several world sizes."""
    scale = sub.add_parser(
        "scale",
        help="one config at several world sizes, then a report",
        description="Run one config at several world sizes (one after another), "
        "then write the sweep's offline HTML report.",
    )
    scale.add_argument(
        "--world-sizes",
        type=_world_sizes,
        default=[1, 2],
        help="comma-separated world sizes (default: 1,2)",
    )
    scale.add_argument("--executor", default="local", choices=["local"], help="where the ranks run")
    scale.add_argument(
        "--report", help="HTML file to write (default: <output-dir>/<sweep>/report.html)"
    )
    _add_config_options(scale, skip=("world_size", "nodes", "tasks_per_node", "run_name"))
    scale.set_defaults(func=_cmd_scale)


def _add_sweep(sub: Any) -> None:
    """``workbench sweep``: a YAML grid, one executed notebook per point."""
    sweep = sub.add_parser(
        "sweep",
        help="run a YAML grid of configs, one executed notebook per point",
        description="Run every point of a sweep spec (experiments/sweeps/X.yaml: name, notebook, "
        "executor, fixed and grid RunConfig fields) by executing its notebook with papermill, one "
        "point after another; keep each executed notebook beside its run as notebook.ipynb; then "
        "write <output_dir>/<name>/summary.csv and report.html. Running it again skips the points "
        "that completed and runs failed or interrupted ones again. Exit status: 0 all points "
        "completed, 1 some failed, 2 a bad spec or notebook, 130 interrupted.",
    )
    sweep.add_argument("spec", help="the sweep spec, a YAML file")
    sweep.add_argument(
        "--force", action="store_true", help="run every point again, even completed ones"
    )
    sweep.add_argument(
        "--dry-run",
        action="store_true",
        help="list the points, their run ids and what would run; run nothing",
    )
    sweep.add_argument("--no-progress", action="store_true", help="no progress bar")
    sweep.add_argument("--output-dir", help="root of the result store (default: the spec's)")
    sweep.set_defaults(func=_cmd_sweep)


def _add_repartition(sub: Any) -> None:
    """``workbench repartition``: Parquet row groups."""
    rep = sub.add_parser(
        "repartition",
        help="rewrite a Parquet file with another row-group layout",
        description="Rewrite a Parquet training file so its row groups shard evenly over the "
        "ranks (their number must be a multiple of the processes), or make a synthetic one.",
    )
    rep.add_argument("path", help="the Parquet file")
    rep.add_argument("-o", "--output", help="write here instead of in place")
    rep.add_argument("--row-groups", type=int, help="this many row groups of equal size")
    rep.add_argument("--rows-per-group", type=int, help="this many rows per row group")
    rep.add_argument(
        "--make",
        type=int,
        metavar="ROWS",
        help="instead, write a synthetic classification dataset of ROWS rows",
    )
    rep.set_defaults(func=_cmd_repartition)


def _add_report(sub: Any) -> None:
    """``workbench report``: the offline HTML report."""
    report = sub.add_parser(
        "report",
        help="write one offline HTML report of a sweep or run",
        description="Write a self-contained HTML report (works with no network).",
    )
    report.add_argument("target", help="a sweep name, a sweep folder or a run folder")
    report.add_argument("-o", "--output", default="report.html", help="HTML file to write")
    report.add_argument(
        "--output-dir", default="experiments/results", help="root of the result store"
    )
    report.set_defaults(func=_cmd_report)


def _unrecognized(extra: list[str], parser: argparse.ArgumentParser) -> str:
    """argparse's "unrecognized arguments" message, with the closest option for each flag."""
    options = [s for action in parser._actions for s in action.option_strings]
    hints = []
    for flag in (e.split("=", 1)[0] for e in extra if e.startswith("--")):
        close = difflib.get_close_matches(flag, options, n=1)
        if close:
            hints.append(f"{flag}: did you mean {close[0]}?")
    return f"unrecognized arguments: {' '.join(extra)}" + (
        f" ({'; '.join(hints)})" if hints else ""
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``workbench`` command; returns its exit status."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        sub = parser._subparsers._group_actions[0].choices[args.command]  # type: ignore[union-attr]
        sub.error(_unrecognized(extra, sub))
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
