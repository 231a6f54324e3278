"""What each ``workbench`` sub-command does once its flags are parsed: each returns the exit
status (0 done, 1 a run or point failed, 2 bad input, 130 interrupted)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from pathlib import Path
from typing import Any

from workbench import schema
from workbench.cli.options import config_from_args
from workbench.cli.slurm_flags import SlurmFlagError, slurm_options


def run(args: argparse.Namespace) -> int:
    from workbench.analysis.throughput.summary import per_rank_table
    from workbench.cli import progress
    from workbench.cli.tables import per_rank_text
    from workbench.errors import ConfigError, PreflightError, RunFailedError
    from workbench.run.launch import launch, sbatch_script
    from workbench.store.load import load_traces

    try:
        options = slurm_options(args)
        config = config_from_args(args)
        if args.dry_run:
            print(sbatch_script(config, **options), end="")
            return 0
        handle = launch(config, executor=args.executor, resume=args.resume, **options)
    except (ConfigError, PreflightError, SlurmFlagError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _print_header(handle, args.executor)
    try:
        progress.wait(handle, progress=not args.no_progress)
    except RunFailedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    _print_summary(handle.path)
    steps = load_traces(handle.path, "steps")
    print("per rank: mean of the measured steps, times in ms")
    print(per_rank_text(per_rank_table(steps)))
    print(f"results: {handle.path}")
    return 0


def _print_header(handle: Any, executor: str) -> None:
    """What was launched and where its results go, before the wait."""
    config = handle.config
    steps = (
        "steps set by the script" if config.total_steps is None else f"{config.total_steps:,} steps"
    )
    if config.until_known is not None:
        from workbench.analysis.measured.units import percent

        steps = f"until known to +-{percent(config.until_known)}, at most {steps}"
    nodes = f" on {config.nodes} nodes x {config.tasks_per_node}" if config.nodes > 1 else ""
    print(
        f"run {handle.run_id}: {config.world_size} rank(s){nodes}, {steps}, "
        f"executor={executor}; results in {handle.path}",
        flush=True,
    )


def _print_summary(run_path: Path) -> None:
    """The run's headline figures from run.json: throughput in samples/s, times in ms (the
    evaluation and checkpoint totals in their own unit), FSDP's all-gathers and reduce-scatters
    where traced (then no allreduce column), memory in GiB and per rank in its parts."""
    from workbench.analysis.measured.units import gib, number, percent, rate, seconds
    from workbench.cli.tables import memory_text, until_known_text
    from workbench.store.files import read_json

    record = read_json(run_path / "run.json")
    s = record.get("summary") or {}

    def fmt(key: str, unit: Any = number, scale: float = 1.0) -> str:
        v = s.get(key)
        return "n/a" if v is None else unit(v * scale)

    def duration(v: float) -> str:
        return "0 s" if v == 0 else seconds(v)

    def per_s(key: str) -> str:
        if s.get(key) is None and uncounted:
            return "unknown samples/s"
        return fmt(key, rate).removesuffix("/s") + " samples/s"

    said = [w.get("message", "") for w in record.get("measurement_warnings") or []]
    uncounted = any(schema.SAMPLES_NOT_COUNTED in m for m in said)
    if s.get("incomplete"):
        print(f"incomplete traces, throughput left out: {s['incomplete']}")
    for message in said:  # what could not be measured, and how to tell it
        print(f"note: {message}")
    print(
        f"throughput: {per_s('samples_per_s')}{_interval_text(s)} total end to end, "
        f"{per_s('samples_per_s_per_device')} per device "
        f"({s.get('measured_steps', 0)} measured steps, warm-up excluded"
        + ("; their samples were not counted: see the note above)" if uncounted else ")")
    )
    if record.get("until_known"):
        print(until_known_text(record["until_known"]))
    print(
        f"training alone: {per_s('train_samples_per_s')} "
        f"(evaluation {fmt('window_eval_s', duration)} and checkpoints "
        f"{fmt('window_save_s', duration)} of the window left out)"
    )
    dropped = record.get("dropped_samples_per_epoch")
    if dropped is not None:
        print(f"samples dropped per epoch (to keep every batch full): {dropped}")
    print("\n".join(_step_lines(s, functools.partial(fmt, unit=number, scale=1000))))
    print(f"peak memory: RSS {fmt('peak_rss_bytes', gib)}, CUDA {fmt('peak_cuda_bytes', gib)}")
    parts = memory_text(record.get("memory_parts") or {})
    if parts:
        print(parts)
    metric = s.get("final_metric_name", "metric")
    shown = fmt("final_metric", percent if metric == "accuracy" else number)
    print(f"final loss {fmt('final_loss')}; {metric} {shown}")


def _interval_text(summary: dict[str, Any]) -> str:
    """`` (5,530-5,810, 95 %)`` after the run's throughput, where its steps give an interval."""
    from workbench.analysis.measured.units import rate

    low, high = summary.get("samples_per_s_low"), summary.get("samples_per_s_high")
    if low is None or high is None:
        return ""
    return f" ({rate(low).removesuffix('/s')}-{rate(high).removesuffix('/s')}, 95 %)"


def _step_lines(summary: dict[str, Any], ms: Any) -> list[str]:
    """The step's phases in ms (``ms``: a summary key's value in ms), and FSDP's collectives
    where traced, in place of the allreduce's column."""
    from workbench.cli.tables import fsdp_text

    phases = ["data_s", "forward_s", "backward_s", "optimizer_s", "comm_s", "step_s"]
    fsdp = None if _known(summary.get("mean_comm_s")) else fsdp_text(summary)
    if fsdp:  # FSDP's collectives, not an allreduce
        phases.remove("comm_s")
    line = "step time (ms): " + ", ".join(
        f"{p.replace('_s', '')} {ms('mean_' + p)}" for p in phases
    )
    return [line + f"; between steps {ms('mean_gap_s')}", *([fsdp] if fsdp else [])]


def _known(value: Any) -> bool:
    """Whether a summary figure is a number (not None, not NaN)."""
    return isinstance(value, (int, float)) and value == value


def ls(args: argparse.Namespace) -> int:
    from workbench.cli.tables import runs_text
    from workbench.store.load import load_runs

    runs = load_runs(args.output_dir, args.sweep or None)
    if runs.empty:
        print(f"no runs in {args.output_dir}")
        return 0
    print(runs_text(runs))
    return 0


def report(args: argparse.Namespace) -> int:
    from workbench.cli.progress import report_bar
    from workbench.ui.report import report_from_store

    try:
        with report_bar(progress=not args.no_progress) as bar:
            path = report_from_store(
                args.target,
                args.output,
                output_dir=args.output_dir,
                plotly_js=args.plotly_js,
                progress=bar,
            )
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


def scale(args: argparse.Namespace) -> int:
    from workbench.cli.progress import report_bar
    from workbench.errors import ConfigError, PreflightError
    from workbench.run.study import check_study, scaling_configs
    from workbench.ui.report import report_from_store

    try:
        options = slurm_options(args)
        sizes, per_node = study_sizes(args)
        config = config_from_args(argparse.Namespace(**{**vars(args), "world_size": max(sizes)}))
        configs = scaling_configs(config, sizes, tasks_per_node=per_node)
        if args.dry_run:
            _print_layouts(configs, options)
            return 0
        check_study(configs, args.executor, **options)
    except (ValueError, ConfigError, PreflightError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        handles = _submit(configs, args.executor, options, not args.no_progress, args.budget)
    except PreflightError as exc:  # the executor's options, refused before the first launch
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for handle in handles:
        print(f"{handle.run_id}: {handle.status()}")
    if handles.budget_note():
        print(handles.budget_note())
    report = args.report or str(Path(config.output_dir) / config.sweep / "report.html")
    with report_bar(progress=not args.no_progress) as bar:
        path = report_from_store(config.sweep, report, output_dir=config.output_dir, progress=bar)
    _print_finding(Path(config.output_dir), config.sweep)
    print(f"results: {Path(config.output_dir) / config.sweep}")
    print(f"report: {path}")
    return 0 if all(h.status() == "completed" for h in handles) else 1


def study_sizes(args: argparse.Namespace) -> tuple[list[int], int | None]:
    """The world sizes of ``scale`` and its ranks per node, from ``--world-sizes`` or
    ``--nodes`` (each of ``--tasks-per-node`` ranks, 1 unless given, as ``run --nodes`` takes
    it); a ValueError naming the flags where both are given or a count is below 1."""
    per_node = args.per_node
    if per_node is not None and per_node < 1:
        raise ValueError(f"--tasks-per-node {per_node}: ranks per node, a whole number >= 1")
    if args.node_counts is None:
        return args.world_sizes or [1, 2], per_node
    if args.world_sizes is not None:
        given = ",".join(map(str, args.world_sizes)), ",".join(map(str, args.node_counts))
        raise ValueError(
            f"--world-sizes {given[0]} and --nodes {given[1]}: give the study's sizes one way, "
            "as world sizes or as nodes of --tasks-per-node ranks"
        )
    per_node = per_node or 1
    return [n * per_node for n in args.node_counts], per_node


def _print_layouts(configs: list[Any], options: dict[str, Any]) -> None:
    """The dry run of ``scale``: each layout's sbatch script, as ``launch_array`` submits it (one
    job array per layout, named after the sweep)."""
    from workbench.run.launch import array_sbatch_scripts
    from workbench.run.study import layout_text

    for members, script in array_sbatch_scripts(configs, **options):
        sizes = ", ".join(str(c.world_size) for c in members)
        job = "one job" if len(members) == 1 else f"one job array of {len(members)} runs"
        print(f"# {layout_text(sizes, members[0].nodes, members[0].tasks_per_node)}: {job}")
        print(script)


def _submit(
    configs: list[Any], executor: str, options: dict[str, Any], progress: bool, budget: Any
) -> Any:
    """Run every config and wait for each with a progress bar (the study loop of
    ``run.rounds``: locally one after another, each on the machine to itself; on Slurm a round
    submitted at once, as job arrays); a failed run is reported and the study goes on."""
    from workbench.cli import progress as bars
    from workbench.run.rounds import run_rounds

    def wait(handle: Any, label: str) -> None:
        _print_header(handle, executor)
        bars.wait(handle, desc=label, progress=progress)

    return run_rounds([(c, []) for c in configs], executor, wait, budget_device_s=budget, **options)


def sweep(args: argparse.Namespace) -> int:
    from workbench.errors import ConfigError
    from workbench.sweeps.runner import check_notebook, plan, run_sweep
    from workbench.sweeps.spec import SweepSpec

    try:
        spec = SweepSpec.from_yaml(args.spec)
        if args.output_dir:
            spec = dataclasses.replace(spec, output_dir=args.output_dir)
        if args.executor and args.executor != spec.executor:
            spec = dataclasses.replace(spec, executor=args.executor, executor_options={})
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
        result = run_sweep(
            spec, force=args.force, progress=not args.no_progress, budget_device_s=args.budget
        )
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
    if result.budget_note:
        print(result.budget_note)
    if result.other_runs:
        print(
            f"note: {len(result.other_runs)} run(s) in {result.sweep_dir} are not points of this "
            "spec (an earlier version of it?); the summary and report include them"
        )
    if result.summary_error:
        print(f"error: summary not written: {result.summary_error}", file=sys.stderr)
    if result.summary_path:
        _print_finding(Path(spec.output_dir), spec.name)
        print(f"summary: {result.summary_path}")
        print(f"report: {result.report_path}")
    return 0 if result.ok and not result.summary_error else 1


def _print_finding(output_dir: Path, sweep: str) -> None:
    """The study's finding in plain words, as the report states it."""
    from workbench.analysis.advice.finding import findings
    from workbench.analysis.run_digests import open_steps
    from workbench.store.load import iter_run_dirs, load_runs, load_traces
    from workbench.store.tunes import load_tunes

    runs = load_runs(output_dir, [sweep])
    dirs = list(iter_run_dirs(output_dir, [sweep]))
    evals = load_traces(dirs, "eval")
    with open_steps(dirs, evals) as steps:  # each run's digest, built once it has ended
        said = findings(runs, steps, evals=evals, tunes=load_tunes(dirs))
    if said:
        print("finding:\n  " + "\n  ".join(said))


def repartition(args: argparse.Namespace) -> int:
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
