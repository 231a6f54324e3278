"""When a run's throughput is known: the 95 % interval of its mean step time from the steps
themselves, and the rule that stops a run once that interval is narrow enough.

Step times in a row are correlated (a slow stretch of steps: another process on the core, a
garbage collection, the network), so their plain standard error is too small. The interval is
the **batch means** one (Schmeiser's fixed number of batches): the measured steps cut into
:data:`BATCHES` consecutive batches of equal size, the Student t interval of the batches' means;
as the run grows its batches grow, so their means become independent even where the steps are
not. Before it, the warm-up is found in the steps themselves (:func:`warmup_count`: the steps at
the start still much slower than the steady state). numpy only: a rank and the analysis both
use it, so the figure a run stopped on is the figure the analysis prints.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

#: Batches the measured steps are cut into (Schmeiser: 10 to 30 hold).
BATCHES = 20
#: The Student t quantile of a 95 % interval with the overlapping batch means' degrees of
#: freedom (about 1.5 x (BATCHES - 1), Meketon and Schmeiser).
T95 = 2.048
#: The same with half the batches (twice their size): about 13.5 degrees of freedom.
T95_HALF_BATCHES = 2.153
#: Fewest steps in a batch before an interval is trusted: smaller batches of correlated steps
#: give too narrow an interval.
MIN_BATCH = 5
#: Fewest measured steps (after the warm-up) for an interval at all.
MIN_STEPS = BATCHES * MIN_BATCH
#: A step after the configured warm-up still counts as warm-up while it is more than this
#: fraction slower than the steady state (DDP's bucket rebuild, the allocator growing its pools).
WARMUP_TOLERANCE = 0.5
#: Fewest steps for the warm-up rule to run (a median needs a few).
WARMUP_MIN_STEPS = 4
#: How often (steps) a run measuring until known looks at its interval.
CHECK_EVERY = 10


def warmup_count(times: Sequence[float] | np.ndarray) -> int:
    """How many of the first ``times`` (step times after the configured warm-up) are warm-up
    still: from the first on, each more than :data:`WARMUP_TOLERANCE` above the steady state
    (the median of the second half), up to the first that is not; at most half of them, and
    none under :data:`WARMUP_MIN_STEPS`."""
    t = np.asarray(times, dtype="float64")
    if len(t) < WARMUP_MIN_STEPS or not np.isfinite(t).any():
        return 0
    steady = float(np.nanmedian(t[len(t) // 2 :]))
    if not math.isfinite(steady) or steady <= 0:
        return 0
    slow = t > steady * (1 + WARMUP_TOLERANCE)
    n = int(np.argmin(slow)) if not slow.all() else len(t)
    return min(n, len(t) // 2)


@dataclass(frozen=True)
class StepEstimate:
    """The mean step time of a run's measured steps and its 95 % interval (batch means)."""

    mean_s: float
    low_s: float
    high_s: float
    measured_steps: int  # steps the estimate is over (after the warm-up)
    batch_steps: int  # steps a batch

    @property
    def half_width(self) -> float:
        """The interval's half-width as a fraction of the mean (0.02: +-2 %)."""
        return (self.high_s - self.low_s) / 2 / self.mean_s

    def rate_interval(self, units: float) -> tuple[float, float, float]:
        """``units`` (samples, tokens) a step as a rate: the point, low and high per second."""
        return units / self.mean_s, units / self.high_s, units / max(self.low_s, 1e-12)


def estimate(times: Sequence[float] | np.ndarray) -> StepEstimate | None:
    """The mean of ``times`` (measured step times, NaN left out) with its batch-means 95 %
    interval; None under :data:`MIN_STEPS` steps. The batches are the last ``BATCHES x size``
    steps (a remainder at the start is left out of the spread, not of the mean)."""
    t = np.asarray(times, dtype="float64")
    t = t[np.isfinite(t)]
    if len(t) < MIN_STEPS:
        return None
    size = len(t) // BATCHES
    mean = float(t.mean())
    if mean <= 0:
        return None
    # Batches still too short for correlated steps show as a variance that grows with their
    # size: the larger of the estimates at ``size`` and twice it.
    # (each with its t quantile: twice the size is half the batches).
    at_size, at_double = _obm_variance(t - mean, size), _obm_variance(t - mean, 2 * size)
    variance, t95 = (at_size, T95) if at_size >= at_double else (at_double, T95_HALF_BATCHES)
    half = t95 * math.sqrt(variance / len(t))
    return StepEstimate(mean, mean - half, mean + half, len(t), size)


def _obm_variance(deviations: np.ndarray, size: int) -> float:
    """``n`` x the variance of the mean of ``n`` steps (their deviations from it), from every
    window of ``size`` steps in a row (overlapping batch means, Meketon and Schmeiser: the
    same estimate as separate batches with less noise in it, so a run that stops once its
    interval is narrow stops less often on one narrow by chance)."""
    n = len(deviations)
    sums = np.concatenate(([0.0], np.cumsum(deviations)))
    window_means = (sums[size:] - sums[:-size]) / size
    return n * size * float(np.sum(window_means**2)) / ((n - size + 1) * (n - size))


@dataclass(frozen=True)
class Verdict:
    """Where a run measuring until known stands after a step: ``stop`` (None: go on) is
    ``"known"``, ``"step cap"`` or ``"time cap"``; ``estimate`` over the measured steps,
    ``warmup`` the steps found to be warm-up after the configured ones."""

    stop: str | None
    estimate: StepEstimate | None
    warmup: int

    def record(self, within: float, steps: int, cap_steps: int, cap_s: float) -> dict[str, Any]:
        """What run.json keeps of it: the goal, how the run ended and how well it is known."""
        e = self.estimate
        return {
            "within": within,
            "stopped_by": self.stop or "end",
            "steps": steps,
            "cap_steps": cap_steps,
            "cap_s": cap_s,
            "warmup_detected": self.warmup,
            **({"half_width": e.half_width, **asdict(e)} if e is not None else {}),
        }


def verdict(
    times: Sequence[float], within: float, elapsed_s: float, cap_s: float, last_step: bool
) -> Verdict:
    """The stopping rule: ``times`` are the step times after the configured warm-up, in order;
    known when their interval (after the detected warm-up) is within +-``within`` of the mean;
    else the time cap once ``elapsed_s`` reaches ``cap_s``, or the step cap at ``last_step``."""
    warm = warmup_count(times)
    e = estimate(times[warm:])
    if e is not None and e.half_width <= within:
        return Verdict("known", e, warm)
    if elapsed_s >= cap_s:
        return Verdict("time cap", e, warm)
    return Verdict("step cap" if last_step else None, e, warm)


def ratio_interval(a: float, a_half: float, b: float, b_half: float) -> tuple[float, float, float]:
    """``a / b`` of two independent figures, each known to +-``half`` (a fraction of it, a
    95 % interval), with its own 95 % interval: the fractions add in quadrature (the delta
    method). Returns the ratio, its low and its high."""
    r = a / b
    half = math.hypot(a_half, b_half)
    return r, r * (1 - half), r * (1 + half)


def resolved(low: float, high: float, against: float = 1.0) -> bool:
    """Whether an interval tells its figure from ``against`` (a speedup from 1x, a change from
    none): it lies wholly on one side."""
    return low > against or high < against


#: Student t quantiles of a 95 % interval by degrees of freedom (launches - 1), for few launches.
T95_BY_DF = {1: 12.71, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}


def pooled(rates: Sequence[float], halves: Sequence[float]) -> tuple[float, float]:
    """The throughput of a study point launched ``len(rates)`` times (each launch's ``rate``,
    known to +-``half``, a fraction) and its 95 % half-width, a fraction: the launches' own
    intervals in quadrature over their count, or, where the launches disagree more than that,
    the spread between them (Student t over the launches: each launch places its ranks and
    threads anew, which no single launch's steps can show). NaN half-width where a launch has
    none."""
    r = np.asarray(rates, dtype="float64")
    h = np.asarray(halves, dtype="float64")
    mean = float(r.mean()) if len(r) else math.nan
    if not len(r) or not np.isfinite(h).all():
        return mean, math.nan
    within = float(np.sqrt(np.sum(h**2)) / len(h))
    if len(r) < 2:
        return mean, within
    between = T95_BY_DF.get(len(r) - 1, 1.96) * float(r.std(ddof=1)) / math.sqrt(len(r)) / mean
    return mean, max(within, between)


def another_launch(
    rates: Sequence[float], halves: Sequence[float], within: float, cap: int
) -> bool:
    """Whether a study point is launched again: below ``cap`` launches, after one (which cannot
    show the spread between launches) or while the pooled interval (:func:`pooled`) is wider
    than +-``within``."""
    if not len(rates) or len(rates) >= cap:
        return False
    return len(rates) < 2 or not pooled(rates, halves)[1] <= within
