"""What the run panes show, folded from a run's events (no Textual here).

A :class:`RunModel` takes the events of one run in ``seq`` order, live or replayed,
and keeps the snapshot the panes render: tier states, Tier-1 samples and their running
statistics, the kernel table, ncu progress, metrics, findings, diagnoses, artifacts.
A resent event (``seq`` already seen, as after a re-attach) changes nothing, so the
same events may arrive twice without showing twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import physical, protocol
from ..remote_agent.measure.stats import median_ci_ranks, percentile
from .boundary import SeqGate

#: Parts of the model an event can change; panes redraw only the parts that changed.
Part = str
#: What each tier is called before it names itself.
TIER_NAMES = {0: "workload", 1: "CUDA events", 2: "kernel timeline", 3: "Nsight Compute"}
PARTS: tuple[Part, ...] = ("header", "tiers", "samples", "tier1", "kernels", "ncu", "metrics",
                           "rules", "static", "diagnoses", "log", "artifacts", "finished",
                           "verdict")


@dataclass
class TierState:
    """One tier as the panes show it (``status`` is ``running`` until it finishes)."""

    tier: int
    name: str
    started: float
    status: str = "running"
    wall_s: float | None = None
    gpu_s: float | None = None
    source: str | None = None
    reason: str = ""
    argv: list[str] | None = None
    #: NVML GPM over the tier's window (Tier 1, a ``cmd:``'s run), when sampled.
    gpm: protocol.GpmMetrics | None = None
    #: Tier 3's estimate, said before ncu starts.
    estimate: protocol.Tier3Estimate | None = None


@dataclass(frozen=True)
class RunningStats:
    """Statistics of the samples so far (the final ones come in ``Tier1Result``)."""

    n: int
    median_ms: float
    ci_low_ms: float
    ci_high_ms: float
    min_ms: float
    max_ms: float
    p5_ms: float
    p95_ms: float

    @property
    def ci_rel_halfwidth(self) -> float:
        """Half the CI's width relative to the median (``inf`` for a zero median)."""
        if self.median_ms <= 0:
            return math.inf
        return (self.ci_high_ms - self.ci_low_ms) / 2.0 / self.median_ms


@dataclass
class LogLine:
    """One line for the log pane."""

    stream: str
    text: str
    tier: int | None


#: Longest line shown once the pieces of a line the pod cut (``Output.cont``) are joined,
#: in characters; the rest of such a line is counted, not kept, so a workload that prints
#: forever without a newline cannot grow the laptop's memory.
MAX_JOINED_CHARS = 1 << 20


@dataclass
class _OpenLine:
    """A line whose pieces are still arriving."""

    tier: int | None
    parts: list[str] = field(default_factory=list)
    kept: int = 0
    dropped: int = 0


class LineJoiner:
    """Joins the pieces of lines the pod cut (``Output.cont``) back into whole lines.

    The pod cuts a line longer than 16 KiB into several ``output`` events; every piece
    but the last says ``cont``. The store keeps the events as they came; whoever shows
    them (the run panes, ``gpuws run``'s printer) shows one line. Pieces join per stream
    (the pod cuts stdout and stderr apart). At most ``limit`` characters of a line are
    kept; the line ends with how many more there were.
    """

    def __init__(self, limit: int = MAX_JOINED_CHARS) -> None:
        self.limit = limit
        self._open: dict[str, _OpenLine] = {}

    def feed(self, ev: protocol.Output) -> LogLine | None:
        """The line ``ev`` completes, or None while its line goes on."""
        line = self._open.get(ev.stream)
        if line is None:
            if not ev.cont:
                return LogLine(ev.stream, ev.text, ev.tier)
            line = self._open[ev.stream] = _OpenLine(ev.tier)
        part = ev.text[:max(0, self.limit - line.kept)]
        if part:
            line.parts.append(part)
            line.kept += len(part)
        line.dropped += len(ev.text) - len(part)
        if ev.cont:
            return None
        del self._open[ev.stream]
        return _joined(ev.stream, line)

    def flush(self) -> list[LogLine]:
        """Lines whose end never came (the run ended, or the pod stopped sending)."""
        lines = [_joined(stream, line) for stream, line in self._open.items()]
        self._open.clear()
        return lines

    @property
    def pending(self) -> int:
        """Characters held for lines not yet ended (at most ``limit`` per stream)."""
        return sum(line.kept for line in self._open.values())


def _joined(stream: str, line: _OpenLine) -> LogLine:
    text = "".join(line.parts)
    if line.dropped:
        text += f"… ({line.dropped:,} more characters of this line not shown)"
    return LogLine(stream, text, line.tier)


@dataclass
class RunModel:
    """The live snapshot of one run."""

    run_id: str
    spec: protocol.RunSpec | None = None
    hostname: str = ""
    started: float | None = None
    #: The GPU the run was pinned to (``RunStarted.gpu``), None where not said.
    gpu: protocol.GpuTarget | None = None
    last_ts: float | None = None
    #: Which events were folded in already (each once, however often it arrives).
    seqs: SeqGate = field(default_factory=SeqGate)
    tiers: dict[int, TierState] = field(default_factory=dict)
    samples: list[float] = field(default_factory=list)
    _sorted: list[float] = field(default_factory=list)
    _unsorted: list[float] = field(default_factory=list)
    #: CUPTI-timed samples arrived and replaced the event samples (``Samples.source``).
    _device_samples: bool = False
    tier1: protocol.Tier1Result | None = None
    kernel_table: protocol.KernelTable | None = None
    ncu: dict[str, protocol.NcuProgress] = field(default_factory=dict)
    metrics: list[protocol.KernelMetrics] = field(default_factory=list)
    rules: list[protocol.Rule] = field(default_factory=list)
    static: list[protocol.StaticAnalysis] = field(default_factory=list)
    diagnoses: list[protocol.Diagnosis] = field(default_factory=list)
    artifacts: list[protocol.Artifact] = field(default_factory=list)
    finished: protocol.RunFinished | None = None
    #: The verdicts as the pod stated them (:mod:`.verdicts` derives today's from the rest).
    program_verdict: protocol.ProgramVerdict | None = None
    kernel_verdicts: list[protocol.KernelVerdict] = field(default_factory=list)
    coverage: protocol.Tier3Coverage | None = None
    event_count: int = 0
    #: Stored samples that are no time a call takes (1e308 ms, negative, NaN), left out of
    #: every figure: an older gpuws stored them before the boundary refused them.
    samples_dropped: int = 0
    #: Joins the pieces of long output lines for the log pane.
    joiner: LineJoiner = field(default_factory=LineJoiner)
    #: The session's $/hour where the face knows it (not an event: the laptop's own),
    #: for Tier 3's estimate in dollars.
    rate_usd_per_hour: float | None = None

    @property
    def last_seq(self) -> int:
        """The highest ``seq`` folded in so far (-1 before any)."""
        return self.seqs.last

    def apply(self, events: list[protocol.Events]) -> tuple[set[Part], list[LogLine]]:
        """Fold events into the snapshot.

        Returns:
            The parts that changed, and the log lines the events carried (in order).
        """
        changed: set[Part] = set()
        lines: list[LogLine] = []
        for ev in events:
            if ev.run_id != self.run_id or ev.seq is None or not self.seqs.admit(ev):
                continue
            self.last_ts = ev.ts
            self.event_count += 1
            changed.add(self._fold(ev, lines))
        if lines:
            changed.add("log")
        return changed, lines

    def _fold(self, ev: protocol.Events, lines: list[LogLine]) -> Part:
        # One branch per event type; the returned part tells the panes what to redraw.
        if isinstance(ev, protocol.Samples):
            if ev.source is not None and not self._device_samples:
                # The reported figure's samples (CUPTI) replace the CUDA-event ones.
                self._device_samples = True
                self.samples.clear()
                self._unsorted.clear()
                self._sorted.clear()
            values = physical.keep(ev.values_ms, "ms")
            self.samples_dropped += len(ev.values_ms) - len(values)
            self.samples.extend(values)
            self._unsorted.extend(values)  # sorted in when a pane next asks
            return "samples"
        if isinstance(ev, protocol.Output):
            line = self.joiner.feed(ev)
            if line is not None:
                lines.append(line)
            return "log"
        if isinstance(ev, protocol.RunFinished):
            lines.extend(self.joiner.flush())  # a cut line the run never ended
        if isinstance(ev, protocol.Log):
            if ev.level != "debug":
                lines.append(LogLine(ev.level, ev.message, None))
            return "log"
        if isinstance(ev, protocol.NcuProgress):
            self.ncu[ev.kernel] = ev
            return "ncu"
        if isinstance(ev, protocol.TierStarted):
            old = self.tiers.get(ev.tier)
            # Tier 3 announces itself, then again with the selected ncu and its argv.
            started = old.started if old is not None and old.status == "running" else ev.ts
            estimate = ev.estimate or (old.estimate if old is not None else None)
            self.tiers[ev.tier] = TierState(ev.tier, ev.name, started, argv=ev.argv,
                                            estimate=estimate)
            return "tiers"
        if isinstance(ev, protocol.TierFinished):
            state = self.tiers.get(ev.tier) or TierState(
                ev.tier, TIER_NAMES.get(ev.tier, f"tier {ev.tier}"), ev.ts - ev.wall_s)
            state.status, state.wall_s, state.gpu_s = ev.status, ev.wall_s, ev.gpu_s
            state.source, state.reason = ev.source, ev.reason
            state.gpm = ev.gpm
            self.tiers[ev.tier] = state
            return "tiers"
        return self._fold_result(ev)

    def _fold_result(self, ev: protocol.Events) -> Part:
        if isinstance(ev, protocol.RunStarted):
            self.spec, self.hostname, self.started = ev.spec, ev.hostname, ev.ts
            self.gpu = ev.gpu
            return "header"
        if isinstance(ev, protocol.Tier1Result):
            self.tier1 = ev
            return "tier1"
        if isinstance(ev, protocol.KernelTable):
            self.kernel_table = ev
            return "kernels"
        if isinstance(ev, protocol.KernelMetrics):
            # One column per profiled launch, as the store keys them: a launch measured
            # again replaces its figures.
            self.metrics = [m for m in self.metrics
                            if (m.kernel, m.launch) != (ev.kernel, ev.launch)] + [ev]
            return "metrics"
        if isinstance(ev, protocol.RuleFindings):
            # The latest findings for a kernel replace the ones before them.
            kernels = {r.kernel for r in ev.rules}
            self.rules = [r for r in self.rules if r.kernel not in kernels] + list(ev.rules)
            return "rules"
        if isinstance(ev, protocol.StaticAnalysis):
            self.static = [s for s in self.static if s.kernel != ev.kernel] + [ev]
            return "static"
        if isinstance(ev, protocol.Diagnosis):
            self.diagnoses.append(ev)
            return "diagnoses"
        if isinstance(ev, protocol.ProgramVerdict):
            self.program_verdict = ev
            return "verdict"
        if isinstance(ev, protocol.KernelVerdict):
            self.kernel_verdicts = [k for k in self.kernel_verdicts
                                    if k.kernel != ev.kernel] + [ev]
            return "verdict"
        if isinstance(ev, protocol.Tier3Coverage):
            self.coverage = ev
            return "verdict"
        if isinstance(ev, protocol.Artifact):
            self.artifacts = [a for a in self.artifacts if a.name != ev.name] + [ev]
            return "artifacts"
        if isinstance(ev, protocol.RunFinished):
            self.finished = ev
            for state in self.tiers.values():
                if state.status == "running":  # cut short: no TierFinished will come
                    state.status = ev.status
            return "finished"
        return "header"

    # ------------------------------------------------------------------ derived views
    @property
    def workload(self) -> str:
        """The workload string, or ``""`` before ``RunStarted``."""
        return self.spec.workload if self.spec is not None else ""

    @property
    def status(self) -> str:
        """``running`` until the run finishes, then its final status."""
        return self.finished.status if self.finished is not None else "running"

    @property
    def sorted_samples(self) -> list[float]:
        """Every sample so far, ascending.

        New samples are merged in only when asked for, so a flood of sample batches
        costs one merge per repaint, not one insertion per sample (timsort merges the
        two sorted runs in linear time).
        """
        if self._unsorted:
            self._unsorted.sort()
            self._sorted.extend(self._unsorted)
            self._sorted.sort()  # two sorted runs: timsort merges them in one pass
            self._unsorted = []
        return self._sorted

    def running_stats(self) -> RunningStats | None:
        """Median, its 95% CI (binomial order statistics, as Tier 1 computes it), p5/p95."""
        values = self.sorted_samples
        n = len(values)
        if n == 0:
            return None
        mid = n // 2
        median = values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2.0
        low, high = median_ci_ranks(n)
        return RunningStats(n=n, median_ms=median, ci_low_ms=values[low - 1],
                            ci_high_ms=values[high - 1], min_ms=values[0], max_ms=values[-1],
                            p5_ms=percentile(values, 5.0), p95_ms=percentile(values, 95.0))

    def elapsed(self, now: float | None = None) -> float:
        """Seconds from the run's start to ``now`` (default: its last event or its end)."""
        if self.started is None:
            return 0.0
        if self.finished is not None:
            return self.finished.wall_s
        end = now if now is not None else (self.last_ts or self.started)
        return max(0.0, end - self.started)
