"""Tier-1 statistics: percentiles, and the median's distribution-free confidence interval.

Expected ranks are recomputed here a second way (exact binomial tail as a Fraction) and
checked against published values (n=10 → ranks 2 and 9, n=20 → 6 and 15).
"""

from __future__ import annotations

import math
import statistics
from fractions import Fraction

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuws import protocol
from gpuws.remote_agent.measure.stats import (
    EXACT_MAX_N,
    ci_reached,
    median_ci_ranks,
    percentile,
    summarize,
)


def _tail(n: int, below: int) -> Fraction:
    """P(B ≤ below) for B ~ Binomial(n, 1/2), exactly."""
    return Fraction(sum(math.comb(n, i) for i in range(below + 1)), 2**n)


def ci_coverage(n: int) -> Fraction:
    """Exact probability that the 95% interval of ``median_ci_ranks`` covers the median:
    P(l ≤ B ≤ n-l) = 1 - 2·P(B ≤ l-1). (A check of the ranks; the agent never needs it.)"""
    low, _ = median_ci_ranks(n)
    return 1 - 2 * _tail(n, low - 1)


def _exact_low_rank(n: int) -> int:
    """Largest l with P(B ≤ l-1) ≤ 0.025 (0 when none), straight from the definition."""
    low, cdf, limit = 0, Fraction(0), Fraction(1, 40)
    while low + 1 <= n:
        cdf += Fraction(math.comb(n, low), 2**n)  # now P(B ≤ low)
        if cdf > limit:
            break
        low += 1
    return low


@pytest.mark.parametrize("n,ranks", [
    (1, (1, 1)), (5, (1, 5)), (6, (1, 6)), (10, (2, 9)), (20, (6, 15)), (100, (40, 61)),
])
def test_known_ranks(n: int, ranks: tuple[int, int]) -> None:
    assert median_ci_ranks(n) == ranks


def test_exact_ranks_match_the_definition_and_are_tight() -> None:
    for n in [*range(6, 200), 499, 500, 777, EXACT_MAX_N]:
        low, high = median_ci_ranks(n)
        assert low == _exact_low_rank(n), n
        assert high == n - low + 1
        assert ci_coverage(n) >= Fraction(95, 100)  # covers ≥ 95%
        assert 1 - 2 * _tail(n, low) < Fraction(95, 100)  # one rank inward would not


@pytest.mark.parametrize("n", [EXACT_MAX_N + 1, 1708, 2156, 4001])
def test_normal_approximation_is_within_one_rank_and_conservative(n: int) -> None:
    low, high = median_ci_ranks(n)
    assert _exact_low_rank(n) - 1 <= low <= _exact_low_rank(n)
    assert high == n - low + 1
    assert ci_coverage(n) >= 0.95


def test_small_n_falls_back_to_min_max() -> None:
    assert ci_coverage(5) == 1 - Fraction(2, 32)  # below 95%: never "reached"
    assert not ci_reached([1.0] * 5, 0.5)
    assert ci_reached([1.0] * 6, 0.0)


def test_summarize_by_hand() -> None:
    samples = [0.30, 0.10, 0.20, 0.25, 0.15, 0.40, 0.35, 0.05, 0.45, 0.50]
    s = summarize(samples)
    # sorted: .05 .10 .15 .20 .25 .30 .35 .40 .45 .50
    assert s["n"] == 10
    assert s["median_ms"] == pytest.approx(0.275)
    assert s["mean_ms"] == pytest.approx(0.275)
    assert s["stdev_ms"] == pytest.approx(statistics.stdev(samples))
    assert (s["min_ms"], s["max_ms"]) == (0.05, 0.50)
    assert s["p5_ms"] == pytest.approx(0.05 + 0.45 * 0.05)  # position 0.45
    assert s["p95_ms"] == pytest.approx(0.45 + 0.55 * 0.05)  # position 8.55
    assert (s["ci_low_ms"], s["ci_high_ms"]) == (0.10, 0.45)  # ranks 2 and 9
    assert s["ci_rel_halfwidth"] == pytest.approx((0.45 - 0.10) / 2 / 0.275)
    stats = msgspec.convert(s, protocol.TimingStats)  # the wire shape, strictly
    assert stats.n == 10


def test_real_event_resolution_samples() -> None:
    # Saxpy of the fixture machine: ~0.240 ms, quantised near 0.5 µs like CUDA events.
    samples = [0.2400 + 0.0005 * (i % 5) for i in range(300)]
    s = summarize(samples)
    assert s["median_ms"] == pytest.approx(0.2410)
    assert s["ci_rel_halfwidth"] <= 0.01
    assert ci_reached(samples, 0.01)
    assert s["ci_low_ms"] <= s["median_ms"] <= s["ci_high_ms"]


def test_one_sample() -> None:
    s = summarize([2.5])
    assert (s["n"], s["median_ms"], s["stdev_ms"], s["ci_rel_halfwidth"]) == (1, 2.5, 0.0, 0.0)


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [float("inf"), 1.0]])
def test_rejects(bad: list[float]) -> None:
    with pytest.raises(ValueError):
        summarize(bad)


@given(st.lists(st.floats(min_value=0.0, max_value=1e3, allow_nan=False), min_size=1,
                max_size=400))
@settings(max_examples=200, deadline=None)
def test_percentiles_match_statistics_inclusive(values: list[float]) -> None:
    ordered = sorted(values)
    if len(values) >= 2:
        cuts = statistics.quantiles(values, n=20, method="inclusive")
        assert percentile(ordered, 5.0) == pytest.approx(cuts[0], abs=1e-9)
        assert percentile(ordered, 95.0) == pytest.approx(cuts[-1], abs=1e-9)
    assert percentile(ordered, 0.0) == ordered[0]
    assert percentile(ordered, 100.0) == ordered[-1]
    assert percentile(ordered, 50.0) == pytest.approx(statistics.median(values))


@given(st.lists(st.floats(min_value=1e-4, max_value=1e3, allow_nan=False), min_size=1,
                max_size=1500))
@settings(max_examples=200, deadline=None)
def test_median_inside_its_ci(values: list[float]) -> None:
    s = summarize(values)
    assert s["min_ms"] <= s["ci_low_ms"] <= s["median_ms"] <= s["ci_high_ms"] <= s["max_ms"]
    assert s["p5_ms"] <= s["median_ms"] <= s["p95_ms"]
    assert s["ci_rel_halfwidth"] >= 0.0


@given(st.lists(st.floats(min_value=1e-4, max_value=1e3, allow_nan=False), min_size=1,
                max_size=300), st.integers(min_value=2, max_value=6))
@settings(max_examples=200, deadline=None)
def test_ci_shrinks_with_more_samples(values: list[float], k: int) -> None:
    # The same distribution seen k times as often: the interval can only tighten.
    few = summarize(values)
    many = summarize(values * k)
    assert many["median_ms"] == pytest.approx(few["median_ms"])
    assert few["ci_low_ms"] <= many["ci_low_ms"] <= many["ci_high_ms"] <= few["ci_high_ms"]
    assert many["ci_rel_halfwidth"] <= few["ci_rel_halfwidth"] + 1e-12
