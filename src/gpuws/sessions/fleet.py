"""A fleet's comparison: one workload on several pods, one line per pod, read from the store.

``gpuws run POD POD ... -w W`` records each pod as its own session and the fleet as a
list of (position, pod, session, run) in ``fleets``/``fleet_pods``
(:mod:`gpuws.sessions.store`). This module turns that record into the table every face
shows: the end of ``gpuws run``, ``gpuws export --fleet`` and the TUI's fleet screen.
The columns and the text of every cell are decided here (numbers through
:mod:`gpuws.text.humanfmt`), so the three faces read the same. A figure that was not
measured is ``None`` here and ``—`` in a cell; nothing is estimated in its place.

The ratio column compares each pod with the fleet's first pod (position 0, as typed
first) the way ``gpuws compare`` compares two runs: the first pod's median over this
pod's, with a 95% bootstrap CI, so above 1 means this pod is faster.
"""

from __future__ import annotations

import msgspec

from gpuws import protocol
from gpuws.errors import StoreError
from gpuws.gpu import clocks
from gpuws.sessions.compare import compare_runs, run_gpu
from gpuws.sessions.store import FleetPodRow, FleetRow, Store
from gpuws.text import humanfmt

#: Pod states that gave no result (the exit status of ``gpuws run`` says some failed).
FAILED_STATES = frozenset({"failed", "cancelled", "unreachable", "lost", "interrupted"})
#: The columns of the comparison, in order (``caution`` only when some line has one).
COLUMNS = ("pod", "status", "GPU", "driver", "Tier-1 median (95% CI)", "throughput",
           "% of peak", "vs first", "clocks", "wall", "caution")


class FleetLine(msgspec.Struct, frozen=True, kw_only=True):
    """One pod's figures (``None`` = not measured or not known).

    Attributes:
        position: the pod's place on the command line (0 is the reference).
        pod: the pod as typed.
        status: see :class:`gpuws.sessions.store.FleetPodRow`; a pod whose run finished
            is ``ok`` or ``failed`` as the run says.
        error: why the pod gave no result (one line, with its remedy).
        session_id: its session, once connected.
        run_id: its run, once started.
        hostname: the pod's own hostname (the pod's word).
        gpu: the GPU model the run used (the pinned GPU, else the pod's first).
        driver: the NVIDIA driver version.
        n: Tier-1 samples.
        median_ms: Tier-1 median time per call.
        ci_low_ms: low end of the median's 95% CI.
        ci_high_ms: high end of it.
        mode: Tier-1 timing mode (``cold``/``hot``).
        rate: GB/s or TFLOP/s at the median, whichever is nearer its peak.
        rate_unit: ``GB/s`` or ``TFLOP/s``.
        pct_peak: that rate in percent of the GPU's peak.
        speedup: first pod's median / this pod's median (above 1: faster than the first).
        speedup_low: low end of its 95% bootstrap CI.
        speedup_high: high end of it.
        cycle_ratio: the first pod's SM cycles per call over this pod's (median time ×
            median SM clock), when both clocks are known: the ratio with the clock
            difference taken out.
        clocks: the clocks behind the Tier-1 figure (:func:`gpuws.gpu.clocks.describe`).
        wall_s: the run's wall time on the pod.
        caution: why this line's figure may not compare (clocks, timing mode).
    """

    position: int
    pod: str
    status: str
    error: str = ""
    session_id: str | None = None
    run_id: str | None = None
    hostname: str | None = None
    gpu: str | None = None
    driver: str | None = None
    n: int | None = None
    median_ms: float | None = None
    ci_low_ms: float | None = None
    ci_high_ms: float | None = None
    mode: str | None = None
    rate: float | None = None
    rate_unit: str | None = None
    pct_peak: float | None = None
    speedup: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None
    cycle_ratio: float | None = None
    clocks: str | None = None
    wall_s: float | None = None
    caution: str = ""

    @property
    def failed(self) -> bool:
        """The pod gave no result (or its run failed)."""
        return self.status in FAILED_STATES


class FleetComparison(msgspec.Struct, frozen=True, kw_only=True):
    """A fleet and its lines, in the order the pods were given."""

    fleet: FleetRow
    lines: list[FleetLine]
    #: Why the ratio column is empty (the first pod has no Tier-1 samples), else "".
    ratio_missing: str = ""

    @property
    def failed(self) -> list[FleetLine]:
        """The lines of pods that gave no result."""
        return [line for line in self.lines if line.failed]


def fleet_comparison(store: Store, fleet_id: str) -> FleetComparison:
    """Read a fleet and compare its pods.

    Raises:
        StoreError: no fleet (or more than one) matches ``fleet_id``.
    """
    fleet = store.fleet(fleet_id)
    lines = [_line(store, pod) for pod in fleet.pods]
    reference = fleet.pods[0] if fleet.pods else None
    ref_samples = bool(reference and reference.run_id and store.samples(reference.run_id))
    ratio_missing = ""
    if reference is not None and not ref_samples:
        ratio_missing = (f"the first pod ({reference.pod}) has no Tier-1 samples, so no pod "
                         "is compared with it")
    elif reference is not None and reference.run_id is not None:
        lines = [_with_ratio(store, reference.run_id, line) for line in lines]
    return FleetComparison(fleet=fleet, lines=lines, ratio_missing=ratio_missing)


def _line(store: Store, pod: FleetPodRow) -> FleetLine:
    probe = store.session(pod.session_id).probe if pod.session_id else None
    if pod.run_id is None or not _stored(store, pod.run_id):
        models = {g.name for g in probe.gpus} if probe is not None else set()
        return FleetLine(position=pod.position, pod=pod.pod, status=pod.status,
                         error=pod.error, session_id=pod.session_id, run_id=pod.run_id,
                         hostname=probe.hostname if probe else None,
                         gpu=models.pop() if len(models) == 1 else None,
                         driver=probe.driver if probe else None)
    run = store.run(pod.run_id)
    if run.status in ("ok", "failed", "cancelled"):
        # A finished run says itself how it went (also when it was attached to after
        # the fleet gave up on its pod); a failed pull keeps the fleet's "failed".
        status = "failed" if pod.status == "failed" else run.status
    else:
        status = pod.status  # still running as far as the store knows: lost, interrupted…
    started = next((e for e in store.run_events(run.run_id, ["run_started"])
                    if isinstance(e, protocol.RunStarted)), None)
    t1 = store.tier1(run.run_id)
    rate, unit, pct = _throughput(t1)
    gpu = run_gpu(store, run.run_id)
    return FleetLine(
        position=pod.position, pod=pod.pod, status=status,
        error="" if status == "ok" else pod.error,
        session_id=pod.session_id, run_id=run.run_id,
        hostname=(started.hostname if started and started.hostname
                  else probe.hostname if probe else None),
        gpu=gpu.name or None, driver=gpu.driver or None,
        n=t1.stats.n if t1 else None, median_ms=t1.stats.median_ms if t1 else None,
        ci_low_ms=t1.stats.ci_low_ms if t1 else None,
        ci_high_ms=t1.stats.ci_high_ms if t1 else None, mode=t1.mode if t1 else None,
        rate=rate, rate_unit=unit, pct_peak=pct, wall_s=run.wall_s,
        clocks=clocks.describe(t1.clocks) if t1 else None,
        caution=(clocks.caution(t1.clocks) or "") if t1 else "")


def _stored(store: Store, run_id: str) -> bool:
    """Whether the run has a row (one whose pod never sent an event has none)."""
    try:
        return store.run(run_id).run_id == run_id
    except StoreError:
        return False


def _throughput(t1: protocol.Tier1Result | None) -> tuple[float | None, str | None,
                                                           float | None]:
    """GB/s or TFLOP/s at the median, whichever is nearer its peak (the bound one)."""
    if t1 is None:
        return None, None, None
    options: list[tuple[float, str, float | None]] = []
    if t1.gbps is not None:
        options.append((t1.gbps, "GB/s", t1.pct_peak_bw))
    if t1.tflops is not None:
        options.append((t1.tflops, "TFLOP/s", t1.pct_peak_flops))
    if not options:
        return None, None, None
    rate, unit, pct = max(options, key=lambda o: -1.0 if o[2] is None else o[2])
    return rate, unit, pct


def _with_ratio(store: Store, reference_run: str, line: FleetLine) -> FleetLine:
    if line.run_id is None or line.median_ms is None or not store.samples(line.run_id):
        return line
    if line.run_id == reference_run:
        return msgspec.structs.replace(line, speedup=1.0, speedup_low=1.0, speedup_high=1.0)
    cmp = compare_runs(store, reference_run, line.run_id)
    if cmp.tier1 is None:
        return line
    caution = "; ".join(c for c in (line.caution, cmp.tier1_caution) if c)
    return msgspec.structs.replace(line, speedup=cmp.tier1.speedup,
                                   speedup_low=cmp.tier1.ci_low,
                                   speedup_high=cmp.tier1.ci_high,
                                   cycle_ratio=cmp.cycle_ratio, caution=caution)


# ----------------------------------------------------------------------------- cells
def cells(line: FleetLine) -> dict[str, str]:
    """The text of each column of one line, as every face shows it (pod text made safe
    by the face: these are plain strings, some of them the pod's word)."""
    dash = humanfmt.DASH
    median = dash
    if line.median_ms is not None:
        median = humanfmt.ms(line.median_ms)
        if line.ci_low_ms is not None and line.ci_high_ms is not None and line.median_ms > 0:
            half = (line.ci_high_ms - line.ci_low_ms) / 2 / line.median_ms
            median += f" ±{humanfmt.share(half, 2)}"
        if line.mode:
            median += f" ({line.mode}, n={humanfmt.num(line.n)})"
    rate = dash if line.rate is None or line.rate_unit is None else (
        humanfmt.num(line.rate, line.rate_unit, 1 if line.rate_unit == "GB/s" else 2))
    if line.speedup is None:
        ratio = dash
    elif line.position == 0:
        ratio = "1 (reference)"
    else:
        ratio = (f"{humanfmt.ratio(line.speedup)} [{line.speedup_low or 0:.3f}, "
                 f"{line.speedup_high or 0:.3f}]")
        if line.cycle_ratio is not None:
            ratio += f"; cycles {humanfmt.ratio(line.cycle_ratio)}"
    status = line.status
    return {"pod": line.pod, "status": status, "GPU": line.gpu or dash,
            "driver": line.driver or dash, "Tier-1 median (95% CI)": median,
            "throughput": rate, "% of peak": humanfmt.pct(line.pct_peak),
            "vs first": ratio, "clocks": line.clocks or dash,
            "wall": humanfmt.duration(line.wall_s),
            "caution": line.caution or ""}


def columns(comparison: FleetComparison) -> list[str]:
    """The columns to show: ``caution`` only when a line has one, ``clocks`` only when a
    line has a Tier-1 figure (clocks are read while Tier 1 samples)."""
    hide = set()
    if not any(line.caution for line in comparison.lines):
        hide.add("caution")
    if all(line.clocks is None for line in comparison.lines):
        hide.add("clocks")
    return [c for c in COLUMNS if c not in hide]


def notes(comparison: FleetComparison) -> list[str]:
    """What the table needs said under it: what the ratio means, or why a column is
    empty everywhere."""
    out: list[str] = []
    first = comparison.fleet.pods[0].pod if comparison.fleet.pods else "the first pod"
    if comparison.ratio_missing:
        out.append(f"vs first: none — {comparison.ratio_missing}.")
    elif any(line.speedup is not None for line in comparison.lines[1:]):
        out.append(f"vs first: {first}'s median / this pod's (above 1 is faster), with its "
                   "95% bootstrap CI; cycles: the same ratio of median time × median SM "
                   "clock, where both clocks are known (the clock difference taken out).")
    if all(line.median_ms is None for line in comparison.lines):
        out.append("No pod has a Tier-1 median: Tier 1 times a Python workload's run() on a "
                   "GPU (a cmd: workload, or a pod without a GPU, has none); wall is the "
                   "whole run on the pod.")
    return out


def failure_lines(comparison: FleetComparison) -> list[str]:
    """One line per pod that gave no result: the pod, how it ended, cause and remedy."""
    return [f"{line.pod} {line.status}: {line.error or 'no reason recorded'}"
            for line in comparison.failed]
