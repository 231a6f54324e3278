"""Bad input, as a new user gives it: every message names what is wrong and what is allowed, and
nothing starts (no run folder is written)."""

from __future__ import annotations

import json
import math
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from workbench import RunConfig, launch
from workbench.cli import main
from workbench.sweeps.spec import SweepSpec

OK = dict(model="mlp", world_size=1, per_device_batch_size=8, max_steps=2)


def _config(**changes: object) -> Callable[[Path], object]:
    return lambda tmp: RunConfig(**{**OK, "output_dir": str(tmp), **changes})


def _launch(config: object, executor: str = "local", **options: object) -> Callable[[Path], object]:
    def go(tmp: Path) -> object:
        given = config
        if isinstance(config, dict):
            given = {**config, "output_dir": str(tmp)}
        return launch(given, executor, **options)  # type: ignore[arg-type]

    return go


def _launch_fields(executor: str = "local", **changes: object) -> Callable[[Path], object]:
    def go(tmp: Path) -> object:
        fields = {**OK, "output_dir": str(tmp), **changes}
        return launch(RunConfig(**fields), executor)

    return go


def _spec(**changes: object) -> Callable[[Path], object]:
    base = {"name": "s", "fixed": {"model": "mlp", "max_steps": 2}, "grid": {"world_size": [1]}}
    return lambda tmp: SweepSpec(**{**base, "output_dir": str(tmp), **changes})


def _cli(*argv: str) -> Callable[[Path], object]:
    return lambda tmp: main([a.replace("{tmp}", str(tmp)) for a in argv])


def _busy_port(tmp: Path) -> object:
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        return launch(RunConfig(**OK, output_dir=str(tmp), master_port=s.getsockname()[1]))


def _report_to_proc(tmp: Path) -> object:
    run = tmp / "sw" / "r1"
    (run / "traces").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "r1", "sweep": "sw", "status": "failed"}))
    return main(["report", str(run), "-o", "/proc/no/report.html"])


# (id, action, words the message must contain: what is wrong ..., what is allowed ...)
CASES: list[tuple[str, Callable[[Path], object], tuple[str, ...]]] = [
    # RunConfig
    ("unknown field", _config(wrold_size=2), ("wrold_size", "did you mean 'world_size'")),
    ("options not a mapping", _config(model_options="big"), ("model_options", "mapping")),
    ("infinite lr", _config(learning_rate=math.inf), ("learning_rate", "finite number > 0")),
    ("nan momentum", _config(momentum=math.nan), ("momentum", "finite number >= 0")),
    ("name with newline", _config(run_name="ok\n"), ("run_name", "folder name")),
    ("sweep with slash", _config(sweep="a/b"), ("sweep", "folder name")),
    ("zero ranks", _config(world_size=0), ("world_size", "integer >= 1")),
    ("unknown precision", _config(precision="fp8"), ("precision", "fp32, fp16, bf16")),
    ("unknown strategy", _config(strategy="zero"), ("strategy", "ddp")),
    ("unknown hook", _config(comm_hook="int8"), ("comm_hook", "powersgd")),
    ("unknown optimizer", _config(optimizer="lamb"), ("optimizer", "adamw")),
    ("unknown model", _config(model="bert"), ("model", "package.module:factory")),
    (
        "unknown size",
        _config(model="transformer", model_options={"size": "tiny"}),
        ("size", "distilbert"),
    ),
    (
        "unknown model option",
        _config(model_options={"width": 3}),
        ("model_options.width", "hidden_dim"),
    ),
    ("both batches", _config(global_batch_size=16), ("exactly one of per_device_batch_size",)),
    ("batch over samples", _config(per_device_batch_size=8192), ("train_samples", "global batch")),
    ("low port", _config(master_port=80), ("master_port", "1024..65535")),
    ("profile window", _config(profile_steps=(5, 2)), ("profile_steps", "first <= last")),
    ("eval placement", _config(eval_on="some"), ("eval_on", "rank0")),
    ("fp16 on cpu", _config(precision="fp16", device="cpu"), ("precision", "bf16")),
    ("fault kind", _config(fault={"kind": "boom"}), ("fault.kind", "raise")),
    # launch
    ("config of a wrong type", _launch(["mlp"]), ("config", "RunConfig or a mapping")),
    ("config dict with a typo", _launch({**OK, "modle": "mlp"}), ("modle", "did you mean 'model'")),
    ("unknown executor", _launch_fields("k8s"), ("executor", "local, debug, slurm")),
    ("local option typo", _launch(RunConfig(**OK), setpu=["x"]), ("setpu", "valid: setup")),
    (
        "slurm option typo",
        _launch(RunConfig(**OK), "slurm", partiton="gpu"),
        ("partiton", "partition"),
    ),
    ("debug with two ranks", _launch_fields("debug", world_size=2), ("world_size", "world_size=1")),
    ("local on two nodes", _launch_fields(nodes=2, world_size=2), ("nodes", "nodes=1")),
    ("plug-in that is not there", _launch_fields(model="nosuch.module:f"), ("model", "nosuch")),
    (
        "output under /proc",
        _launch_fields(output_dir="/proc/wb"),
        ("output_dir", "cannot create files"),
    ),
    ("port in use", _busy_port, ("master_port", "already in use")),
    # the command line
    ("unknown flag", _cli("run", "--modle", "mlp"), ("--modle", "did you mean --model?")),
    ("world sizes", _cli("scale", "--world-sizes", "1,x"), ("--world-sizes", "integers >= 1")),
    ("bad choice", _cli("run", "--executor", "k8s"), ("--executor", "'local'")),
    ("bad boolean", _cli("run", "--static-graph", "maybe"), ("--static-graph", "true or false")),
    ("bad field value", _cli("run", "--device", "tpu"), ("device='tpu'", "cuda")),
    ("missing parquet", _cli("repartition", "{tmp}/none.parquet"), ("none.parquet", "--make ROWS")),
    ("report nowhere", _report_to_proc, ("/proc/no/report.html", "cannot write the report")),
    (
        "report of nothing",
        _cli("report", "nosuch", "--output-dir", "{tmp}"),
        ("nosuch", "workbench ls"),
    ),
    # sweep specs
    ("spec grid typo", _spec(grid={"wrold_size": [1]}), ("wrold_size", "world_size")),
    ("spec reserved field", _spec(fixed={"run_name": "x"}), ("run_name",)),
    ("spec name", _spec(name="ok\n"), ("name", "folder name")),
    ("spec executor", _spec(executor="k8s"), ("executor", "local, debug, slurm")),
    ("spec executor option", _spec(executor_options={"partiton": "x"}), ("partiton", "setup")),
    ("spec point", _spec(grid={"world_size": [1, 0]}), ("world_size", "integer >= 1")),
]


@pytest.mark.parametrize("action, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_says_what_is_wrong_and_what_is_allowed(
    action: Callable[[Path], object], words: tuple[str, ...], tmp_path: Path, capsys
) -> None:
    try:
        result = action(tmp_path)
    except SystemExit as exc:  # argparse
        assert exc.code == 2
        message = capsys.readouterr().err
    except (ValueError, TypeError) as exc:
        message = str(exc)
    else:
        assert result == 2, f"accepted: {result!r}"  # a CLI command that returned its error code
        message = capsys.readouterr().err
    for word in words:
        assert word in message, f"{word!r} not in:\n{message}"
    assert not list(tmp_path.rglob("config.json")), "a run folder was written"


def test_there_are_forty_distinct_bad_inputs() -> None:
    assert len({c[0] for c in CASES}) == len(CASES) >= 40


def test_a_spec_file_with_an_unknown_key_names_it(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "grdi": {"world_size": [1]}}))
    with pytest.raises(ValueError, match="grdi"):
        SweepSpec.from_yaml(path)
