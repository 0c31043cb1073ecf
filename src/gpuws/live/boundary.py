"""The trust boundary: everything that arrives from a pod is checked here, once.

A pod is somebody else's machine running somebody else's benchmark, and a workload can
append lines to its own run's ``events.ndjson``, which the agent forwards as they are.
So nothing from the wire is stored, written to disk or shown before :class:`Boundary`
has looked at it:

- a run event must belong to a run the laptop asked for on this connection (started
  with a laptop-chosen id, or attached by name);
- ``seq`` is an integer in ``[0, MAX_SEQ]`` near the run's sequence; a far jump ahead is
  refused (a forged ``seq`` of 2**63 would otherwise poison every later batch), a repeat
  is passed on for the store to deduplicate (or report, if its body differs);
- ``ts`` is finite and near the run's time;
- strings, lists, maps and nesting are bounded, integers fit SQLite, floats are finite;
- every number is physical (:mod:`gpuws.physical`): no kernel time of 1e308 s, no
  negative duration, no share of 5,000 %, no absurd GB/s;
- an artifact's name is a plain relative path inside the run's artifact directory, its
  remote path is exactly that file in the run's directory, its size and sha256 are sane.

A refused event that sits in the run's sequence is replaced by a ``log`` event saying what
was refused, so the stored sequence stays gap-free (a gap would make every re-attach
replay from it) and the person sees the refusal where it happened. Undecodable lines are
counted with a few samples kept: memory stays flat whatever the pod sends.
"""

from __future__ import annotations

import math
import posixpath
import re
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from .. import physical, protocol
from ..errors import ProtocolError
from ..text.textsafe import visible
from .telemetry import MAX_GPU_INDEX, MAX_GPUS

#: Highest ``seq`` accepted: two billion events is far past any real run, and far below
#: what SQLite's INTEGER holds.
MAX_SEQ = 2**31 - 1
#: How far ahead of the next expected ``seq`` an event may jump.
SEQ_WINDOW = 10_000
#: Largest integer anywhere in an event (exact in a float; fits SQLite's INTEGER).
MAX_INT = 2**53
#: Longest string in an event (an output chunk is 16 KiB; a demangled kernel name a few).
MAX_STR = 256 * 1024
#: Longest list in an event (Tier-1 sample batches hold a few thousand values).
MAX_LIST = 1_000_000
#: Most keys in one map (ncu metrics of one kernel: a few hundred).
MAX_KEYS = 100_000
#: Deepest nesting (``details`` maps are free-form).
MAX_DEPTH = 16
#: How far a timestamp may lie ahead of the laptop's clock (clock skew), or before the
#: run's start, before it is refused.
TS_SLACK_S = 86_400.0
#: Nothing gpuws records happened before 2001.
TS_MIN = 1e9
#: Largest artifact announced without refusal (the pull has its own, configurable, ceiling).
MAX_ARTIFACT_BYTES = 1 << 50
#: Bad lines whose preview is kept.
BAD_SAMPLES = 5

#: In the body of the ``log`` event stored in place of a refused one: the store
#: (sessions/store.py) lets a later event with the same seq replace it. Defined here, not
#: in the store, so that checking an answer (every `gpuws sync`) loads no SQLite.
REFUSAL_MARK = b"gpuws refused an event from the pod"
#: How a stand-in for a refused event begins (the store lets a later event replace it).
REFUSAL_PREFIX = REFUSAL_MARK.decode() + ": "

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: What a run id looks like (the agent's own rule, remote_agent/runs.py RUN_ID_RE).
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_RUN_ID = RUN_ID_PATTERN


class Refused(Exception):
    """Why one event was refused (a sentence for people)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass
class RefusalCount:
    """How often one kind of refusal happened, and the first example.

    Attributes:
        kind: a short name (``run_id``, ``seq``, ``ts``, ``bounds``, ``artifact``,
            ``bad_line``).
        count: how many events were refused for it on this connection.
        first: the first refusal's message.
    """

    kind: str
    count: int = 0
    first: str = ""


@dataclass
class _Run:
    next_seq: int
    started: float | None = None
    run_dir: str | None = None


#: Called with (kind, message, count) the 1st, 10th, 100th… time a kind is refused.
OnRefusal = Callable[[str, str, int], None]


@dataclass
class Boundary:
    """The checks for one connection.

    Args:
        on_refusal: told about refusals (the first of each kind, then at each power of
            ten), so a flood is one line and a count, not a flood of lines.
        now: the laptop's wall clock.
    """

    on_refusal: OnRefusal | None = None
    now: Callable[[], float] = time.time
    refusals: dict[str, RefusalCount] = field(default_factory=dict)
    bad_samples: deque[protocol.BadLine] = field(
        default_factory=lambda: deque(maxlen=BAD_SAMPLES))
    _runs: dict[str, _Run] = field(default_factory=dict)

    # ------------------------------------------------------------------ expectations
    def expect(self, run_id: str, from_seq: int = 0, *, started: float | None = None,
               run_dir: str | None = None) -> None:
        """Accept ``run_id``'s events from ``from_seq`` on (the laptop asked for them).

        ``started`` and ``run_dir`` come from the run's stored ``run_started`` when the
        laptop attaches after it; otherwise the run's own ``run_started`` sets them.
        """
        if not _RUN_ID.match(run_id):
            raise ValueError(f"not a run id: {run_id!r}")
        run = self._runs.get(run_id)
        if run is None:
            self._runs[run_id] = _Run(from_seq, started, run_dir)
        else:
            run.next_seq = min(run.next_seq, from_seq)
            run.started = run.started or started
            run.run_dir = run.run_dir or run_dir

    def expects(self, run_id: str) -> bool:
        """Whether this connection accepts events of ``run_id``."""
        return run_id in self._runs

    def refused_total(self) -> int:
        """Events and lines refused on this connection."""
        return sum(r.count for r in self.refusals.values())

    # ------------------------------------------------------------------ checks
    def check(self, ev: protocol.Events | protocol.BadLine) -> protocol.Events | None:
        """The event to pass on (``ev`` itself, a probe with its GPU list cut to
        :data:`MAX_GPUS`, or a ``log`` standing in for a refused run event), or None."""
        if isinstance(ev, protocol.BadLine):
            self.bad_samples.append(ev)
            self._refuse("bad_line", f"a line from the pod is not a protocol event "
                                     f"({visible(ev.reason, 200)}): {visible(ev.preview, 80)}")
            return None
        if ev.run_id is None:
            if isinstance(ev, protocol.ProbeResult):  # a probe not asked for: the same cut
                ev = msgspec.structs.replace(ev, probe=_cut_gpus(ev.probe))
            try:
                _check_ts(ev.ts, None, self.now())
                _check_bounds(ev)
                # The specific checks first: their words name what was wrong.
                if isinstance(ev, protocol.Telemetry):
                    _check_telemetry(ev)
                check_gpm_and_estimate(ev)
                _check_physical(ev)
            except Refused as why:
                self._refuse(why.kind, f"{type(ev).__name__}: {why.message}")
                return None
            return ev
        return self._check_run_event(ev)

    def _check_run_event(self, ev: protocol.Events) -> protocol.Events | None:
        run_id = ev.run_id
        assert run_id is not None
        run = self._runs.get(run_id)
        if run is None:
            self._refuse("run_id", f"an event for run {visible(run_id, 80)!s}, which this "
                                   "connection did not start or attach")
            return None
        seq = ev.seq
        if seq is None or seq < 0 or seq > MAX_SEQ:
            self._refuse("seq", f"run {run_id}: an event with seq {visible(seq, 40)} "
                                f"(expected 0…{MAX_SEQ})")
            return None
        if seq > run.next_seq + SEQ_WINDOW:
            self._refuse("seq", f"run {run_id}: seq jumps from {run.next_seq} to {seq}")
            return None
        # A small jump is let through: an undecodable line (counted above) may have held
        # the seq in between. What matters downstream holds either way: the store resumes
        # from its gap-free prefix and keeps the first copy of any seq.
        in_sequence = seq >= run.next_seq
        if in_sequence:
            run.next_seq = seq + 1
        try:
            _check_ts(ev.ts, run.started, self.now())
            _check_bounds(ev)
            check_gpm_and_estimate(ev)  # first: its words name what was wrong
            _check_physical(ev)
            if isinstance(ev, protocol.RunStarted) and seq == 0:
                run.started = run.started or ev.ts
                run.run_dir = run.run_dir or ev.run_dir
            elif isinstance(ev, protocol.Artifact):
                _check_artifact(ev, run.run_dir)
            elif isinstance(ev, VERDICTS):
                check_verdict(ev)
            elif isinstance(ev, protocol.Tier1Result):
                check_tier1(ev)
            elif isinstance(ev, protocol.KernelTable):
                check_kernel_table(ev)
        except Refused as why:
            message = f"run {run_id} seq {seq}: {type(ev).__name__} refused: {why.message}"
            self._refuse(why.kind, message)
            if not in_sequence:
                return None
            # Keep the stored sequence gap-free, and the refusal visible where it happened.
            return protocol.Log(run_id=run_id, seq=seq, ts=self.now(), level="warning",
                                message=REFUSAL_PREFIX + why.message[:2000])
        return ev

    def _refuse(self, kind: str, message: str) -> None:
        entry = self.refusals.get(kind)
        if entry is None:
            entry = self.refusals[kind] = RefusalCount(kind, 0, message)
        entry.count += 1
        n = entry.count
        if self.on_refusal is not None and _is_power_of_ten_or_one(n):
            self.on_refusal(kind, message, n)


def _is_power_of_ten_or_one(n: int) -> bool:
    while n % 10 == 0:
        n //= 10
    return n == 1


# ---------------------------------------------------------------------- field checks
def _check_ts(ts: float | None, started: float | None, now: float) -> None:
    if ts is None:
        return
    if not math.isfinite(ts) or ts < TS_MIN or ts > now + TS_SLACK_S:
        raise Refused("ts", f"timestamp {ts!r} is not a time near now")
    if started is not None and ts < started - TS_SLACK_S:
        raise Refused("ts", f"timestamp {ts!r} lies a day or more before the run started")


def _check_bounds(ev: protocol.Events) -> None:
    _walk(ev, 0)


def _walk(value: Any, depth: int) -> None:
    """Raise Refused if anything in ``value`` is out of bounds (see the module docstring)."""
    if depth > MAX_DEPTH:
        raise Refused("bounds", f"nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, str):
        if len(value) > MAX_STR:
            raise Refused("bounds", f"a string of {len(value)} characters (limit {MAX_STR})")
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if not -MAX_INT <= value <= MAX_INT:
            raise Refused("bounds", f"the integer {value} is out of range")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise Refused("bounds", f"the number {value!r} is not finite")
    elif isinstance(value, list):
        if len(value) > MAX_LIST:
            raise Refused("bounds", f"a list of {len(value)} items (limit {MAX_LIST})")
        if value and set(map(type, value)) == {float} and math.isfinite(sum(value)):
            # The common case (Tier-1 samples): all floats, and a finite sum proves none is
            # NaN or infinite; both checks run in C. (A sum that overflows to inf from
            # finite values falls through to the walk below.)
            return
        for item in value:
            _walk(item, depth + 1)
    elif isinstance(value, dict):
        if len(value) > MAX_KEYS:
            raise Refused("bounds", f"a map of {len(value)} keys (limit {MAX_KEYS})")
        for key, item in value.items():
            _walk(key, depth + 1)
            _walk(item, depth + 1)
    elif isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            _walk(getattr(value, name), depth + 1)


def _check_physical(ev: protocol.Events) -> None:
    """Refuse a number no GPU, clock or run produces (the bounds: :mod:`gpuws.physical`).

    Separate from :func:`_walk`'s size bounds: those keep memory flat, these keep every
    later view's arithmetic finite (a stored 1e308 once crashed the histogram each time the
    run was opened).
    """
    why = physical.problem(ev)
    if why is not None:
        raise Refused("value", why)


def _check_telemetry(ev: protocol.Telemetry) -> None:
    # The laptop keeps a history per GPU index: ever-new indexes were ever-new histories.
    if len(ev.gpus) > MAX_GPUS:
        raise Refused("telemetry", f"a telemetry sample of {len(ev.gpus)} GPUs "
                                   f"(limit {MAX_GPUS})")
    for gpu in ev.gpus:
        if not 0 <= gpu.index <= MAX_GPU_INDEX:
            raise Refused("telemetry", f"a telemetry sample for GPU index {gpu.index} "
                                       f"(expected 0…{MAX_GPU_INDEX})")


#: Longest one-line text in GPM figures and Tier-3 estimates (reasons, bases, plans).
MAX_EVIDENCE_STR = 500
#: Longest GPM window (a week of a ``cmd:`` workload) and Tier-3 estimate accepted.
MAX_WINDOW_S = 7 * 86_400.0
#: Most replay passes and launches an estimate may name (``--set full`` takes 38 passes).
MAX_PASSES = 10_000
MAX_LAUNCHES = 1_000_000
#: Most cheaper plans an estimate may list.
MAX_PLANS = 16
#: GPM's percentage fields (``protocol.GpmMetrics``), each 0-100 by nvml.h.
GPM_PCT_FIELDS = ("sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "hmma_active_pct",
                  "dram_bw_pct", "fp64_pct", "fp32_pct", "fp16_pct", "timed_share_pct")


def check_gpm_and_estimate(ev: protocol.Events) -> None:
    """The bounds of NVML GPM figures, GPM probe answers and Tier-3 estimates.

    The general walk only proves numbers finite and strings under 256 KiB; these figures
    are read as evidence (a verdict may rest on "DRAM bandwidth 89%") and as a budget, so
    a lying pod must not put 10,000% or a negative time in front of a person: every
    percentage is 0-100, every time is 0 to a week, counts are bounded, and each reason,
    basis and plan is one line of at most :data:`MAX_EVIDENCE_STR` characters.

    Raises:
        Refused: one of them is out of bounds (kind ``bounds``).
    """
    if isinstance(ev, protocol.TierFinished) and ev.gpm is not None:
        _check_gpm(ev.gpm)
    elif isinstance(ev, protocol.TierStarted) and ev.estimate is not None:
        _check_estimate(ev.estimate)
    elif isinstance(ev, protocol.ProbeResult):
        for gpu in ev.probe.gpus:
            _line(gpu.gpm_reason, "a GPU's GPM reason")


def _check_gpm(gpm: protocol.GpmMetrics) -> None:
    for name in GPM_PCT_FIELDS:
        value = getattr(gpm, name)
        if value is not None and not 0.0 <= value <= 100.0:
            raise Refused("bounds", f"NVML GPM {name} {value!r} is not a percentage 0-100")
    _seconds(gpm.window_s, "NVML GPM window")
    _line(gpm.reason, "NVML GPM reason")
    _line(gpm.source, "NVML GPM source")


def _check_estimate(est: protocol.Tier3Estimate) -> None:
    for label, value in (("estimate", est.seconds), ("kernel time", est.kernel_s),
                         ("pass overhead", est.pass_overhead_s), ("start", est.start_s),
                         ("report reading", est.read_s), ("budget", est.budget_s)):
        _seconds(value, f"Tier-3 {label}")
    if not 0 <= est.passes <= MAX_PASSES:
        raise Refused("bounds", f"Tier-3 estimate: {est.passes} passes (0…{MAX_PASSES})")
    if not 0 <= est.launches <= MAX_LAUNCHES:
        raise Refused("bounds", f"Tier-3 estimate: {est.launches} launches "
                                f"(0…{MAX_LAUNCHES})")
    if len(est.cheaper) > MAX_PLANS:
        raise Refused("bounds", f"Tier-3 estimate: {len(est.cheaper)} cheaper plans "
                                f"(limit {MAX_PLANS})")
    for text in (est.passes_basis, est.launches_basis, est.kernel_basis, est.start_basis,
                 *est.cheaper):
        _line(text, "Tier-3 estimate text")


def check_tier1(ev: protocol.Tier1Result) -> None:
    """The words a Tier-1 result shows beside its figure: each one line, bounded.

    ``timing_source`` and ``caution`` sit next to the median in the run pane, the CLI and
    the export; a pod must not fill that line with a page or break it across lines.

    Raises:
        Refused: one of them is not one line of at most :data:`MAX_EVIDENCE_STR`
            characters (kind ``bounds``).
    """
    if ev.timing_source is not None:
        _line(ev.timing_source, "Tier-1 timing source")
    if ev.caution is not None:
        _line(ev.caution, "Tier-1 caution")


def _seconds(value: float | None, what: str) -> None:
    if value is not None and not 0.0 <= value <= MAX_WINDOW_S:
        raise Refused("bounds", f"{what} of {value!r} s is not a time 0…{MAX_WINDOW_S:g} s")


def _line(text: str, what: str) -> None:
    if len(text) > MAX_EVIDENCE_STR or "\n" in text or "\r" in text:
        raise Refused("bounds", f"{what} is not one line of at most {MAX_EVIDENCE_STR} "
                                "characters")


def _check_artifact(ev: protocol.Artifact, run_dir: str | None) -> None:
    # The same rule the pull applies before writing (one rule for names on the laptop);
    # imported here, as only a run's events carry artifacts (see REFUSAL_MARK).
    from ..sessions.artifacts import name_problem

    why = name_problem(ev.name)
    if why is not None:
        raise Refused("artifact", f"artifact name {visible(ev.name, 120)!s}: {why}")
    if not 0 <= ev.size <= MAX_ARTIFACT_BYTES:
        raise Refused("artifact", f"artifact {ev.name}: size {ev.size} is not sane")
    if not _SHA256.match(ev.sha256):
        raise Refused("artifact", f"artifact {ev.name}: {visible(ev.sha256, 80)!s} is not "
                                  "a sha256")
    if run_dir is None:
        raise Refused("artifact", f"artifact {ev.name} arrived before its run's start, so "
                                  "its place on the pod cannot be checked")
    expected = posixpath.join(run_dir, "artifacts", ev.name)
    if ev.path != expected:
        raise Refused("artifact", f"artifact {ev.name}: its pod path "
                                  f"{visible(ev.path, 200)!s} is not {expected}")


#: Verdict events and their bounds: a verdict is a few sentences about a handful of kernels;
#: anything far larger is not one (the generic bounds above would let 256 KiB strings and
#: a million findings through to every pane and export).
VERDICTS = (protocol.ProgramVerdict, protocol.KernelVerdict, protocol.Tier3Coverage)
MAX_VERDICT_TEXT = 4000
MAX_VERDICT_ITEMS = 64
#: A kernel's full demangled name may run to a few thousand characters (CUTLASS).
MAX_VERDICT_NAME = 16 * 1024


def check_verdict(ev: protocol.ProgramVerdict | protocol.KernelVerdict
                  | protocol.Tier3Coverage) -> None:
    """Raise Refused when a verdict event is larger than any real verdict."""
    names: list[str | None] = []
    texts: list[str] = []
    lists: list[Sequence[object]] = []
    if isinstance(ev, protocol.ProgramVerdict):
        texts += [ev.source, ev.bound, ev.summary, ev.tier3_advice, ev.window, ev.left_out]
        names.append(ev.top_kernel)
        lists += [ev.families, ev.findings, ev.evidence]
        for f in ev.findings:
            texts += [f.code, f.title, f.detail, *f.remedies]
            names.append(f.kernel)
            lists += [f.remedies, f.evidence]
            texts += [x for e in f.evidence for x in (e.name, e.unit, e.source)]
        texts += [fam.family for fam in ev.families]
        texts += [x for e in ev.evidence for x in (e.name, e.unit, e.source)]
    elif isinstance(ev, protocol.KernelVerdict):
        names.append(ev.kernel)
        texts += [ev.short_name, ev.bound, ev.sentence, *ev.sources]
        lists += [ev.sources, ev.evidence, ev.rules]
        texts += [x for e in ev.evidence for x in (e.name, e.unit, e.source)]
        texts += [x for r in ev.rules for x in (r.rule, r.kind, r.message, r.evidence,
                                                r.speedup_type or "")]
    else:
        texts.append(ev.regex or "")
        lists += [ev.profiled, ev.missed, ev.others]
        names += [r.name for r in (*ev.profiled, *ev.missed)] + list(ev.others)
        texts += [x for r in (*ev.profiled, *ev.missed) for x in (r.short_name, r.why)]
    for items in lists:
        if len(items) > MAX_VERDICT_ITEMS:
            raise Refused("bounds", f"{type(ev).__name__} with a list of {len(items)} items "
                                    f"(limit {MAX_VERDICT_ITEMS})")
    for t in texts:
        if len(t) > MAX_VERDICT_TEXT:
            raise Refused("bounds", f"{type(ev).__name__} with a text of {len(t)} characters "
                                    f"(limit {MAX_VERDICT_TEXT})")
    for n in names:
        if n is not None and len(n) > MAX_VERDICT_NAME:
            raise Refused("bounds", f"{type(ev).__name__} with a kernel name of {len(n)} "
                                    f"characters (limit {MAX_VERDICT_NAME})")


#: A kernel table's steady window, host time and ranks: a code location is a file name,
#: a line and a function; a window leaves out a few phases; the host's sites are its top
#: few; a rank's own table its top rows. Anything far larger is not a profile's.
MAX_CODE = 500
MAX_TABLE_TEXT = 2000
MAX_SITES = 16
MAX_PHASES = 16
MAX_RANKS = 4096
MAX_RANK_ROWS = 1000
#: A grid or block as the agent writes it: three positive counts (CUDA's largest, 2^31-1).
LAUNCH_DIMS = re.compile(r"\A\([1-9]\d{0,9}, [1-9]\d{0,9}, [1-9]\d{0,9}\)\Z")


def check_kernel_table(ev: protocol.KernelTable) -> None:
    """Raise Refused when a kernel table's window, host time, communication or ranks are
    larger or stranger than any profile's (a code string of 100 KiB, a window whose last
    step precedes its first, a million ranks)."""
    rows = list(ev.kernels)
    parts: list[tuple[protocol.SteadyWindow | None, protocol.HostTime | None,
                      protocol.CommShare | None]] = [(ev.window, ev.host, ev.comm)]
    ranks = ev.ranks or []
    if len(ranks) > MAX_RANKS:
        raise Refused("bounds", f"a kernel table of {len(ranks)} ranks (limit {MAX_RANKS})")
    for r in ranks:
        if len(r.kernels) > MAX_RANK_ROWS:
            raise Refused("bounds", f"rank {r.rank} with {len(r.kernels)} kernel rows "
                                    f"(limit {MAX_RANK_ROWS})")
        rows += r.kernels
        parts.append((r.window, r.host, r.comm))
    for row in rows:
        if row.code is not None and len(row.code) > MAX_CODE:
            raise Refused("bounds", f"a kernel's code location of {len(row.code)} "
                                    f"characters (limit {MAX_CODE})")
        for dims in (row.grid, row.block):
            if dims is not None and LAUNCH_DIMS.match(dims) is None:
                raise Refused("value", f"a kernel's launch dimensions {dims[:40]!r}")
    for window, host, comm in parts:
        texts: list[str] = []
        if window is not None:
            if window.first_step > window.last_step or window.steps > window.last_step:
                raise Refused("value", f"a window of steps {window.first_step}-"
                                       f"{window.last_step} holding {window.steps}")
            if len(window.left_out) > MAX_PHASES:
                raise Refused("bounds", f"a window leaving out {len(window.left_out)} "
                                        f"phases (limit {MAX_PHASES})")
            texts += [window.label, window.basis]
            texts += [x for p in window.left_out for x in (p.phase, p.what)]
        if host is not None:
            sites = (*host.launch_sites, *host.sync_sites, *host.python_sites)
            for group in (host.launch_sites, host.sync_sites, host.python_sites):
                if len(group) > MAX_SITES:
                    raise Refused("bounds", f"host time with {len(group)} sites "
                                            f"(limit {MAX_SITES})")
            if host.loop is not None and len(host.loop) > MAX_CODE:
                raise Refused("bounds", f"a loop's code location of {len(host.loop)} "
                                        f"characters (limit {MAX_CODE})")
            for site in sites:
                if len(site.code) > MAX_CODE:
                    raise Refused("bounds", f"a host site's code location of "
                                            f"{len(site.code)} characters (limit {MAX_CODE})")
        if comm is not None:
            texts.append(comm.where)
        for t in texts:
            if len(t) > MAX_TABLE_TEXT:
                raise Refused("bounds", f"a kernel table text of {len(t)} characters "
                                        f"(limit {MAX_TABLE_TEXT})")


#: The answers a command may check (constrained, so each keeps its own type).
AnswerT = TypeVar("AnswerT", protocol.NsysPlan, protocol.NcuPlan, protocol.ProbeResult,
                  protocol.StatResult, protocol.RunList, protocol.WorkspaceStored,
                  protocol.WorkspaceState, protocol.LeaseStatus, protocol.Error)


def check_answer(ev: AnswerT) -> AnswerT:
    """A request's answer (an event with no run), checked like every event from the pod:
    ``ts`` sane, strings, lists and maps bounded.

    Answers go straight to the request that asked (``AgentClient.request``), past the
    engine's stream; ``AgentClient`` puts each one through here before handing it on
    (probe, run lists, the ncu and nsys plans, stat), so every face gets them checked.

    Raises:
        ProtocolError: the answer was refused; the message says why.
    """
    ev = bound_lease(bound_gpu_list(ev))
    why: list[str] = []
    if Boundary(on_refusal=lambda _kind, message, _n: why.append(message)).check(ev) is None:
        raise ProtocolError(f"the pod's answer was refused: {why[0] if why else '?'}",
                            title="Refused answer",
                            remedy="the agent on the pod is not gpuws's own; reconnect")
    return ev


# Most GPUs a probe may list (MAX_GPUS, with telemetry's): CUDA numbers at most 64
# devices per process (``--gpu`` takes 0..63). A pod announcing 1,000 froze the dashboard
# for 10 s; 5,000 crashed it.


def bound_gpu_list(ev: AnswerT) -> AnswerT:
    """A probe with at most :data:`MAX_GPUS` GPUs and its optional readings physical; what
    was cut is said in ``gpu_error`` (the dashboard and ``doctor`` show it beside the GPUs
    kept). Other answers: as they are.
    """
    if not isinstance(ev, protocol.ProbeResult):
        return ev
    probe = _cut_gpus(ev.probe)
    return ev if probe is ev.probe else msgspec.structs.replace(ev, probe=probe)


def bound_lease(ev: AnswerT) -> AnswerT:
    """A lease status without the stops that hold a number no clock gives, and with its
    other times that none gives blanked ("unknown"); how many is ``left_out`` (the pod's
    own ``left_out`` is not its to say). The stops come from a log in the pod user's
    cache: one bad line there refused the whole status, so the laptop saw no auto-stop
    and recorded none of the pod's stops. Other answers: as they are.
    """
    if not isinstance(ev, protocol.LeaseStatus):
        return ev
    last = ev.stops[-protocol.MAX_LEASE_STOPS:]  # (older ones are history: not read)
    stops = [s for s in last if physical.problem(s) is None]
    status, blanked = physical.blank(msgspec.structs.replace(ev, stops=stops, left_out=0))
    return msgspec.structs.replace(status, left_out=len(last) - len(stops) + len(blanked))


def _cut_gpus(probe: protocol.Probe) -> protocol.Probe:
    """At most :data:`MAX_GPUS` GPUs, and readings no GPU gives shown as not measured
    (one garbage reading should not refuse the whole probe); both said in ``gpu_error``."""
    gpus = probe.gpus
    notes = []
    if len(gpus) > MAX_GPUS:
        notes.append(f"the pod listed {len(gpus):,} GPUs; gpuws keeps the first {MAX_GPUS} "
                     "(no machine has more)")
        probe = msgspec.structs.replace(probe, gpus=gpus[:MAX_GPUS])
    probe, blanked = physical.blank(probe)
    if blanked:
        notes.append(f"{len(blanked)} reading(s) no GPU gives left out: "
                     + ", ".join(blanked[:3]) + (" …" if len(blanked) > 3 else ""))
    if not notes:
        return probe
    if probe.gpu_error:
        notes.append(probe.gpu_error)
    return msgspec.structs.replace(probe, gpu_error="; ".join(notes))


def is_refusal(ev: protocol.Events) -> bool:
    """Whether ``ev`` stands in for a refused event (a later event may take its seq)."""
    return isinstance(ev, protocol.Log) and ev.message.startswith(REFUSAL_PREFIX)


@dataclass
class SeqGate:
    """Lets each event of one run through once, in ``seq`` order, however often it arrives.

    A repeat (a backfill from the store, then the live stream; a resend after an attach)
    is held back, except the event that replaces a stand-in for a refused forgery: the
    store kept it, so whoever shows the run must show it too.
    """

    last: int = -1
    _stand_ins: set[int] = field(default_factory=set)

    def admit(self, ev: protocol.Events) -> bool:
        """Whether to show ``ev`` (an event of this gate's run with a ``seq``)."""
        seq = ev.seq
        assert seq is not None
        if seq <= self.last:
            if seq not in self._stand_ins or is_refusal(ev):
                return False
            self._stand_ins.discard(seq)
        elif is_refusal(ev):
            self._stand_ins.add(seq)
        self.last = max(self.last, seq)
        return True
