"""Slurm from the terminal: the Slurm back end's options as flags of ``run``, ``scale`` and
``tune`` (``--partition``, ``--account``, ``--gpus-per-node``, ``--setup``, ``--sbatch-arg``,
...), checked before anything is submitted, and ``--dry-run``, which prints the sbatch script
instead of submitting it. The flags are the keyword arguments of
``launch(config, executor="slurm", ...)`` (``workbench.run.backends.slurm.SLURM_OPTIONS``)."""

from __future__ import annotations

import argparse
from typing import Any

from workbench.run.backends import backend

#: Flags whose value is one option as it is (text or a number): (flag, option, type, metavar,
#: help).
_SCALARS: tuple[tuple[str, str, Any, str, str], ...] = (
    ("--partition", "partition", str, "NAME", "partition (queue) to submit to"),
    ("--account", "account", str, "NAME", "account to charge"),
    ("--qos", "qos", str, "NAME", "quality of service"),
    ("--gpus-per-node", "gpus_per_node", int, "N", "GPUs per node (default: the ranks per node "
     "when {device} is cuda, else 0)"),
    ("--cpus-per-task", "cpus_per_task", int, "N", "CPUs per rank (default: {threads})"),
    ("--mem-gb", "mem_gb", int, "GB", "memory per node in GB (a whole number, as sbatch takes)"),
    ("--constraint", "constraint", str, "FEATURES", "node features, e.g. a100"),
    ("--poll-s", "poll_s", float, "S", "seconds between squeue checks while waiting (default "
     "30: be gentle with the scheduler)"),
)  # fmt: skip
#: Flags given once per value: (flag, option, metavar, help).
_LISTS: tuple[tuple[str, str, str, str], ...] = (
    ("--setup", "setup", "LINE", "a shell line run before srun, e.g. 'module load cuda/12.4' "
     "(repeatable, in order)"),
    ("--sbatch-arg", "sbatch_args", "KEY[=VALUE]", "an extra #SBATCH option, e.g. "
     "reservation=r1 or exclusive, or as sbatch spells it: --sbatch-arg=--exclusive "
     "(repeatable)"),
    ("--srun-arg", "srun_args", "ARG", "an extra srun argument, e.g. --cpu-bind=cores "
     "(repeatable; write it as --srun-arg=--cpu-bind=cores)"),
    ("--env", "env", "KEY=VALUE", "an environment variable for every rank, e.g. NCCL_DEBUG=INFO "
     "(repeatable)"),
)  # fmt: skip
_DESTS = [s[1] for s in _SCALARS] + [s[1] for s in _LISTS]
_FLAGS = {s[1]: s[0] for s in (*_SCALARS, *_LISTS)}


class SlurmFlagError(ValueError):
    """A Slurm flag given wrongly: which flag, what was given, what is allowed."""


def add_slurm_flags(
    parser: argparse.ArgumentParser, dry_run: bool = True, layout: str | None = None
) -> None:
    """The Slurm options as a group of flags (and ``--dry-run`` where ``dry_run``); ``layout``
    names the command's own flags for the nodes, ranks per node and time limit, where it has
    them (its help names no flag it does not take)."""
    said = f"; nodes, ranks per node and the time limit are {layout}" if layout else ""
    group = parser.add_argument_group(
        "Slurm (with --executor slurm; from a login node)", f"The job's resources and set-up{said}."
    )
    # The run's own flags where the command has them (added before), else the run's fields.
    has = parser._option_string_actions
    words = {
        "device": "--device" if "--device" in has else "the run's device",
        "threads": "--threads-per-rank" if "--threads-per-rank" in has else "threads_per_rank",
    }
    for flag, dest, kind, metavar, help_ in _SCALARS:
        group.add_argument(flag, dest=dest, type=kind, metavar=metavar, help=help_.format(**words))
    for flag, dest, metavar, help_ in _LISTS:
        group.add_argument(flag, dest=dest, action="append", metavar=metavar, help=help_)
    if dry_run:
        group.add_argument(
            "--dry-run",
            action="store_true",
            help="print the sbatch script that would be submitted (scale: one per layout) and "
            "submit nothing",
        )


def slurm_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``launch`` options the Slurm flags give (``{}`` where none was given); a
    :class:`SlurmFlagError` where one is malformed or given without ``--executor slurm``."""
    given = {d: getattr(args, d) for d in _DESTS if getattr(args, d, None) is not None}
    back_end = backend(args.executor)
    if set(given) - set(back_end.options):
        flags = ", ".join(_FLAGS[d] for d in given if d not in back_end.options)
        raise SlurmFlagError(
            f"{flags}: Slurm options, given with --executor {args.executor}; add "
            "--executor slurm, or leave them out"
        )
    if getattr(args, "dry_run", False) and not back_end.job_script:
        raise SlurmFlagError(
            f"--dry-run: prints the sbatch script of --executor slurm; with --executor "
            f"{args.executor} there is none (leave --dry-run out)"
        )
    options: dict[str, Any] = {
        d: v for d, v in given.items() if d not in ("sbatch_args", "env", "srun_args")
    }
    if "setup" in options:
        options["setup"] = list(options["setup"])
    if "srun_args" in given:
        options["srun_args"] = list(given["srun_args"])
    if "sbatch_args" in given:
        options["sbatch_args"] = dict(_sbatch_arg(text) for text in given["sbatch_args"])
    if "env" in given:
        options["env"] = dict(_variable(text) for text in given["env"])
    return options


def _sbatch_arg(text: str) -> tuple[str, Any]:
    """``reservation=r1`` (or ``--reservation=r1``) as ``("reservation", "r1")``; a bare
    ``exclusive`` as ``("exclusive", True)``."""
    key, sep, value = text.lstrip("-").partition("=")
    if not key or " " in key:
        raise SlurmFlagError(
            f"--sbatch-arg {text!r}: expected KEY=VALUE or KEY (an sbatch option without its "
            "dashes, e.g. reservation=r1 or exclusive)"
        )
    return key, value if sep else True


def _variable(text: str) -> tuple[str, str]:
    """``NCCL_DEBUG=INFO`` as ``("NCCL_DEBUG", "INFO")``."""
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise SlurmFlagError(
            f"--env {text!r}: expected NAME=VALUE with NAME a variable name, e.g. NCCL_DEBUG=INFO"
        )
    return key, value
