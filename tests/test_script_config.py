"""A user's script as a run, without starting a process: the phases from hand-built events, the
config's rules, the command line, and the checks before launch."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.cli import build_parser, main
from workbench.config import RunConfig
from workbench.errors import ConfigError, PreflightError
from workbench.run.launch import launch
from workbench.trace.step_events import (
    BACKWARD,
    BACKWARD_END,
    FETCH,
    FETCH_END,
    FORWARD,
    FORWARD_END,
    OPTIMIZER,
    OPTIMIZER_END,
    step_phases,
)

SCRIPTS = Path(__file__).parent / "scripts"


def test_phases_of_one_step_add_up_and_follow_the_table() -> None:
    # fetch 10 ms, move 2 ms, DDP forward 20 ms, loss 3 ms, backward 30 ms, clip 1 ms, step 4 ms
    events = [
        (FETCH, 1.000),
        (FETCH_END, 1.010),
        (FORWARD, 1.012),
        (FORWARD_END, 1.032),
        (BACKWARD, 1.035),
        (BACKWARD_END, 1.065),
        (OPTIMIZER, 1.066),
        (OPTIMIZER_END, 1.070),
    ]
    p = step_phases(events, previous_end=0.99)
    assert p.start == 1.0
    assert p.data_s == pytest.approx(0.012)
    assert p.forward_s == pytest.approx(0.023)
    assert p.backward_s == pytest.approx(0.030)
    assert p.optimizer_s == pytest.approx(0.005)
    assert p.step_s == pytest.approx(0.070)


def test_accumulation_sums_the_micro_batches() -> None:
    # two micro-batches of fetch 5, forward 10, backward 20 ms; then a 2 ms optimizer step
    events, t = [], 0.0
    for _ in range(2):
        for kind, d in ((FETCH, 0.005), (FETCH_END, 0.0), (FORWARD, 0.010), (FORWARD_END, 0.0)):
            events.append((kind, t))
            t += d
        events += [(BACKWARD, t), (BACKWARD_END, t + 0.020)]
        t += 0.020
    events += [(OPTIMIZER, t), (OPTIMIZER_END, t + 0.002)]
    p = step_phases(events, previous_end=None)
    assert (p.data_s, p.forward_s, p.backward_s) == pytest.approx((0.010, 0.020, 0.040))
    assert p.optimizer_s == pytest.approx(0.002) and p.step_s == pytest.approx(0.072)


def test_without_ddp_the_forward_runs_from_the_fetch_to_the_backward() -> None:
    events = [
        (FETCH, 0.0),
        (FETCH_END, 0.004),
        (BACKWARD, 0.019),
        (BACKWARD_END, 0.049),
        (OPTIMIZER, 0.049),
        (OPTIMIZER_END, 0.050),
    ]
    p = step_phases(events, previous_end=None)
    assert (p.data_s, p.forward_s, p.backward_s) == pytest.approx((0.004, 0.015, 0.030))


def test_without_fetch_or_forward_the_step_starts_at_the_previous_end() -> None:
    events = [(BACKWARD, 2.010), (BACKWARD_END, 2.030), (OPTIMIZER, 2.031), (OPTIMIZER_END, 2.032)]
    p = step_phases(events, previous_end=2.0)
    assert p.start == 2.0 and p.data_s is None
    assert (p.forward_s, p.backward_s, p.optimizer_s) == pytest.approx((0.010, 0.020, 0.002))


def test_a_phase_never_seen_is_none_not_zero() -> None:
    events = [(FORWARD, 0.0), (FORWARD_END, 0.01), (OPTIMIZER, 0.02), (OPTIMIZER_END, 0.03)]
    p = step_phases(events, previous_end=None)
    assert p.data_s is None and p.backward_s is None
    assert p.forward_s == pytest.approx(0.02)


def test_a_script_config_names_the_run_after_the_script_and_round_trips() -> None:
    config = RunConfig(script="train.py", world_size=2, script_args=["--lr", "0.1"])
    assert config.is_script and config.model == "script:train"
    assert config.script_args == ("--lr", "0.1") and config.total_steps is None
    assert RunConfig.from_json(config.to_json()) == config
    module = RunConfig(script_module="mypkg.train_bert", world_size=1)
    assert module.model == "script:train_bert"


def test_a_script_config_refuses_what_the_script_decides_all_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig(
            script="train.py",
            script_module="pkg.train",
            world_size=2,
            per_device_batch_size=32,
            precision="bf16",
            script_args=["--lr", 0.1],
        )
    fields = {p.field for p in err.value.problems}
    assert fields == {"script_module", "per_device_batch_size", "precision", "script_args"}
    assert "set by the script itself" in str(err.value)


def test_script_args_without_a_script_and_a_bad_module_name_are_errors() -> None:
    with pytest.raises(ConfigError, match="only with script"):
        RunConfig(per_device_batch_size=8, script_args=["--x"])
    with pytest.raises(ConfigError, match="dotted module name"):
        RunConfig(script_module="not a module", world_size=1)


def test_the_command_line_passes_everything_after_the_double_dash_to_the_script() -> None:
    from workbench.cli.options import config_from_args

    argv = ["run", "--script", "t.py", "--world-size", "2", "--", "--steps", "5", "--", "x"]
    parser = build_parser()
    args = parser.parse_args(argv[: argv.index("--")])
    args.script_args = argv[argv.index("--") + 1 :]
    config = config_from_args(args)
    assert config.script == "t.py" and config.script_args == ("--steps", "5", "--", "x")
    assert config.per_device_batch_size is None  # the script's own batch, no CLI default
    help_text = parser._subparsers._group_actions[0].choices["run"].format_help()  # type: ignore[union-attr]
    assert "your own training" in help_text and "--module PKG.MODULE" in help_text


def test_bad_scripts_are_named_before_any_process_starts(tmp_path: Path, capsys) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    cases = {
        "missing.py": "no such file",
        str(broken): "does not compile",
    }
    for script, message in cases.items():
        with pytest.raises(PreflightError, match=message) as err:
            launch(RunConfig(script=script, world_size=2, output_dir=str(tmp_path / "r")))
        assert script in str(err.value)
    with pytest.raises(PreflightError, match="no such module"):
        launch(RunConfig(script_module="no_such_pkg.train", world_size=1, output_dir=str(tmp_path)))
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").rglob("run.json"))
    # the same from the command line: exit status 2 and the field named
    assert main(["run", "--script", "missing.py", "--output-dir", str(tmp_path / "c")]) == 2
    assert "script='missing.py'" in capsys.readouterr().err


def test_the_report_says_what_a_script_run_could_not_measure() -> None:
    import pandas as pd

    from workbench.ui.unmeasured import unmeasured_lines

    runs = pd.DataFrame(
        {
            "run_id": ["a", "b", "c"],
            "model": ["script:train", "script:train", "mlp"],
            "script": ["train.py", "train.py", None],
            "measurement_warnings": [None, "x stepped no optimizer", None],
        }
    )
    lines = unmeasured_lines(runs)
    assert lines[0].startswith("train: your own training, traced from outside")
    assert lines[1] == "not measured in b: x stepped no optimizer" and len(lines) == 2
    assert unmeasured_lines(runs.iloc[2:].drop(columns="measurement_warnings")) == []
