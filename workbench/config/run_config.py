"""RunConfig: every knob of one training run, validated before anything starts, JSON round trip.

Validation here is pure (no torch, no machine facts); checks that need the machine (GPUs present, a
port free, a folder writable) live in :func:`workbench.launch.preflight`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.errors import ConfigError, Problem

#: The knobs each built-in model takes, with their defaults (tiny, so a CPU runs them in ms).
MODEL_OPTIONS: dict[str, dict[str, Any]] = {
    "mlp": {"input_dim": 32, "hidden_dim": 64, "num_layers": 2, "num_classes": 4},
    "cnn": {"image_size": 16, "channels": 3, "width": 16, "blocks": 2, "num_classes": 4},
    "transformer": {
        "vocab_size": 256,
        "seq_len": 32,
        "d_model": 64,
        "num_heads": 4,
        "num_layers": 2,
        "ffn_dim": 128,
        "num_classes": 4,
    },
    "gpt": {"vocab_size": 128, "seq_len": 32, "d_model": 64, "num_heads": 4, "num_layers": 2},
}
BUILTIN_DATASETS = ("synthetic", "parquet")
STRATEGIES = ("ddp", "dp", "single")
COMM_HOOKS = ("allreduce", "fp16", "bf16", "powersgd")
COMM_TRACING = ("sampled", "hook", "off")
LR_SCALINGS = ("none", "linear", "sqrt")
EVAL_PLACEMENTS = ("all", "rank0")
PRECISIONS = ("fp32", "fp16", "bf16")
DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl")
OPTIMIZERS = ("sgd", "adamw")
FAULT_KINDS = ("raise", "exit", "hang", "kill", "preempt")
_PLUGIN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


def _doc(text: str, default: Any = None, **kw: Any) -> Any:
    if "default_factory" in kw:
        return field(metadata={"help": text}, **kw)
    return field(default=default, metadata={"help": text})


@dataclass(frozen=True, kw_only=True)
class FaultInjection:
    """Make one rank misbehave on purpose, to test how failures are reported."""

    rank: int = _doc("global rank that misbehaves", 0)
    step: int = _doc("global step (from 1) at whose start it misbehaves", 1)
    kind: str = _doc(
        "raise: an exception; exit: os._exit(3); hang: sleep forever; kill: SIGKILL; "
        "preempt: the scheduler's preemption signal to this rank",
        "raise",
    )
    attempt: int = _doc("only on this attempt (0 = first launch), so a resumed run runs clean", 0)


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything that defines one training run. Give exactly one of ``per_device_batch_size`` and
    ``global_batch_size``, and ``world_size`` or ``tasks_per_node`` (with ``nodes``); the others are
    derived and recorded (listed in ``derived``)."""

    # -- naming and storage
    sweep: str = _doc("sweep this run belongs to (a folder of the store)", "default")
    run_name: str | None = _doc("run id; generated from model, world size and time when omitted")
    output_dir: str = _doc("root of the result store", "experiments/results")
    # -- model and data
    model: str = _doc(
        f"built-in model ({', '.join(MODEL_OPTIONS)}) or a 'package.module:factory' plug-in", "mlp"
    )
    model_options: Mapping[str, Any] = _doc(
        "keyword arguments for the model factory (sizes); see MODEL_OPTIONS", default_factory=dict
    )
    dataset: str = _doc(
        "'synthetic' (made locally from the seed) or 'package.module:factory'", "synthetic"
    )
    dataset_options: Mapping[str, Any] = _doc(
        "keyword arguments for a plug-in dataset factory", default_factory=dict
    )
    train_samples: int = _doc("training samples in the synthetic dataset", 4096)
    eval_samples: int = _doc("evaluation samples in the synthetic dataset", 1024)
    # -- devices
    world_size: int | None = _doc("total number of ranks (devices); = nodes x tasks_per_node")
    nodes: int = _doc("number of nodes (machines)", 1)
    tasks_per_node: int | None = _doc("ranks (devices) per node")
    device: str = _doc("auto (cuda when present, else cpu), cpu or cuda", "auto")
    backend: str = _doc(
        "torch.distributed backend: auto (nccl on CUDA, gloo on CPU), gloo, nccl", "auto"
    )
    threads_per_rank: int = _doc("torch intra-op threads per rank on CPU", 1)
    # -- batch and schedule
    per_device_batch_size: int | None = _doc("samples per rank per micro-step")
    global_batch_size: int | None = _doc(
        "samples per optimizer step over all ranks = per_device x world_size x accumulation"
    )
    gradient_accumulation_steps: int = _doc(
        "micro-steps per optimizer step (no_sync on all but last)", 1
    )
    # -- parallelism strategy and the DDP knobs that change scaling
    strategy: str = _doc(
        "ddp (one process per device), dp (DataParallel: one process drives all local "
        "GPUs; the batch is the total) or single (one device, no wrapper)",
        "ddp",
    )
    find_unused_parameters: bool = _doc(
        "DDP: tolerate parameters that get no gradient (slower)", False
    )
    bucket_cap_mb: float = _doc("DDP gradient bucket size in MiB", 25.0)
    gradient_as_bucket_view: bool = _doc(
        "DDP: gradients are views into the buckets (saves a copy)", False
    )
    static_graph: bool = _doc(
        "DDP: the graph is the same every step (enables optimisations)", False
    )
    sync_batchnorm: bool = _doc("convert BatchNorm layers to SyncBatchNorm", False)
    comm_hook: str = _doc(
        "gradient communication: allreduce, fp16 or bf16 (compressed), powersgd", "allreduce"
    )
    powersgd_rank: int = _doc("PowerSGD matrix approximation rank", 1)
    lr_scaling: str = _doc(
        "learning rate vs batch: none, linear or sqrt in global batch over lr_reference_batch",
        "none",
    )
    lr_reference_batch: int | None = _doc(
        "batch at which learning_rate is right (default: the "
        "per-device batch x accumulation, i.e. one device)"
    )
    lr_warmup_steps: int = _doc("linear learning-rate warm-up from 0 over this many steps", 0)
    epochs: int | None = _doc("passes over the training set (1 when neither epochs nor max_steps)")
    max_steps: int | None = _doc("stop after this many optimizer steps")
    warmup_steps: int = _doc("first steps traced but left out of throughput", 2)
    optimizer: str = _doc(f"one of {', '.join(OPTIMIZERS)}", "sgd")
    learning_rate: float = _doc("learning rate", 0.05)
    momentum: float = _doc("SGD momentum", 0.9)
    weight_decay: float = _doc("weight decay", 0.0)
    precision: str = _doc(
        "fp32, fp16 (CUDA only, with a GradScaler) or bf16 (autocast, CPU too)", "fp32"
    )
    seed: int = _doc("seed for data, model initialisation and shuffling", 0)
    # -- evaluation
    eval_every_epochs: int = _doc("evaluate after every N epochs (0: only at the end)", 1)
    eval_at_end: bool = _doc("evaluate once more after the last step if not just done", True)
    eval_batch_size: int = _doc("evaluation samples per rank per batch", 256)
    eval_on: str = _doc(
        "all: every rank predicts its shard and rank 0 gathers; rank0: rank 0 "
        "predicts everything while the others wait",
        "all",
    )
    eval_timeout_s: float = _doc("how long ranks may wait for an evaluation on rank 0", 3600.0)
    # -- checkpoints, timeouts, tracing
    checkpoint_every_steps: int = _doc("save a checkpoint every N steps (0: never)", 0)
    collective_timeout_s: float = _doc(
        "process-group timeout: a hung rank fails its peers after it", 120.0
    )
    timeout_min: float = _doc(
        "job time limit in minutes (submitit's own default is 2 locally)", 60.0
    )
    master_port: int | None = _doc("rendezvous port; a free one is picked locally when omitted")
    signal_delay_s: int = _doc(
        "seconds before the time limit at which ranks are told to checkpoint and requeue", 60
    )
    stop_check_every_steps: int = _doc(
        "how often (steps) the ranks agree whether a preemption signal arrived (0: never)", 100
    )
    trace_flush_s: float = _doc("flush trace rows to disk at least this often (seconds)", 2.0)
    trace_sample_ids: bool = _doc("also record which dataset indices each rank consumed", False)
    trace_comm: str = _doc(
        "how gradient communication is timed: 'sampled' reads DDP's own timer (no Python hook) "
        "on the first 10 steps and every trace_comm_every_steps after, leaving comm_s empty in "
        "between; 'hook' times every bucket of every step with a Python comm hook (about 0.1 ms "
        "per bucket on CPU, see BENCHMARKS.md); 'off' records nothing. comm_bytes and "
        "comm_buckets are recorded on every step unless 'off'. The compression hooks always time "
        "every step: they are Python hooks anyway",
        "sampled",
    )
    trace_comm_every_steps: int = _doc(
        "with trace_comm='sampled': read DDP's communication timer every this many steps", 10
    )
    profile_steps: tuple[int, int] | None = _doc(
        "record torch.profiler traces for steps first..last (inclusive), one file per rank"
    )
    fault: FaultInjection | None = _doc("fault injection for tests")

    derived: tuple[str, ...] = field(default=(), init=False, metadata={"help": "fields filled in"})

    def __post_init__(self) -> None:
        if isinstance(self.fault, Mapping):
            object.__setattr__(self, "fault", _fault_from_dict(self.fault))
        if isinstance(self.profile_steps, list):
            object.__setattr__(self, "profile_steps", tuple(self.profile_steps))
        object.__setattr__(self, "model_options", dict(self.model_options))
        object.__setattr__(self, "dataset_options", dict(self.dataset_options))
        problems = _validate(self)
        if problems:
            raise ConfigError(problems)
        self._derive()

    def _derive(self) -> None:
        derived = []

        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)
            derived.append(name)

        if self.world_size is None:
            put("world_size", self.nodes * (self.tasks_per_node or 1))
        if self.tasks_per_node is None:
            put("tasks_per_node", self.world_size // self.nodes)  # type: ignore[operator]
        per_step = self.world_size * self.gradient_accumulation_steps  # type: ignore[operator]
        if self.global_batch_size is None:
            put("global_batch_size", self.per_device_batch_size * per_step)  # type: ignore[operator]
        if self.per_device_batch_size is None:
            put("per_device_batch_size", self.global_batch_size // per_step)  # type: ignore[operator]
        if self.epochs is None and self.max_steps is None:
            put("epochs", 1)
        object.__setattr__(self, "derived", tuple(derived))

    # -- derived facts used everywhere
    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps in one pass over the training set (incomplete batches are dropped)."""
        return self.train_samples // self.global_batch_size  # type: ignore[operator]

    @property
    def total_steps(self) -> int:
        """Optimizer steps the run makes: ``max_steps`` capped by ``epochs`` when both are given."""
        by_epochs = self.epochs * self.steps_per_epoch if self.epochs is not None else None
        candidates = [s for s in (self.max_steps, by_epochs) if s is not None]
        return min(candidates)

    @property
    def lr_scale(self) -> float:
        """Factor on ``learning_rate`` from ``lr_scaling``: global batch over the reference batch
        (linear), or its square root (sqrt)."""
        if self.lr_scaling == "none":
            return 1.0
        reference = (
            self.lr_reference_batch or self.per_device_batch_size * self.gradient_accumulation_steps  # type: ignore[operator]
        )  # type: ignore[operator]
        ratio = self.global_batch_size / reference  # type: ignore[operator]
        return ratio if self.lr_scaling == "linear" else ratio**0.5

    @property
    def per_process_batch_size(self) -> int:
        """Samples one process loads per micro-step (DataParallel's process loads the total)."""
        return self.global_batch_size // (self.processes * self.gradient_accumulation_steps)  # type: ignore[operator]

    @property
    def processes(self) -> int:
        """Processes the job starts: one per device, except DataParallel's single driver."""
        return 1 if self.strategy == "dp" else self.world_size  # type: ignore[return-value]

    @property
    def model_kwargs(self) -> dict[str, Any]:
        """Model options merged over the built-in defaults."""
        return {**MODEL_OPTIONS.get(self.model, {}), **self.model_options}

    # -- JSON round trip
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["derived"] = list(self.derived)
        return d

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunConfig:
        """Build from a dict; derived values (listed in ``derived``) are recomputed, unknown keys
        are an error listing the valid names."""
        data = dict(data)
        for name in data.pop("derived", ()):
            data.pop(name, None)
        unknown = sorted(set(data) - set(init_field_names()))
        if unknown:
            raise ConfigError(
                [
                    Problem(k, data[k], f"unknown field; valid: {', '.join(init_field_names())}")
                    for k in unknown
                ]
            )
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        return cls.from_dict(json.loads(text))

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        return cls.from_json(Path(path).read_text())

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with some fields changed; derived fields are derived again."""
        data = self.to_dict()
        for name in data.pop("derived"):
            if name not in changes:
                data.pop(name)
        data.update(changes)
        return RunConfig.from_dict(data)


def init_field_names() -> list[str]:
    """The fields a user may set."""
    return [f.name for f in dataclasses.fields(RunConfig) if f.init]


def field_help() -> dict[str, str]:
    """One line of help per settable field (used by the CLI and the launch panel)."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(RunConfig) if f.init}


def _fault_from_dict(data: Mapping[str, Any]) -> FaultInjection:
    valid = [f.name for f in dataclasses.fields(FaultInjection)]
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise ConfigError(
            [Problem(f"fault.{k}", data[k], f"unknown; valid: {', '.join(valid)}") for k in unknown]
        )
    return FaultInjection(**data)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _validate(c: RunConfig) -> list[Problem]:
    """Every problem with the config, so the user fixes them all in one go."""
    p: list[Problem] = []

    def positive(name: str, optional: bool = False, zero_ok: bool = False) -> bool:
        v = getattr(c, name)
        if v is None and optional:
            return True
        if not _is_int(v) or v < (0 if zero_ok else 1):
            p.append(Problem(name, v, "must be an integer >= " + ("0" if zero_ok else "1")))
            return False
        return True

    def one_of(name: str, allowed: tuple[str, ...]) -> None:
        v = getattr(c, name)
        if v not in allowed:
            p.append(Problem(name, v, f"must be one of {', '.join(allowed)}"))

    for name in ("sweep",):
        if not isinstance(c.sweep, str) or not _NAME.match(c.sweep):
            p.append(Problem(name, c.sweep, "a folder name: letters, digits, '_', '-', '.', '+'"))
    if c.run_name is not None and (not isinstance(c.run_name, str) or not _NAME.match(c.run_name)):
        p.append(
            Problem("run_name", c.run_name, "a folder name: letters, digits, '_', '-', '.', '+'")
        )
    if not isinstance(c.output_dir, str) or not c.output_dir:
        p.append(Problem("output_dir", c.output_dir, "a folder path"))

    # model and data
    if c.model in MODEL_OPTIONS:
        unknown = sorted(set(c.model_options) - set(MODEL_OPTIONS[c.model]))
        for k in unknown:
            p.append(
                Problem(
                    f"model_options.{k}",
                    c.model_options[k],
                    f"unknown option of model {c.model!r}; "
                    f"valid: {', '.join(MODEL_OPTIONS[c.model])}",
                )
            )
        for k, v in c.model_options.items():
            if k in MODEL_OPTIONS[c.model] and (not _is_int(v) or v < 1):
                p.append(Problem(f"model_options.{k}", v, "must be an integer >= 1"))
        opts = c.model_kwargs
        if c.model in ("transformer", "gpt") and opts["d_model"] % opts["num_heads"]:
            p.append(
                Problem(
                    "model_options.d_model",
                    opts["d_model"],
                    f"must be divisible by num_heads={opts['num_heads']}",
                )
            )
    elif not (isinstance(c.model, str) and _PLUGIN.match(c.model)):
        p.append(
            Problem(
                "model",
                c.model,
                f"a built-in model ({', '.join(MODEL_OPTIONS)}) or 'package.module:factory'",
            )
        )
    if c.dataset not in BUILTIN_DATASETS and not (
        isinstance(c.dataset, str) and _PLUGIN.match(c.dataset)
    ):
        builtin = ", ".join(repr(d) for d in BUILTIN_DATASETS)
        p.append(Problem("dataset", c.dataset, f"{builtin} or 'package.module:factory'"))
    sizes_ok = positive("train_samples") & positive("eval_samples")

    # devices
    one_of("device", DEVICES)
    one_of("backend", BACKENDS)
    if c.backend == "nccl" and c.device == "cpu":
        p.append(
            Problem("backend", c.backend, "nccl needs device='cuda' (or 'auto'); use gloo on CPU")
        )
    positive("threads_per_rank")
    layout_ok = (
        positive("nodes")
        & positive("world_size", optional=True)
        & positive("tasks_per_node", optional=True)
    )
    if layout_ok:
        if c.world_size is not None and c.tasks_per_node is not None:
            if c.world_size != c.nodes * c.tasks_per_node:
                p.append(
                    Problem(
                        "world_size",
                        c.world_size,
                        f"must equal nodes x tasks_per_node = {c.nodes} x {c.tasks_per_node}",
                    )
                )
        elif c.world_size is not None and c.world_size % c.nodes:
            p.append(Problem("world_size", c.world_size, f"must be a multiple of nodes={c.nodes}"))

    # batch and schedule
    batch_ok = positive("gradient_accumulation_steps")
    given = [n for n in ("per_device_batch_size", "global_batch_size") if getattr(c, n) is not None]
    if len(given) != 1:
        p.append(
            Problem(
                "per_device_batch_size" if not given else "global_batch_size",
                {n: getattr(c, n) for n in ("per_device_batch_size", "global_batch_size")},
                "give exactly one of per_device_batch_size and global_batch_size",
            )
        )
        batch_ok = False
    else:
        batch_ok &= positive(given[0])
    if batch_ok and layout_ok:
        world = c.world_size or c.nodes * (c.tasks_per_node or 1)
        per_step = world * c.gradient_accumulation_steps
        if c.global_batch_size is not None and c.global_batch_size % per_step:
            p.append(
                Problem(
                    "global_batch_size",
                    c.global_batch_size,
                    f"must be divisible by world_size x gradient_accumulation_steps = {per_step}",
                )
            )
        elif sizes_ok:
            global_batch = c.global_batch_size or c.per_device_batch_size * per_step  # type: ignore[operator]
            if c.train_samples < global_batch:
                p.append(
                    Problem(
                        "train_samples",
                        c.train_samples,
                        f"smaller than one global batch ({global_batch}); "
                        "use more samples or a smaller batch",
                    )
                )
    positive("epochs", optional=True)
    positive("max_steps", optional=True)
    positive("warmup_steps", zero_ok=True)
    one_of("optimizer", OPTIMIZERS)
    one_of("strategy", STRATEGIES)
    one_of("comm_hook", COMM_HOOKS)
    one_of("trace_comm", COMM_TRACING)
    positive("trace_comm_every_steps")
    one_of("lr_scaling", LR_SCALINGS)
    one_of("eval_on", EVAL_PLACEMENTS)
    positive("powersgd_rank")
    positive("lr_reference_batch", optional=True)
    positive("lr_warmup_steps", zero_ok=True)
    if c.strategy != "ddp" and c.comm_hook != "allreduce":
        p.append(
            Problem(
                "comm_hook",
                c.comm_hook,
                f"communication hooks need strategy='ddp', not {c.strategy!r}",
            )
        )
    layout_world = (c.world_size or c.nodes * (c.tasks_per_node or 1)) if layout_ok else 1
    if c.strategy == "single" and layout_world != 1:
        p.append(
            Problem(
                "world_size",
                {"world_size": c.world_size, "nodes": c.nodes, "tasks_per_node": c.tasks_per_node},
                "strategy='single' runs on one device: use world_size=1",
            )
        )
    if c.strategy == "dp" and c.device == "cpu":
        p.append(
            Problem(
                "strategy",
                c.strategy,
                "DataParallel splits batches over CUDA devices; on CPU "
                "use 'ddp' (one process per rank) or 'single'",
            )
        )
    if c.strategy == "dp" and c.nodes != 1:
        p.append(
            Problem("nodes", c.nodes, "strategy='dp' drives the GPUs of one node: use nodes=1")
        )
    if c.dataset == "parquet":
        for key in ("train", "eval"):
            if not isinstance(c.dataset_options.get(key), str):
                p.append(
                    Problem(
                        f"dataset_options.{key}",
                        c.dataset_options.get(key),
                        "dataset='parquet' needs the path of a Parquet file",
                    )
                )
    for name in (
        "bucket_cap_mb",
        "eval_timeout_s",
        "learning_rate",
        "collective_timeout_s",
        "timeout_min",
        "trace_flush_s",
    ):
        v = getattr(c, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            p.append(Problem(name, v, "must be a number > 0"))
    for name in ("momentum", "weight_decay"):
        v = getattr(c, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            p.append(Problem(name, v, "must be a number >= 0"))
    one_of("precision", PRECISIONS)
    if c.sync_batchnorm and c.device == "cpu":
        p.append(
            Problem(
                "sync_batchnorm",
                c.sync_batchnorm,
                "SyncBatchNorm needs CUDA (torch runs it on GPU tensors only); on device='cpu' "
                "leave it off",
            )
        )
    if c.precision == "fp16" and c.device == "cpu":
        p.append(
            Problem(
                "precision",
                c.precision,
                "fp16 needs CUDA (GradScaler); on device='cpu' use fp32 or bf16",
            )
        )
    if not _is_int(c.seed):
        p.append(Problem("seed", c.seed, "must be an integer"))

    # evaluation, checkpoints
    positive("eval_every_epochs", zero_ok=True)
    positive("eval_batch_size")
    positive("checkpoint_every_steps", zero_ok=True)
    positive("stop_check_every_steps", zero_ok=True)
    positive("signal_delay_s")
    if c.master_port is not None and (
        not _is_int(c.master_port) or not 1024 <= c.master_port <= 65535
    ):
        p.append(Problem("master_port", c.master_port, "must be an integer in 1024..65535"))
    if c.profile_steps is not None:
        w = c.profile_steps
        if not (
            isinstance(w, tuple)
            and len(w) == 2
            and all(_is_int(x) for x in w)
            and 1 <= w[0] <= w[1]
        ):
            p.append(Problem("profile_steps", w, "two steps (first, last) with 1 <= first <= last"))
    if c.fault is not None:
        if not isinstance(c.fault, FaultInjection):
            p.append(Problem("fault", c.fault, "a FaultInjection or a dict with rank, step, kind"))
        else:
            if c.fault.kind not in FAULT_KINDS:
                p.append(
                    Problem("fault.kind", c.fault.kind, f"must be one of {', '.join(FAULT_KINDS)}")
                )
            world = c.world_size or (
                c.nodes * c.tasks_per_node if layout_ok and c.tasks_per_node else 1
            )
            if not _is_int(c.fault.rank) or not 0 <= c.fault.rank < world:
                p.append(Problem("fault.rank", c.fault.rank, f"must be a rank in 0..{world - 1}"))
    return p
