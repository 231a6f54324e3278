"""How ``workbench --help`` reads: plain text (no reStructuredText markup), paragraphs wrapped
but example blocks kept as written, on/off flags shown as ``--x, --no-x``, and the examples
under each command."""

from __future__ import annotations

import argparse
import re
import textwrap
from collections.abc import Callable
from typing import Any

#: Examples shown under ``workbench --help`` and each sub-command's ``--help``.
EXAMPLES: dict[str, str] = {
    "workbench": """\
  workbench run --model mlp --world-size 2 --steps 50      one run, then its summary
  workbench run --script train.py --world-size 2 -- --epochs 1   your own script, traced
  workbench scale --world-sizes 1,2,4 --steps 40 --sweep study1   then a report
  workbench sweep experiments/sweeps/quickstart.yaml       a YAML grid, one notebook per point
  workbench ls                                             the runs in the store
  workbench report study1 -o study1.html                   one HTML file, works offline
  workbench predict study1 --world-sizes 8,64 --busbw 9.5GB/s   what if: more ranks, a network
  workbench tune RUN_ID --budget 10m                       try what the finding suggests, measured
  workbench run --help                                     every flag of a run, grouped""",
    "run": """\
  workbench run --model mlp --world-size 2 --steps 50
  workbench run --model transformer --world-size 2 --global-batch-size 64 --precision bf16
  workbench run --comm-hook powersgd --powersgd-rank 2 --static-graph --world-size 4
  workbench run --run-name long1 --epochs 5 --checkpoint-every-steps 100
  workbench run --run-name long1 --epochs 5 --resume        continue it from its checkpoint
  workbench run --model-options '{"size": "distilbert"}' --model transformer
  workbench run --script train.py --world-size 2 -- --lr 0.1    your script, its args after --
  workbench run --module mypkg.train --world-size 2 --sweep mine   as python -m mypkg.train
  workbench run --executor slurm --nodes 2 --tasks-per-node 8 --partition gpu --dry-run
  workbench run --executor slurm --world-size 8 --partition gpu --time-min 30   one Slurm job""",
    "ls": """\
  workbench ls
  workbench ls --sweep study1 --sweep study2
  workbench ls --output-dir ../results""",
    "scale": """\
  workbench scale --world-sizes 1,2,4 --steps 40 --sweep study1
  workbench scale --world-sizes 1,2 --global-batch-size 256 --sweep strong   strong scaling
  workbench scale --model transformer --world-sizes 1,2 --report study.html
  workbench scale --script train.py --world-sizes 1,2 --sweep mine -- --steps 40
  workbench scale --executor slurm --world-sizes 1,2,4,8 --partition gpu   all queued at once
  workbench scale --executor slurm --world-sizes 1,2,4,8,16 --tasks-per-node 4 --partition gpu
  workbench scale --executor slurm --nodes 1,2,4 --tasks-per-node 4 --partition gpu --dry-run""",
    "sweep": """\
  workbench sweep experiments/sweeps/quickstart.yaml
  workbench sweep experiments/sweeps/comm_hooks.yaml --dry-run
  workbench sweep experiments/sweeps/comm_hooks.yaml --force --output-dir results2
  workbench sweep experiments/sweeps/quickstart.yaml --executor pool""",
    "repartition": """\
  workbench repartition train.parquet --make 100000          a synthetic dataset
  workbench repartition train.parquet --row-groups 8         shards evenly over 1, 2, 4, 8
  workbench repartition train.parquet --rows-per-group 512 -o even.parquet""",
    "report": """\
  workbench report study1 -o study1.html
  workbench report experiments/results/study1/mlp-w2-20250101-120000-a1b2 -o one.html""",
    "tune": """\
  workbench tune mlp-w2-20261125-061816-a639
  workbench tune mlp-w2-20261125-061816-a639 --budget 5m --repeats 4 --json
  workbench tune experiments/results/quickstart-sweep/w2_mlp-3f2a --top 2
  workbench tune RUN_ID --executor slurm --partition gpu --account proj   short runs as jobs""",
    "predict": """\
  workbench predict quickstart-sweep --world-sizes 2,8,64 --busbw 9.5GB/s --latency 5us
  workbench predict study1 --world-sizes 16 --bandwidth 25Gbit/s --json
  workbench predict study1 --nodes 4,8 --busbw 1.2GB/s           a sweep of 1- and 2-node runs
  workbench predict study1 --world-sizes 4,8 --strategy fsdp,ddp --device-memory 80GB   what fits
  workbench predict experiments/results/study1 --world-sizes 4,8 --busbw 2.5e9""",
}

_RST = (
    (re.compile(r":[\w:]+:`~?([^`]*)`"), r"\1"),  # :mod:`x`, :func:`~a.b`
    (re.compile(r"``([^`]*)``"), r"\1"),
    (re.compile(r"`([^`]*)`"), r"\1"),
)


def plain(text: str) -> str:
    """``text`` without reStructuredText markup, as argparse prints it: ``x`` and :mod:`x` become
    x; a ``%`` is escaped (argparse formats help with %)."""
    for pattern, repl in _RST:
        text = pattern.sub(repl, text)
    return text.replace("%", "%%")


def examples(command: str) -> str:
    """The epilog of ``command``: its examples."""
    return "examples:\n" + EXAMPLES[command]


class Switch(argparse.BooleanOptionalAction):
    """An on/off flag: ``--x`` on, ``--no-x`` off; ``--x true|false`` is still accepted, so
    scripts that gave the value keep working."""

    def __init__(
        self, option_strings: list[str], dest: str, convert: Callable[[str], Any], **kwargs: Any
    ) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.nargs = "?"
        self.type = convert  # set after, since BooleanOptionalAction no longer takes a type

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        if option_string is not None and option_string.startswith("--no-"):
            if values is not None:
                raise argparse.ArgumentError(self, f"takes no value, got {values!r}")
            setattr(namespace, self.dest, False)
        else:
            setattr(namespace, self.dest, True if values is None else values)


class Formatter(argparse.HelpFormatter):
    """argparse's help, with paragraphs wrapped (never inside a ``--flag-name``) but indented
    blocks (examples) kept as written, and an on/off flag shown as ``--x, --no-x``."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for block in text.split("\n\n"):
            if any(line.startswith("  ") for line in block.splitlines()):
                paragraphs.append(textwrap.indent(block, indent))
            else:
                words = " ".join(block.split())
                paragraphs.append(
                    textwrap.fill(
                        words,
                        width,
                        initial_indent=indent,
                        subsequent_indent=indent,
                        break_on_hyphens=False,
                    )
                )
        return "\n\n".join(paragraphs)

    def _split_lines(self, text: str, width: int) -> list[str]:
        """An option's help in lines, never broken inside a word (a ``--flag-name``)."""
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, Switch):
            return ", ".join(action.option_strings)
        return super()._format_action_invocation(action)
