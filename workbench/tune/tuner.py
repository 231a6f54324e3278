"""``tune(run)``: try what the run's diagnosis calls for, predicted first, then measured.

From a completed run: its diagnosis and the candidates it calls for
(:mod:`workbench.analysis.tune_plan`, the list the finding's advice is written from), each
predicted by the scaling model; those whose predicted gain is below the noise
(:data:`~workbench.analysis.tune_plan.NOISE`), or that a script run's instrumentation cannot
apply, are skipped and said so. The rest, highest prediction first, are run short (the base's
config with fewer steps and no evaluation, on the warm pool) as ``repeats`` interleaved pairs
(base then candidate, then candidate then base, ...), each run's throughput taken at its median step
(:func:`~workbench.analysis.tune_measure.median_step_throughput`), and the gain's interval from
the pairs (:func:`~workbench.analysis.tune_measure.paired_gain`). The tune stops at its
budget: a candidate whose pairs would not fit is skipped ("budget spent"). Everything is
checked before the first launch: a failed run, one with too few measured steps, a budget
smaller than one candidate are each a :class:`TuneError` and nothing starts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench import schema
from workbench.analysis.tune_measure import (
    MIN_MEASURED_STEPS,
    median_step_throughput,
    model_inputs,
    paired_gain,
    run_diagnosis,
    verdict,
)
from workbench.analysis.tune_plan import (
    NOISE,
    SAID,
    Candidate,
    ModelInputs,
    candidates_for,
    predicted_gain,
)
from workbench.config.run_config import RunConfig
from workbench.errors import ConfigError
from workbench.run.backends.pool import warm_pool
from workbench.run.launch import launch
from workbench.store.files import read_json, write_json
from workbench.store.load import load_runs, load_traces
from workbench.store.tunes import TUNE_FILE

#: Seconds a short run costs beyond its steps (start, import, teardown; warm pool, loaded host).
STARTUP_S = 6.0
#: A short run measures about this many seconds of steps, within the bounds below.
TARGET_WINDOW_S = 1.0
MIN_SHORT_STEPS, MAX_SHORT_STEPS, SHORT_WARMUP = 30, 300, 5
#: Fields whose change alters what the training computes (batch, accumulation, compression).
MATH_FIELDS = ("per_device_batch_size", "global_batch_size", "gradient_accumulation_steps")


class TuneError(ValueError):
    """A tune cannot start from this run or budget; the message says why and what would do."""


@dataclass
class TuneResult:
    """What a tune found: ``base`` (the run's config), ``candidates`` (one dict each: ``change``,
    ``label``, ``predicted_gain``, ``measured_gain``, ``low``, ``high``, ``verdict``, ``why``,
    ``changes_math``, ``note``, the throughputs and run ids measured, and for a change of the
    mathematics ``loss_curves``), ``best`` (the change of the best better candidate, ``{}``
    when none), ``run_id``, ``diagnosis``, ``said`` (advice no knob reaches), ``noise``."""

    run_id: str
    base: dict[str, Any]
    diagnosis: dict[str, Any]
    candidates: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] = field(default_factory=dict)
    said: str = ""
    noise: float = NOISE
    repeats: int = 3

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: NaN as None."""
        return _clean(
            {
                "run_id": self.run_id,
                "base": self.base,
                "diagnosis": self.diagnosis,
                "candidates": self.candidates,
                "best": self.best,
                "said": self.said,
                "noise": self.noise,
                "repeats": self.repeats,
            }
        )


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def find_run(run: str | Path, output_dir: str | Path = "experiments/results") -> Path:
    """A run's folder: ``run`` itself when it is one, else the run of that id under
    ``output_dir`` (any sweep)."""
    path = Path(run)
    if (path / schema.RUN_FILE).is_file():
        return path
    found = sorted(Path(output_dir).glob(f"*/{run}/{schema.RUN_FILE}"))
    if not found:
        raise TuneError(
            f"run {str(run)!r}: not a run folder, and no run of that id under {output_dir} "
            "(workbench ls lists the runs)"
        )
    return found[0].parent


def _short_config(
    config: RunConfig, steps: int, sweep: str, change: Mapping[str, Any]
) -> RunConfig:
    """The base's config as a short measuring run, with ``change``."""
    fields: dict[str, Any] = dict(change)
    fields.update(sweep=sweep, run_name=None, network_benchmark=False)
    if not config.is_script:
        fields.update(
            max_steps=steps,
            epochs=None,
            warmup_steps=SHORT_WARMUP,
            eval_every_epochs=0,
            eval_at_end=False,
            checkpoint_every_steps=0,
        )
    return config.replace(**fields)


def _label(change: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in change.items()) or "no change"


def _plan(
    cause: str, config: RunConfig, changes: Sequence[Mapping[str, Any]] | None
) -> list[Candidate]:
    if changes is None:
        return candidates_for(cause, config.to_dict(), config.is_script)
    return [
        Candidate(
            dict(c),
            _label(c),
            changes_math=bool(set(c) & set(MATH_FIELDS))
            or c.get("comm_hook", "allreduce") != "allreduce",
        )
        for c in changes
    ]


def _row(c: Candidate, gain: float, note: str) -> dict[str, Any]:
    return {
        "change": dict(c.change),
        "label": c.label,
        "predicted_gain": gain,
        "measured_gain": float("nan"),
        "low": float("nan"),
        "high": float("nan"),
        "verdict": "skipped",
        "why": "",
        "changes_math": c.changes_math,
        "note": "; ".join(n for n in (c.note, note) if n),
    }


def _work(change: Mapping[str, Any], config: RunConfig) -> float:
    """How many times the base's compute per step a change does (batch, accumulation)."""
    work = 1.0
    if change.get("per_device_batch_size") and config.per_device_batch_size:
        work *= float(change["per_device_batch_size"]) / config.per_device_batch_size
    if "gradient_accumulation_steps" in change:
        work *= float(change["gradient_accumulation_steps"]) / config.gradient_accumulation_steps
    return work


def tune(
    run: str | Path,
    *,
    output_dir: str | Path = "experiments/results",
    budget_s: float = 600.0,
    repeats: int = 3,
    executor: str = "pool",
    noise: float = NOISE,
    top: int | None = None,
    changes: Sequence[Mapping[str, Any]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> TuneResult:
    """Tune ``run`` (a run folder or id under ``output_dir``); see the module docstring.

    ``budget_s``: seconds of short runs at most (estimated before each candidate from the runs
    so far). ``repeats``: pairs per candidate (2 or more). ``executor``: ``pool`` (warm
    workers) or ``local``. ``noise``: the smallest gain worth measuring and counting.
    ``top``: measure at most this many candidates (highest prediction first). ``changes``:
    try these RunConfig changes instead of the diagnosis's list (each predicted, and measured
    whatever its prediction).
    ``progress``: called with a line of progress before each short run."""
    if repeats < 2:
        raise TuneError(f"repeats={repeats}: an interval needs 2 pairs or more")
    if not budget_s > 0:
        raise TuneError(f"budget {budget_s} s: must be positive")
    path = find_run(run, output_dir)
    record = read_json(path / schema.RUN_FILE)
    run_id = str(record.get("run_id", path.name))
    status = record.get("status")
    if status != "completed":
        failure = (record.get("failure") or {}).get("message") or ""
        raise TuneError(
            f"run {run_id} is {status}, not completed{': ' + failure if failure else ''}; a "
            "tune starts from a completed run's measurements (run it again, then tune)"
        )
    config = RunConfig.from_dict(record["config"])
    runs = load_runs(path.parent.parent, [path.parent.name])
    runs = runs[runs["run_id"] == run_id]
    steps = load_traces([path], "steps")
    diagnosis = run_diagnosis(runs, steps) if len(steps) else {"measured_steps": 0}
    measured = int(diagnosis.get("measured_steps", 0))
    if measured < MIN_MEASURED_STEPS:
        raise TuneError(
            f"run {run_id} has {measured} measured step(s) (after warm-up); a tune needs "
            f"{MIN_MEASURED_STEPS} or more to diagnose it and predict: run it with more "
            f"max_steps (warm-up is {config.warmup_steps} steps)"
        )
    inputs = model_inputs(runs, steps, config.to_dict())
    assert inputs is not None  # measured steps exist
    cause = str(diagnosis["cause"])
    result = TuneResult(run_id, config.to_dict(), _clean(diagnosis), noise=noise, repeats=repeats)
    plan = _plan(cause, config, changes)
    if changes is None and not plan:
        result.said = SAID.get(cause, SAID["unexplained"])
    rows, todo = _predict(plan, inputs, noise, explicit=changes is not None)
    result.candidates = rows
    todo = todo[:top] if top is not None else todo
    for i, row in enumerate(rows):
        if row["verdict"] == "skipped" and not row["why"] and i not in todo:
            row["why"] = f"not among the top {top} predictions"
    if not todo:
        _save(path, result)
        return result
    short = _short_steps(inputs)
    for i in list(todo):  # a change the config's rules refuse is said, before anything starts
        try:
            _short_config(config, short, f"tune-{run_id}", rows[i]["change"])
        except ConfigError as exc:
            rows[i]["why"] = f"not a valid config: {exc}"
            todo.remove(i)
    if not todo:
        _save(path, result)
        return result
    estimates = [_estimate(inputs, short, _work(rows[i]["change"], config)) for i in todo]
    if budget_s < min(estimates) * 2 * repeats:
        raise TuneError(
            f"budget {_secs(budget_s)} is less than one candidate: {repeats} pairs of short "
            f"runs take about {_secs(min(estimates) * 2 * repeats)} ({short} steps each, "
            f"about {_secs(STARTUP_S)} to start); give a budget of at least that, or fewer "
            "repeats"
        )
    _measure(result, rows, todo, config, short, budget_s, executor, progress, estimates)
    better = [r for r in rows if r["verdict"] == "better"]
    result.best = dict(max(better, key=lambda r: r["measured_gain"])["change"]) if better else {}
    _save(path, result)
    return result


def _predict(
    plan: Sequence[Candidate], inputs: ModelInputs, noise: float, explicit: bool = False
) -> tuple[list[dict[str, Any]], list[int]]:
    """Every candidate's row with its prediction; the indices to measure, best first (changes
    asked for ``explicit``ly are measured whatever their prediction)."""
    rows = []
    for c in plan:
        gain, note = predicted_gain(c.change, inputs) if c.change else (float("nan"), "")
        row = _row(c, gain, note)
        if not c.reachable:
            row["why"] = "the script's own setting: change it in the script (not reachable)"
        elif not c.change:
            row["why"] = "the run's config does not give it (nothing to change)"
        elif math.isfinite(gain) and gain < noise and not explicit:
            row["why"] = f"predicted {gain:+.1%} is below the noise ({noise:.0%})"
        rows.append(row)
    todo = [i for i, r in enumerate(rows) if not r["why"]]
    todo.sort(
        key=lambda i: (
            -(rows[i]["predicted_gain"] if math.isfinite(rows[i]["predicted_gain"]) else 0)
        )
    )
    return rows, todo


def _short_steps(inputs: ModelInputs) -> int:
    step = inputs.base.step_s
    want = math.ceil(TARGET_WINDOW_S / step) if step > 0 else MIN_SHORT_STEPS
    return SHORT_WARMUP + min(max(want, MIN_SHORT_STEPS), MAX_SHORT_STEPS)


def _estimate(inputs: ModelInputs, steps: int, work: float) -> float:
    """Seconds one short run is expected to take (the mean of base and candidate)."""
    return STARTUP_S + steps * inputs.base.step_s * (1 + work) / 2


def _secs(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.0f} s"


def _measure(
    result: TuneResult,
    rows: list[dict[str, Any]],
    todo: list[int],
    config: RunConfig,
    short: int,
    budget_s: float,
    executor: str,
    progress: Callable[[str], None] | None,
    estimates: list[float],
) -> None:
    """Run the pairs of each candidate in ``todo`` within the budget; fill in the rows."""
    sweep = f"tune-{result.run_id}"
    started = time.monotonic()
    took: list[float] = []
    total = len(todo) * 2 * result.repeats
    done = 0
    pool = warm_pool(size=config.processes) if executor == "pool" else nullcontext()
    with pool:
        for k, i in enumerate(todo):
            row = rows[i]
            per_run = sum(took) / len(took) if took else estimates[k]
            spent = time.monotonic() - started
            if spent + per_run * 2 * result.repeats > budget_s:
                row["why"] = f"budget spent ({_secs(spent)} of {_secs(budget_s)})"
                total -= 2 * result.repeats
                continue
            base_thr: list[float] = []
            cand_thr: list[float] = []
            ids: list[str] = []
            last: dict[str, Any] = {}
            for r in range(result.repeats):
                order = (("base", {}), ("candidate", row["change"]))
                # every other pair runs the candidate first: an order effect cancels
                for side, change in order if r % 2 == 0 else order[::-1]:
                    if progress is not None:
                        rate = done / sum(took) * 60 if took else float("nan")
                        left = (total - done) * (sum(took) / len(took) if took else per_run)
                        progress(
                            f"tune: run {done + 1}/{total} ({row['label']}, pair {r + 1}/"
                            f"{result.repeats}, {side}): "
                            + (f"{rate:.1f} runs/min, " if math.isfinite(rate) else "")
                            + f"about {_secs(left)} left"
                        )
                    t0 = time.monotonic()
                    cfg = _short_config(config, short, sweep, change)
                    handle = launch(cfg, executor=executor)
                    handle.wait()
                    took.append(time.monotonic() - t0)
                    done += 1
                    steps = load_traces([handle.path], "steps")
                    (base_thr if side == "base" else cand_thr).append(median_step_throughput(steps))
                    ids.append(str(handle.run_id))
                    last[side] = steps
            gain, low, high = paired_gain(base_thr, cand_thr)
            row.update(
                measured_gain=gain,
                low=low,
                high=high,
                verdict=verdict(gain, low, high, result.noise),
                base_samples_per_s=base_thr,
                candidate_samples_per_s=cand_thr,
                run_ids=ids,
            )
            if row["changes_math"]:
                row["loss_curves"] = _loss_curves(last["base"], last["candidate"])


def _loss_curves(base: Any, candidate: Any) -> list[list[float]]:
    """``[step, base loss, candidate loss]`` per step both ran (the mean over ranks)."""
    a = base.groupby("step")["loss"].mean()
    b = candidate.groupby("step")["loss"].mean()
    both = a.to_frame("base").join(b.rename("candidate"), how="inner")
    return [[int(s), float(r.base), float(r.candidate)] for s, r in both.iterrows()]


def _save(path: Path, result: TuneResult) -> None:
    write_json(path / TUNE_FILE, result.to_dict())


def load_tune(path: str | Path) -> dict[str, Any] | None:
    """The last tune of a run (its folder), or ``None``."""
    file = Path(path) / TUNE_FILE
    return read_json(file) if file.is_file() else None
