"""Intervals of measured figures that hold without a model of their distribution: the median's
from order statistics, and a mean's over correlated steps from the medians of consecutive
batches (a slow stretch of steps is one batch's worth of evidence, not many). No torch."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def median_interval(values: Sequence[float]) -> tuple[float, float]:
    """The 95 % interval of the median of ``values``, from order statistics: the values of
    ranks ``(k - 1.96 sqrt k) / 2`` and ``1 + (k + 1.96 sqrt k) / 2`` of the ``k`` sorted ones,
    clipped to the ends; ``(nan, nan)`` under 2 values."""
    ordered = sorted(values)
    k = len(ordered)
    if k < 2:
        return float("nan"), float("nan")
    half = 1.96 * math.sqrt(k)
    low = max(math.floor((k - half) / 2), 1)
    high = min(math.ceil(1 + (k + half) / 2), k)
    return ordered[low - 1], ordered[high - 1]


def batch_median_interval(series: np.ndarray) -> tuple[float, float]:
    """The 95 % interval (:func:`median_interval`) of the medians of consecutive batches of
    ``series`` (NaN left out), ``floor(sqrt n)`` values a batch: steps in a row are correlated
    (a slow stretch), batches far less so. ``(nan, nan)`` under 4 values."""
    x = series[np.isfinite(series)]
    size = math.isqrt(len(x))
    if size < 2:
        return float("nan"), float("nan")
    batches = x[: len(x) // size * size].reshape(-1, size)
    return median_interval([float(v) for v in np.median(batches, axis=1)])
