"""Statistics of Tier-1 timing samples (standard library only).

Kernel times are skewed (a floor set by the hardware, a tail of clock dips, preemption
and contention), so the reported centre is the median and its 95% confidence interval
comes from binomial order statistics, which assume nothing about the distribution: the
number of samples below the true median is Binomial(n, 1/2), so the interval between the
l-th and (n-l+1)-th smallest samples covers the median with probability
``1 - 2·P(B ≤ l-1)``. Ranks are exact (integer arithmetic) up to :data:`EXACT_MAX_N`
samples and from the normal approximation with continuity correction above.
"""

from __future__ import annotations

import math
import statistics
from fractions import Fraction
from functools import lru_cache
from typing import Dict, List, Sequence, Tuple

#: Up to this many samples the CI ranks come from the exact binomial distribution.
EXACT_MAX_N = 1000
#: Fewest samples whose widest interval (min, max) still covers the median with ≥ 95%:
#: ``1 - 2·0.5**6 = 0.969``. With fewer, the interval reported is (min, max) and
#: :func:`ci_reached` is never true.
MIN_CI_SAMPLES = 6


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation between order statistics.

    This is numpy's default (``method="linear"``): position ``(n-1)·q/100``.

    Raises:
        ValueError: No values, or ``q`` outside [0, 100].
    """
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside [0, 100]")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


@lru_cache(maxsize=4096)
def median_ci_ranks(n: int, confidence: float = 0.95) -> Tuple[int, int]:
    """1-based ranks ``(l, u)`` of the order statistics bounding the median's CI.

    ``l`` is the largest rank with ``P(B ≤ l-1) ≤ (1-confidence)/2`` for
    ``B ~ Binomial(n, 1/2)``, and ``u = n - l + 1`` (symmetric), so the coverage
    ``1 - 2·P(B ≤ l-1)`` is at least ``confidence``. When no rank qualifies (tiny n),
    the ranks are ``(1, n)``.

    Args:
        n: Number of samples (≥ 1).
        confidence: Coverage wanted, in (0, 1).
    """
    if n < 1:
        raise ValueError("median_ci_ranks needs n >= 1")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence} is outside (0, 1)")
    tail = Fraction((1.0 - confidence) / 2.0).limit_denominator(10**9)
    if n <= EXACT_MAX_N:
        # Compare Σ_{i<l} C(n, i) with tail·2^n in integers: exact, no underflow.
        bound = tail.numerator * (1 << n)
        cdf = 0
        term = 1  # C(n, i)
        low = 0
        for i in range(n // 2 + 1):
            cdf += term
            if cdf * tail.denominator > bound:
                break
            low = i + 1  # P(B ≤ i) ≤ tail, so rank i+1 qualifies
            term = term * (n - i) // (i + 1)
    else:
        z = statistics.NormalDist().inv_cdf(1.0 - float(tail))
        low = math.floor((n + 1 - z * math.sqrt(n)) / 2.0)
    if low < 1:
        return 1, n
    return low, n - low + 1


def summarize(samples_ms: Sequence[float], confidence: float = 0.95) -> Dict[str, int | float]:
    """Statistics of timing samples, shaped like ``protocol.TimingStats``.

    Args:
        samples_ms: Per-call times in milliseconds (any order).
        confidence: Coverage of the median's interval.

    Returns:
        ``n``, ``median_ms``, ``mean_ms``, ``stdev_ms`` (sample, n-1; 0 for one
        sample), ``min_ms``, ``max_ms``, ``p5_ms``, ``p95_ms`` (linear interpolation),
        ``ci_low_ms``, ``ci_high_ms`` (the median's CI) and ``ci_rel_halfwidth``
        (``(high - low) / 2 / median``).

    Raises:
        ValueError: No samples, or a sample that is not a finite number.
    """
    values = _sorted_finite(samples_ms)
    n = len(values)
    med = statistics.median(values)
    mean = math.fsum(values) / n
    stdev = statistics.stdev(values, mean) if n > 1 else 0.0
    ci_low, ci_high = _median_ci(values, confidence)
    return {
        "n": n,
        "median_ms": med,
        "mean_ms": mean,
        "stdev_ms": stdev,
        "min_ms": values[0],
        "max_ms": values[-1],
        "p5_ms": percentile(values, 5.0),
        "p95_ms": percentile(values, 95.0),
        "ci_low_ms": ci_low,
        "ci_high_ms": ci_high,
        "ci_rel_halfwidth": _rel_halfwidth(ci_low, ci_high, med),
    }


def ci_reached(samples: Sequence[float], target: float, confidence: float = 0.95) -> bool:
    """Whether the median's CI half-width, relative to the median, is at most ``target``.

    Never true with fewer than :data:`MIN_CI_SAMPLES` samples, whose (min, max) interval
    does not reach 95% coverage.
    """
    if len(samples) < MIN_CI_SAMPLES:
        return False
    values = _sorted_finite(samples)
    low, high = _median_ci(values, confidence)
    return _rel_halfwidth(low, high, statistics.median(values)) <= target


def _sorted_finite(samples: Sequence[float]) -> List[float]:
    if not samples:
        raise ValueError("no samples to summarize")
    values = sorted(float(v) for v in samples)
    if not all(math.isfinite(v) for v in values):
        raise ValueError("samples must be finite numbers")
    return values


def _median_ci(values: List[float], confidence: float) -> Tuple[float, float]:
    low, high = median_ci_ranks(len(values), confidence)
    return values[low - 1], values[high - 1]


def _rel_halfwidth(low: float, high: float, median: float) -> float:
    if high == low:
        return 0.0
    if median <= 0.0:
        # A zero or negative median has no meaningful relative width; say "not reached".
        return math.inf
    return (high - low) / 2.0 / median
