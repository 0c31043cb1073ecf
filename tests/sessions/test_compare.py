"""Run comparison: bootstrap CI of the speedup, Cliff's δ, metric deltas, regression gate."""

from __future__ import annotations

import bisect
import json
import random
import statistics
from types import ModuleType

import msgspec
import pytest
from rich.console import Console

from gpuws.errors import StoreError, UsageError
from gpuws.sessions import compare as cmp
from gpuws.sessions.compare import (
    Comparison,
    cliffs_delta,
    compare_runs,
    comparison_json,
    delta_magnitude,
    refuse_if_empty,
    regression_gate,
    render_comparison,
)
from gpuws.sessions.store import Store


def _with_metrics(lines: list[bytes], **changes: float) -> list[bytes]:
    """The run's lines with some canonical metrics of its kernel_metrics event changed."""
    out = []
    for line in lines:
        event = json.loads(line)
        if event["type"] == "kernel_metrics":
            event["metrics"].update(changes)
            line = json.dumps(event).encode()
        out.append(line)
    return out


@pytest.fixture
def runs(store: Store, recorded: ModuleType) -> Store:
    """base (0.240 ms), fast (0.200 ms, shorter ncu duration), same (0.240 ms, other seed)."""
    t0 = recorded.T0
    sid = store.open_session("pod", "local", None, 3.99, started=t0)
    store.ingest_many(sid, recorded.saxpy_run("base", n_samples=400, seed=1))
    store.ingest_many(sid, _with_metrics(
        recorded.saxpy_run("fast", t0=t0 + 60, median_ms=0.200, n_samples=400, seed=2),
        duration_ns=205_440.0, dram_throughput_pct=79.6, flops=1.34e8))
    store.ingest_many(sid, recorded.saxpy_run("same", t0=t0 + 120, n_samples=400, seed=3))
    store.ingest_many(sid, recorded.saxpy_run("slow", t0=t0 + 180, median_ms=0.300,
                                              n_samples=400, seed=4))
    store.ingest_many(sid, recorded.saxpy_run("t3only", t0=t0 + 240, tiers=(3,)))
    return store


def test_faster_run_beyond_noise(runs: Store) -> None:
    c = compare_runs(runs, "base", "fast")
    t = c.tier1
    assert t is not None and c.tier1_missing == ""
    assert t.n_a == t.n_b == 400
    assert t.median_a_ms == pytest.approx(0.240, rel=0.01)
    assert t.speedup == pytest.approx(t.median_a_ms / t.median_b_ms)
    assert t.speedup == pytest.approx(1.2, rel=0.01)
    assert t.ci_low < t.speedup < t.ci_high and t.ci_low > 1.0
    assert not t.within_noise
    assert t.cliffs_delta > 0.9 and t.magnitude == "large"
    assert t.verdict.startswith("fast is 1.2") and "faster than base" in t.verdict
    # Deterministic: a fixed seed gives the same interval every time.
    again = compare_runs(runs, "base", "fast").tier1
    assert again is not None and (again.ci_low, again.ci_high) == (t.ci_low, t.ci_high)


def test_same_distribution_is_within_noise(runs: Store) -> None:
    t = compare_runs(runs, "base", "same").tier1
    assert t is not None
    assert t.ci_low <= 1.0 <= t.ci_high and t.within_noise
    assert "within noise" in t.verdict and "contains 1.0" in t.verdict
    assert t.magnitude == "negligible"


def test_tier3_metrics_side_by_side(runs: Store) -> None:
    c = compare_runs(runs, "base", "fast")
    (k,) = c.kernels
    assert (k.kernel, k.launch, k.in_a, k.in_b) == ("saxpy", 0, True, True)
    by_key = {m.key: m for m in k.metrics}
    d = by_key["duration_ns"]
    assert (d.a, d.b, d.delta) == (246_528.0, 205_440.0, 205_440.0 - 246_528.0)
    assert d.delta_pct == pytest.approx(-16.67, abs=0.01)
    assert by_key["dram_throughput_pct"].delta == pytest.approx(79.6 - 66.34)
    f = by_key["flops"]  # unknown in the baseline: no delta
    assert (f.a, f.b, f.delta, f.delta_pct) == (None, 1.34e8, None, None)
    assert by_key["tensor_pipe_active_pct"].delta_pct is None  # 0 → 0: no relative change
    assert by_key["shared_mem_per_block"].delta_pct == 0.0
    assert list(by_key)[:3] == ["duration_ns", "sm_throughput_pct", "memory_throughput_pct"]


def test_missing_tier1_is_said_not_guessed(runs: Store) -> None:
    c = compare_runs(runs, "base", "t3only")
    assert c.tier1 is None and c.tier1_missing == "no Tier-1 samples in run t3only"
    assert c.kernels[0].in_a and c.kernels[0].in_b
    failed, message = regression_gate(c, 5.0)
    assert failed and "cannot gate t3only against base" in message
    with pytest.raises(StoreError, match="nope"):
        compare_runs(runs, "base", "nope")


def test_regression_gate(runs: Store) -> None:
    slow = compare_runs(runs, "base", "slow")  # 25% slower
    failed, message = regression_gate(slow, 10.0)
    assert failed and message.startswith("regression: slow vs base: time +25")
    failed, message = regression_gate(slow, 40.0)
    assert not failed and "limit +40%" in message
    failed, message = regression_gate(compare_runs(runs, "base", "same"), 0.0)
    assert not failed and "within noise" in message  # noise never fails a gate
    assert not regression_gate(compare_runs(runs, "base", "fast"), 0.0)[0]
    with pytest.raises(UsageError):
        regression_gate(slow, -1.0)


def test_runs_timed_in_different_modes_are_flagged_and_never_gated(
        runs: Store, recorded: ModuleType) -> None:
    sid = runs.open_session("pod", "local", None, 3.99, started=recorded.T0 + 300)
    runs.ingest_many(sid, recorded.saxpy_run("coldrun", t0=recorded.T0 + 300, n_samples=400,
                                             seed=5, mode="cold"))
    c = compare_runs(runs, "base", "coldrun")
    assert c.tier1 is not None
    assert c.tier1_caution.startswith("base was timed hot and coldrun cold")
    failed, message = regression_gate(c, 50.0)
    assert failed and "cannot gate coldrun against base" in message and "--hot" in message
    console = Console(record=True, width=200)
    render_comparison(c, console)
    assert "caution: base was timed hot" in console.export_text()
    assert compare_runs(runs, "base", "same").tier1_caution == ""


def test_gate_needs_the_whole_interval_past_the_limit() -> None:
    # A measured slowdown right at the limit, whose CI straddles it, does not fail.
    rng = random.Random(11)
    a = [rng.gauss(1.0, 0.05) for _ in range(50)]
    b = [x * 1.10 for x in a]
    t = cmp.compare_samples(a, b, label_a="a", label_b="b")
    c = Comparison(run_a="a", run_b="b", workload_a="w", workload_b="w", tier1=t,
                   tier1_missing="", kernels=[])
    slowdown_ci = (1 / t.ci_high - 1) * 100, (1 / t.ci_low - 1) * 100
    assert slowdown_ci[0] < 10.0 < slowdown_ci[1]
    assert not regression_gate(c, 10.0)[0]
    assert regression_gate(c, slowdown_ci[0] - 0.5)[0]


def test_bootstrap_matches_literal_resampling() -> None:
    # The O(1) median draw must give the distribution literal resampling gives.
    rng = random.Random(5)
    for n in (1, 2, 7, 8, 61):
        xs = sorted(rng.lognormvariate(0.0, 0.3) for _ in range(n))
        fast_rng, slow_rng = random.Random(1), random.Random(2)
        fast = sorted(cmp._resampled_median(xs, fast_rng) for _ in range(20_000))
        slow = sorted(statistics.median(slow_rng.choices(xs, k=n)) for _ in range(20_000))
        # Kolmogorov–Smirnov distance between the two empirical distributions; 0.025 is
        # beyond what two 20,000-draw samples of one distribution reach (p < 0.001).
        ks = max(abs(bisect.bisect_right(fast, v) - bisect.bisect_right(slow, v)) / 20_000
                 for v in set(fast) | set(slow))
        assert ks < 0.025, (n, ks)
        assert statistics.fmean(fast) == pytest.approx(statistics.fmean(slow), rel=0.01)


def test_cliffs_delta_against_the_definition() -> None:
    assert cliffs_delta([1, 2, 3], [1, 2, 3]) == 0.0
    assert cliffs_delta([4, 5], [1, 2]) == 1.0
    assert cliffs_delta([1, 2], [4, 5]) == -1.0
    assert cliffs_delta([1, 1], [1, 1]) == 0.0
    rng = random.Random(3)
    a = [round(rng.gauss(1.0, 0.2), 2) for _ in range(120)]  # rounded: plenty of ties
    b = [round(rng.gauss(1.1, 0.2), 2) for _ in range(90)]
    brute = sum((x > y) - (x < y) for x in a for y in b) / (len(a) * len(b))
    assert cliffs_delta(a, b) == pytest.approx(brute)


@pytest.mark.parametrize(("delta", "word"), [
    (0.0, "negligible"), (0.146, "negligible"), (-0.147, "small"), (0.329, "small"),
    (0.33, "medium"), (-0.473, "medium"), (0.474, "large"), (-1.0, "large")])
def test_magnitude_words(delta: float, word: str) -> None:
    assert delta_magnitude(delta) == word


def test_render_and_json(runs: Store) -> None:
    c = compare_runs(runs, "base", "fast")
    console = Console(record=True, width=160, color_system=None)
    render_comparison(c, console)
    text = console.export_text()
    assert "fast is 1.2" in text and "faster than base" in text
    assert "2,000 bootstrap resamples" in text
    assert "duration_ns" in text and "-16.7%" in text
    decoded = msgspec.json.decode(comparison_json(c), type=Comparison)
    assert decoded == c

    missing = compare_runs(runs, "base", "t3only")
    console = Console(record=True, width=160, color_system=None)
    render_comparison(missing, console)
    assert "no Tier-1 samples in run t3only" in console.export_text()


def test_nothing_in_common_is_refused_with_what_is_missing(
        runs: Store, recorded: ModuleType) -> None:
    sid = runs.sessions()[0].id
    runs.ingest_many(sid, recorded.cancelled_run("stopped", t0=recorded.T0 + 400))
    runs.ingest_many(sid, recorded.blocked_run("blocked", t0=recorded.T0 + 500))
    runs.ingest_many(sid, recorded.saxpy_run("t3again", t0=recorded.T0 + 600, tiers=(3,)))
    # Tier 1 only in one, metrics only in the other.
    with pytest.raises(UsageError) as info:
        refuse_if_empty(compare_runs(runs, "t3only", "blocked"))
    assert info.value.title == "Nothing to compare"
    assert info.value.message == ("nothing to compare between t3only and blocked: no Tier-1 "
                                  "samples in run t3only and the kernels Tier 3 profiled "
                                  "differ between them")
    assert "gpuws history" in info.value.remedy
    # Neither side has anything at all.
    runs.ingest_many(sid, recorded.cancelled_run("stopped2", t0=recorded.T0 + 700)[:2])
    with pytest.raises(UsageError, match="no Tier-1 samples in either run and neither has "
                                         "Tier-3 metrics"):
        refuse_if_empty(compare_runs(runs, "stopped2", "stopped2"))
    # What can be compared is not refused: metrics in both, or samples in both (a
    # cancelled run's samples are still samples).
    refuse_if_empty(compare_runs(runs, "t3only", "t3again"))
    refuse_if_empty(compare_runs(runs, "base", "stopped"))


def test_no_empty_table_when_tier1_is_missing(runs: Store) -> None:
    console = Console(record=True, width=160, color_system=None)
    render_comparison(compare_runs(runs, "base", "t3only"), console)
    text = console.export_text()
    assert text.startswith("t3only (builtin:saxpy) vs base (builtin:saxpy)\n"
                           "Tier 1 not compared: no Tier-1 samples in run t3only\n")
    assert "samples" not in text.split("\n", 2)[2]  # no header-only Tier-1 table
    assert "246.5 µs" in text  # metrics formatted for people, not 246528


def test_the_gate_refuses_a_baseline_from_another_gpu_model() -> None:
    """A slowdown or speedup between two models says nothing about the code: the gate
    refuses (failing, as for runs timed in different modes) and says what to pass. Same
    model on another driver or clock: still gated, with the difference named."""
    rng = random.Random(7)
    a = [rng.gauss(1.0, 0.01) for _ in range(60)]
    t = cmp.compare_samples(a, [x * 0.7 for x in a], label_a="a", label_b="b")  # B faster
    other = Comparison(run_a="a", run_b="b", workload_a="w", workload_b="w", tier1=t,
                       tier1_missing="", kernels=[],
                       gpu_a=cmp.RunGpu(name="NVIDIA H100 80GB HBM3", driver="580.1"),
                       gpu_b=cmp.RunGpu(name="NVIDIA H200", driver="580.1"),
                       differences=["different GPUs: A NVIDIA H100 80GB HBM3 vs B NVIDIA H200"])
    failed, message = regression_gate(other, 5.0)
    assert failed and "cannot gate b against a" in message
    assert "different GPUs (A NVIDIA H100 80GB HBM3, B NVIDIA H200)" in message
    assert "--baseline a run on the same GPU model" in message
    same = msgspec.structs.replace(
        other, gpu_a=cmp.RunGpu(name="NVIDIA H200", driver="570.1"),
        differences=["different drivers: A 570.1 vs B 580.1"])
    failed, message = regression_gate(same, 5.0)
    assert not failed and message.startswith("ok: ")
    assert message.endswith("; different drivers: A 570.1 vs B 580.1")
    # No model known on one side (runs recorded before the GPU was kept): gated as before.
    unknown = msgspec.structs.replace(other, gpu_a=cmp.RunGpu(), differences=[])
    assert not regression_gate(unknown, 5.0)[0]


def test_a_run_with_the_timer_cost_taken_out_is_compared_with_it_put_back(
        runs: Store, recorded: ModuleType) -> None:
    """A run from an agent that takes the event pair's cost out (timer_ms) against one
    from an older agent: 0.0016 ms less per call would otherwise read as a speed-up."""
    lines = []
    for line in recorded.saxpy_run("newagent", t0=recorded.T0 + 300, median_ms=0.2384,
                                   n_samples=400, seed=3):
        event = json.loads(line)
        if event["type"] == "tier1_result":
            event["timer_ms"] = 0.0016
        lines.append(json.dumps(event).encode())
    sid = runs.open_session("pod", "local", None, 3.99, started=recorded.T0 + 300)
    runs.ingest_many(sid, lines)
    c = compare_runs(runs, "base", "newagent")
    assert c.tier1 is not None
    assert c.tier1.median_b_ms == pytest.approx(0.240, rel=0.002)
    assert any(d.startswith("only B had the timer's own cost (1.6 µs) taken out")
               for d in c.differences)
    # Put back, the two are the same code on the same footing: the gate may judge them.
    failed, message = regression_gate(c, 5.0)
    assert not failed, message
    flipped = compare_runs(runs, "newagent", "base")
    assert flipped.tier1 is not None and flipped.tier1.median_a_ms == pytest.approx(0.240,
                                                                                     rel=0.002)
    assert compare_runs(runs, "base", "same").tier1_caution == ""


def test_a_change_under_the_run_to_run_floor_is_no_difference() -> None:
    # Two runs of an unchanged kernel: 400 tightly spread samples each, the second run's
    # median 0.4% higher, as watch iterations of one Triton add differed on the H100
    # (docs/performance.md §13). The bootstrap interval excludes 1.0 (within-run noise
    # is tiny), yet 0.4% is what separate runs differ by: no verdict may claim it.
    rng = random.Random(7)
    a = [0.0952 * (1 + rng.gauss(0, 0.001)) for _ in range(400)]
    b = [0.0952 * 1.004 * (1 + rng.gauss(0, 0.001)) for _ in range(400)]
    drift = cmp.compare_samples(a, b, label_a="a", label_b="b")
    assert not drift.within_noise and drift.ci_high < 1.0  # the interval excludes 1.0
    assert drift.under_floor and cmp.verdict_word(drift) == "no difference"
    assert "run-to-run" in drift.verdict and "no difference is claimed" in drift.verdict
    # A 1% change with the same spread is past the floor: slower, said so.
    c = [0.0952 * 1.01 * (1 + rng.gauss(0, 0.001)) for _ in range(400)]
    real = cmp.compare_samples(a, c, label_a="a", label_b="c")
    assert not real.under_floor and cmp.verdict_word(real) == "slower"
    assert cmp.change_text(real).endswith("slower")
    # The floor is the caller's: at 0.1% the same drift is called slower.
    strict = cmp.compare_samples(a, b, floor_pct=0.1)
    assert cmp.verdict_word(strict) == "slower"
