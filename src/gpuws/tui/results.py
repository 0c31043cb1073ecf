"""A finished run's results, read from the store in one go (no Textual here)."""

from __future__ import annotations

from dataclasses import dataclass

from .. import protocol
from ..errors import GpuwsError
from ..sessions.compare import Comparison, compare_runs
from ..sessions.store import KernelMetricsRow, RunRow, Store


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
    return RunResults(run=run, probe=session.probe, tier1=store.tier1(run.run_id),
                      metrics=store.metrics(run.run_id), rules=store.rules(run.run_id),
                      static=static, diagnoses=store.diagnoses(run.run_id),
                      comparison=comparison, baseline_note=note)
