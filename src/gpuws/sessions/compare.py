"""Compare two runs: is B faster than A, by how much, and is it more than noise?

Tier 1: the speedup of medians (``median_A / median_B``: above 1 means B is faster) with
a 95% bootstrap confidence interval, and Cliff's δ as an effect size that does not
assume normal timings. Tier 3: the canonical ncu metrics of each kernel side by side.

Two runs are only as comparable as the GPUs and clocks they ran on: each run's GPU model,
driver and Tier-1 clocks are set side by side, every difference is said in one line, and
when both median SM clocks are known a cycle-space ratio (time × SM clock) stands beside
the time ratio, so a speedup that only comes from a faster clock shows as such.
"""

from __future__ import annotations

import bisect
import random
import statistics
from typing import Any, Literal

import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpuws import physical, protocol
from gpuws.errors import UsageError
from gpuws.gpu import clocks
from gpuws.remote_agent.measure.stats import percentile
from gpuws.sessions.store import KernelMetricsRow, Store
from gpuws.text import humanfmt
from gpuws.text.textsafe import visible
from gpuws.workspace.code import CodeRecord, diff_entries

RESAMPLES = 2000
SEED = 20_240_601
CONFIDENCE = 0.95
#: The least change in the median (%) called faster or slower. The bootstrap interval only
#: holds the noise *within* a run; separate runs of an unchanged kernel differ by more:
#: ten watch iterations of the same ~95 µs Triton add on an H100 (an edit of a comment
#: each, docs/performance.md §13) had medians 95.08–95.42 µs, and 3 of their 10
#: comparisons excluded 1.0 at 95% (+0.4%, -0.3%, +0.2%). Half a percent keeps those "no
#: difference" and is still well under the 1–3% changes kernel work decides on.
NOISE_FLOOR_PCT = 0.5

Magnitude = Literal["negligible", "small", "medium", "large"]


class Tier1Comparison(msgspec.Struct, frozen=True, kw_only=True):
    """Tier-1 timing of A against B.

    ``speedup`` is ``median_a / median_b``; ``cliffs_delta`` is P(a > b) − P(a < b), so a
    positive δ means A's calls tend to take longer than B's.
    """

    n_a: int
    n_b: int
    median_a_ms: float
    median_b_ms: float
    speedup: float
    ci_low: float
    ci_high: float
    cliffs_delta: float
    magnitude: Magnitude
    #: The confidence interval contains 1.0: no difference can be told from noise.
    within_noise: bool
    verdict: str
    #: The interval excludes 1.0 but the change is under ``NOISE_FLOOR_PCT``, what runs of
    #: an unchanged kernel differ by: no difference is claimed either.
    under_floor: bool = False


class MetricDelta(msgspec.Struct, frozen=True, kw_only=True):
    """One metric of one kernel in both runs (``delta = b − a``)."""

    key: str
    a: float | None
    b: float | None
    delta: float | None
    delta_pct: float | None


class KernelComparison(msgspec.Struct, frozen=True, kw_only=True):
    """A profiled launch matched by kernel name and launch index (absent side: ``None``)."""

    kernel: str
    launch: int
    in_a: bool
    in_b: bool
    metrics: list[MetricDelta]


class RunGpu(msgspec.Struct, frozen=True, kw_only=True):
    """The GPU a run ran on, as far as the store knows it (``""``/None: not known).

    From the run's ``RunStarted.gpu`` (the GPU the agent pinned it to) and its session's
    probe (names and the driver). A run not pinned on a pod whose GPUs are all one model
    ran on that model; on a mixed pod its GPU is not known.
    """

    name: str = ""
    index: int | None = None
    uuid: str | None = None
    driver: str = ""


class Comparison(msgspec.Struct, frozen=True, kw_only=True):
    """Everything :func:`compare_runs` found."""

    run_a: str
    run_b: str
    workload_a: str
    workload_b: str
    tier1: Tier1Comparison | None
    #: Why there is no Tier-1 comparison (empty when there is one).
    tier1_missing: str
    kernels: list[KernelComparison]
    #: Set when the two runs' Tier-1 samples were taken in different modes (hot/cold):
    #: their medians then differ by how they were measured, not only by the code.
    tier1_caution: str = ""
    resamples: int = RESAMPLES
    seed: int = SEED
    confidence: float = CONFIDENCE
    #: The GPU each run ran on (model, index, UUID, driver).
    gpu_a: RunGpu = msgspec.field(default_factory=RunGpu)
    gpu_b: RunGpu = msgspec.field(default_factory=RunGpu)
    #: The clocks behind each run's Tier-1 figure (None: not recorded).
    clocks_a: protocol.ClockRange | None = None
    clocks_b: protocol.ClockRange | None = None
    #: Each run's clock caution (:func:`gpuws.gpu.clocks.caution`), empty when none.
    clock_caution_a: str = ""
    clock_caution_b: str = ""
    #: One line per way the runs' GPUs differ: model, driver, SM clock.
    differences: list[str] = msgspec.field(default_factory=list)
    #: A's SM cycles per call over B's (median time × median SM clock), when both clocks
    #: are known: the speedup with the clock difference taken out.
    cycle_ratio: float | None = None
    #: What the cycle ratio means here, in one line (empty without one).
    cycle_note: str = ""
    #: The code each run measured (None: run without a workspace).
    code_a: CodeRecord | None = None
    code_b: CodeRecord | None = None
    #: The files that differ between the two runs' trees, marked ``+`` added, ``~``
    #: modified, ``-`` removed (from A to B); None when a tree's manifest is not stored.
    code_changes: list[str] | None = None


#: Median SM clocks further apart than this are a difference worth a line (NVML moves the
#: clock in 15 MHz steps: 1% is a step or two at boost clocks).
CLOCK_DIFFERENCE = 0.01


def run_gpu(store: Store, run_id: str) -> RunGpu:
    """The GPU a stored run ran on, from its ``RunStarted.gpu`` and its session's probe."""
    run = store.run(run_id)
    probe = store.session(run.session_id).probe
    target: protocol.GpuTarget | None = None
    for ev in store.run_events(run.run_id, ["run_started"]):
        if isinstance(ev, protocol.RunStarted):
            target = ev.gpu
    driver = (probe.driver or "") if probe is not None else ""
    known = probe.gpus if probe is not None else []
    if target is not None:
        match = next((g for g in known if target.uuid and g.uuid == target.uuid), None) or \
            next((g for g in known if g.index == target.index), None)
        name = target.name or (match.name if match is not None else "")
        return RunGpu(name=name, index=target.index, uuid=target.uuid or
                      (match.uuid if match is not None else None), driver=driver)
    models = {g.name for g in known}
    if len(known) == 1:
        g = known[0]
        return RunGpu(name=g.name, index=g.index, uuid=g.uuid, driver=driver)
    return RunGpu(name=models.pop() if len(models) == 1 else "", driver=driver)


def gpu_differences(a: RunGpu, b: RunGpu, clocks_a: protocol.ClockRange | None,
                    clocks_b: protocol.ClockRange | None) -> list[str]:
    """One line per way the two runs' GPUs differ: model, driver, median SM clock.

    Only what is known on both sides is called different; a run without recorded clocks
    beside one with them is said as such (its figure cannot be set on the same clock).
    """
    lines: list[str] = []
    if a.name and b.name and a.name != b.name:
        lines.append(f"different GPUs: A {a.name} vs B {b.name}")
    if a.driver and b.driver and a.driver != b.driver:
        lines.append(f"different drivers: A {a.driver} vs B {b.driver}")
    sm_a = clocks_a.sm_mhz_median if clocks_a is not None else None
    sm_b = clocks_b.sm_mhz_median if clocks_b is not None else None
    if sm_a is not None and sm_b is not None:
        if abs(sm_a - sm_b) > CLOCK_DIFFERENCE * max(sm_a, sm_b):
            lines.append(f"different SM clocks: A median {humanfmt.mhz(sm_a)} vs B "
                         f"{humanfmt.mhz(sm_b)}")
    elif (sm_a is None) != (sm_b is None):
        has, lacks = ("A", "B") if sm_a is not None else ("B", "A")
        lines.append(f"clocks recorded for {has} only ({lacks}: {clocks.NOT_RECORDED}): the "
                     "clock difference cannot be taken out")
    return lines


def compare_runs(store: Store, a: str, b: str) -> Comparison:
    """Compare run ``b`` against run ``a`` (ids or unique prefixes).

    Raises:
        StoreError: a run id is unknown or ambiguous.
    """
    run_a, run_b = store.run(a), store.run(b)
    samples_a = _timed(store.samples(run_a.run_id))
    samples_b = _timed(store.samples(run_b.run_id))
    result_a, result_b = store.tier1(run_a.run_id), store.tier1(run_b.run_id)
    samples_a, samples_b, timer_note = _same_timer(samples_a, result_a, samples_b, result_b)
    missing = [r.run_id for r, s in ((run_a, samples_a), (run_b, samples_b)) if not s]
    tier1 = None
    reason = ""
    if missing:
        reason = ("no Tier-1 samples in run " + missing[0] if len(missing) == 1
                  else "no Tier-1 samples in either run")
    else:
        tier1 = compare_samples(samples_a, samples_b, label_a=run_a.run_id,
                                label_b=run_b.run_id)
    caution = ""
    if tier1 is not None and result_a and result_b and result_a.mode != result_b.mode:
        caution = (f"{run_a.run_id} was timed {result_a.mode} and {run_b.run_id} "
                   f"{result_b.mode}: the medians differ by how they were taken; rerun one "
                   f"with --{result_a.mode} (or --{result_b.mode}) to compare the code")
    clocks_a = result_a.clocks if result_a is not None else None
    clocks_b = result_b.clocks if result_b is not None else None
    gpu_a, gpu_b = run_gpu(store, run_a.run_id), run_gpu(store, run_b.run_id)
    ratio = None
    note = ""
    if tier1 is not None:
        ratio = clocks.cycle_ratio(tier1.median_a_ms, clocks_a, tier1.median_b_ms, clocks_b)
        if ratio is not None:
            note = (f"cycle-space ratio {humanfmt.ratio(ratio)} (A/B of median time × median "
                    f"SM clock: {_cycles(tier1.median_a_ms, clocks_a)} vs "
                    f"{_cycles(tier1.median_b_ms, clocks_b)} per call): the speedup with the "
                    "clock difference taken out")
    return Comparison(run_a=run_a.run_id, run_b=run_b.run_id, workload_a=run_a.workload,
                      workload_b=run_b.workload, tier1=tier1, tier1_missing=reason,
                      tier1_caution=caution,
                      kernels=compare_metrics(store.metrics(run_a.run_id),
                                              store.metrics(run_b.run_id)),
                      gpu_a=gpu_a, gpu_b=gpu_b, clocks_a=clocks_a, clocks_b=clocks_b,
                      clock_caution_a=clocks.caution(clocks_a) or "",
                      clock_caution_b=clocks.caution(clocks_b) or "",
                      differences=gpu_differences(gpu_a, gpu_b, clocks_a, clocks_b)
                      + ([timer_note] if timer_note and tier1 is not None else []),
                      cycle_ratio=ratio, cycle_note=note, **code_comparison(
                          store, run_a.run_id, run_b.run_id))


def code_comparison(store: Store, a: str, b: str) -> dict[str, Any]:
    """The ``code_*`` fields of a comparison: each run's code and the files between them."""
    code_a, code_b = store.code(a), store.code(b)
    changes = None
    if code_a is not None and code_b is not None:
        old, new = store.manifest(code_a.tree_sha256), store.manifest(code_b.tree_sha256)
        if old is not None and new is not None:
            diff = diff_entries(old, new)
            changes = sorted([f"+{p}" for p in diff.added] + [f"~{p}" for p in diff.modified]
                             + [f"-{p}" for p in diff.removed], key=lambda m: m[1:])
    return {"code_a": code_a, "code_b": code_b, "code_changes": changes}


def code_lines(c: Comparison, limit: int = 20) -> list[str]:
    """The code behind each run, and the files that changed between them (plain text)."""
    if c.code_a is None and c.code_b is None:
        return []
    lines = [f"code A: {c.code_a.short() if c.code_a else 'no workspace'}",
             f"code B: {c.code_b.short() if c.code_b else 'no workspace'}"]
    if c.code_changes is not None:
        if not c.code_changes:
            lines.append("same tree: no file changed between them")
        else:
            shown = ", ".join(c.code_changes[:limit])
            more = f", … {len(c.code_changes) - limit} more" if len(c.code_changes) > limit \
                else ""
            lines.append(f"{len(c.code_changes)} file(s) changed from A to B: {shown}{more}")
    return [visible(line, 2000) for line in lines]


def _same_timer(samples_a: list[float], result_a: protocol.Tier1Result | None,
                samples_b: list[float], result_b: protocol.Tier1Result | None,
                ) -> tuple[list[float], list[float], str]:
    """The two runs' samples on the same footing, and a line saying so when it took work.

    Agents since ``Tier1Result.timer_ms`` take the event pair's own cost (~1.6 µs on an
    H100) out of every sample; older ones did not. Set side by side, that alone would
    read as a speed-up of a fast kernel, so the newer run's cost goes back in.
    """
    ta = result_a.timer_ms if result_a is not None else None
    tb = result_b.timer_ms if result_b is not None else None
    if result_a is None or result_b is None or (ta is None) == (tb is None):
        return samples_a, samples_b, ""
    if ta is not None:
        samples_a = [v + ta / result_a.batch for v in samples_a]
        newer, cost = "A", ta
    else:
        assert tb is not None
        samples_b = [v + tb / result_b.batch for v in samples_b]
        newer, cost = "B", tb
    return samples_a, samples_b, (
        f"only {newer} had the timer's own cost ({humanfmt.ms(cost)}) taken out "
        "of its samples; it is put back for this comparison")


def _timed(values: list[float]) -> list[float]:
    """The samples a ratio of times can use: physical (:mod:`gpuws.physical`; an older
    gpuws stored 1e308 and 0 from a lying pod) and above zero (a median of 0 divides)."""
    return [v for v in physical.keep(values, "ms") if v > 0]


def _cycles(median_ms: float, clock: protocol.ClockRange | None) -> str:
    return humanfmt.si(clocks.cycles_per_call(median_ms, clock), "cycles")


def refuse_if_empty(c: Comparison) -> None:
    """Refuse a comparison that compares nothing, saying what is missing.

    Two runs compare when both have Tier-1 samples, or when at least one profiled kernel
    launch appears in both. A comparison with neither would print empty tables.

    Raises:
        UsageError: nothing in the two runs can be compared (one line: what is missing).
    """
    if c.tier1 is not None or any(k.in_a and k.in_b for k in c.kernels):
        return
    only = {True: [k for k in c.kernels if k.in_a], False: [k for k in c.kernels if k.in_b]}
    if only[True] or only[False]:
        tier3 = "and the kernels Tier 3 profiled differ between them"
    else:
        tier3 = "and neither has Tier-3 metrics"
    raise UsageError(f"nothing to compare between {c.run_a} and {c.run_b}: "
                     f"{c.tier1_missing} {tier3}",
                     title="Nothing to compare",
                     remedy="compare runs that ran Tier 1 (`gpuws history` shows each run's "
                            "Tier-1 median)")


def compare_samples(a: list[float], b: list[float], *, label_a: str = "A",
                    label_b: str = "B", floor_pct: float = NOISE_FLOOR_PCT
                    ) -> Tier1Comparison:
    """Compare two sample sets (milliseconds per call); both must be non-empty.

    B is called faster or slower only when the bootstrap CI of the ratio of medians
    excludes 1.0 *and* the median moved by ``floor_pct`` or more (``NOISE_FLOOR_PCT``).
    """
    sa, sb = sorted(a), sorted(b)
    med_a, med_b = statistics.median(sa), statistics.median(sb)
    speedup = med_a / med_b
    lo, hi = bootstrap_ratio_ci(sa, sb)
    delta = cliffs_delta(sa, sb)
    magnitude = delta_magnitude(delta)
    within = lo <= 1.0 <= hi
    change_pct = (1.0 / speedup - 1.0) * 100.0
    under_floor = not within and abs(change_pct) < floor_pct
    ci = f"95% CI {lo:.3f}–{hi:.3f}×"
    if within:
        verdict = (f"within noise: {label_b} vs {label_a} speedup {speedup:.3f}× ({ci}); "
                   "the interval contains 1.0, so no difference can be claimed")
    elif under_floor:
        verdict = (f"within run-to-run noise: {label_b} vs {label_a} {change_pct:+.2f}% "
                   f"({ci}), under the {floor_pct:g}% by which runs of an unchanged kernel "
                   "differ, so no difference is claimed")
    elif speedup > 1:
        verdict = f"{label_b} is {speedup:.3f}× faster than {label_a} ({ci})"
    else:
        verdict = f"{label_b} is {1 / speedup:.3f}× slower than {label_a} ({ci})"
    verdict += f"; Cliff's δ {delta:+.2f} ({magnitude})"
    return Tier1Comparison(n_a=len(sa), n_b=len(sb), median_a_ms=med_a, median_b_ms=med_b,
                           speedup=speedup, ci_low=lo, ci_high=hi, cliffs_delta=delta,
                           magnitude=magnitude, within_noise=within, verdict=verdict,
                           under_floor=under_floor)


def bootstrap_ratio_ci(sorted_a: list[float], sorted_b: list[float],
                       resamples: int = RESAMPLES, seed: int = SEED,
                       confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Percentile bootstrap CI of ``median(A) / median(B)`` (inputs sorted ascending).

    Both sets are resampled with replacement ``resamples`` times from a fixed seed, so
    the interval is deterministic.
    """
    rng = random.Random(seed)
    ratios = sorted(_resampled_median(sorted_a, rng) / _resampled_median(sorted_b, rng)
                    for _ in range(resamples))
    tail_pct = 100.0 * (1.0 - confidence) / 2
    return percentile(ratios, tail_pct), percentile(ratios, 100.0 - tail_pct)


def _resampled_median(xs: list[float], rng: random.Random) -> float:
    """The median of one bootstrap resample of sorted ``xs``, drawn in O(1).

    Drawing n indices uniformly with replacement and taking the median is the same as
    drawing the middle order statistic(s) of n uniforms directly: the k-th smallest of n
    uniforms is Beta(k, n−k+1), and given it is u, the next is u + (1−u)·Beta(1, n−k).
    Because ``xs`` is sorted, index order is value order, so ``xs[⌊n·U(k)⌋]`` is exactly the
    resample's k-th smallest value. This makes 2,000 resamples of 100,000 samples cheap
    where literal resampling would sort 400 million numbers.
    """
    n = len(xs)
    if n == 1:
        return xs[0]
    k = (n + 1) // 2
    u = rng.betavariate(k, n - k + 1)
    low = xs[min(n - 1, int(n * u))]
    if n % 2:
        return low
    u_next = u + (1.0 - u) * rng.betavariate(1, n - k)
    return (low + xs[min(n - 1, int(n * u_next))]) / 2


def cliffs_delta(a: list[float], b: list[float]) -> float:
    """Cliff's δ = P(a > b) − P(a < b) over all pairs, in O((n + m) log m)."""
    sb = sorted(b)
    m = len(sb)
    score = 0
    for x in a:
        score += bisect.bisect_left(sb, x) - (m - bisect.bisect_right(sb, x))
    return score / (len(a) * m)


def delta_magnitude(delta: float) -> Magnitude:
    """Romano et al.'s thresholds: |δ| < 0.147 negligible, < 0.33 small, < 0.474 medium."""
    d = abs(delta)
    if d < 0.147:
        return "negligible"
    if d < 0.33:
        return "small"
    if d < 0.474:
        return "medium"
    return "large"


def compare_metrics(a: list[KernelMetricsRow],
                    b: list[KernelMetricsRow]) -> list[KernelComparison]:
    """Pair launches by (kernel, launch) and put their canonical metrics side by side."""
    by_a = {(r.kernel, r.launch): r for r in a}
    by_b = {(r.kernel, r.launch): r for r in b}
    keys = list(by_a) + [k for k in by_b if k not in by_a]
    out = []
    for key in keys:
        ra, rb = by_a.get(key), by_b.get(key)
        ma = ra.metrics if ra is not None else {}
        mb = rb.metrics if rb is not None else {}
        names = list(ma) + [n for n in mb if n not in ma]
        out.append(KernelComparison(kernel=key[0], launch=key[1], in_a=ra is not None,
                                    in_b=rb is not None,
                                    metrics=[_delta(n, ma.get(n), mb.get(n)) for n in names]))
    return out


def _delta(key: str, a: float | None, b: float | None) -> MetricDelta:
    if a is None or b is None:
        return MetricDelta(key=key, a=a, b=b, delta=None, delta_pct=None)
    return MetricDelta(key=key, a=a, b=b, delta=b - a,
                       delta_pct=100.0 * (b - a) / abs(a) if a != 0 else None)


def regression_gate(comparison: Comparison, fail_if_slower_pct: float) -> tuple[bool, str]:
    """Decide a CI gate: fail only when B is slower than A beyond noise *and* threshold.

    "Beyond" means the whole confidence interval lies past ``fail_if_slower_pct``: a
    noisy measurement that merely might be that slow does not fail the gate. A missing
    Tier-1 result fails it, since nothing was shown to be fine.

    Returns:
        ``(failed, message)``.
    """
    if fail_if_slower_pct < 0:
        raise UsageError(f"--fail-if-slower {fail_if_slower_pct}% must not be negative")
    c = comparison.tier1
    if c is None:
        return True, f"cannot gate {comparison.run_b} against {comparison.run_a}: " + \
            comparison.tier1_missing
    if comparison.tier1_caution:
        return True, f"cannot gate {comparison.run_b} against {comparison.run_a}: " + \
            comparison.tier1_caution
    a, b = comparison.gpu_a.name, comparison.gpu_b.name
    if a and b and a != b:
        # Another model's time says nothing about a regression in the code: an H100
        # baseline would pass any slowdown on an H200 and fail any speedup on an A100.
        return True, (f"cannot gate {comparison.run_b} against {comparison.run_a}: they ran "
                      f"on different GPUs (A {visible(a, 80)}, B {visible(b, 80)}); give "
                      "--baseline a run on the same GPU model")
    limit = 1.0 / (1.0 + fail_if_slower_pct / 100.0)
    slower = (1.0 / c.speedup - 1.0) * 100.0
    band = f"{(1.0 / c.ci_high - 1.0) * 100.0:+.1f}% to {(1.0 / c.ci_low - 1.0) * 100.0:+.1f}%"
    detail = (f"{comparison.run_b} vs {comparison.run_a}: time {slower:+.1f}% "
              f"(95% CI {band}), limit +{fail_if_slower_pct:g}%")
    # Same model, other driver or clocks: still a gate, with the difference named, since
    # a driver or a throttled clock can be the regression itself.
    also = "".join(f"; {visible(d, 200)}" for d in comparison.differences)
    if c.ci_high < limit:
        return True, f"regression: {detail}; slower beyond noise and the limit{also}"
    if c.within_noise:
        return False, f"ok: {detail}; within noise{also}"
    return False, f"ok: {detail}{also}"


def render_comparison(c: Comparison, console: Console) -> None:
    """Print a comparison as rich tables (workloads and kernel names never read as markup)."""
    who = Text.assemble((visible(c.run_b), "bold"), f" ({visible(c.workload_b, 200)}) vs ",
                        (visible(c.run_a), "bold"), f" ({visible(c.workload_a, 200)})")
    head = Table(title=who)
    head.add_column("")
    head.add_column(Text(f"A {visible(c.run_a)}"), justify="right")
    head.add_column(Text(f"B {visible(c.run_b)}"), justify="right")
    t = c.tier1
    if t is None:
        # No empty table: say whose runs these are and what Tier 1 lacks.
        console.print(who)
        console.print(Text(f"Tier 1 not compared: {c.tier1_missing}", "yellow"))
    else:
        head.add_row("samples", humanfmt.num(t.n_a), humanfmt.num(t.n_b))
        head.add_row("median", humanfmt.ms(t.median_a_ms), humanfmt.ms(t.median_b_ms))
        for label, a, b in gpu_rows(c):
            head.add_row(label, Text(visible(a, 200)), Text(visible(b, 200)))
        console.print(head)
        quiet = t.within_noise or t.under_floor
        style = "yellow" if quiet else ("green" if t.speedup > 1 else "red")
        console.print(f"speedup (A/B) {humanfmt.ratio(t.speedup)}, {int(c.confidence * 100)}% "
                      f"CI [{t.ci_low:.3f}, {t.ci_high:.3f}] ({humanfmt.num(c.resamples)} "
                      "bootstrap resamples)")
        console.print(Text(t.verdict, style=style))
        if c.cycle_note:
            console.print(Text(c.cycle_note))
        if c.tier1_caution:
            console.print(Text(f"caution: {c.tier1_caution}", style="yellow"))
    for line in caution_lines(c):
        console.print(Text(line, style="yellow"))
    for line in code_lines(c):
        console.print(Text(line, style="cyan"))
    for k in c.kernels:
        table = Table(title=Text(f"{visible(k.kernel, 200)} (launch {k.launch})" + (
            "" if k.in_a and k.in_b else " — only in " + ("A" if k.in_a else "B"))))
        for col in ("metric", "A", "B", "Δ", "Δ%"):
            table.add_column(col, justify="left" if col == "metric" else "right")
        for m in k.metrics:
            delta = humanfmt.metric(m.key, m.delta)
            if m.delta is not None and m.delta > 0:
                delta = "+" + delta
            table.add_row(Text(visible(m.key, 80)), humanfmt.metric(m.key, m.a),
                          humanfmt.metric(m.key, m.b),
                          delta, "" if m.delta_pct is None else f"{m.delta_pct:+.1f}%")
        console.print(table)


def gpu_rows(c: Comparison) -> list[tuple[str, str, str]]:
    """``(label, A, B)`` rows of what the runs ran on: GPU, driver, Tier-1 clocks."""
    def gpu(g: RunGpu) -> str:
        where = f"GPU {g.index}" if g.index is not None else ""
        return " · ".join(x for x in (visible(g.name, 60), where) if x) or "not recorded"

    return [("GPU", gpu(c.gpu_a), gpu(c.gpu_b)),
            ("driver", visible(c.gpu_a.driver, 40) or "not recorded",
             visible(c.gpu_b.driver, 40) or "not recorded"),
            ("Tier-1 clocks", clocks.describe(c.clocks_a), clocks.describe(c.clocks_b))]


def caution_lines(c: Comparison) -> list[str]:
    """What makes the two figures less comparable, one line each (pod text made visible)."""
    lines = [visible(d, 300) for d in c.differences]
    for side, text in (("A", c.clock_caution_a), ("B", c.clock_caution_b)):
        if text:
            lines.append(f"caution ({side}): {text}")
    return lines


def comparison_json(c: Comparison) -> str:
    """The comparison as indented JSON (stable field order)."""
    return msgspec.json.format(msgspec.json.encode(c), indent=2).decode("utf-8")


def verdict_word(c: Tier1Comparison | None) -> str:
    """faster / slower / no difference (at 95%, and by at least ``NOISE_FLOOR_PCT``)."""
    if c is None:
        return ""
    if c.within_noise or c.under_floor:
        return "no difference"
    return "faster" if c.speedup > 1.0 else "slower"


def change_text(c: Tier1Comparison | None) -> str:
    """``-2.1% [-2.4, -1.8] faster``: time change of B against A with its 95% CI (what
    ``gpuws watch`` prints per iteration and the export's watch table shows)."""
    if c is None:
        return "—"
    return f"{change_range(c)} {verdict_word(c)}"


def change_range(c: Tier1Comparison | None) -> str:
    """``-2.1% [-2.4, -1.8]``: :func:`change_text` without the verdict word (the TUI's
    watch table gives the word its own column)."""
    if c is None:
        return "—"
    pct = (1.0 / c.speedup - 1.0) * 100.0
    lo = (1.0 / c.ci_high - 1.0) * 100.0
    hi = (1.0 / c.ci_low - 1.0) * 100.0
    return f"{pct:+.1f}% [{lo:+.1f}, {hi:+.1f}]"
