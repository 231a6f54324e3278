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
        help="predict a sweep's throughput at other world sizes (on its own network, or one given)",
        description="From a sweep's completed runs, the scaling model's throughput, step time "
        "(compute and exposed communication), speedup and efficiency at the given world sizes "
        "on the given network (none given: more ranks on the network the runs measured on "
        "their own machine); low and high are a 95 %% interval: the model's own error on "
        "the sweep's measured world sizes (at least 2 %%) and the runs' own intervals. It "
        "needs a multi-rank run (its gradient bytes and "
        "its overlap). A config's runs on one node and on several are one curve: compute "
        "from its smallest run, each link class (within a node, across nodes) from the runs "
        "that crossed it.",
        epilog=examples("predict"),
        formatter_class=Formatter,
    )
    parser.add_argument("sweep", help="a sweep name (under --output-dir) or a sweep folder")
    parser.add_argument(
        "--output-dir", default="experiments/results", help="root of the result store"
    )
    where = parser.add_argument_group("where (world sizes, or nodes of --per-node ranks)")
    where.add_argument("--world-sizes", type=world_sizes, help="comma-separated, e.g. 2,8,64")
    where.add_argument(
        "--nodes",
        type=world_sizes,
        metavar="N,N,...",
        help="comma-separated node counts, e.g. 4,8: world size = nodes x --per-node",
    )
    where.add_argument(
        "--per-node",
        type=int,
        metavar="P",
        help="ranks (GPUs) a node: the network then has two link classes, within a node "
        "(--intra-busbw or --intra-bandwidth; default: as the sweep's runs measured it on "
        "their machine; none with 1) and across nodes (--busbw or --bandwidth); with --nodes, "
        "default: the ranks a node of the sweep's runs on more than one node",
    )
    _add_strategies(parser)
    net = parser.add_argument_group(
        "the network, across nodes where --per-node is given (one of; default: as the runs "
        "measured it, per link class; needed with --per-node or --nodes)"
    ).add_mutually_exclusive_group()
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
    _add_intra(parser)
    parser.add_argument("--json", action="store_true", help="a JSON list, one object per row")
    parser.set_defaults(func=predict_command)


def _add_intra(parser: argparse.ArgumentParser) -> None:
    """The link within a node."""
    intra = parser.add_argument_group("within a node (with --per-node; at most one)")
    one = intra.add_mutually_exclusive_group()
    one.add_argument("--intra-busbw", help="bus bandwidth inside one node, e.g. 150GB/s")
    one.add_argument("--intra-bandwidth", help="a link rate inside one node, e.g. 600Gbit/s")
    intra.add_argument(
        "--intra-latency", default="0", help="per hop and bucket inside a node (default 0)"
    )


def _add_strategies(parser: argparse.ArgumentParser) -> None:
    """``--strategy`` and ``--device-memory``."""
    strategies = parser.add_argument_group("strategies (DDP or FSDP, and what fits)")
    strategies.add_argument(
        "--strategy",
        type=_strategies,
        metavar="S,S",
        help="compare strategies, e.g. fsdp,ddp: each one's throughput, step time and memory "
        "per rank at each size, from the sweep's runs of either (the default for a sweep with "
        "FSDP runs: its own strategies); without a network given, on the one the runs measured",
    )
    strategies.add_argument(
        "--device-memory",
        metavar="BYTES",
        help="a device's memory, e.g. 80GB or 141GiB: say which strategy fits at each size "
        "(parameters, gradients, optimizer state, the working set and the activations saved for "
        "backward, at each size's micro-batch; where the runs did not count them, without)",
    )


#: What ``predict`` says of the network when none is given.
MEASURED_NETWORK = "as the runs measured it on their own machine, per link class"


def _strategies(text: str) -> list[str]:
    """``fsdp,ddp`` as a list, each a strategy the model knows."""
    from workbench.analysis.model.memory import STRATEGIES

    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in STRATEGIES]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"{text!r}: comma-separated strategies, each one of {', '.join(STRATEGIES)}"
        )
    return list(dict.fromkeys(names))


def _load(sweep: str, output_dir: str) -> tuple[Any, Any]:
    from workbench.analysis.run_digests import open_steps
    from workbench.store.load import iter_run_dirs, load_runs, load_traces

    root, names = _where(sweep, output_dir)
    runs = load_runs(root, names)
    if runs.empty:
        raise ValueError(f"no runs of sweep {names[0]!r} under {root}")
    dirs = iter_run_dirs(root, names)
    # the runs' digests (built once each run has ended), with the evaluations as the report
    # counts them
    return runs, open_steps(dirs, load_traces(dirs, "eval"))


def _dirs(sweep: str, output_dir: str) -> list[Path]:
    from workbench.store.load import iter_run_dirs

    return iter_run_dirs(*_where(sweep, output_dir))


def _where(sweep: str, output_dir: str) -> tuple[Path, list[str]]:
    """(store, [sweep name]): a sweep of the store under ``output_dir``, else a sweep folder
    (a folder of the working directory that happens to share the sweep's name is not it)."""
    path = Path(sweep)
    if (Path(output_dir) / sweep).is_dir() or not path.is_dir():
        return Path(output_dir), [sweep]
    return path.parent, [path.name]


def _network(busbw: str | None, bandwidth: str | None, latency: str) -> Any:
    """One link class from its flags: a bus bandwidth or a link rate, and a latency."""
    from workbench.analysis.model.predict import parse_rate, parse_seconds, target_network

    return target_network(
        busbw_bytes_per_s=parse_rate(busbw) if busbw else None,
        link_bits_per_s=parse_rate(bandwidth, bits=True) * 8 if bandwidth else None,
        latency_s=parse_seconds(latency),
    )


def _check_where(args: argparse.Namespace) -> None:
    """A ValueError naming the flags of where to predict that do not fit together."""
    if (args.world_sizes is None) == (args.nodes is None):
        raise ValueError("give --world-sizes, or --nodes (exactly one of them)")
    if args.per_node is not None and args.per_node < 1:
        raise ValueError(f"--per-node {args.per_node}: ranks a node, 1 or more")
    if args.per_node is None and (args.intra_busbw or args.intra_bandwidth):
        raise ValueError("--intra-busbw/--intra-bandwidth needs --per-node (ranks a node)")


def _world_sizes(args: argparse.Namespace, per_node: int | None) -> list[int]:
    """The world sizes asked for: ``--world-sizes``, or ``--nodes`` x ranks a node."""
    if args.nodes is not None and per_node is not None:
        return [n * per_node for n in args.nodes]
    return list(args.world_sizes)


def _clean(value: Any) -> Any:
    """JSON-safe: NaN as null, numpy numbers as Python's."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _predict(args: argparse.Namespace) -> tuple[Any, Any, list[int], list[str] | None, Any]:
    """The table, the network, the world sizes, the strategies compared (None: the plain
    prediction) and the device memory asked about; ValueError for what does not fit."""
    from workbench.analysis.model.predict import (
        parse_bytes,
        predict,
        sweep_ranks_per_node,
        target_cluster,
    )
    from workbench.analysis.model.strategies import compare_strategies
    from workbench.analysis.model.strategy_words import own_strategies
    from workbench.store.load import parameter_layouts

    _check_where(args)
    given = bool(args.busbw or args.bandwidth)
    network = _network(args.busbw, args.bandwidth, args.latency) if given else None
    memory = parse_bytes(args.device_memory) if args.device_memory else None
    intra = None
    if args.intra_busbw or args.intra_bandwidth:
        intra = _network(args.intra_busbw, args.intra_bandwidth, args.intra_latency)
    runs, steps = _load(args.sweep, args.output_dir)
    with steps:
        strategies = args.strategy or own_strategies(runs, memory)
        per_node = args.per_node
        if per_node is None and args.nodes is not None:
            per_node = sweep_ranks_per_node(runs)
        if network is None and per_node:
            raise ValueError(
                "give the network across nodes: --busbw or --bandwidth (without them, and "
                "without --per-node and --nodes, more ranks on the network the runs measured)"
            )
        if per_node:
            assert network is not None  # said above
            network = target_cluster(network, per_node, intra, runs, steps)
        sizes = _world_sizes(args, per_node)
        if strategies:
            layouts = parameter_layouts(_dirs(args.sweep, args.output_dir))
            table = compare_strategies(runs, steps, layouts, sizes, strategies, network, memory)
        else:
            table = predict(runs, steps, sizes, network)
    return table, network, sizes, strategies, memory


def predict_command(args: argparse.Namespace) -> int:
    from workbench.analysis.model.predict import PredictionError
    from workbench.analysis.model.strategy_words import strategy_lines
    from workbench.ui.what_if import prediction_lines

    try:
        table, network, sizes, strategies, memory = _predict(args)
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
    if strategies:
        print("\n".join(strategy_lines(table, sizes, memory, network)))
        return 0
    print(f"network: {network.description if network else MEASURED_NETWORK}")
    print("\n".join(prediction_lines(table)))
    return 0
