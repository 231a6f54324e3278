"""The report's glossary: what each number and word of its tables and figures means, folded
under the figures so the finding and the charts come first. No torch."""

from __future__ import annotations

#: The definitions, as HTML list items.
DEFINITIONS = """
<li><b>scaling group</b>: runs are repeats of one point when every config field agrees but world
size, nodes, tasks per node, seed, run name, where results are filed, the port and timeouts. A
group is <b>weak</b> scaling (per-device batch fixed, global batch grows with the world size) or
<b>strong</b> (global batch fixed); a study holding both warns and keeps both, and a run at their
crossing counts in each.</li>
<li><b>throughput</b>: samples of all ranks over the wall time of the measured window (first
measured step start to last step end, across ranks; the warm-up steps of each attempt left out),
never a sum of per-rank rates: end to end (<i>samples_per_s</i>), and training alone
(<i>train_samples_per_s</i>: the window less the evaluations and checkpoints inside it, each the
slowest rank's). <b>between steps</b> in the step breakdown: the time from a step's end to the
next step's start (<i>gap_s</i>) less the checkpoint (<i>save_s</i>) and evaluation shown beside
it, so a bar adds up to the wall time per step. <b>speedup</b>: mean throughput over the mean
throughput of the group's smallest world size;
<b>efficiency</b>: speedup / (world size / smallest world size). <b>_std</b>: standard deviation of
the runs of a point (ddof 1; empty from one run). <b>speedup_std</b> = speedup &times;
&radic;((s<sub>N</sub>/m<sub>N</sub>)&sup2; + (s<sub>B</sub>/m<sub>B</sub>)&sup2;) with the means m
and standard deviations s of both ends' throughputs; empty when either end is one run, and at the
base. An empty spread draws no error bar.</li>
<li><b>scaling model</b>: step time at N = compute + exposed communication, exposed = (1 -
overlap) &times; ring allreduce time of the gradient bytes at N, but at least the ring time less
the backward compute it can hide behind. Compute is the base's training step time (the one that
gives the mean throughput of its repeats) less its measured exposed communication (DDP's timer
on its sampled steps; none at one rank), and overlap = 1 - exposed / span from the same steps
(from the curve's smallest multi-rank runs for a 1-rank base); weak curves keep compute, strong
curves divide it by N / base N. The network, measured per link class (one node, across nodes),
is a preset, or
the runs' own allreduce micro-benchmark (run after the last step at the run's bucket sizes:
bus bandwidth = bytes / time &times; 2(n-1)/n, as nccl-tests define it; the median over the
runs), or, without one, fitted over runs at three or more world sizes (its RMS residual in the
note); with none of these there is no prediction, and the figure says why.</li>
<li><b>exposed communication</b>: where DDP's own timer was read (sampled steps), its
communication span less the part overlapped with backward compute, i.e. the time from the last
gradient ready to the end of the allreduces (method "measured"); otherwise backward time beyond
the same config's backward time at the smallest world size (DDP's backward waits for the last
allreduce), at most comm_s; without such a reference, min(comm_s, backward_s), the no-overlap
bound. <b>comm_s</b> is a span from the first bucket's launch to the last one's end, mostly
hidden behind backward: not the cost of communication.</li>
<li><b>wait_s</b>, <b>exposed_transfer_s</b>, <b>hidden_comm_s</b>: the exposed communication
split. On each sampled step a rank's wait is its comm_s less the smallest over the ranks (the
last rank to reach the allreduce waits for no one): waiting for the slowest rank, not
communication. The exposed transfer is what even that last rank could not hide (the smallest
exposed time over ranks). Hidden: the part overlapped with backward compute. Advice about the
network follows the exposed transfer alone.</li>
<li><b>exposed all-gather</b>, <b>exposed reduce-scatter</b> (FSDP: <i>all_gather_exposed_s</i>,
<i>reduce_scatter_exposed_s</i> and their <i>_share</i> of the traced step; <i>_hidden_s</i>
the rest): FSDP2's collectives inside forward (each block's gather) and backward (the re-gather
of a block resharded after forward, and each group's reduce-scatter), each call timed from its
start to its end; exposed is the part the computing thread waited in (on CPU FSDP2 calls both
synchronously: all of it), any wait for the other ranks inside the call included. Per run, the
mean over its measured rows (its summary), for every rank. An FSDP run has no allreduce: its
comm_s and exposed communication are empty, and its compute is forward, backward and optimizer
less both exposed parts.</li>
<li><b>straggler</b>: a rank whose own compute (data, forward, optimizer and DDP's backward compute
timer on the steps it sampled; a rank that waits for the others is not slow) exceeds the median of
the other ranks' by more than the threshold on most steps of a window, from the reported step on;
<i>slow_phase</i> is the traced phase (data, forward, backward compute, optimizer) in
which it exceeds the others' median the most, by <i>slow_phase_extra_s</i> per step.</li>
<li><b>tflops_per_device</b>: FLOPs of one training step (forward + backward over every gradient
accumulation micro-batch, counted once per run by PyTorch's FlopCounterMode on rank 0 before the
measured window, so the count costs the measured steps nothing) per sample, &times; samples_per_s
over the measured window / world size, in TFLOP/s. <b>mfu</b>: tflops_per_device over the
device's dense (no 2:4 sparsity) peak for the run's precision, from a table of vendor datasheets
(<i>mfu_note</i> names the peak and its source); a CPU or an unknown device has no MFU and the
note says why.</li>
<li><b>fixed</b> (above a table): the values that every row of the table shares, said once
instead of in a column; the CSV summary keeps every column in every row, as raw numbers.</li>
"""


def glossary_html() -> str:
    """The glossary as a folded ``<details>`` section (id ``glossary``)."""
    return (
        '<details id="glossary" class="glossary"><summary>Glossary: what the numbers mean'
        f'</summary><ul class="note">{DEFINITIONS}</ul></details>'
    )
