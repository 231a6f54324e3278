"""The checks that span fields of a RunConfig, one named function each.

Each field's own constraint (type, choices, bounds) is declared beside it and checked by
``fields.check_fields`` first; a rule is given the names of the fields that failed there (``bad``)
and skips reasoning about them, so one mistake is reported once. Rules take the config loosely
typed (``Any``): its values are not yet known to be well typed, and ``run_config`` imports this
module (not the other way round).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from workbench.config.choices import (
    ATTENTION_MODELS,
    HF_ARCHITECTURES,
    HF_PREFIX,
    MODEL_OPTIONS,
    SIZE_OPTION,
    ZERO_OPTIONS,
)
from workbench.config.fault import FaultInjection
from workbench.config.fields import check_fields, did_you_mean, is_int
from workbench.config.names import is_module_name, script_name
from workbench.config.sizes import merged_options, size_problem, sizes_of
from workbench.errors import Problem

#: A rule: the config and the fields already found bad -> its problems.
Rule = Callable[[Any, frozenset[str]], list[Problem]]
LAYOUT_FIELDS = frozenset({"nodes", "world_size", "tasks_per_node"})
BATCH_FIELDS = ("per_device_batch_size", "global_batch_size")


def world(c: Any) -> int:
    """Total ranks as the layout fields give them (``RunConfig`` derives it the same way)."""
    return int(c.world_size or c.nodes * (c.tasks_per_node or 1))


def layout(c: Any, bad: frozenset[str]) -> list[Problem]:
    """``world_size`` is ``nodes x tasks_per_node`` when both are given, else a multiple of
    ``nodes``."""
    if bad & LAYOUT_FIELDS or c.world_size is None:
        return []
    if c.tasks_per_node is not None and c.world_size != c.nodes * c.tasks_per_node:
        rule = f"must equal nodes x tasks_per_node = {c.nodes} x {c.tasks_per_node}"
        return [Problem("world_size", c.world_size, rule)]
    if c.tasks_per_node is None and c.world_size % c.nodes:
        return [Problem("world_size", c.world_size, f"must be a multiple of nodes={c.nodes}")]
    return []


def batch(c: Any, bad: frozenset[str]) -> list[Problem]:
    """Exactly one of the two batch sizes; the global batch splits evenly over ranks and
    micro-steps; one global batch fits in the training set. (A script has its own.)"""
    if c.is_script:
        return []
    given = [n for n in BATCH_FIELDS if getattr(c, n) is not None]
    if len(given) != 1:
        return [
            Problem(
                "global_batch_size" if given else "per_device_batch_size",
                {n: getattr(c, n) for n in BATCH_FIELDS},
                "give exactly one of per_device_batch_size and global_batch_size",
            )
        ]
    if bad & {*LAYOUT_FIELDS, *BATCH_FIELDS, "gradient_accumulation_steps"}:
        return []
    per_step = world(c) * c.gradient_accumulation_steps
    if c.global_batch_size is not None and c.global_batch_size % per_step:
        rule = f"must be divisible by world_size x gradient_accumulation_steps = {per_step}"
        return [Problem("global_batch_size", c.global_batch_size, rule)]
    global_batch = c.global_batch_size or c.per_device_batch_size * per_step
    if "train_samples" not in bad and c.train_samples < global_batch:
        rule = (
            f"smaller than one global batch ({global_batch}); use more samples or a smaller batch"
        )
        return [Problem("train_samples", c.train_samples, rule)]
    return []


def model_options(c: Any, bad: frozenset[str]) -> list[Problem]:
    """A built-in model's options: known names, integers >= 1, a ``size`` among the model's
    presets, and ``d_model`` divisible by ``num_heads`` for attention models (with the preset's
    sizes where the options leave them out). A plug-in's options are its own business."""
    if bad & {"model", "model_options"} or c.model not in MODEL_OPTIONS:
        return []
    valid = MODEL_OPTIONS[c.model]
    names = [*valid, SIZE_OPTION] if sizes_of(c.model) else list(valid)
    p = []
    for key, value in c.model_options.items():
        if key == SIZE_OPTION:
            problem = size_problem(c.model, value)
            p += [problem] if problem is not None else []
        elif key not in valid:
            rule = f"unknown option of model {c.model!r}; {did_you_mean(key, names)}"
            p.append(Problem(f"model_options.{key}", value, rule + f"valid: {', '.join(names)}"))
        elif not is_int(value) or value < (0 if key in ZERO_OPTIONS else 1):
            least = 0 if key in ZERO_OPTIONS else 1
            p.append(Problem(f"model_options.{key}", value, f"must be an integer >= {least}"))
    opts = merged_options(c.model, c.model_options)
    if c.model in ATTENTION_MODELS:
        d_model, heads = opts["d_model"], opts["num_heads"]
        sizes_ok = all(is_int(v) and v >= 1 for v in (d_model, heads))
        if sizes_ok and d_model % heads:
            rule = f"must be divisible by num_heads={heads}"
            p.append(Problem("model_options.d_model", d_model, rule))
    return p


def hf_model(c: Any, bad: frozenset[str]) -> list[Problem]:
    """``hf:<architecture>`` names one of :data:`HF_ARCHITECTURES` and uses the synthetic data
    (its options are the config class's fields: preflight checks them, with transformers)."""
    if "model" in bad or not str(c.model).startswith(HF_PREFIX):
        return []
    arch = c.model[len(HF_PREFIX) :]
    p = []
    if arch not in HF_ARCHITECTURES:
        valid = ", ".join(HF_PREFIX + a for a in HF_ARCHITECTURES)
        p.append(Problem("model", c.model, f"{did_you_mean(arch, HF_ARCHITECTURES)}valid: {valid}"))
    if c.dataset != "synthetic":
        rule = "a Hugging Face model is fed synthetic token ids: use dataset='synthetic'"
        p.append(Problem("dataset", c.dataset, rule))
    return p


def dataset(c: Any, bad: frozenset[str]) -> list[Problem]:
    """``dataset='parquet'`` needs the paths of its train and eval files in ``dataset_options``."""
    if c.dataset != "parquet" or "dataset_options" in bad:
        return []
    return [
        Problem(
            f"dataset_options.{key}",
            c.dataset_options.get(key),
            "dataset='parquet' needs the path of a Parquet file",
        )
        for key in ("train", "eval")
        if not isinstance(c.dataset_options.get(key), str)
    ]


def strategy(c: Any, bad: frozenset[str]) -> list[Problem]:
    """What each strategy allows: hooks only with DDP, 'single' on one device, DataParallel on
    the CUDA devices of one node (FSDP's own: :func:`fsdp`)."""
    if "strategy" in bad:
        return []
    p = []
    if c.strategy != "ddp" and c.comm_hook != "allreduce" and "comm_hook" not in bad:
        rule = f"communication hooks need strategy='ddp', not {c.strategy!r}"
        p.append(Problem("comm_hook", c.comm_hook, rule))
    if c.strategy == "single" and not bad & LAYOUT_FIELDS and world(c) != 1:
        given = {"world_size": c.world_size, "nodes": c.nodes, "tasks_per_node": c.tasks_per_node}
        rule = "strategy='single' runs on one device: use world_size=1"
        p.append(Problem("world_size", given, rule))
    if c.strategy == "dp" and c.device == "cpu":
        rule = (
            "DataParallel splits batches over CUDA devices; on CPU "
            "use 'ddp' (one process per rank) or 'single'"
        )
        p.append(Problem("strategy", c.strategy, rule))
    if c.strategy == "dp" and c.nodes != 1 and "nodes" not in bad:
        rule = "strategy='dp' drives the GPUs of one node: use nodes=1"
        p.append(Problem("nodes", c.nodes, rule))
    return p


#: DDP's own knobs (other than ``comm_hook``, which the strategy rule judges), refused with
#: ``strategy='fsdp'`` where given, and why: FSDP2 has none of them.
DDP_ONLY = {
    "find_unused_parameters": "FSDP2 reduces every parameter group's gradients in backward",
    "bucket_cap_mb": "FSDP2 reduce-scatters one parameter group (a block) at a time, not buckets",
    "gradient_as_bucket_view": "FSDP2's gradients are the reduce-scatter's shards, not buckets",
    "static_graph": "FSDP2 has no static-graph mode",
}
#: FSDP's own knobs, refused with any other strategy where given.
FSDP_ONLY = ("reshard_after_forward", "fsdp_param_dtype", "fsdp_reduce_dtype")


def given(c: Any, name: str) -> bool:
    """Whether field ``name`` of ``c`` differs from its default."""
    f = next(f for f in dataclasses.fields(c) if f.name == name)
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return bool(getattr(c, name) != default)


def fsdp(c: Any, bad: frozenset[str]) -> list[Problem]:
    """``strategy='fsdp'``: none of DDP's own knobs, every rank in the evaluation's forward
    (its all-gathers need them all), no checkpoints (a sharded model's are not written), no
    DDP comm hook timing; FSDP's knobs only with ``strategy='fsdp'``. (A script's FSDP is
    its own: script runs refuse both sets.)"""
    if "strategy" in bad or c.is_script:
        return []
    if c.strategy != "fsdp":
        rule = f"an FSDP setting: only with strategy='fsdp', not {c.strategy!r} (remove it)"
        return [Problem(n, getattr(c, n), rule) for n in FSDP_ONLY if n not in bad and given(c, n)]
    p = [
        Problem(n, getattr(c, n), f"a DDP setting, not with strategy='fsdp': {why}")
        for n, why in DDP_ONLY.items()
        if n not in bad and given(c, n)
    ]
    refused = {
        "eval_on": (
            c.eval_on == "rank0",
            "with strategy='fsdp' every rank takes part in the model's forward (its "
            "all-gathers need them all): use 'all'",
        ),
        "checkpoint_every_steps": (
            is_int(c.checkpoint_every_steps) and c.checkpoint_every_steps > 0,
            "a sharded model's checkpoints are not written: use 0 with strategy='fsdp', or ddp",
        ),
        "trace_comm": (
            c.trace_comm == "hook",
            "'hook' times DDP's gradient buckets; with strategy='fsdp' use 'sampled' (FSDP's "
            "all-gathers and reduce-scatters, every step) or 'off'",
        ),
    }
    for name, (wrong, rule) in refused.items():
        if wrong and name not in bad:
            p.append(Problem(name, getattr(c, name), rule))
    return p


def needs_cuda(c: Any, bad: frozenset[str]) -> list[Problem]:
    """What torch runs on CUDA only (NCCL, SyncBatchNorm, fp16 with a GradScaler), refused on
    ``device='cpu'``."""
    if c.device != "cpu":
        return []
    p = []
    if c.backend == "nccl":
        rule = "nccl needs device='cuda' (or 'auto'); use gloo on CPU"
        p.append(Problem("backend", c.backend, rule))
    if c.sync_batchnorm is True:
        rule = (
            "SyncBatchNorm needs CUDA (torch runs it on GPU tensors only); on device='cpu' "
            "leave it off"
        )
        p.append(Problem("sync_batchnorm", c.sync_batchnorm, rule))
    if c.precision == "fp16":
        rule = "fp16 needs CUDA (GradScaler); on device='cpu' use fp32 or bf16"
        p.append(Problem("precision", c.precision, rule))
    return p


def profile_window(c: Any, bad: frozenset[str]) -> list[Problem]:
    """``profile_steps``: omitted, or two steps (first, last) with 1 <= first <= last."""
    w = c.profile_steps
    if w is None or (
        isinstance(w, tuple) and len(w) == 2 and all(is_int(x) for x in w) and 1 <= w[0] <= w[1]
    ):
        return []
    return [Problem("profile_steps", w, "two steps (first, last) with 1 <= first <= last")]


def fault(c: Any, bad: frozenset[str]) -> list[Problem]:
    """``fault``: a valid FaultInjection (a dict of its fields is turned into one before the
    checks) whose rank exists."""
    f = c.fault
    if f is None or "fault" in bad:
        return []
    if not isinstance(f, FaultInjection):
        return [Problem("fault", f, "a FaultInjection or a dict with rank, step, kind")]
    p = check_fields(f, "fault.")
    if not p and not bad & LAYOUT_FIELDS and f.rank >= world(c):
        p.append(Problem("fault.rank", f.rank, f"must be a rank in 0..{world(c) - 1}"))
    return p


#: Fields a script run does not use: the script's own code decides what they would. Given with
#: a value other than their default, they are an error rather than silently ignored. The DDP
#: knobs that are not here (bucket_cap_mb, gradient_as_bucket_view, static_graph, comm_hook,
#: powersgd_rank) are applied to the script's DDP by the workbench's instrumentation.
NOT_FOR_SCRIPTS = (
    "model",
    "model_options",
    "dataset",
    "dataset_options",
    "train_samples",
    "eval_samples",
    "per_device_batch_size",
    "global_batch_size",
    "gradient_accumulation_steps",
    "strategy",
    "reshard_after_forward",
    "fsdp_param_dtype",
    "fsdp_reduce_dtype",
    "find_unused_parameters",
    "sync_batchnorm",
    "lr_scaling",
    "lr_reference_batch",
    "lr_warmup_steps",
    "epochs",
    "max_steps",
    "optimizer",
    "learning_rate",
    "momentum",
    "weight_decay",
    "precision",
    "eval_every_epochs",
    "eval_at_end",
    "eval_batch_size",
    "eval_on",
    "eval_timeout_s",
    "checkpoint_every_steps",
    "stop_check_every_steps",
    "trace_sample_ids",
    "profile_steps",
    "fault",
)


def script(c: Any, bad: frozenset[str]) -> list[Problem]:
    """At most one of ``script`` and ``script_module``; its arguments are strings; the fields a
    script decides itself keep their defaults; DDP's own timer is how it is traced."""
    p = []
    if c.script is not None and c.script_module is not None:
        rule = f"give script ({c.script!r}) or script_module, not both"
        p.append(Problem("script_module", c.script_module, rule))
    args = c.script_args
    if not isinstance(args, tuple) or not all(isinstance(a, str) for a in args):
        p.append(Problem("script_args", args, "a list of strings (the script's own arguments)"))
    if c.script_module is not None and not is_module_name(c.script_module):
        rule = "a dotted module name, e.g. 'mypkg.train'"
        p.append(Problem("script_module", c.script_module, rule))
    if not c.is_script:
        if args and "script_args" not in {q.field for q in p}:
            p.append(Problem("script_args", args, "only with script or script_module"))
        return p
    defaults = {f.name: f for f in dataclasses.fields(c)}
    for name in NOT_FOR_SCRIPTS:
        f = defaults[name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if getattr(c, name) != default:
            rule = "set by the script itself; not a setting of a script run (remove it)"
            p.append(Problem(name, getattr(c, name), rule))
    if c.trace_comm != "sampled":
        rule = "a script's communication is read from DDP's own timer: 'sampled' only"
        p.append(Problem("trace_comm", c.trace_comm, rule))
    return p


def derived(c: Any) -> dict[str, Any]:
    """The fields a valid config ``c`` leaves out and implies, by name, in this order: the
    layout (``world_size``, ``tasks_per_node``), then a script's ``model`` (named after it, so
    run ids, tables and findings say whose training it is), or the batch size not given and
    ``epochs=1`` where neither ``epochs`` nor ``max_steps`` is (``max_steps`` =
    :data:`UNTIL_KNOWN_STEP_CAP` instead when measuring until known)."""
    out: dict[str, Any] = {}
    if c.world_size is None:
        out["world_size"] = c.nodes * (c.tasks_per_node or 1)
    world_size = out.get("world_size", c.world_size)
    if c.tasks_per_node is None:
        out["tasks_per_node"] = world_size // c.nodes
    if c.is_script:
        out["model"] = f"script:{script_name(c.script, c.script_module)}"
        return out
    per_step = world_size * c.gradient_accumulation_steps
    if c.global_batch_size is None:
        out["global_batch_size"] = c.per_device_batch_size * per_step
    if c.per_device_batch_size is None:
        out["per_device_batch_size"] = c.global_batch_size // per_step
    if c.epochs is None and c.max_steps is None:
        if c.until_known is None:
            out["epochs"] = 1
        else:
            out["max_steps"] = UNTIL_KNOWN_STEP_CAP
    return out


#: The step cap of a run measuring until known where neither epochs nor max_steps is given.
UNTIL_KNOWN_STEP_CAP = 2000


#: Every cross-field rule, in the order their problems are listed.
RULES: tuple[Rule, ...] = (
    script,
    layout,
    batch,
    model_options,
    hf_model,
    dataset,
    strategy,
    fsdp,
    needs_cuda,
    profile_window,
    fault,
)


def check(c: Any, bad: frozenset[str]) -> list[Problem]:
    """Every cross-field problem of the config ``c``; ``bad``: fields whose own check failed."""
    return [problem for rule in RULES for problem in rule(c, bad)]
