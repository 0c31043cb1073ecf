"""Today's verdicts over a run's events, for whoever shows them (TUI, printer, export).

The pod states its verdicts as the tiers end (``program_verdict``, ``kernel_verdict``,
``tier3_coverage``), with the logic of the agent it ran. A replay or an export reads the
stored events again through the same pure functions (:mod:`..remote_agent.verdicts`),
so an old session gets today's logic. Without counters, the pod's own verdict is kept as
it said it where there is one; else the laptop builds it from the same inputs the pod
read (Tier 1, NVML GPM on the tiers' ``tier_finished``, static analysis).

Also here: the one rule for long kernel tables (the top rows and one "others" row).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from .. import protocol
from ..remote_agent.verdicts.kernel import (
    coverage,
    first_match,
    gpm_window,
    kernel_verdict,
    kernel_verdict_without_counters,
)
from ..remote_agent.verdicts.names import short_name
from ..remote_agent.verdicts.program import program_verdict, tier3_advice, window_text
from ..text import humanfmt

if TYPE_CHECKING:
    from .model import RunModel

#: Rows a kernel table shows before the rest fold into one "others" row.
TOP_ROWS = 10
#: The event types a verdict is derived from (and the pod's own verdicts).
INPUT_TYPES = ("run_started", "tier_started", "tier_finished", "tier1_result", "kernel_table",
               "kernel_metrics", "rule_findings", "static_analysis", "program_verdict",
               "kernel_verdict", "tier3_coverage", "diagnosis")

S = TypeVar("S", bound=msgspec.Struct)


@dataclass
class Inputs:
    """What the verdicts of one run are derived from."""

    spec: protocol.RunSpec | None = None
    tier3_argv: list[str] | None = None
    tier3_status: str | None = None
    #: A diagnosis said the counters are blocked (predicted, or ncu said so).
    counters_blocked: bool = False
    #: The run's GPU's SM count as the probe read it (ncu's own, in the metrics, wins).
    sm_count: int | None = None
    #: NVML GPM by tier (1: Tier 1's timed rounds, 0: a ``cmd:``'s run), where sampled.
    gpm: dict[int, protocol.GpmMetrics] = field(default_factory=dict)
    tier1: protocol.Tier1Result | None = None
    table: protocol.KernelTable | None = None
    metrics: list[protocol.KernelMetrics] = field(default_factory=list)
    rules: list[protocol.Rule] = field(default_factory=list)
    static: list[protocol.StaticAnalysis] = field(default_factory=list)
    pod_program: protocol.ProgramVerdict | None = None
    pod_kernels: list[protocol.KernelVerdict] = field(default_factory=list)
    pod_coverage: protocol.Tier3Coverage | None = None


@dataclass(frozen=True)
class Verdicts:
    """A run's verdicts: the program's, each kernel's, and Tier 3 checked against Tier 2."""

    program: protocol.ProgramVerdict | None = None
    kernels: list[protocol.KernelVerdict] = field(default_factory=list)
    coverage: protocol.Tier3Coverage | None = None

    def __bool__(self) -> bool:
        return self.program is not None or bool(self.kernels) or self.coverage is not None


def inputs_from_events(events: Iterable[protocol.Events]) -> Inputs:
    """The inputs from a run's events in ``seq`` order (later ones win, as in the model)."""
    got = Inputs()
    rules: dict[str, list[protocol.Rule]] = {}
    for ev in events:
        if isinstance(ev, protocol.RunStarted):
            got.spec = ev.spec
            got.sm_count = ev.gpu.sm_count if ev.gpu is not None else None
        elif isinstance(ev, protocol.TierStarted) and ev.tier == 3:
            got.tier3_argv = ev.argv or got.tier3_argv
        elif isinstance(ev, protocol.TierFinished):
            if ev.tier == 3:
                got.tier3_status = ev.status
            if ev.gpm is not None:
                got.gpm[ev.tier] = ev.gpm
        elif isinstance(ev, protocol.Tier1Result):
            got.tier1 = ev
        elif isinstance(ev, protocol.KernelTable):
            got.table = ev
        elif isinstance(ev, protocol.KernelMetrics):
            got.metrics = [m for m in got.metrics
                           if (m.kernel, m.launch) != (ev.kernel, ev.launch)] + [ev]
        elif isinstance(ev, protocol.RuleFindings):
            for kernel in {r.kernel for r in ev.rules}:
                rules[kernel] = [r for r in ev.rules if r.kernel == kernel]
        elif isinstance(ev, protocol.StaticAnalysis):
            got.static = [s for s in got.static if s.kernel != ev.kernel] + [ev]
        elif isinstance(ev, protocol.ProgramVerdict):
            got.pod_program = ev
        elif isinstance(ev, protocol.KernelVerdict):
            got.pod_kernels = [k for k in got.pod_kernels if k.kernel != ev.kernel] + [ev]
        elif isinstance(ev, protocol.Tier3Coverage):
            got.pod_coverage = ev
        elif isinstance(ev, protocol.Diagnosis) and ev.code == "counters_blocked":
            got.counters_blocked = True
    got.rules = [r for kernel_rules in rules.values() for r in kernel_rules]
    return got


def inputs_from_model(model: RunModel) -> Inputs:
    """The inputs from a run model (live, or replayed from the store)."""
    tier3 = model.tiers.get(3)
    return Inputs(spec=model.spec, tier3_argv=tier3.argv if tier3 is not None else None,
                  tier3_status=tier3.status if tier3 is not None else None,
                  tier1=model.tier1, table=model.kernel_table, metrics=list(model.metrics),
                  rules=list(model.rules), static=list(model.static),
                  pod_program=model.program_verdict, pod_kernels=list(model.kernel_verdicts),
                  pod_coverage=model.coverage,
                  counters_blocked=any(d.code == "counters_blocked" for d in model.diagnoses),
                  sm_count=model.gpu.sm_count if model.gpu is not None else None,
                  gpm={t: s.gpm for t, s in model.tiers.items() if s.gpm is not None})


def tier3_regex(argv: Sequence[str] | None) -> str | None:
    """The kernel filter Tier 3 ran with (``-k regex:…``), or None."""
    args = list(argv or [])
    for i, arg in enumerate(args[:-1]):
        if arg in ("-k", "--kernel-name", "--kernel-id"):
            value = args[i + 1]
            return value[len("regex:"):] if value.startswith("regex:") else re.escape(value)
    return None


def derive(got: Inputs) -> Verdicts:
    """The run's verdicts by today's logic, where its events allow."""
    program = got.pod_program
    regex = tier3_regex(got.tier3_argv) or (got.spec.kernel_regex if got.spec else None)
    if got.table is not None:
        table = msgspec.to_builtins(got.table)
        found = program_verdict(table)
        if got.tier3_argv is not None or (got.spec is not None and 3 in got.spec.tiers):
            found["tier3_advice"] = tier3_advice(found, table["kernels"], regex)
        program = _convert(found, protocol.ProgramVerdict)
    kernels = list(got.pod_kernels)
    cov = got.pod_coverage
    if got.metrics:
        kernels, seen = [], set()
        for m in got.metrics:
            if m.kernel in seen:
                continue
            seen.add(m.kernel)
            rules = [msgspec.to_builtins(r) for r in got.rules if r.kernel == m.kernel]
            kernels.append(_convert(kernel_verdict(msgspec.to_builtins(m), rules,
                                                   got.sm_count), protocol.KernelVerdict))
        if got.table is not None:
            cov = _convert(coverage(
                msgspec.to_builtins(got.table), [m.kernel for m in got.metrics], regex=regex,
                launch_skip=got.spec.launch_skip if got.spec else 0,
                launch_count=got.spec.launch_count if got.spec else 1), protocol.Tier3Coverage)
    elif not kernels and (got.counters_blocked or got.tier3_status in ("fallback", "skipped")):
        rows = msgspec.to_builtins(got.table.kernels) if got.table is not None else None
        tier1_gpm, run_gpm = (msgspec.to_builtins(got.gpm[t]) if t in got.gpm else None
                              for t in (1, 0))
        gpm = gpm_window(tier1_gpm, run_gpm, rows)
        if got.tier1 is not None or got.static or gpm is not None:
            static = got.static[-1] if got.static else None
            name = (static.kernel if static is not None
                    else first_match(rows, regex) or "the workload")
            tier1 = msgspec.to_builtins(got.tier1) if got.tier1 is not None else None
            kernels = [_convert(kernel_verdict_without_counters(
                name, tier1, msgspec.to_builtins(static) if static is not None else None,
                gpm), protocol.KernelVerdict)]
    return Verdicts(program, kernels, cov)


def _convert(found: dict[str, Any], kind: type[S]) -> S:
    return msgspec.convert(found, kind)


# ------------------------------------------------------------------ words for people
def evidence_text(e: protocol.Evidence) -> str:
    """``GPU busy share of the kernel span 0.5% (nsys)``: a number with its source."""
    if e.unit == "%":
        value = humanfmt.pct(e.value)
    elif e.unit == "ns":
        value = humanfmt.ms(None if e.value is None else e.value / 1e6)
    elif e.unit == "":
        value = humanfmt.num(e.value)
    else:
        value = humanfmt.num(e.value, e.unit, 1)
    return f"{e.name} {value} ({e.source})"


@dataclass(frozen=True)
class Shown:
    """A long kernel table cut for people: the top rows, and the rest in one row."""

    rows: list[protocol.KernelRow]
    others: int
    others_calls: int
    others_share_pct: float
    others_total_ns: float


def top_rows(rows: Sequence[protocol.KernelRow], top: int = TOP_ROWS) -> Shown:
    """The first ``top`` rows and one "others" row with the rest's total share."""
    rest = rows[top:]
    return Shown(list(rows[:top]), len(rest), sum(r.calls for r in rest),
                 sum(r.share_pct for r in rest), sum(r.total_ns for r in rest))


def window_caption(window: protocol.SteadyWindow | None,
                   comm: protocol.CommShare | None = None) -> str:
    """``judged: decode steps 2–23, 8.1 ms each (kernel repeats); communication 45%,
    exposed 30%`` under a kernel table ("" when the whole run was judged and nothing
    was communicated)."""
    parts = []
    if window is not None:
        parts.append(f"judged: {window_text(msgspec.to_builtins(window))} ({window.basis})")
    if comm is not None:
        parts.append(f"communication {humanfmt.pct(comm.comm_pct, 0)} of the window, "
                     f"{humanfmt.pct(comm.exposed_pct, 0)} not overlapped with compute"
                     + (" (on the host)" if comm.where == "host" else ""))
    return "; ".join(parts)


def rank_name(r: protocol.RankTable) -> str:
    """``rank 1`` (``process`` where the launcher named no rank)."""
    return f"rank {r.rank}" if r.rank is not None else "process"


def short(name: str) -> str:
    """The short name of a kernel (Nsight's function name); the full one stays in data."""
    return short_name(name)
