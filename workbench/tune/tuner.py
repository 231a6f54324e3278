"""``tune(run)``: try what the run's diagnosis calls for, predicted first, then measured.

From a completed run: its frames, asked of the store (its row, and its step frames from its
digest or its rows, as :func:`~workbench.store.digests.serve.open_frames` decides), then its
diagnosis and the candidates it calls for (:mod:`workbench.analysis.advice.candidates`, the list
the finding's advice is written from), asked of the analysis with those frames in one call
(:func:`~workbench.analysis.advice.base_plan.base_plan`), each predicted by the scaling
model; those whose predicted gain is below the noise
(:data:`~workbench.analysis.advice.candidates.NOISE`), or that a script run's instrumentation
cannot apply, are skipped and said so. The rest, highest prediction first, are run short (the base's
config with fewer steps and no evaluation, on the warm pool) as ``repeats`` interleaved pairs
(base then candidate, then candidate then base, ...), each run's throughput taken at its faster
steps (:func:`~workbench.tune.measure.step_throughput`), and the gain's interval
from the pairs (:func:`~workbench.tune.measure.paired_gain`); a change the first set calls
better or worse is confirmed by a second set (:func:`~workbench.tune.measure.confirmed`). The
tune stops at its budget: a candidate whose pairs would not fit is skipped ("budget spent").
Everything is checked before the first launch: a failed run, one with too few measured steps,
a budget smaller than one candidate are each a :class:`TuneError` and nothing starts.

Where the candidates hold the larger batch and nothing measured what of the compute grows with it,
a probe of four short runs first measures that (:mod:`workbench.tune.probe`), when the budget
leaves room for it beside one candidate; the candidates are then predicted and ranked again with
that split. It runs even where every prediction is under the noise: assuming all of the compute
grows with the batch gives the least a larger batch can gain. The short runs and the probe are
the tune's own measurement: it reads them itself (:mod:`workbench.tune.measure`,
:mod:`workbench.tune.probe`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench import schema
from workbench.analysis.advice.base_plan import BasePlan, base_plan
from workbench.analysis.advice.candidates import (
    NOISE,
    Candidate,
    ModelInputs,
    as_measured,
    predicted_gain,
    prediction_order,
)
from workbench.analysis.run_digests import RULES
from workbench.config.run_config import RunConfig
from workbench.errors import ConfigError, TuneError
from workbench.run.backends import backend
from workbench.run.backends.pool import warm_pool
from workbench.store.digests.serve import open_frames
from workbench.store.files import read_json, write_json
from workbench.store.load import load_runs, load_traces
from workbench.store.tunes import TUNE_FILE
from workbench.tune.budget import estimate, room_for_probe, short_steps, work
from workbench.tune.measure import (
    MIN_MEASURED_STEPS,
    SHORT_WARMUP,
    Pairs,
    measure,
    short_config,
)
from workbench.tune.probe import PROBE_RUNS, PROBE_STEPS, batch_to_probe, with_batch_probe


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
    #: What of the base's compute grows with the batch, where the tune's probe measured it
    #: (``per_step_s``, ``per_sample_s``, ``batches``, ``world_size``, ``how``); ``{}`` if not.
    batch_cost: dict[str, Any] = field(default_factory=dict)

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
                "batch_cost": self.batch_cost,
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
        "note": "; ".join(
            n for n in (c.note, note, c.partial and f"predicted {c.partial}", c.assumes) if n
        ),
    }


def tune(
    run: str | Path,
    *,
    output_dir: str | Path = "experiments/results",
    budget_s: float = 600.0,
    repeats: int = 3,
    executor: str = "pool",
    executor_options: Mapping[str, Any] | None = None,
    noise: float = NOISE,
    top: int | None = None,
    changes: Sequence[Mapping[str, Any]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> TuneResult:
    """Tune ``run`` (a run folder or id under ``output_dir``); see the module docstring.

    ``budget_s``: seconds of short runs at most (estimated before each candidate from the runs
    so far). ``repeats``: pairs per candidate (2 or more). ``executor``: ``pool`` (warm
    workers), ``local`` or ``slurm``; ``executor_options``: what ``launch`` takes besides
    (for ``slurm``, its options: partition, account, ...). ``noise``: the smallest gain worth
    measuring and counting. ``top``: measure at most this many candidates (highest prediction
    first). ``changes``: try these RunConfig changes instead of the diagnosis's list (each
    predicted, and measured whatever its prediction). ``progress``: called with a line of
    progress before each short run."""
    _refuse_bad_input(repeats, budget_s)
    path = find_run(run, output_dir)
    config, run_id, base = _load_base(path, changes)
    inputs, plan = base.inputs, base.candidates
    assert inputs is not None  # measured steps exist
    result = TuneResult(
        run_id, config.to_dict(), _clean(base.diagnosis), noise=noise, repeats=repeats
    )
    result.said = base.said
    short = short_steps(inputs)

    explicit = changes is not None
    rows, todo = _ranked(plan, inputs, noise, explicit, top, (config, short, run_id))
    result.candidates = rows
    where = (executor, dict(executor_options or {}))
    spent = 0.0
    probe = batch_to_probe(plan, config, inputs) > 0  # even under the noise: see the module
    # a budget that holds no candidate is refused before any process starts
    measured = [rows[i]["change"] for i in todo]
    room = room_for_probe(budget_s, inputs, measured, config, short, repeats)
    warm = backend(executor).warm_workers and (todo or probe)
    with warm_pool(config.processes) if warm else nullcontext():
        if probe:
            inputs, spent = _probe(result, plan, config, inputs, room, where, progress)
            if result.batch_cost:  # the larger batch predicted again, from the split
                rows, todo = _ranked(plan, inputs, noise, explicit, top, (config, short, run_id))
                result.candidates = rows
        if todo:
            estimates = [estimate(inputs, short, work(rows[i]["change"], config)) for i in todo]
            how = Pairs(run_id, repeats, noise)
            left = budget_s - spent
            measure(rows, todo, config, short, left, where, progress, estimates, how)
    better = [r for r in rows if r["verdict"] == "better"]
    result.best = dict(max(better, key=lambda r: r["measured_gain"])["change"]) if better else {}
    _save(path, result)
    return result


def _refuse_bad_input(repeats: int, budget_s: float) -> None:
    if repeats < 2:
        raise TuneError(f"repeats={repeats}: an interval needs 2 pairs or more")
    if not budget_s > 0:
        raise TuneError(f"budget {budget_s} s: must be positive")


def _probe(
    result: TuneResult,
    plan: Sequence[Candidate],
    config: RunConfig,
    inputs: ModelInputs,
    room_s: float,
    where: tuple[str, dict[str, Any]],
    progress: Callable[[str], None] | None,
) -> tuple[ModelInputs, float]:
    """The batch probe where it fits in ``room_s`` (its split kept in ``result``): the model's
    inputs with the split, and the seconds it took."""
    if room_s < PROBE_RUNS * estimate(inputs, SHORT_WARMUP + PROBE_STEPS, 1.0):
        return inputs, 0.0
    sweep = f"tune-{result.run_id}"
    inputs, result.batch_cost, spent = with_batch_probe(
        plan, config, inputs, sweep, where, progress
    )
    return inputs, spent


def _ranked(
    plan: Sequence[Candidate],
    inputs: ModelInputs,
    noise: float,
    explicit: bool,
    top: int | None,
    short_runs: tuple[RunConfig, int, str],
) -> tuple[list[dict[str, Any]], list[int]]:
    """Every candidate's row with its prediction, and the indices to measure, best first: at
    most ``top``, and only valid configs (``short_runs``: the base's config, the short runs'
    steps and the base's run id)."""
    rows, todo = _predict(plan, inputs, noise, explicit)
    todo = todo[:top] if top is not None else todo
    for i, row in enumerate(rows):
        if row["verdict"] == "skipped" and not row["why"] and i not in todo:
            row["why"] = f"not among the top {top} predictions"
    return rows, _valid(rows, todo, *short_runs)


def _valid(
    rows: list[dict[str, Any]], todo: list[int], config: RunConfig, short: int, run_id: str
) -> list[int]:
    """``todo`` less the changes the config's rules refuse (said in their rows), before
    anything starts."""
    out = []
    for i in todo:
        try:
            short_config(config, short, f"tune-{run_id}", rows[i]["change"])
        except ConfigError as exc:
            rows[i]["why"] = f"not a valid config: {exc}"
            continue
        out.append(i)
    return out


def _load_base(
    path: Path, changes: Sequence[Mapping[str, Any]] | None = None
) -> tuple[RunConfig, str, BasePlan]:
    """The base run's config, run id and plan (:func:`base_plan`: its diagnosis, the model's
    inputs, the candidates); a :class:`TuneError` for a run that did not complete or measured
    too few steps."""
    record = read_json(path / schema.RUN_FILE)
    run_id = str(record.get("run_id", path.name))
    status = record.get("status")
    if status != "completed":
        failure = (record.get("failure") or {}).get("message") or ""
        raise TuneError(
            f"run {run_id} is {status}, not completed{': ' + failure if failure else ''}; a "
            "tune starts from a completed run's measurements (run it again, then tune)"
        )
    said = [str(w.get("message", "")) for w in record.get("measurement_warnings") or []]
    if any(schema.SAMPLES_NOT_COUNTED in m for m in said):
        raise TuneError(
            f"run {run_id}: {schema.SAMPLES_NOT_COUNTED}, so its throughput, and any gain, is "
            "unknown; tell them with workbench.trace.note(samples=...) in the script's "
            "training loop, run it again, then tune"
        )
    config = RunConfig.from_dict(record["config"])
    runs = load_runs(path.parent.parent, [path.parent.name])
    runs = runs[runs["run_id"] == run_id]
    evals = load_traces([path], "eval")
    # The store's frames of the run, from its digest (built here once if it has none, with the
    # analysis's rules) or its rows, the store decides; then the analysis's plan, in one call.
    with open_frames([path], RULES, evals if len(evals) else None) as frames:
        plan = base_plan(
            runs, frames, config.to_dict(), config.is_script, changes, MIN_MEASURED_STEPS
        )
    measured = int(plan.diagnosis.get("measured_steps", 0))
    if measured < MIN_MEASURED_STEPS:
        raise TuneError(
            f"run {run_id} has {measured} measured step(s) (after warm-up); a tune needs "
            f"{MIN_MEASURED_STEPS} or more to diagnose it and predict: run it with more "
            f"max_steps (warm-up is {config.warmup_steps} steps)"
        )
    return config, str(runs["run_id"].iloc[0]), plan


def _predict(
    plan: Sequence[Candidate], inputs: ModelInputs, noise: float, explicit: bool = False
) -> tuple[list[dict[str, Any]], list[int]]:
    """Every candidate's row with its prediction; the indices to measure, best first (changes
    asked for ``explicit``ly are measured whatever their prediction)."""
    rows = []
    measured = [as_measured(c, inputs) for c in plan]
    for c in measured:
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
    todo.sort(key=lambda i: prediction_order(rows[i]["predicted_gain"], measured[i].partial))
    return rows, todo


def _save(path: Path, result: TuneResult) -> None:
    write_json(path / TUNE_FILE, result.to_dict())


def load_tune(path: str | Path) -> dict[str, Any] | None:
    """The last tune of a run (its folder), or ``None``."""
    file = Path(path) / TUNE_FILE
    return read_json(file) if file.is_file() else None
