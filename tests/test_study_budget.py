"""A study's launches in rounds, what they cost and a budget (real runs).

Known answers by construction: a goal no run can reach (+-0.1 % of an mlp's throughput in a
fraction of a second) makes every point ask for its second launch, so the order of the
launches and their count are known in advance; the device-seconds a launch held are bounded
below by its ranks' own measured training time and above by the study's wall clock, both
measured apart from the code that records them; a budget smaller than one launch's start-up
leaves the second point unlaunched, whatever the machine."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.config.budget import budget_seconds
from workbench.config.run_config import RunConfig
from workbench.run.study import run_study, scaling_configs

#: Unreachable in 0.3 s of an mlp's steps: every point is launched to the cap of 2.
UNREACHABLE = {"until_known": 0.001, "until_known_max_s": 0.3, "until_known_launches": 2}


def _run(path: Path) -> dict:
    return json.loads((path / "run.json").read_text())


@pytest.fixture(scope="module")
def two_rounds(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """mlp at 1 and 2 ranks through ``run_study``, two launches each, on warm pool workers (the
    rounds are the executor's business alone: the pool's start-up is a tenth of a second)."""
    store = tmp_path_factory.mktemp("rounds")
    config = RunConfig(
        model="mlp",
        per_device_batch_size=32,
        train_samples=2048,
        eval_samples=64,
        eval_batch_size=64,
        warmup_steps=2,
        output_dir=str(store),
        sweep="rounds",
        **UNREACHABLE,
    )
    before = time.time()
    handles = run_study(scaling_configs(config, [1, 2]), executor="pool", progress=False)
    return {"handles": handles, "wall_s": time.time() - before, "store": store}


@pytest.mark.slow
def test_points_are_launched_again_in_rounds_not_back_to_back(two_rounds: dict) -> None:
    handles = two_rounds["handles"]
    assert [h.config.world_size for h in handles] == [1, 1, 2, 2], "point by point"
    assert all(h.status() == "completed" for h in handles)
    by_start = sorted(handles, key=lambda h: _run(h.path)["submitted_at"])
    assert [h.config.world_size for h in by_start] == [1, 2, 1, 2], [h.run_id for h in by_start]
    assert len({h.run_id for h in handles}) == 4
    assert handles.left == [] and handles.budget_note() is None


@pytest.mark.slow
def test_device_seconds_lie_between_the_measured_training_and_the_wall_clock(
    two_rounds: dict,
) -> None:
    runs = [_run(h.path) for h in two_rounds["handles"]]
    for run in runs:
        ranks = run["config"]["world_size"]
        trained = run["summary"]["measured_wall_s"]  # the ranks' own steps, from their traces
        assert ranks * trained < run["device_s"], (run["run_id"], trained, run["device_s"])
    # the launches ran one after another inside the study's wall clock
    held = sum(r["device_s"] / r["config"]["world_size"] for r in runs)
    assert held <= two_rounds["wall_s"], (held, two_rounds["wall_s"])


@pytest.mark.slow
def test_the_finding_and_the_table_say_the_cost(two_rounds: dict, capsys) -> None:
    from workbench.analysis.throughput.scaling import scaling_table
    from workbench.store.load import load_runs, load_traces

    runs = load_runs(two_rounds["store"], ["rounds"])
    table = scaling_table(runs, load_traces(list(runs["path"]), "steps"))
    for n in (1, 2):
        mine = runs[runs["world_size"] == n]
        assert table.loc[table["world_size"] == n, "device_s"].item() == pytest.approx(
            mine["device_s"].sum()
        )
        assert table.loc[table["world_size"] == n, "runs"].item() == 2
    html = two_rounds["store"] / "report.html"
    assert (
        main(["report", "rounds", "--output-dir", str(two_rounds["store"]), "-o", str(html)]) == 0
    )
    capsys.readouterr()
    said = f"cost: {runs['device_s'].sum():,.0f} device-seconds in 4 launches"
    assert said in html.read_text(), "the report's finding says the cost"
    assert " device-s<" in html.read_text(), "and its table each point's"


@pytest.mark.slow
def test_a_budget_stops_the_study_and_says_what_is_left(tmp_path: Path, capsys) -> None:
    """A budget of one device-second: the first launch measures for at most that (its cap is
    the budget left) and spends it with its start-up alone, so the 2-rank point never starts;
    the study says so, and that is no failure."""
    code = main(
        [
            "scale",
            "--model=mlp",
            "--world-sizes=1,2",
            "--until-known=0.1%",
            "--until-known-launches=3",
            "--budget=1 device-seconds",
            "--train-samples=2048",
            "--eval-samples=64",
            f"--output-dir={tmp_path}",
            "--sweep=budget",
            "--no-progress",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    runs = [_run(p.parent) for p in (tmp_path / "budget").glob("*/run.json")]
    assert len(runs) == 1 and runs[0]["config"]["world_size"] == 1, out
    assert runs[0]["config"]["until_known_max_s"] == 1.0
    assert runs[0]["device_s"] > 1.0
    assert "the study stopped short of: mlp at 1 rank: known to +-" in out
    assert "mlp at 2 ranks: not measured" in out
    assert "cost: " in out and "device-seconds in 1 launch;" in out


@pytest.mark.parametrize(
    "text, seconds",
    [("2000", 2000), ("2000 device-seconds", 2000), ("30 device-minutes", 1800), ("2h", 7200)],
)
def test_budgets_read_as_people_write_them(text: str, seconds: float) -> None:
    assert budget_seconds(text) == seconds


@pytest.mark.parametrize("text", ["0", "two hours", "-5", "3 days"])
def test_a_bad_budget_is_refused_before_anything_runs(text: str, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["scale", "--model=mlp", f"--budget={text}", f"--output-dir={tmp_path}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--budget" in err and "device-seconds" in err, err
    assert not any(tmp_path.iterdir())
