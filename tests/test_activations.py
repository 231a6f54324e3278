"""The activations a step saves for its backward, counted in a rank's memory parts, against a
count by hand: a stack of bias-free linear layers saves each layer's input (batch x width x 4
bytes; the weights it also saves are parameters, counted as such), and the loss (cross-entropy
of fp32 logits) saves its log-softmax (batch x 4 classes x 4 bytes), the targets (batch x 8) and
its 4-byte total weight. Under FSDP the gathered weights a layer saves are parameters too: the
same count. Then ``predict`` scales it with the micro-batch a device runs at another size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.config.run_config import RunConfig
from workbench.run.study import run_study

from .helpers import WARM

pytestmark = pytest.mark.slow

WIDTH, LAYERS, BATCH = 64, 3, 16


def by_hand(batch: int) -> int:
    inputs = batch * (32 + LAYERS * WIDTH) * 4
    return inputs + batch * 4 * 4 + batch * 8 + 4


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    store = tmp_path_factory.mktemp("activations")
    common = dict(model="tests.plugins:linear_stack", dataset="tests.plugins:synthetic_like_mlp",
                  model_options={"width": WIDTH, "layers": LAYERS}, train_samples=1024,
                  eval_samples=64, max_steps=3, output_dir=str(store))  # fmt: skip
    weak = dict(per_device_batch_size=BATCH, sweep="acts", **common)
    configs = [RunConfig(world_size=n, run_name=f"ddp-{n}", **weak) for n in (1, 2)]
    configs.append(RunConfig(world_size=2, strategy="fsdp", run_name="fsdp-2", **weak))
    strong = dict(global_batch_size=2 * BATCH, sweep="strong", **common)
    configs += [RunConfig(world_size=n, run_name=f"strong-{n}", **strong) for n in (1, 2)]
    handles = run_study(configs, executor=WARM, progress=False, again=False)
    assert [h.status() for h in handles] == ["completed"] * 5
    return store


def _parts(store: Path, run: str) -> dict:
    return json.loads((store / "acts" / run / "run.json").read_text())["memory_parts"]


@pytest.mark.parametrize("run", ["ddp-1", "ddp-2", "fsdp-2"])
def test_every_rank_counts_what_its_forward_saved(study: Path, run: str) -> None:
    parts = _parts(study, run)
    assert parts and all(p["activation_samples"] == BATCH for p in parts.values()), parts
    assert {p["activation_bytes"] for p in parts.values()} == {by_hand(BATCH)}, parts


def _predicted(study: Path, sweep: str, capsys: pytest.CaptureFixture[str]) -> list[dict]:
    code = main(["predict", sweep, "--output-dir", str(study), "--world-sizes", "4",
                 "--strategy", "ddp", "--json"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [r for r in json.loads(out) if r["world_size"] == 4]
    assert rows, out
    return rows


def test_predict_scales_the_activations_with_the_micro_batch_a_device_runs(
    study: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Weak scaling (16 a device at every size): the same at 4 ranks. Strong scaling (32 in
    all): 8 a device at 4 ranks, the bytes a sample measured at 32 and 16 times 8 (the loss's
    4 fixed bytes spread over the samples: within 1 %)."""
    for row in _predicted(study, "acts", capsys):
        assert row["activation_bytes"] == pytest.approx(by_hand(BATCH), rel=1e-3), row
    for row in _predicted(study, "strong", capsys):
        assert row["activation_bytes"] == pytest.approx(by_hand(BATCH // 2), rel=0.01), row
        assert row["total_bytes"] > row["activation_bytes"], "counted in what a rank holds"
