"""What each figure of the catalogue shows, in words: its formula, its window, what was sampled
and, for FLOP/s, the peak and its source. One text per figure, shown as the figure's subtitle by
the catalogue, so the report and the dashboard say the same. The wording follows
docs/measurements.md, "What each number means". No torch.
"""

from __future__ import annotations

from workbench.ui.plots.binning import BAND_RANKS, MAX_COLUMNS, MAX_ROWS

#: The window every per-step number is taken over.
WINDOW = (
    "Measured window: per attempt, from the first measured step's start to the last step's end, "
    "warm-up steps left out: the traced warm-up_steps and, after them, the leading steps still "
    "more than 50 % slower than the steady state (median of the second half; at most half the "
    "steps), counted in the run's warmup_detected_steps."
)
#: How communication is timed, and what stands for the steps in between.
COMM_SAMPLING = (
    "Communication is sampled: with trace_comm='sampled' (the default) DDP's own timer is read "
    "on the first 10 steps and every trace_comm_every_steps (default 50) after. Figures from "
    "DDP's timers use the sampled steps alone: nothing is carried to the steps in between."
)
#: Error bars: only where a point has repeats.
SPREAD = "Error bars only where a point has 2 or more runs: their standard deviation (ddof 1)."
#: Achieved FLOP/s and MFU, with the peak's source.
FLOPS = (
    "Hover, where FLOPs were counted: TFLOP/s per device = FLOPs of one training step per sample "
    "x training samples/s (evaluations and checkpoints left out) / world size / 1e12; MFU = "
    "that / the device's dense tensor peak for the run's math mode (TF32 where allowed), the "
    "peak and its datasheet named per point."
)
#: Scaling figures' throughput.
THROUGHPUT = (
    "samples/s per device = samples of all ranks in the measured window / the window's wall "
    "time less the evaluations and checkpoints inside it (training alone) / world size."
)
SPEEDUP = (
    "speedup = mean training throughput at N / mean training throughput at the group's "
    "smallest world size, on the fewest nodes there (evaluations and checkpoints left out of "
    "both). One line per group, whatever its node counts; a diamond: the point crossed nodes."
)
EFFICIENCY = "Labels: efficiency = speedup / (N / base N)."
SPEEDUP_SPREAD = (
    "Error bars only with repeats at both ends: speedup_std = speedup x sqrt((s_N/m_N)^2 + "
    "(s_B/m_B)^2), s and m the runs' std and mean throughput."
)
EPOCH = (
    "time per epoch = train_samples / end-to-end samples/s (evaluations and checkpoints included)."
)
FINAL = (
    "final training loss: the last step's loss, mean over ranks; final metric: rank 0's last "
    "evaluation. Mean over a point's runs."
)
PHASES = (
    "Mean per measured step: data, forward, backward compute (backward less exposed "
    "communication), exposed communication (what no backward compute hid: DDP's comm_exposed_s "
    "where traced, else the backward time beyond the same config's at the smallest world size, "
    "else bounded by min(comm_s, backward_s)), optimizer, other (step_s less the traced phases); "
    "then between steps (gap_s less checkpoint and evaluation), checkpoint and evaluation, so a "
    "bar is wall_step_s. Communication hidden behind backward is in the backward hover."
)
HEATMAP = (
    "step_s per rank and measured step (first stamp to last), ms; in DDP every rank waits for "
    "the slowest, so the rows look alike."
)
#: How a rank x step heatmap is binned (the title states the bin size and the grouping).
BINNED = (
    f"At most {MAX_COLUMNS} columns: each cell the median of a bin of consecutive steps, "
    f"labelled by its first step. Past {MAX_ROWS} ranks a row is a host (or, with one host or "
    f"more than {MAX_ROWS}, a block of consecutive ranks), its cell the largest of its ranks' "
    "medians, so a slow rank is not averaged away; the hover names the row's ranks."
)
#: What a value across ranks over the steps shows.
RANK_BANDS = (
    f"Each rank's steps binned to at most {MAX_COLUMNS} points (the median per bin of "
    f"consecutive steps). Up to {BAND_RANKS} ranks: a line per rank; past {BAND_RANKS}: per bin "
    "the min, p10, median, p90 and max across ranks (the value at position round(q x (n - 1)) "
    "of the ranks in order; p10-p90 shaded darker) and the slowest rank's own line, named (the "
    "largest median over its bins)."
)
#: What a per-rank bar chart shows past BAND_RANKS ranks.
RANK_QUANTILES = (
    f"Past {BAND_RANKS} ranks, the ranks at the min, p10, median, p90 and max of the ranks' "
    "values (position round(q x (n - 1)) of the ranks in order) are drawn instead of every "
    "rank, each named: max is the slowest (the largest, for memory)."
)
COMPUTE = (
    "compute = data_s + forward_s + optimizer_s + backward compute per rank and measured step, "
    "ms: what the rank computes itself, its waits for the others left out; a straggler stands "
    "out here. Backward compute is DDP's timer on the steps it sampled (blank between them, "
    "never carried over)."
)
MEMORY = (
    "Peak over every step, warm-up included, per rank: process RSS, the CUDA allocator's peak "
    "and what NVML sees of the process on its GPU (allocator, context, NCCL buffers); "
    "GiB = 2^30 bytes."
)
EVAL = (
    "Mean over evaluations of rank 0's parts, ms: predict, wait (in the barriers before the "
    "gather and the broadcast: waiting for the slowest rank), gather, metric (rank 0) and "
    "broadcast, adding up to eval_s."
)
LOSS = (
    "Training loss at each step, mean over ranks, warm-up steps included; at most 500 points "
    "per run (bins of consecutive steps averaged)."
)
METRIC = "The evaluation metric, rank 0's, at the step after which it was evaluated."
PREDICTED = (
    "Markers: measured speedup. Dashed: the scaling model, step time at N = compute + exposed "
    "communication, exposed = (1 - overlap) x ring allreduce time of the gradient bytes at N, "
    "but at least the ring time less the backward compute it can hide behind; compute is the "
    "base's training step time less its measured exposed communication (DDP's timer on sampled "
    "steps), overlap = 1 - exposed / span from the same steps; weak curves keep compute, strong "
    "curves divide it by N / base N. One curve per config, whatever its node counts: each "
    "point is predicted on the network of its link class (one node, across nodes; a diamond "
    "crossed nodes), measured on the runs that crossed it."
)


def definition(*parts: str) -> str:
    """One figure's definition from its parts, in order, as one text."""
    return " ".join(p.strip() for p in parts if p.strip())
