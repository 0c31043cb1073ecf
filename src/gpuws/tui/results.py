"""A finished run's results, read from the store in one go (no Textual here)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import protocol
from ..errors import GpuwsError
from ..live import timeline
from ..live.verdicts import INPUT_TYPES, Verdicts, derive, inputs_from_events
from ..sessions.compare import Comparison, compare_runs
from ..sessions.runlist import why_failed
from ..sessions.store import ArtifactRow, KernelMetricsRow, RunRow, Store
from ..workspace.code import CodeRecord


def no_trace_why(tiers: list[int], table: protocol.KernelTable | None, status: str,
                 failure: str = "") -> str:
    """Why a run has no timeline trace to draw, in a sentence.

    Args:
        tiers: the tiers the run asked for.
        table: Tier 2's kernel table, if it made one.
        status: the run's status (``running`` while it goes on).
        failure: why the run or a tier failed ("" if nothing did).
    """
    if 2 not in tiers:
        return ("Tier 2 was not asked for: no timeline. Start a run with Tier 2 ticked to "
                "see its kernels across time.")
    if table is not None:
        return (f"No timeline: Tier 2 read its kernels from {table.source}, which keeps no "
                "trace here; only a Tier 2 through torch.profiler keeps one.")
    if status == "running":
        return "No timeline yet: it comes home with the run's artifacts after Tier 2."
    why = f": {failure}" if failure else ""
    return f"No timeline: Tier 2 gave no kernel table{why}."


@dataclass(frozen=True)
class RunResults:
    """Everything the results screen shows about one run.

    Attributes:
        run: the run's row.
        probe: the pod it ran on (from its session).
        tier1: the Tier-1 result, if Tier 1 finished.
        metrics: ncu metrics per profiled launch.
        rules: ncu's rule findings.
        static: static analyses (registers, shared memory, theoretical occupancy).
        diagnoses: what the run had to say about itself.
        comparison: the comparison with its baseline, if it has one.
        baseline_note: why there is no comparison (empty when there is).
        failure: why the run failed, was cancelled or a tier gave nothing (empty when
            everything it was asked for ran).
        tiers: how each tier that finished ended, by tier number.
        code: the workspace code the run measured (None: no workspace).
        verdicts: what bounds the program and its kernels, by today's logic.
        kernel_table: Tier 2's ranked kernels (the timeline's blocks find their row in it).
        trace: the run's timeline trace artifact (None: the run kept none).
    """

    run: RunRow
    probe: protocol.Probe | None
    tier1: protocol.Tier1Result | None
    metrics: list[KernelMetricsRow]
    rules: list[protocol.Rule]
    static: list[protocol.StaticAnalysis]
    diagnoses: list[protocol.Diagnosis]
    comparison: Comparison | None
    baseline_note: str
    failure: str = ""
    tiers: dict[int, protocol.TierFinished] = field(default_factory=dict)
    code: CodeRecord | None = None
    verdicts: Verdicts = field(default_factory=Verdicts)
    kernel_table: protocol.KernelTable | None = None
    trace: ArtifactRow | None = None

    def no_trace_why(self) -> str:
        """Why the run kept no timeline trace (for a run whose artifacts hold none)."""
        asked = self.run.spec.tiers if self.run.spec is not None else [1, 2, 3]
        return no_trace_why(asked, self.kernel_table, self.run.status, self.failure)

    def metrics_note(self) -> str:
        """Why there are no Tier-3 metrics to show (empty when there are some)."""
        if self.metrics:
            return ""
        asked = self.run.spec.tiers if self.run.spec is not None else [1, 2, 3]
        if 3 not in asked:
            chosen = ", ".join(str(t) for t in asked)
            return (f"Tier 3 (Nsight Compute) was not asked for: this run ran tier(s) {chosen}. "
                    "Start a run with Tier 3 ticked for metrics.")
        tier3 = self.tiers.get(3)
        if tier3 is not None and tier3.status != "ok":
            why = f": {tier3.reason}" if tier3.reason else ""
            return f"No Tier-3 metrics: Tier 3 {tier3.status}{why}. The findings tab says more."
        if tier3 is not None:
            return ("No Tier-3 metrics: Tier 3 finished but recorded no kernel (did the kernel "
                    "regex match a launch?).")
        if self.run.status == "running":
            return "No Tier-3 metrics yet: the run has not reached Tier 3."
        why = f": {self.failure}" if self.failure else ""
        return f"No Tier-3 metrics: the run {self.run.status} before Tier 3{why}."


def load_results(store: Store, run_id: str) -> RunResults:
    """Read a run's results (run on the store's thread).

    Raises:
        StoreError: no such run.
    """
    run = store.run(run_id)
    session = store.session(run.session_id)
    static = [e for e in store.run_events(run.run_id, ["static_analysis"])
              if isinstance(e, protocol.StaticAnalysis)]
    comparison: Comparison | None = None
    note = ("no baseline: mark a run of this workload as the baseline (b on its results), "
            "or pick one in the run launcher")
    if run.baseline_of is not None:
        try:
            comparison = compare_runs(store, run.baseline_of, run.run_id)
            note = ""
        except GpuwsError as exc:
            note = f"cannot compare with {run.baseline_of}: {exc.message}"
    elif run.is_baseline:
        note = "this run is the baseline of its workload"
    tiers = {e.tier: e for e in store.run_events(run.run_id, ["tier_finished"])
             if isinstance(e, protocol.TierFinished)}
    return RunResults(run=run, probe=session.probe, tier1=store.tier1(run.run_id),
                      metrics=store.metrics(run.run_id), rules=store.rules(run.run_id),
                      static=static, diagnoses=store.diagnoses(run.run_id),
                      comparison=comparison, baseline_note=note,
                      failure=why_failed(store, run.run_id), tiers=tiers,
                      code=store.code(run.run_id),
                      verdicts=derive(inputs_from_events(
                          store.run_events(run.run_id, INPUT_TYPES))),
                      kernel_table=next((e for e in reversed(store.run_events(
                          run.run_id, ["kernel_table"])) if isinstance(e, protocol.KernelTable)),
                          None),
                      trace=next((a for a in store.artifacts(run.run_id)
                                  if a.name == timeline.FILE_NAME), None))
