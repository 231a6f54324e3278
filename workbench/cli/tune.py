"""``workbench tune``: try what a run's diagnosis calls for, predicted first, then measured."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from workbench.cli.help import Formatter, examples
from workbench.cli.slurm_flags import SlurmFlagError, add_slurm_flags, slurm_options
from workbench.run.backends import study_executors

_DURATION = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def duration(text: str) -> float:
    """Seconds from ``10m``, ``90s``, ``1.5h`` or a plain number of seconds."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|m|min|h)?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a duration such as 10m, 90s, 1h")
    return float(match.group(1)) * _DURATION[match.group(2) or "s"]


def add_tune(sub: Any) -> None:
    """The ``tune`` sub-command's parser."""
    parser = sub.add_parser(
        "tune",
        help="try what a run's finding suggests, predicted then measured",
        description="From a completed run: the changes its diagnosis calls for "
        "(communication-bound: bucket size, compression hooks, gradient_as_bucket_view, "
        "static_graph, a larger per-device batch, gradient accumulation), each predicted by "
        "the scaling model, then, in the finding's order, run short on warm workers as "
        "interleaved pairs with the base and measured with a 95 %% interval. Predictions "
        "below the noise are skipped and said so; the tune stops at the budget. Exit status: "
        "0 done, 1 a short run failed, 2 bad input (nothing launched).",
        epilog=examples("tune"),
        formatter_class=Formatter,
    )
    parser.add_argument("run", help="a run id (under --output-dir) or a run folder")
    parser.add_argument(
        "--output-dir", default="experiments/results", help="root of the result store"
    )
    parser.add_argument(
        "--budget", type=duration, default=600.0, help="time for the short runs (default 10m)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="interleaved pairs per candidate (default 3; as many again to confirm a change)",
    )
    parser.add_argument(
        "--executor",
        default="pool",
        choices=study_executors(),
        help="where the short runs run: pool (warm workers here), local, or slurm (one job "
        "each, with the flags below) (default: pool)",
    )
    parser.add_argument("--top", type=int, help="measure at most this many candidates")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument("--no-progress", action="store_true", help="no progress lines")
    add_slurm_flags(parser, dry_run=False)
    parser.set_defaults(func=tune_command)


def tune_command(args: argparse.Namespace) -> int:
    from workbench.errors import ConfigError, PreflightError, RunFailedError
    from workbench.tune import TuneError, tune
    from workbench.tune.render import report_text

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        result = tune(
            args.run,
            output_dir=args.output_dir,
            budget_s=args.budget,
            repeats=args.repeats,
            executor=args.executor,
            executor_options=slurm_options(args),
            top=args.top,
            progress=None if args.no_progress else say,
        )
    except (TuneError, ConfigError, PreflightError, SlurmFlagError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RunFailedError as exc:
        print(f"error: a short run failed: {exc}", file=sys.stderr)
        return 1
    data = result.to_dict()
    if args.json:
        out = {
            "base": data["base"],
            "candidates": [{k: c.get(k) for k in _JSON_KEYS} for c in data["candidates"]],
            "best": data["best"],
        }
        print(json.dumps(out, indent=2))
        return 0
    print(report_text(data))
    return 0


_JSON_KEYS = (
    "change",
    "label",
    "predicted_gain",
    "measured_gain",
    "low",
    "high",
    "verdict",
    "why",
    "changes_math",
)
