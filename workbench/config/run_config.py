"""RunConfig: every knob of one training run, validated before anything starts, JSON round trip.

Each field declares its own constraint beside it (``fields.setting``: choices, bounds, format; the
annotation: type and whether it may be omitted); the rules that span fields are
``workbench.config.rules``. Validation is pure (no torch, no machine facts); checks that need the
machine (GPUs present, a port free, a folder writable) live in ``workbench.run.preflight``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.config import rules
from workbench.config.choices import (
    BACKENDS,
    BUILTIN_DATASETS,
    COMM_HOOKS,
    COMM_TRACING,
    DEVICES,
    EVAL_PLACEMENTS,
    FSDP_DTYPES,
    LR_SCALINGS,
    MODEL_OPTIONS,
    OPTIMIZERS,
    PRECISIONS,
    STRATEGIES,
)
from workbench.config.fault import FaultInjection, fault_from_json
from workbench.config.fields import check_fields, refuse_unknown_keywords, setting
from workbench.config.sizes import resolve_model_options
from workbench.errors import ConfigError, Problem

#: Fields JSON gives in another shape: (name, the shape JSON gives, the field's own).
SHAPES = (
    ("model_options", Mapping, dict),
    ("dataset_options", Mapping, dict),
    ("script_args", list, tuple),
    ("profile_steps", list, tuple),
)


@refuse_unknown_keywords
@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything that defines one training run. Give exactly one of ``per_device_batch_size`` and
    ``global_batch_size``, and ``world_size`` or ``tasks_per_node`` (with ``nodes``); the others are
    derived and recorded (listed in ``derived``). An unknown keyword, or any value breaking a
    field's constraint or a rule across fields, is one ConfigError listing every problem."""

    # -- naming and storage
    sweep: str = setting(
        "sweep this run belongs to (a folder of the store)", "default", kind="folder_name"
    )
    run_name: str | None = setting(
        "run id; generated from model, world size and time when omitted", kind="folder_name"
    )
    output_dir: str = setting("root of the result store", "experiments/results", kind="path")
    # -- your own training: a script run on every rank instead of the built-in loop
    script: str | None = setting(
        "a training script, run on every rank as `python SCRIPT SCRIPT_ARGS` with torchrun's "
        "environment and traced from outside (the model, data, batch and schedule fields are "
        "the script's own and do not apply; bucket_cap_mb, gradient_as_bucket_view, "
        "static_graph and comm_hook, when set, are applied to the DDP the script builds)",
        kind="path",
    )
    script_module: str | None = setting(
        "like script, as `python -m SCRIPT_MODULE SCRIPT_ARGS` (a dotted module name)"
    )
    script_args: tuple[str, ...] = setting(
        "the script's own command-line arguments (what follows `--` on the command line)",
        default_factory=tuple,
    )
    # -- model and data
    model: str = setting(
        f"built-in model ({', '.join(MODEL_OPTIONS)}) or a 'package.module:factory' plug-in",
        "mlp",
        choices=tuple(MODEL_OPTIONS),
        plugin=True,
    )
    model_options: Mapping[str, Any] = setting(
        "keyword arguments for the model factory (sizes; see MODEL_OPTIONS), or 'size': a "
        "preset of MODEL_SIZES (transformer: distilbert, bert-base; gpt: gpt2-small) that the "
        "other options given override",
        default_factory=dict,
    )
    dataset: str = setting(
        "'synthetic' (made locally from the seed) or 'package.module:factory'",
        "synthetic",
        choices=BUILTIN_DATASETS,
        plugin=True,
    )
    dataset_options: Mapping[str, Any] = setting(
        "keyword arguments for a plug-in dataset factory", default_factory=dict
    )
    train_samples: int = setting("training samples in the synthetic dataset", 4096, minimum=1)
    eval_samples: int = setting("evaluation samples in the synthetic dataset", 1024, minimum=1)
    # -- devices
    world_size: int | None = setting(
        "total number of ranks (devices); = nodes x tasks_per_node", minimum=1
    )
    nodes: int = setting("number of nodes (machines)", 1, minimum=1)
    tasks_per_node: int | None = setting("ranks (devices) per node", minimum=1)
    device: str = setting(
        "auto (cuda when present, else cpu), cpu or cuda", "auto", choices=DEVICES
    )
    backend: str = setting(
        "torch.distributed backend: auto (nccl on CUDA, gloo on CPU), gloo, nccl",
        "auto",
        choices=BACKENDS,
    )
    threads_per_rank: int = setting("torch intra-op threads per rank on CPU", 1, minimum=1)
    # -- batch and schedule
    per_device_batch_size: int | None = setting("samples per rank per micro-step", minimum=1)
    global_batch_size: int | None = setting(
        "samples per optimizer step over all ranks = per_device x world_size x accumulation",
        minimum=1,
    )
    gradient_accumulation_steps: int = setting(
        "micro-steps per optimizer step (no_sync on all but last)", 1, minimum=1
    )
    # -- parallelism strategy and the DDP and FSDP knobs that change scaling
    strategy: str = setting(
        "ddp (one process per device), fsdp (FSDP2: fully_shard on each block, then the "
        "root), dp (DataParallel: one process drives all local GPUs; the batch is the total) "
        "or single (one device, no wrapper)",
        "ddp",
        choices=STRATEGIES,
    )
    reshard_after_forward: bool = setting(
        "fsdp: free each block's gathered parameters after its forward and gather them again "
        "in backward (ZeRO-3-like); false keeps them until backward (ZeRO-2-like: more "
        "memory, no second all-gather)",
        True,
    )
    fsdp_param_dtype: str = setting(
        "fsdp: dtype the parameters are gathered and computed in (fp32: their own; the "
        "optimizer always steps the fp32 shards)",
        "fp32",
        choices=FSDP_DTYPES,
    )
    fsdp_reduce_dtype: str | None = setting(
        "fsdp: dtype the gradients are reduce-scattered in (omitted: fsdp_param_dtype)",
        choices=FSDP_DTYPES,
    )
    find_unused_parameters: bool = setting(
        "DDP: tolerate parameters that get no gradient (slower)", False
    )
    bucket_cap_mb: float = setting("DDP gradient bucket size in MiB", 25.0, above=0)
    gradient_as_bucket_view: bool = setting(
        "DDP: gradients are views into the buckets (saves a copy)", False
    )
    static_graph: bool = setting(
        "DDP: the graph is the same every step (enables optimisations)", False
    )
    sync_batchnorm: bool = setting("convert BatchNorm layers to SyncBatchNorm", False)
    comm_hook: str = setting(
        "gradient communication: allreduce, fp16 or bf16 (compressed), powersgd",
        "allreduce",
        choices=COMM_HOOKS,
    )
    powersgd_rank: int = setting("PowerSGD matrix approximation rank", 1, minimum=1)
    lr_scaling: str = setting(
        "learning rate vs batch: none, linear or sqrt in global batch over lr_reference_batch",
        "none",
        choices=LR_SCALINGS,
    )
    lr_reference_batch: int | None = setting(
        "batch at which learning_rate is right (default: the "
        "per-device batch x accumulation, i.e. one device)",
        minimum=1,
    )
    lr_warmup_steps: int = setting(
        "linear learning-rate warm-up from 0 over this many steps", 0, minimum=0
    )
    epochs: int | None = setting(
        "passes over the training set (1 when neither epochs nor max_steps)", minimum=1
    )
    max_steps: int | None = setting("stop after this many optimizer steps", minimum=1)
    warmup_steps: int = setting("first steps traced but left out of throughput", 2, minimum=0)
    until_known: float | None = setting(
        "stop once the 95 % interval of the throughput is within +- this fraction (2% or 0.02)",
        above=0,
        maximum=0.5,
    )
    until_known_max_s: float = setting("until_known's cap: seconds of training", 300.0, above=0)
    until_known_launches: int = setting(
        "until_known: a study point's launches at most (again while they disagree)", 1, minimum=1
    )
    optimizer: str = setting(f"one of {', '.join(OPTIMIZERS)}", "sgd", choices=OPTIMIZERS)
    learning_rate: float = setting("learning rate", 0.05, above=0)
    momentum: float = setting("SGD momentum", 0.9, minimum=0)
    weight_decay: float = setting("weight decay", 0.0, minimum=0)
    precision: str = setting(
        "fp32, fp16 (CUDA only, with a GradScaler) or bf16 (autocast, CPU too)",
        "fp32",
        choices=PRECISIONS,
    )
    seed: int = setting("seed for data, model initialisation and shuffling", 0)
    # -- evaluation
    eval_every_epochs: int = setting(
        "evaluate after every N epochs (0: only at the end)", 1, minimum=0
    )
    eval_at_end: bool = setting("evaluate once more after the last step if not just done", True)
    eval_batch_size: int = setting("evaluation samples per rank per batch", 256, minimum=1)
    eval_on: str = setting(
        "all: every rank predicts its shard and rank 0 gathers; rank0: rank 0 "
        "predicts everything while the others wait",
        "all",
        choices=EVAL_PLACEMENTS,
    )
    eval_timeout_s: float = setting(
        "how long ranks may wait for an evaluation on rank 0", 3600.0, above=0
    )
    # -- checkpoints, timeouts, tracing
    checkpoint_every_steps: int = setting(
        "save a checkpoint every N steps (0: never)", 0, minimum=0
    )
    collective_timeout_s: float = setting(
        "process-group timeout: a hung rank fails its peers after it", 120.0, above=0
    )
    timeout_min: float = setting(
        "job time limit in minutes (submitit's own default is 2 locally)", 60.0, above=0
    )
    master_port: int | None = setting(
        "rendezvous port; a free one is picked locally when omitted", minimum=1024, maximum=65535
    )
    signal_delay_s: int = setting(
        "seconds before the time limit at which ranks are told to checkpoint and requeue",
        60,
        minimum=1,
    )
    stop_check_every_steps: int = setting(
        "how often (steps) the ranks agree whether a preemption signal arrived (0: never)",
        100,
        minimum=0,
    )
    trace_flush_s: float = setting(
        "flush trace rows to disk at least this often (seconds)", 1.0, above=0
    )
    trace_sample_ids: bool = setting("also record which dataset indices each rank consumed", False)
    trace_comm: str = setting(
        "how gradient communication is timed: 'sampled' reads DDP's own timer (no Python hook; "
        "with a compression hook, that hook's bytes) on the first 10 steps and every "
        "trace_comm_every_steps after: comm_s (DDP's span), backward_compute_s and "
        "comm_exposed_s, empty in between; 'hook' times every bucket of every step with a "
        "Python comm hook (about 0.1 ms per bucket on CPU, see BENCHMARKS.md; bytes only on "
        "CUDA, where the hook sees the enqueue, not the transfer); 'off' records nothing. "
        "comm_bytes and comm_buckets are recorded on every step unless 'off'",
        "sampled",
        choices=COMM_TRACING,
    )
    trace_comm_every_steps: int = setting(
        "with trace_comm='sampled': read DDP's communication timer every this many steps "
        "(on CUDA each read waits for the step's timing events)",
        50,
        minimum=1,
    )
    network_benchmark: bool = setting(
        "multi-rank runs: after the last step, time allreduces at the run's own gradient "
        "bucket sizes (loops sized to 0.3 s at the fastest single allreduce; 0.5-1 s in all on "
        "a 2-core CPU host, more where it also times comm hooks; outside the throughput window) "
        "and record algorithm and bus "
        "bandwidth (nccl-tests' definitions) in run.json under 'network'",
        True,
    )
    profile_steps: tuple[int, int] | None = setting(
        "record torch.profiler traces for steps first..last (inclusive), one file per rank"
    )
    fault: FaultInjection | None = setting("fault injection for tests")

    derived: tuple[str, ...] = field(default=(), init=False, metadata={"help": "fields filled in"})

    def __post_init__(self) -> None:
        """Check every field, then the rules across fields; fill in the derived fields."""
        problems = self._normalise()
        problems += check_fields(self)
        bad = frozenset(p.field.split(".")[0] for p in problems)
        problems += rules.check(self, bad)
        if problems:
            raise ConfigError(problems)
        self._derive()

    def _normalise(self) -> list[Problem]:
        """Take JSON's shapes (lists for tuples, a dict for ``fault``: its problems returned)."""
        for name, given, shape in SHAPES:
            if isinstance(getattr(self, name), given):
                object.__setattr__(self, name, shape(getattr(self, name)))
        fault, problems = fault_from_json(self.fault)
        object.__setattr__(self, "fault", fault)
        return problems

    def _derive(self) -> None:
        """Fill in what the fields given imply (``rules.derived``), named in ``derived``."""
        values = rules.derived(self)
        for name, value in values.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "derived", tuple(values))

    # -- derived facts used everywhere
    @property
    def is_script(self) -> bool:
        """Whether the ranks run a user's script (``script`` or ``script_module``)."""
        return self.script is not None or self.script_module is not None

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps in one pass over the training set (incomplete batches are dropped)."""
        return self.train_samples // self.global_batch_size  # type: ignore[operator]

    @property
    def total_steps(self) -> int | None:
        """Optimizer steps the run makes: ``max_steps`` capped by ``epochs`` when both are given;
        None for a script (it decides)."""
        if self.is_script:
            return None
        by_epochs = self.epochs * self.steps_per_epoch if self.epochs is not None else None
        candidates = [s for s in (self.max_steps, by_epochs) if s is not None]
        return min(candidates)

    @property
    def lr_scale(self) -> float:
        """Factor on ``learning_rate`` from ``lr_scaling``: global batch over the reference batch
        (linear), or its square root (sqrt)."""
        if self.lr_scaling == "none":
            return 1.0
        accumulated = self.per_device_batch_size * self.gradient_accumulation_steps  # type: ignore[operator]
        reference = self.lr_reference_batch or accumulated
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
        """What the model is built with: a built-in model's defaults, then the preset that
        ``model_options['size']`` names, then the other options given; a plug-in's options as
        given."""
        return resolve_model_options(self.model, self.model_options)

    # -- JSON round trip
    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON-able values (``derived`` a list)."""
        d = dataclasses.asdict(self)
        d["derived"] = list(self.derived)
        return d

    def to_json(self, indent: int | None = 2) -> str:
        """The config as JSON, keys sorted."""
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunConfig:
        """Build from a dict; derived values (listed in ``derived``) are recomputed, unknown keys
        are an error listing the valid names."""
        data = dict(data)
        for name in data.pop("derived", ()):
            data.pop(name, None)
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        """Build from :meth:`to_json`'s text."""
        return cls.from_dict(json.loads(text))

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        """Build from a JSON file."""
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
