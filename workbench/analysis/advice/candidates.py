"""What to try for a run, from its diagnosis: the candidate list that both the finding's advice
and ``workbench tune`` read, so the two never disagree.

:func:`diagnose` names the largest measured cause of one run's step (``exposed_transfer``,
FSDP's ``exposed_all_gather`` and ``exposed_reduce_scatter``, ``wait``, ``data``, ``gaps``) when
it takes at least :data:`DIAGNOSIS_SHARE` of the step, else ``compute``.
:func:`candidates_for` lists the RunConfig changes that cause calls for, each marked when it
changes the training's mathematics (batch, accumulation, compression), and for a script run
whether the workbench's instrumentation reaches it; :func:`prediction_order` ranks them for both.
:func:`predicted_gain` feeds each change to the scaling model
(:func:`workbench.analysis.model.scaling_model.model_curve`; FSDP's own settings are not in it:
measured, not predicted). Pure pandas/numpy; no torch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workbench.analysis.advice.fsdp_words import (
    DDP_KNOBS,
    FSDP_SAID,
    FSDP_SETTINGS,
    KEEP_GATHERED,
)
from workbench.analysis.model.batch_cost import BatchCost
from workbench.analysis.model.network import NetworkModel, ring_allreduce_time
from workbench.analysis.model.scaling_model import Base, model_arrays

#: A cause "calls for" tuning when it takes at least this share of the run's step.
DIAGNOSIS_SHARE = 0.15
#: An allreduce span over this share of the step is communication-bound (see :func:`diagnose`).
SPAN_SHARE = 0.5
#: End-to-end step times vary 5-25 % between clean repeats on a shared host; under 5 % cannot
#: be resolved end to end even with interleaved pairs (FACTS). Predicted gains below this are
#: not worth a measurement, and a measured gain must reach it to count as better or worse.
NOISE = 0.05
#: What the model assumes PowerSGD (rank 1) sends: the low-rank factors of each gradient matrix,
#: about a tenth of the bytes for layers of a few hundred units (it depends on their shapes).
POWERSGD_BYTES = 0.1
#: How much larger a per-device batch to try: enough to amortise one allreduce over much more
#: compute (memory permitting: activations grow with it).
BATCH_FACTOR = 4
#: The fields the workbench's instrumentation applies to a script's own DDP (torch_hooks).
SCRIPT_REACHABLE = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "comm_hook")


@dataclass(frozen=True)
class Candidate:
    """One change to try: ``change`` (RunConfig fields and values), ``label`` (words),
    ``changes_math`` (the training computes something else: the user decides), ``reachable``
    (for a script run: whether the workbench can apply it without changing the script),
    ``partial`` (the cost its prediction leaves out; see :func:`prediction_order`),
    ``assumes`` (what its prediction assumes, said beside it)."""

    change: Mapping[str, Any]
    label: str
    changes_math: bool = False
    reachable: bool = True
    note: str = ""
    partial: str = ""
    assumes: str = ""


#: What a comm hook's prediction leaves out: the model knows the bytes a hook saves, not what
#: compressing and decompressing the gradients costs (PowerSGD measured -57 % where +23 % was
#: predicted: BENCHMARKS.md, "Tune: predicted against measured").
HOOK_COST = "before the cost of compressing"


def prediction_order(gain: float, partial: str = "") -> tuple[bool, float]:
    """The sort key of a change, the order the finding names changes in and ``workbench tune``
    tries them: predictions that cover the change's costs first, then those that leave one
    out (``partial``), each by predicted gain, best first; no prediction last."""
    return bool(partial), -gain if math.isfinite(gain) else math.inf


#: What a cause with no RunConfig knob asks of the user (said, not tuned).
SAID = {
    "compute": (
        "look at what grew in each rank's own compute with N (a smaller per-device batch, "
        "memory bandwidth, clocks)"
    ),
    "contention": (
        "give each rank its own cores (fewer ranks per host, or threads_per_rank x ranks within "
        "the cores), or more work per step so the gain outweighs the sharing"
    ),
    "wait": "find the slowest rank (the straggler line) and why it is slow",
    "data": "load the data ahead (more loader workers, prefetching, data on local disk)",
    "gaps": "look at the work between steps (logging, host synchronisation)",
    "unexplained": "trace more steps or sample DDP's timers more often to see where it went",
    **FSDP_SAID,
}


def _value(config: Mapping[str, Any], name: str) -> Any:
    """A config value, ``None`` where missing or NaN (a run table's empty cell)."""
    value = config.get(name)
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _bucket_sizes(current: float) -> list[float]:
    """Larger and smaller gradient buckets than ``current`` MiB (4x each way, within reason)."""
    out = [min(current * 4, 200.0), max(current / 4, 1.0)]
    return [float(v) for v in dict.fromkeys(out) if v != current]


def _keep_gathered(config: Mapping[str, Any], script: bool) -> list[Candidate]:
    """FSDP's change for its exposed all-gathers: keep the gathered parameters until backward,
    where the run reshards after forward (a script's FSDP is its own: no field reaches it)."""
    resharded = _value(config, "reshard_after_forward")
    kept = resharded is not None and not bool(resharded)
    if script or kept or _value(config, "strategy") != "fsdp":
        return []
    return [Candidate({"reshard_after_forward": False}, KEEP_GATHERED, note="memory permitting")]


def candidates_for(cause: str, config: Mapping[str, Any], script: bool = False) -> list[Candidate]:
    """The changes ``cause`` calls for, from the run's ``config`` (a RunConfig's dict).

    Communication-bound (``exposed_transfer``): ``bucket_cap_mb`` up and down, ``comm_hook``
    fp16, bf16 and powersgd, ``gradient_as_bucket_view``, ``static_graph``, a per-device batch
    :data:`BATCH_FACTOR` times as large and twice the micro-steps of gradient accumulation (one
    allreduce for them, DDP's no_sync). Straggler, data, compute, gaps: none (no RunConfig
    field reaches them; see :data:`SAID`). For a script run, the batch and accumulation are
    the script's own: listed, not reachable. FSDP's exposed all-gathers (``exposed_all_gather``)
    call for ``reshard_after_forward`` false where it is true (its gain not modelled: measured);
    an FSDP run never gets a DDP knob (:data:`DDP_KNOBS`)."""
    if cause == "exposed_all_gather":
        return _keep_gathered(config, script)
    if cause != "exposed_transfer":
        return []
    out: list[Candidate] = []
    cap = float(_value(config, "bucket_cap_mb") or 25.0)
    for size in _bucket_sizes(cap):
        word = "larger" if size > cap else "smaller"
        out.append(
            Candidate({"bucket_cap_mb": size}, f"bucket_cap_mb {cap:g} -> {size:g} ({word})")
        )
    if (_value(config, "comm_hook") or "allreduce") == "allreduce":
        for hook in ("fp16", "bf16", "powersgd"):
            label = f"comm_hook {hook}"
            out.append(Candidate({"comm_hook": hook}, label, changes_math=True, partial=HOOK_COST))
    if not _value(config, "gradient_as_bucket_view"):
        out.append(Candidate({"gradient_as_bucket_view": True}, "gradient_as_bucket_view"))
    if not _value(config, "static_graph"):
        out.append(Candidate({"static_graph": True}, "static_graph"))
    batch = _value(config, "per_device_batch_size")
    if batch:
        change, label = {"per_device_batch_size": int(batch) * BATCH_FACTOR}, ""
        label = f"per-device batch {int(batch)} -> {int(batch) * BATCH_FACTOR}"
    else:
        change, label = {}, f"a per-device batch {BATCH_FACTOR}x as large"
    # the model has one compute time per step: it cannot tell the per-step cost from the
    # per-sample one, so it scales all of it (an underestimate where a step is mostly overhead)
    assumes = f"if all of its compute grows {BATCH_FACTOR}x"
    out.append(Candidate(change, label, True, note="memory permitting", assumes=assumes))
    accumulation = int(_value(config, "gradient_accumulation_steps") or 1)
    out.append(
        Candidate(
            {"gradient_accumulation_steps": accumulation * 2},
            f"gradient accumulation {accumulation} -> {accumulation * 2} (no_sync)",
            changes_math=True,
        )
    )
    if script:  # what the instrumentation cannot apply is listed, not tried
        out = [
            c
            if c.change and all(k in SCRIPT_REACHABLE for k in c.change)
            else dataclasses.replace(c, reachable=False)
            for c in out
        ]
    if _value(config, "strategy") == "fsdp":
        out = [c for c in out if not DDP_KNOBS & set(c.change)]
    return out


def diagnose(parts: Mapping[str, float]) -> tuple[str, float]:
    """The cause that calls for tuning and its share of the step: of ``parts`` (seconds per
    step: ``step_s`` and the causes of :mod:`workbench.analysis.advice.losses`), the largest of
    ``exposed_transfer, exposed_all_gather, exposed_reduce_scatter, wait, data, gaps`` at
    :data:`DIAGNOSIS_SHARE` of the step or more; else ``compute`` (its share). Waiting in the
    allreduce counts as communication (ranks sharing a host's cores reach it at different
    times step by step) unless it is more than twice the exposed transfer: then a rank is
    slow, and the cause is ``wait``. A run whose allreduce
    span (``comm_span``: DDP's timer, the smallest over ranks) covers :data:`SPAN_SHARE` of the
    step or more is communication-bound (that share). FSDP's exposed all-gathers and
    reduce-scatters reach the share together: the larger of the two is the cause."""
    step = float(parts.get("step_s", float("nan")))
    if not (math.isfinite(step) and step > 0):
        return "unexplained", float("nan")

    def part(name: str) -> float:
        value = float(parts.get(name, 0.0) or 0.0)
        return value if math.isfinite(value) else 0.0

    transfer, wait = part("exposed_transfer"), part("wait")
    straggler = wait > 2 * transfer
    # DDP's allreduce span over most of the step: communication-bound, however the step's
    # exposed part splits into transfer and wait (on a shared host that split swings)
    span = part("comm_span") / step
    comm = (transfer if straggler else transfer + wait) / step
    shares = {
        "exposed_transfer": max(comm, span if span >= SPAN_SHARE and not straggler else 0.0),
        "exposed_all_gather": part("exposed_all_gather") / step,
        "exposed_reduce_scatter": part("exposed_reduce_scatter") / step,
        "wait": (wait if straggler else 0.0) / step,
        "data": part("data") / step,
        "gaps": part("gaps") / step,
    }
    cause, share = max(shares.items(), key=lambda kv: kv[1])
    fsdp = {k: shares.pop(k) for k in ("exposed_all_gather", "exposed_reduce_scatter")}
    if sum(fsdp.values()) >= max(DIAGNOSIS_SHARE, *shares.values()):  # FSDP's, together
        cause, share = max(fsdp.items(), key=lambda kv: kv[1])
        return cause, share
    if share >= DIAGNOSIS_SHARE:
        return cause, share
    compute = float(parts.get("compute", float("nan")))
    return "compute", compute / step if math.isfinite(compute) else float("nan")


@dataclass(frozen=True)
class ModelInputs:
    """The scaling model's view of the base run at its own world size: ``base`` (wall step,
    exposed communication, bytes, buckets), the ``network`` and the calibrated ``overlap``."""

    base: Base
    network: NetworkModel
    overlap: float
    bucket_cap_mb: float = 25.0
    per_device_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    #: What of the compute grows with the batch, where something measured it (a study's fit,
    #: a tune's probe); None: all of it, the assumption.
    batch_cost: BatchCost | None = None
    #: Seconds per step of each comm hook on the base's own buckets, measured by its network
    #: micro-benchmark (``network.hooks``: compressing included); empty where not measured.
    hook_time_s: Mapping[str, float] = dataclasses.field(default_factory=dict)

    @property
    def per_step_share(self) -> float:
        """The share of the base's compute that does not grow with the batch, at its samples a
        rank a step (0 where nothing measured it: all of it grows)."""
        if self.batch_cost is None:
            return 0.0
        samples = self.per_device_batch_size * self.gradient_accumulation_steps
        return self.batch_cost.per_step_share(samples)

    @property
    def batch_split(self) -> str:
        """How the split was measured, in words (empty where it is assumed)."""
        return "" if self.batch_cost is None else self.batch_cost.words()

    def hook_factor(self, hook: str) -> float:
        """How many times the plain allreduce's time ``hook`` took on the base's buckets (NaN:
        not measured)."""
        plain, mine = self.hook_time_s.get("allreduce"), self.hook_time_s.get(hook)
        if plain and mine and math.isfinite(plain) and math.isfinite(mine) and plain > 0:
            return mine / plain
        return float("nan")


def as_measured(c: Candidate, inputs: ModelInputs) -> Candidate:
    """``c`` as the base's measurements let it be predicted: a larger batch from the measured
    split of the compute (said instead of the assumption), a comm hook from its measured time
    (nothing left out)."""
    if inputs.batch_split and "per_device_batch_size" in c.change:
        c = dataclasses.replace(c, assumes=inputs.batch_split)
    hook = c.change.get("comm_hook")
    if hook and math.isfinite(inputs.hook_factor(hook)):
        c = dataclasses.replace(c, partial="")
    return c


def span_network(nbytes: float, world_size: int, span_s: float) -> NetworkModel | None:
    """The ring bandwidth at which ``nbytes`` take the measured ``span_s`` (no latency): the
    network the run's own allreduce shows when nothing else measured one."""
    if not (world_size > 1 and nbytes > 0 and math.isfinite(span_s) and span_s > 0):
        return None
    bw = float(ring_allreduce_time(nbytes, world_size, 1.0, 0.0)) / span_s
    return NetworkModel(name="span", bandwidth_bytes_per_s=bw, latency_s=0.0)


def _rate(base: Base, inputs: ModelInputs) -> float:
    # the arrays, not the frame: a finding's interval asks this twice per change and sampled step
    curve = model_arrays(base, inputs.network, [base.world_size], inputs.overlap)
    return float(curve["samples_per_s"][0])


def predicted_gain(change: Mapping[str, Any], inputs: ModelInputs) -> tuple[float, str]:
    """The scaling model's throughput gain (ratio minus 1) of ``change`` over the base, both
    predicted by the model (so its error on the base cancels), and what it assumed: fp16 and
    bf16 halve the gradient bytes, PowerSGD sends :data:`POWERSGD_BYTES` of them (the hooks'
    own compute is not modelled) unless the base's micro-benchmark timed the hook on its buckets:
    then the communication takes the measured multiple of the plain allreduce's time
    (:meth:`ModelInputs.hook_factor`); ``bucket_cap_mb`` scales the bucket count (the latency term);
    accumulating k times the micro-steps does k times the compute per allreduce; a batch k
    times as large, ``per_step_share + (1 - per_step_share) x k`` times (k times where nothing
    measured the share);
    ``gradient_as_bucket_view`` and ``static_graph`` are not in the model (0). NaN when the
    base has no modelled compute."""
    if FSDP_SETTINGS & set(change):
        return float("nan"), "FSDP's settings are not in this model: measured, not predicted"
    b = inputs.base
    before = _rate(b, inputs)
    if not (math.isfinite(before) and before > 0):
        return float("nan"), "the model has no compute for the base"
    buckets, work = b.buckets, 1.0
    nbytes, comm_scale, said = _with_hook(change.get("comm_hook"), inputs)
    notes = [said] if said else []
    if "bucket_cap_mb" in change:
        cap = float(change["bucket_cap_mb"])
        # the bucket count scales with the cap, but no more buckets than the bytes fill (DDP's
        # small first bucket: one more)
        fill = math.ceil(b.gradient_bytes / (cap * 2**20)) + 1
        buckets = max(1, min(round(b.buckets * inputs.bucket_cap_mb / cap), fill))
        notes.append(
            f"{b.buckets} -> {buckets} bucket(s), latency {inputs.network.latency_s:.2g} s each"
        )
    samples = 1.0  # samples per step, as a multiple of the base's
    if "per_device_batch_size" in change and change["per_device_batch_size"]:
        samples = float(change["per_device_batch_size"]) / float(inputs.per_device_batch_size)
        # the per-step part of the compute stays; the rest grows with the samples
        work = inputs.per_step_share + (1 - inputs.per_step_share) * samples
    if "gradient_accumulation_steps" in change:
        samples = float(change["gradient_accumulation_steps"]) / float(
            inputs.gradient_accumulation_steps
        )
        work = samples  # every micro-step is a whole forward and backward
    if work != 1.0:
        notes.append(f"{work:.3g}x the compute per allreduce for {samples:g}x the samples")
    if {"gradient_as_bucket_view", "static_graph"} & set(change):
        notes.append("not in the model (no term): 0")
    compute = b.step_s - b.exposed_comm_s
    after = Base(
        world_size=b.world_size,
        step_s=compute * work + b.exposed_comm_s,
        samples_per_step=b.samples_per_step * samples,
        exposed_comm_s=b.exposed_comm_s,
        gradient_bytes=nbytes,
        buckets=buckets,
        scaling=b.scaling,
        backward_compute_s=b.backward_compute_s * work,
        comm_scale=b.comm_scale * comm_scale,
    )
    return _rate(after, inputs) / before - 1, "; ".join(notes)


def _with_hook(hook: str | None, inputs: ModelInputs) -> tuple[float, float, str]:
    """The gradient bytes a comm ``hook`` sends, the multiple of the plain allreduce's time its
    communication takes, and what that rests on: the hook's time measured on the base's buckets
    where its micro-benchmark timed it (the bytes unchanged: the time is the measurement), else
    the bytes it saves (its compressing not modelled)."""
    nbytes = inputs.base.gradient_bytes
    scale = inputs.hook_factor(hook) if hook else float("nan")
    if math.isfinite(scale):
        said = "(measured, compressing included)"
        return (
            nbytes,
            scale,
            f"{hook} took {scale:.2f}x the plain allreduce's time on the run's buckets {said}",
        )
    if hook in ("fp16", "bf16"):
        return nbytes / 2, 1.0, f"{hook} halves the bytes; its casts are not modelled"
    if hook == "powersgd":
        said = f"PowerSGD sends about {POWERSGD_BYTES:.0%} of the bytes (assumed)"
        return nbytes * POWERSGD_BYTES, 1.0, said
    return nbytes, 1.0, ""


def _pct(value: Any) -> str:
    return "?" if value is None else f"{float(value):+.0%}"


def verified(tune: Mapping[str, Any]) -> str:
    """What a tune (``tune.json``'s content) verified, in one sentence: each measured
    candidate's measured gain with its interval beside its prediction, by verdict, and how
    many were not measured."""
    rows = tune.get("candidates") or []
    parts = []
    for word, name in (("better", "better"), ("no significant change", "same"), ("worse", "worse")):
        told = [
            f"{r['label']} {_pct(r['measured_gain'])} ({_pct(r['low'])} to {_pct(r['high'])}, "
            f"predicted {_pct(r['predicted_gain'])})"
            for r in rows
            if r.get("verdict") == name
        ]
        if told:
            parts.append(f"{word}: {'; '.join(told)}")
    skipped = sum(1 for r in rows if r.get("verdict") == "skipped")
    if skipped:
        parts.append(f"{skipped} not measured (below the noise, not reachable or over the budget)")
    if not rows:
        parts.append(f"nothing to tune ({tune.get('said') or 'no candidate'})")
    return f"tune of run {tune.get('run_id')}: " + ", ".join(parts)
