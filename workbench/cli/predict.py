"""``workbench predict``: a sweep's throughput at other world sizes on a given network."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from workbench.cli.help import Formatter, examples
from workbench.cli.options import world_sizes


def add_predict(sub: Any) -> None:
    """The ``predict`` sub-command's parser."""
    parser = sub.add_parser(
        "predict",
        help="predict a sweep's throughput at other world sizes on a given network",
        description="From a sweep's completed runs, the scaling model's throughput, step time "
        "(compute and exposed communication), speedup and efficiency at the given world sizes "
        "on the given network; low and high bound the throughput by the model's own error on "
        "the sweep's measured world sizes. It needs a multi-rank run (its gradient bytes and "
        "its overlap).",
        epilog=examples("predict"),
        formatter_class=Formatter,
    )
    parser.add_argument("sweep", help="a sweep name (under --output-dir) or a sweep folder")
    parser.add_argument(
        "--output-dir", default="experiments/results", help="root of the result store"
    )
    parser.add_argument(
        "--world-sizes", type=world_sizes, required=True, help="comma-separated, e.g. 2,8,64"
    )
    net = parser.add_argument_group("the network (one of)").add_mutually_exclusive_group(
        required=True
    )
    net.add_argument(
        "--busbw",
        help="allreduce bus bandwidth in nccl-tests' terms (what nccl-tests or the workbench's "
        "network benchmark reports on the target cluster), e.g. 9.5GB/s; a plain number is "
        "bytes per second",
    )
    net.add_argument(
        "--bandwidth",
        help="a link rate, e.g. 10Gbit/s or 25Gb/s, converted as bus bandwidth = rate / 8 "
        "(an ideal ring: an upper bound; prefer a measured --busbw)",
    )
    parser.add_argument("--latency", default="0", help="per hop and bucket, e.g. 5us (default 0)")
    parser.add_argument("--json", action="store_true", help="a JSON list, one object per row")
    parser.set_defaults(func=predict_command)


def _load(sweep: str, output_dir: str) -> tuple[Any, Any]:
    from workbench.analysis.stored import StoredSteps
    from workbench.store.load import iter_run_dirs, load_runs

    path = Path(sweep)
    root, name = (path.parent, path.name) if path.is_dir() else (Path(output_dir), sweep)
    runs = load_runs(root, [name])
    if runs.empty:
        raise ValueError(f"no runs of sweep {name!r} under {root}")
    return runs, StoredSteps(iter_run_dirs(root, [name]))  # the rows stay in the engine


def _clean(value: Any) -> Any:
    """JSON-safe: NaN as null, numpy numbers as Python's."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def predict_command(args: argparse.Namespace) -> int:
    from workbench.analysis.predict import (
        PredictionError,
        parse_rate,
        parse_seconds,
        predict,
        target_network,
    )
    from workbench.ui.what_if import prediction_lines

    try:
        network = target_network(
            busbw_bytes_per_s=parse_rate(args.busbw) if args.busbw else None,
            link_bits_per_s=parse_rate(args.bandwidth, bits=True) * 8 if args.bandwidth else None,
            latency_s=parse_seconds(args.latency),
        )
        runs, steps = _load(args.sweep, args.output_dir)
        with steps:
            table = predict(runs, steps, args.world_sizes, network)
    except PredictionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        rows = [{k: _clean(v) for k, v in row.items()} for row in table.to_dict("records")]
        print(json.dumps(rows, indent=2))
        return 0
    print(f"network: {network.description}")
    print("\n".join(prediction_lines(table)))
    return 0
