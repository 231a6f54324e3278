"""``workbench --help`` as a person reads it: the run's flags in named groups, the choices
listed, on/off flags as ``--x/--no-x``, the test-only ``--fault`` hidden but working, examples
under every command (each one a command the parser accepts), and no reStructuredText markup."""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex

import pytest

from workbench.cli import build_parser, main
from workbench.cli.commands import study_sizes
from workbench.cli.help import EXAMPLES
from workbench.cli.options import config_from_args
from workbench.config.fault import FaultInjection
from workbench.config.run_config import RunConfig
from workbench.run.study import scaling_configs

COMMANDS = ("run", "ls", "scale", "sweep", "repartition", "report")
RUN_GROUPS = (
    "launch:",
    "naming and storage:",
    "model and data:",
    "layout (ranks and devices):",
    "batch:",
    "schedule and optimizer:",
    "DDP:",
    "FSDP:",
    "evaluation:",
    "robustness (checkpoints, timeouts, preemption):",
    "tracing:",
)


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """One width for every help, so a flag and its metavar stay on one line."""
    monkeypatch.setenv("COLUMNS", "100")


def help_of(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_run_help_groups_the_flags_and_lists_the_choices(capsys) -> None:
    text = help_of(capsys, "run")
    assert text.startswith("usage: workbench run [options] [-- SCRIPT_ARGS ...]\n"), text[:200]
    headings = [line for line in text.splitlines() if line and not line.startswith(" ")]
    for group in RUN_GROUPS:
        assert group in headings, f"no {group!r} group in:\n{headings}"
    assert "other settings:" not in headings, "a RunConfig field has no group of its own"
    for listed in (
        "--executor {local,debug",
        "--device {auto,cpu,cuda}",
        "--backend {auto,gloo,nccl}",
        "--strategy {ddp,fsdp,dp,single}",
        "--precision {fp32,fp16,bf16}",
        "--comm-hook {allreduce,fp16,bf16,powersgd}",
        "--lr-scaling {none,linear,sqrt}",
        "--optimizer {sgd,adamw}",
        "--eval-on {all,rank0}",
        "--trace-comm {sampled,hook,off}",
        "--model {mlp,cnn,transformer,gpt,planted,MODULE:FACTORY}",
    ):
        assert listed in text, f"{listed!r} not in run --help"
    # the DDP group holds the DDP knobs, the tracing group the tracing ones
    ddp = text.split("\nDDP:\n")[1].split("\n\n")[0]
    assert "--bucket-cap-mb" in ddp and "--comm-hook" in ddp and "--eval-on" not in ddp
    tracing = text.split("\ntracing:\n")[1].split("\n\n")[0]
    assert "--trace-comm " in tracing and "--profile-steps" in tracing


def test_on_off_flags_take_no_value_in_help(capsys) -> None:
    text = help_of(capsys, "run")
    for name in ("static-graph", "eval-at-end", "network-benchmark", "sync-batchnorm"):
        assert f"--{name}, --no-{name}\n" in text, name
    assert "STATIC_GRAPH" not in text and "EVAL_AT_END" not in text
    assert "(default: on)" in text.split("--eval-at-end, --no-eval-at-end")[1].split("\n  --")[0]


def test_static_graph_on_and_off_reach_the_config() -> None:
    parser = build_parser()

    def config(*flags: str) -> RunConfig:
        return config_from_args(parser.parse_args(["run", *flags]))

    assert config().static_graph is False, "RunConfig's default when the flag is not given"
    assert config("--static-graph").static_graph is True
    assert config("--static-graph", "--no-static-graph").static_graph is False, "the last wins"
    assert config("--no-static-graph", "--static-graph").static_graph is True
    assert config("--static-graph", "false").static_graph is False, "a value is still accepted"
    assert config("--no-eval-at-end").eval_at_end is False
    assert config("--eval-at-end=yes").eval_at_end is True


def test_an_off_flag_refuses_a_value(capsys) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["run", "--no-static-graph", "true"])
    assert refused.value.code == 2
    assert "--no-static-graph" in capsys.readouterr().err


def test_fault_is_hidden_from_help_but_accepted(capsys) -> None:
    for command in ("run", "scale"):
        assert "--fault" not in help_of(capsys, command), command
    args = build_parser().parse_args(
        ["run", "--fault", '{"rank": 1, "step": 3, "kind": "exit"}', "--world-size", "2"]
    )
    assert config_from_args(args).fault == FaultInjection(rank=1, step=3, kind="exit")


def test_every_command_has_examples_and_no_markup(capsys) -> None:
    top = help_of(capsys)
    assert "\nexamples:\n  workbench run --model mlp --world-size 2 --steps 50" in top
    assert "\ncommands:\n" in top
    for command in COMMANDS:
        text = help_of(capsys, command)
        examples = text.split("\nexamples:\n")[1]
        assert examples.lstrip().startswith(f"workbench {command}"), (command, examples[:100])
    for text in [top] + [help_of(capsys, c) for c in COMMANDS]:
        assert "``" not in text and ":mod:" not in text and ":func:" not in text


@pytest.mark.parametrize("command", sorted(EXAMPLES))
def test_every_example_is_a_command_the_parser_accepts(command: str) -> None:
    """The words after each example (three spaces or more from it) explain it."""
    parser = build_parser()
    for line in EXAMPLES[command].splitlines():
        argv = shlex.split(re.split(r"\s{3,}", line.strip())[0])
        assert argv[0] == "workbench", line
        if "--help" in argv:
            continue
        script_args = argv[argv.index("--") + 1 :] if "--" in argv else []
        argv = argv[: argv.index("--")] if "--" in argv else argv
        args, extra = parser.parse_known_args(argv[1:])
        assert not extra, f"{line!r}: {extra}"
        if script_args:
            args.script_args = script_args
        if args.command == "scale":
            sizes, per_node = study_sizes(args)
            args.world_size = max(sizes)
            scaling_configs(config_from_args(args), sizes, tasks_per_node=per_node)  # valid too
        elif args.command == "run":
            config_from_args(args)  # a valid RunConfig too


def test_every_settable_field_still_has_a_flag() -> None:
    parser = build_parser()
    run = parser._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    dests = {a.dest for a in run._actions}
    fields = {f.name for f in dataclasses.fields(RunConfig) if f.init}
    assert fields <= dests, sorted(fields - dests)


# -- every flag a help names is one its command takes

#: Flags of other programs that help names on purpose, each passed through a flag of ours:
#: srun's (``--srun-arg=--cpu-bind=cores``) and sbatch's (``--sbatch-arg=--exclusive``).
OTHER_PROGRAMS = {"--cpu-bind": "srun", "--exclusive": "sbatch"}
FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")
#: A bare ``--`` on an example line: what follows is the script's own arguments.
SCRIPT_ARGS = re.compile(r"(?:^|\s)--(?:\s|$)")


def sub_commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each sub-command's parser, as the parser itself holds them (a new one is included)."""
    (found,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(found.choices)


def unaccepted_flags(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """``(command, flag)`` for every ``--flag`` the help of ``parser`` or of one of its
    sub-commands names (options, descriptions, epilog examples) that the command's parser does
    not take exactly (an abbreviation argparse would accept is not the flag it names). A line
    that starts an example (``workbench CMD ...``) is judged by CMD's parser; what follows a
    bare ``--`` there is the script's own."""
    subs = sub_commands(parser)
    found = []
    for name, command in [("workbench", parser), *subs.items()]:
        for line in command.format_help().splitlines():
            example = re.match(r"\s*workbench (\w+)", line)
            owner = subs.get(example.group(1), command) if example else command
            own = SCRIPT_ARGS.split(line)[0] if example else line
            for flag in FLAG.findall(own):
                if flag not in owner._option_string_actions and flag not in OTHER_PROGRAMS:
                    found.append((owner.prog.removeprefix("workbench ") or name, flag))
    return sorted(set(found))


@pytest.mark.parametrize("columns", ["100", "60"])
def test_every_flag_a_help_names_is_one_its_command_takes(
    columns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a narrow terminal too: a flag broken over two lines (--tasks-\\nper-node) is not one
    its command takes."""
    monkeypatch.setenv("COLUMNS", columns)
    parser = build_parser()
    assert {"run", "scale", "sweep", "tune", "predict"} <= set(sub_commands(parser))
    assert unaccepted_flags(parser) == []


def test_the_flag_check_finds_a_flag_named_but_not_taken() -> None:
    """The check itself, on a parser whose help names flags it does not take: in an option's
    help, in a description, in an example (but not the script's own after --)."""
    parser = argparse.ArgumentParser(prog="workbench")
    sub = parser.add_subparsers()
    scale = sub.add_parser(
        "scale",
        description="Nodes are --nodes and --tasks-per-node.",
        epilog="  workbench scale --world-sizes 1,2 --wrld 3 -- --lr 0.1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    scale.add_argument("--world-sizes", help="like --world-size of run")
    scale.add_argument("--tasks", help="--srun-arg=--cpu-bind=cores passes it on")
    assert unaccepted_flags(parser) == [
        ("scale", "--nodes"),
        ("scale", "--srun-arg"),
        ("scale", "--tasks-per-node"),
        ("scale", "--world-size"),
        ("scale", "--wrld"),
    ]
