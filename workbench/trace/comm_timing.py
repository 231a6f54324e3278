"""Gradient communication as DDP's own reducer times it (``trace_comm="sampled"``).

DDP keeps a timer in its C++ reducer and exposes it only through private calls
(``_set_ddp_runtime_logging_sample_rate``, ``logger.set_runtime_stats_and_log``,
``_get_ddp_logging_data``). Each call is guarded: in a torch without one, the run records the
gradient bytes alone and says so once (a warning in the rank log, kept in the rank's summary
and from there in ``run.json``), and the run goes on.

What the reducer's timestamps are (torch 2.x, ``reducer.cpp``): backward compute starts in
``prepare_for_backward`` (the end of DDP's forward), communication starts when the first bucket
is launched, backward compute ends in the callback queued once every gradient is ready (just
before ``finalize_backward``), communication ends when ``finalize_backward`` has waited for
every bucket. DDP's logger turns them into ``backward_compute_time``, ``backward_comm_time``
and ``backward_compute_comm_overlap_time`` (first launch to end of compute); it resets every
one of them to 0 before each sampled iteration, so a 0 means "not measured", never 0 s.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

from workbench.errors import MeasurementWarning

#: DDP's private calls the sampler needs, as their names appear in a warning.
PRIVATE_CALLS = (
    "_set_ddp_runtime_logging_sample_rate",
    "logger.set_runtime_stats_and_log",
    "_get_ddp_logging_data",
)


class CommFields(NamedTuple):
    """One step's communication columns (see ``schema.STEP_COLUMNS``); None: not measured.
    DDP's first, then FSDP2's all-gathers and reduce-scatters (``fsdp_comm``)."""

    comm_s: float | None
    comm_bytes: int | None
    comm_buckets: int | None
    backward_compute_s: float | None = None
    comm_exposed_s: float | None = None
    all_gather_bytes: int | None = None
    all_gather_s: float | None = None
    all_gather_exposed_s: float | None = None
    all_gather_calls: int | None = None
    reduce_scatter_bytes: int | None = None
    reduce_scatter_s: float | None = None
    reduce_scatter_exposed_s: float | None = None
    reduce_scatter_calls: int | None = None


def warn(message: str) -> str:
    """Say ``message`` once in the rank's log (stderr) and return it for the rank's summary."""
    warnings.warn(message, MeasurementWarning, stacklevel=2)
    return message


def _measured(data: Mapping[str, Any], duration: str, start: str, end: str) -> float | None:
    """``data[duration]`` in seconds, or None where DDP left it reset: the duration is 0 or
    missing, or (where this torch reports them) one of its two timestamps is 0."""
    value = data.get(duration)
    if not value or value <= 0:
        return None
    if any(key in data and not data[key] for key in (start, end)):
        return None
    return float(value) / 1e9


def ddp_timer_fields(data: Mapping[str, Any]) -> tuple[float | None, float | None, float | None]:
    """(comm_s, backward_compute_s, comm_exposed_s) in seconds from DDP's logging data of one
    sampled iteration; each None where DDP did not measure it.

    Exposed communication is ``backward_comm_time - backward_compute_comm_overlap_time``: the
    time from the end of backward compute to the end of communication. Both are durations on
    the reducer's own clock (CUDA events on CUDA), so the difference is valid on either device;
    its host timestamps are only used to tell a real measurement from a reset 0."""
    comm = _measured(
        data, "backward_comm_time", "backward_comm_time_start", "backward_comm_time_end"
    )
    compute = _measured(
        data, "backward_compute_time", "backward_compute_time_start", "backward_compute_time_end"
    )
    overlap = data.get("backward_compute_comm_overlap_time")
    stamps = ("backward_comm_time_start", "backward_compute_time_end")
    if comm is None or compute is None or overlap is None or overlap < 0:
        return comm, compute, None
    if any(key in data and not data[key] for key in stamps):
        return comm, compute, None
    if overlap == 0 and not all(key in data for key in stamps):
        return comm, compute, None  # no timestamps to tell a reset 0 from a measured one
    return comm, compute, max(comm - float(overlap) / 1e9, 0.0)


def bucket_counts(data: Mapping[str, Any]) -> tuple[int, int] | None:
    """(bytes, buckets) of DDP's current buckets (rebuilt after the first step, if it was)."""
    sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes")
    if not sizes:
        return None
    counts = [int(size) for size in str(sizes).split(",")]
    return sum(counts), len(counts)


class DDPCommSampler:
    """Communication timing from DDP's own reducer timer: no Python hook needed, so DDP keeps its
    C++ allreduce path. DDP times the first 10 iterations and every ``every_steps``-th after (the
    rate is set here); on those steps ``take()`` reads comm_s, backward_compute_s and
    comm_exposed_s (see :func:`ddp_timer_fields`). Bytes and bucket count come, on every step,
    from ``hook_meter`` where a compression hook moves the gradients (what it really sent: the
    reducer's timer spans a hook's work as well), else from DDP's bucket sizes;
    ``gradient_bytes`` (all gradients) stands in for those if DDP's logging data is unavailable.
    ``take()`` must be called once per synchronised step, after ``backward``. ``warnings`` holds
    what the rank said about a missing private call."""

    def __init__(
        self, ddp: Any, every_steps: int, gradient_bytes: int, hook_meter: Any = None
    ) -> None:
        self.ddp = ddp
        self.every_steps = every_steps
        self.hook_meter = hook_meter
        self.iteration = 0  # DDP's count: forwards that synchronise gradients
        self.warnings: list[str] = []
        self.timed = True  # False once a private call failed: bytes only from then on
        self._bytes: int | None = gradient_bytes
        self._buckets: int | None = None
        self._steady = CommFields(None, None, None)  # an untimed step's, reused while alike
        self._call("_set_ddp_runtime_logging_sample_rate", every_steps)

    @property
    def method(self) -> str:
        """How this rank's communication columns were measured, for its summary."""
        return "ddp_timer" if self.timed else "bytes_only"

    def _call(self, name: str, *args: Any) -> Any:
        """One private DDP call; on any failure, bytes only for the rest of the run."""
        try:
            target = self.ddp.logger if name.startswith("logger.") else self.ddp
            return getattr(target, name.split(".")[-1])(*args)
        except Exception as exc:
            self.timed = False
            self.warnings.append(
                warn(
                    f"trace_comm='sampled': DDP's private {name} failed in torch "
                    f"{_torch_version()} ({type(exc).__name__}: {exc}); comm_s, "
                    "backward_compute_s and comm_exposed_s are not recorded, comm_bytes is "
                    "the gradient bytes and comm_buckets is not known"
                )
            )
            return None

    def _sampled(self) -> bool:
        return self.iteration <= 10 or self.iteration % self.every_steps == 0

    def _times(self) -> tuple[float | None, float | None, float | None]:
        """DDP's figures for this step (comm_s, backward_compute_s, comm_exposed_s)."""
        # DDP itself folds the timer into its logging data at the next forward; doing it now
        # puts the figures on this step's row.
        self._call("logger.set_runtime_stats_and_log")
        data = self._call("_get_ddp_logging_data") if self.timed else None
        if not isinstance(data, Mapping):
            return None, None, None
        counts = bucket_counts(data)
        if counts is not None:
            self._bytes, self._buckets = counts
        if data.get("iteration") != self.iteration:
            return None, None, None
        return ddp_timer_fields(data)

    def take(self) -> CommFields:
        """This step's communication columns (on a step DDP did not time, with bytes and
        buckets as before, the same object as the last such step's)."""
        self.iteration += 1
        sent = self.hook_meter.take() if self.hook_meter is not None else None
        times = self._times() if self.timed and self._sampled() else None
        nbytes, buckets = (sent[1], sent[2]) if sent is not None else (self._bytes, self._buckets)
        if times is not None:
            return CommFields(times[0], nbytes, buckets, times[1], times[2])
        steady = self._steady
        if steady.comm_bytes != nbytes or steady.comm_buckets != buckets:
            steady = self._steady = CommFields(None, nbytes, buckets)
        return steady


def _torch_version() -> str:
    import torch

    return str(torch.__version__)
