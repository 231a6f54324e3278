"""Trace schema (version 2): the columns every trace file carries, and the store's file names.

Version 2 added FSDP2's communication (``all_gather_*``, ``reduce_scatter_*``); a file of
version 1 lacks them and reads with them null. DDP's columns mean what they meant in version 1.

Kept free of torch and pandas so that the tracer (in each rank) and the analysis (on a laptop)
can both import it cheaply.
"""

from __future__ import annotations

TRACE_SCHEMA_VERSION = 2
#: The version that added each column after the first (readers fill it null in older files).
ADDED_IN: dict[str, int] = {}

#: One row per rank per step. Times are seconds; ``t_start_s`` is measured from a t0 that all
#: ranks agree on (taken right after a barrier). Memory columns are bytes; CUDA ones are null
#: on CPU.
STEP_COLUMNS: dict[str, str] = {
    "run_id": "string",
    "rank": "int64",
    "local_rank": "int64",
    "host": "string",
    "world_size": "int64",
    "attempt": "int64",  # 0 for the first launch, +1 for each resume/requeue
    "epoch": "int64",
    "step": "int64",  # global optimizer step, counted from 1
    # Warm-up steps are traced but left out of throughput: the first ``warmup_steps`` of each
    # attempt (a resumed attempt warms up again: fresh process, cold caches, a new DDP reducer).
    "warmup": "bool",
    # The step's start (host clock) on the rank's t0 clock.
    "t_start_s": "float64",
    # The traced phases of the step, which add up to step_s: data_s (fetching and moving the
    # batch), forward_s, backward_s, optimizer_s (step, scaler update, zero_grad). With gradient
    # accumulation the first three are sums over the micro-steps.
    "data_s": "float64",
    "forward_s": "float64",
    "backward_s": "float64",
    "optimizer_s": "float64",
    # The step itself, from its first stamp to its last: the traced phases and nothing between
    # steps. The step's end is t_start_s + step_s. (Not the wall time per step: that is
    # step_s + gap_s, which the analysis calls wall_step_s.)
    "step_s": "float64",
    # Between steps: the next step's start minus this step's end (on this rank, same attempt):
    # the loop's own work (trace row, checks, the preemption agreement), any checkpoint
    # (save_s) and any evaluation (the eval rows of this step) after this step. Null on the
    # attempt's last step, and on rows written before the next step started (at a checkpoint);
    # the analysis then takes it from the next row's t_start_s, the same arithmetic.
    "gap_s": "float64",
    # The checkpoint written after this step: this rank's part of it (its files, then the wait
    # for every rank to finish theirs), up to the commit. Null on steps without a checkpoint.
    "save_s": "float64",
    # Gradient communication. With trace_comm="sampled" the three columns below are DDP's own
    # reducer timer (its logging data), on sampled steps only (null in between, and null where
    # DDP reset a field to 0 or the timer is unavailable: then comm_bytes alone is recorded):
    # comm_s is DDP's backward_comm_time, from the first bucket's allreduce launch to the end of
    # finalize_backward (the wait for the last bucket): a span that, with several buckets,
    # mostly overlaps backward compute, so it is NOT the communication cost. On CPU the
    # reducer's timer reads the host clock; on CUDA it records events on the compute stream.
    # With trace_comm="hook" and the compression hooks: each bucket's launch-to-completion
    # time summed (on CPU only; null on CUDA, where a Python hook sees the enqueue, not the
    # transfer).
    "comm_s": "float64",
    # DDP's backward_compute_time: from the end of DDP's forward (the reducer's
    # prepare_for_backward, so the loss computation is included) to the end of the autograd
    # backward pass (the reducer's final callback, once every gradient is ready). Sampled
    # steps only, like comm_s.
    "backward_compute_s": "float64",
    # Exposed communication: backward_comm_time - backward_compute_comm_overlap_time, i.e. the
    # time from the end of backward compute (the last gradient ready) to the end of
    # finalize_backward: the communication (and the copy of reduced buckets into .grad) that no
    # computation hides. This is what communication adds to the step. Sampled steps only.
    "comm_exposed_s": "float64",
    "comm_bytes": "int64",  # bytes handed to allreduce this step (all buckets)
    "comm_buckets": "int64",
    # FSDP2's collectives (``workbench.trace.fsdp_comm``; null where no FSDP2 module was
    # found, 0 for FSDP at one rank, which communicates nothing). Per kind, summed over the
    # step's calls: the all-gathers (each parameter group's gather in forward, and backward's
    # re-gather of a module resharded after forward) and the reduce-scatters (one per group in
    # backward). *_bytes: each call's whole buffer, as nccl-tests counts a collective's size:
    # the gathered (unsharded) parameters, the unsharded gradients reduced; each parameter's
    # first dimension padded to a multiple of the world size, at the all-gather's
    # (``param_dtype``) or the reduction's dtype. Each rank sends (n-1)/n of it. *_s: each
    # call from its start to its completion (host clock; null on CUDA, where the call only
    # enqueues). *_exposed_s: the part of *_s the step's computing thread waited in: all of a
    # call that returns once done (FSDP2's default on CPU: gloo), null where an asynchronous
    # call's wait is not seen; hidden = *_s - *_exposed_s. *_calls: the calls.
    "all_gather_bytes": "int64",
    "all_gather_s": "float64",
    "all_gather_exposed_s": "float64",
    "all_gather_calls": "int64",
    "reduce_scatter_bytes": "int64",
    "reduce_scatter_s": "float64",
    "reduce_scatter_exposed_s": "float64",
    "reduce_scatter_calls": "int64",
    "samples": "int64",  # samples this rank consumed this step
    # Tokens in those samples, where the batch holds token ids (an integer input of two or more
    # dimensions: its element count, padding included); null where the batch has none.
    "tokens": "int64",
    "loss": "float64",
    "lr": "float64",
    "mem_alloc_bytes": "float64",  # CUDA allocator, null on CPU
    "mem_reserved_bytes": "float64",
    "mem_peak_bytes": "float64",
    # NVML: this process's memory on its GPU (CUDA context, NCCL buffers, ...)
    "mem_device_bytes": "float64",
    "rss_bytes": "int64",  # process resident set size, always
}

ADDED_IN.update(
    {
        f"{kind}_{what}": 2
        for kind in ("all_gather", "reduce_scatter")
        for what in ("bytes", "s", "exposed_s", "calls")
    }
)

#: One row per rank per evaluation. ``gather_s`` and ``metric_s`` are rank 0's work; other ranks
#: record the time they spent in the gather call and 0 for the metric. ``wait_s`` is the time in
#: the barriers before the gather and before the broadcast: waiting for the slowest rank, so the
#: collectives' own parts hold only their transfer.
EVAL_COLUMNS: dict[str, str] = {
    "run_id": "string",
    "rank": "int64",
    "world_size": "int64",
    "attempt": "int64",
    "epoch": "int64",
    "step": "int64",
    "t_start_s": "float64",
    "predict_s": "float64",
    "wait_s": "float64",
    "gather_s": "float64",
    "metric_s": "float64",
    "broadcast_s": "float64",
    "eval_s": "float64",  # the whole evaluation on this rank
    # evaluation samples this rank predicted, the sampler's padding (repeats that keep every
    # rank's batch count equal) left out: the ranks' samples add up to the evaluation set
    "samples": "int64",
    "metric_name": "string",
    "metric_value": "float64",
    "loss": "float64",  # mean evaluation loss over the whole evaluation set
}

#: What a rank's measurement warning says when no sample of its steps could be counted (the
#: same words on every rank, so the run keeps one warning with its ranks); readers match it.
SAMPLES_NOT_COUNTED = "the samples of its steps were not counted"

RUN_STATUSES = ("pending", "running", "completed", "failed", "cancelled", "preempted")

# Store layout: <output_dir>/<sweep>/<run_id>/...
CONFIG_FILE = "config.json"
RUN_FILE = "run.json"
TRACES_DIR = "traces"
RANKS_DIR = "ranks"  # per-rank status files, each owned by its rank
CHECKPOINTS_DIR = "checkpoints"
PROFILES_DIR = (
    "profiles"  # torch.profiler traces, one per rank (Holistic Trace Analysis, TensorBoard)
)
LOGS_DIR = "logs"
FLIGHT_DIR = "flight"  # each rank's flight record: where it is, its last collectives


#: Trace file suffixes: one Arrow IPC stream per rank and kind while the rank runs (record batches
#: appended at each flush), one Parquet file per rank and kind once it ends; JSONL is what live
#: files were before the Arrow stream (read, never written).
FINAL_SUFFIX = "parquet"
LIVE_SUFFIX = "arrows"
LEGACY_LIVE_SUFFIX = "jsonl"
TRACE_KINDS = ("steps", "eval")


def trace_file(kind: str, rank: int, suffix: str = FINAL_SUFFIX) -> str:
    """``steps-rank00003.parquet``: the file of one kind (``steps`` or ``eval``) of one rank."""
    if kind not in TRACE_KINDS:
        raise ValueError(f"kind={kind!r}: must be one of {TRACE_KINDS}")
    return f"{kind}-rank{rank:05d}.{suffix}"


def steps_file(rank: int, suffix: str = FINAL_SUFFIX) -> str:
    return trace_file("steps", rank, suffix)


def eval_file(rank: int, suffix: str = FINAL_SUFFIX) -> str:
    return trace_file("eval", rank, suffix)


def live_steps_file(rank: int) -> str:
    """The step rows of a rank while it runs (an Arrow IPC stream)."""
    return steps_file(rank, LIVE_SUFFIX)


def live_eval_file(rank: int) -> str:
    return eval_file(rank, LIVE_SUFFIX)


def trace_columns(kind: str) -> dict[str, str]:
    """The columns of one kind of trace file."""
    if kind not in TRACE_KINDS:
        raise ValueError(f"kind={kind!r}: must be one of {TRACE_KINDS}")
    return STEP_COLUMNS if kind == "steps" else EVAL_COLUMNS
