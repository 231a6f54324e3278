"""The ``workbench`` command: ``run``, ``ls``, ``scale``, ``sweep``, ``repartition``, ``report``,
``predict``, ``tune``.

The parser is here; the flags of the run configuration are :mod:`workbench.cli.options`, and what
each sub-command does is :mod:`workbench.cli.commands`."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from typing import Any

from workbench.cli import commands
from workbench.cli.help import Formatter, examples
from workbench.cli.options import add_config_options, budget, world_sizes
from workbench.cli.predict import add_predict
from workbench.cli.slurm_flags import add_slurm_flags
from workbench.cli.tune import add_tune
from workbench.run.backends import BACKENDS, study_executors


def build_parser() -> argparse.ArgumentParser:
    """The ``workbench`` command and its sub-commands."""
    parser = argparse.ArgumentParser(
        prog="workbench",
        description="Launch, trace and analyse PyTorch DDP scaling studies. "
        "'workbench COMMAND --help' says more about each command.",
        epilog=examples("workbench"),
        formatter_class=Formatter,
    )
    sub = parser.add_subparsers(title="commands", dest="command", required=True, metavar="COMMAND")
    adds = (
        _add_run,
        _add_ls,
        _add_scale,
        _add_sweep,
        _add_repartition,
        _add_report,
        add_predict,
        add_tune,
    )
    for add in adds:
        add(sub)
    return parser


def _add_run(sub: Any) -> None:
    """``workbench run``: one run, then its summary."""
    run = _command(
        sub,
        "run",
        help="launch one training run and print its summary",
        description="Launch one DDP training run, show its progress while it runs, then print "
        "its summary and a table per rank. Every RunConfig field is a flag, in the groups below.",
        usage="%(prog)s [options] [-- SCRIPT_ARGS ...]",
    )
    launching = run.add_argument_group("launch")
    launching.add_argument(
        "--executor",
        default="local",
        choices=list(BACKENDS),
        help="local: one subprocess per rank; debug: world size 1 in this process; pool: "
        "ranks from a warm pool of workers; slurm: one Slurm job (its flags below) "
        "(default: local)",
    )
    launching.add_argument(
        "--resume",
        action="store_true",
        help="continue the run named by --run-name from its latest checkpoint",
    )
    _no_progress(launching)
    add_config_options(run)
    add_slurm_flags(run, layout="--nodes, --tasks-per-node and --time-min")
    run.set_defaults(func=commands.run)


def _add_ls(sub: Any) -> None:
    """``workbench ls``: the runs in the store."""
    ls = _command(sub, "ls", help="list runs in the store", description="List runs in the store.")
    ls.add_argument("--output-dir", default="experiments/results", help="root of the result store")
    ls.add_argument("--sweep", action="append", help="only this sweep (repeatable)")
    ls.set_defaults(func=commands.ls)


def _add_scale(sub: Any) -> None:
    """``workbench scale``: one config at several world sizes."""
    scale = _command(
        sub,
        "scale",
        help="one config at several world sizes, then a report",
        description="Run one config at several world sizes (one after another, each with its "
        "progress), then write the sweep's offline HTML report. The per-device batch stays "
        "fixed (weak scaling) unless --global-batch-size is given (strong scaling). With "
        "--script, your script at each world size, its arguments after --.",
        usage="%(prog)s [options] [-- SCRIPT_ARGS ...]",
    )
    study = scale.add_argument_group(
        "study (its sizes: world sizes, or nodes of --tasks-per-node ranks)",
        "With --tasks-per-node, a node is filled first, then whole nodes: --world-sizes "
        "1,2,4,8,16 --tasks-per-node 4 runs 1, 2 and 4 ranks on one node, then 2 and 4 nodes "
        "of 4; above one node a world size must be a multiple of it. --nodes 1,2,4 "
        "--tasks-per-node 4 says the same in nodes (world size = nodes x tasks per node).",
    )
    study.add_argument(
        "--world-sizes",
        type=world_sizes,
        metavar="N,N,...",
        help="comma-separated world sizes (default: 1,2, unless --nodes is given)",
    )
    study.add_argument(
        "--nodes",
        dest="node_counts",
        type=world_sizes,
        metavar="N,N,...",
        help="comma-separated node counts, each of --tasks-per-node ranks (instead of "
        "--world-sizes)",
    )
    study.add_argument(
        "--tasks-per-node",
        dest="per_node",
        type=int,
        metavar="N",
        help="ranks (devices) per node (default: one node per world size; with --nodes, 1)",
    )
    _study_flags(study)
    _no_progress(study)
    add_config_options(scale, skip=("world_size", "nodes", "tasks_per_node", "run_name"))
    add_slurm_flags(scale, layout="--nodes, --tasks-per-node and --time-min")
    scale.set_defaults(func=commands.scale)


def _study_flags(study: Any) -> None:
    """``scale``'s flags of how the study runs: where, within what budget, its report."""
    study.add_argument(
        "--executor",
        default="local",
        choices=study_executors(),
        help="where the ranks run; local and pool: this machine, one node, one run at a "
        "time; slurm: every world size submitted at once (each round of launches again too), "
        "as one job array per layout (default: local)",
    )
    study.add_argument(
        "--budget",
        type=budget,
        metavar="DEVICE_SECONDS",
        help="stop launching when the study has held this many device-seconds (ranks x "
        "seconds; '2000', '30 device-minutes', '2h') and say which points remain unknown "
        "and by how much; a run measuring until known is capped at what is left "
        "(default: no budget)",
    )
    study.add_argument(
        "--report",
        metavar="HTML",
        help="HTML file to write (default: <output-dir>/<sweep>/report.html)",
    )


def _add_sweep(sub: Any) -> None:
    """``workbench sweep``: a YAML grid, one executed notebook per point."""
    sweep = _command(
        sub,
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
    sweep.add_argument(
        "--budget",
        type=budget,
        metavar="DEVICE_SECONDS",
        help="as scale's: stop when this call has held this many device-seconds (default: "
        "the spec's budget_device_s, else none)",
    )
    sweep.add_argument("--output-dir", help="root of the result store (default: the spec's)")
    sweep.add_argument(
        "--executor",
        choices=list(BACKENDS),
        help="run every point on this executor instead of the spec's, e.g. pool (warm workers: "
        "no imports per rank) or local for a spec written for Slurm; the spec's "
        "executor_options are dropped unless it names the same one (default: the spec's)",
    )
    sweep.set_defaults(func=commands.sweep)


def _add_repartition(sub: Any) -> None:
    """``workbench repartition``: Parquet row groups."""
    rep = _command(
        sub,
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
    rep.set_defaults(func=commands.repartition)


def _add_report(sub: Any) -> None:
    """``workbench report``: the offline HTML report."""
    report = _command(
        sub,
        "report",
        help="write one offline HTML report of a sweep or run",
        description="Write a self-contained HTML report (works with no network).",
    )
    report.add_argument("target", help="a sweep name, a sweep folder or a run folder")
    report.add_argument("-o", "--output", default="report.html", help="HTML file to write")
    report.add_argument(
        "--output-dir", default="experiments/results", help="root of the result store"
    )
    report.add_argument(
        "--plotly-js",
        choices=["inline", "directory"],
        default="inline",
        help="inline: plotly.js inside the file (about 4.8 MB, one file that opens anywhere); "
        "directory: one shared plotly.min.js beside the report, for a folder of many reports",
    )
    _no_progress(report, "a large sweep's report is analysed (shown past 2 s)")
    report.set_defaults(func=commands.report)


def _command(sub: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A sub-command's parser, with the help's formatting and the command's examples."""
    return sub.add_parser(name, epilog=examples(name), formatter_class=Formatter, **kwargs)


def _no_progress(group: Any, while_: str = "a run runs") -> None:
    group.add_argument(
        "--no-progress",
        action="store_true",
        help=f"no progress bar while {while_} (it goes to stderr: a line every few seconds "
        "when stderr is no terminal)",
    )


def _similarity(a: Sequence[str], b: Sequence[str]) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def _unrecognized(extra: list[str], parser: argparse.ArgumentParser) -> str:
    """argparse's "unrecognized arguments" message, with the closest option for each flag."""
    options = [s for action in parser._actions for s in action.option_strings]
    hints = []
    for flag in (e.split("=", 1)[0] for e in extra if e.startswith("--")):
        close = difflib.get_close_matches(flag, options, n=3)
        if close:
            # A transposition (--modle) means the flag with the same letters (--model, not
            # --module): closest by letters first, then by order.
            best = max(close, key=lambda c: _similarity(sorted(flag), sorted(c)))
            hints.append(f"{flag}: did you mean {best}?")
    return f"unrecognized arguments: {' '.join(extra)}" + (
        f" ({'; '.join(hints)})" if hints else ""
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``workbench`` command; returns its exit status."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first `--` is the script's own (`workbench run --script t.py -- ...`).
    script_args = argv[argv.index("--") + 1 :] if "--" in argv else None
    argv = argv[: argv.index("--")] if "--" in argv else argv
    args, extra = parser.parse_known_args(argv)
    if script_args is not None:
        if args.command not in ("run", "scale"):
            extra += ["--", *script_args]
        else:
            args.script_args = script_args
    if extra:
        sub = parser._subparsers._group_actions[0].choices[args.command]  # type: ignore[union-attr,index]
        sub.error(_unrecognized(extra, sub))
    return int(args.func(args))
