"""The stored runs as people look for them: id, workload, status, why it failed, Tier-1 median.

``gpuws history`` prints these, and the TUI's results screen uses :func:`why_failed` so a
failed run says why on every face. Everything is read from the store; nothing here
connects.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from .. import protocol
from ..workspace.code import CodeRecord
from .store import RunRow, Store

#: Where every error that names an unknown run id points.
RUN_LISTING_REMEDY = ("`gpuws history` lists the stored runs (`gpuws history SESSION` one "
                      "session's); give an id or a unique prefix of one")


class RunSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One stored run in a listing (``None`` = not known or not measured).

    Attributes:
        run_id: the run's id (what ``compare``, ``baseline``, ``pull`` and ``replay``
            take, or any unique prefix of it).
        session_id: the session it ran in.
        host: the pod, as it was given to ``connect``/``run``.
        workload: the workload string.
        status: ``ok``, ``failed``, ``cancelled`` or ``running`` (no end recorded yet).
        started: when it started (unix seconds).
        wall_s: how long it ran.
        tiers: the tiers it was asked for.
        tier1_median_ms: Tier 1's median time per call.
        tier1_ci_pct: the half-width of that median's 95% CI, in percent of it.
        tier1_n: how many Tier-1 samples the median is of.
        tier1_mode: ``hot`` or ``cold``.
        why: why it failed or was cancelled, or which tiers did not give results
            (empty when everything it was asked for ran).
        is_baseline: it is the baseline of its workload.
        baseline_of: the baseline it is compared with.
        code: the workspace code it measured (tree hash, git commit and changes), None
            for a run without a workspace.
    """

    run_id: str
    session_id: str
    host: str
    workload: str
    status: str
    started: float | None
    wall_s: float | None
    tiers: list[int]
    tier1_median_ms: float | None
    tier1_ci_pct: float | None
    tier1_n: int | None
    tier1_mode: str | None
    why: str
    is_baseline: bool
    baseline_of: str | None
    code: CodeRecord | None = None


def list_runs(store: Store, session: str | None = None) -> list[RunSummary]:
    """Every stored run, newest session first, each session's runs in the order they ran.

    Args:
        store: the session store.
        session: only this session (an id or unique prefix).

    Raises:
        StoreError: ``session`` matches no session, or more than one.
    """
    return list(iter_runs(store, session))


#: Runs summarized together: their events and code are read in one statement each (one
#: query per run and kind was most of a listing's reads), and a listing holds this many
#: at a time whatever the store's size.
CHUNK = 100
#: The events a listing line is made of.
_LISTED = ("tier1_result", "run_finished", "tier_started", "tier_finished", "diagnosis")


def iter_runs(store: Store, session: str | None = None,
              limit: int | None = None) -> Iterator[RunSummary]:
    """The stored runs in :func:`list_runs`' order, read :data:`CHUNK` runs at a time.

    Memory is one chunk's runs whatever the store holds (20,000 runs were 122 MiB of
    JSON built whole before the first byte went out), and the first runs come before
    the last are read, within one session too (a ``watch`` session may hold thousands).

    Args:
        store: the session store.
        session: only this session (an id or unique prefix).
        limit: only the ``limit`` newest runs (still newest session first, each
            session's runs in the order they ran); None: every run.

    Raises:
        StoreError: ``session`` matches no session, or more than one (raised before the
            first run is yielded).
    """
    if limit is None:
        chosen = [store.session(session)] if session is not None else None
        return (summary
                for s in (chosen if chosen is not None else store.newest_sessions())
                for chunk in _chunks(store.iter_session_runs(s.id))
                for summary in summarize_many(store, chunk, s.host))
    newest = store.newest_runs(limit, session)
    by_session: dict[str, list[RunRow]] = {}
    for run in reversed(newest):  # oldest first: each session's runs in the order they ran
        by_session.setdefault(run.session_id, []).append(run)
    sessions = sorted((store.session(sid) for sid in by_session),
                      key=lambda s: s.started, reverse=True)
    return (summary for s in sessions for chunk in _chunks(iter(by_session[s.id]))
            for summary in summarize_many(store, chunk, s.host))


def _chunks(runs: Iterator[RunRow]) -> Iterator[list[RunRow]]:
    chunk: list[RunRow] = []
    for run in runs:
        chunk.append(run)
        if len(chunk) == CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def summarize(store: Store, run: RunRow, host: str) -> RunSummary:
    """One run's line in a listing."""
    return summarize_many(store, [run], host)[0]


def summarize_many(store: Store, runs: list[RunRow], host: str) -> list[RunSummary]:
    """Several runs' lines, their events and code read in one statement each."""
    ids = [run.run_id for run in runs]
    events = store.listing_events(ids, _LISTED)
    codes = store.codes(ids)
    return [_summary(run, host, events[run.run_id], codes.get(run.run_id)) for run in runs]


def _summary(run: RunRow, host: str, events: list[protocol.Events],
             code: CodeRecord | None) -> RunSummary:
    # The run's last Tier-1 result, as Store.tier1 gives it.
    t1 = next((ev for ev in reversed(events) if isinstance(ev, protocol.Tier1Result)), None)
    stats = t1.stats if t1 is not None else None
    return RunSummary(
        run_id=run.run_id, session_id=run.session_id, host=host, workload=run.workload,
        status=run.status, started=run.started, wall_s=run.wall_s,
        tiers=list(run.spec.tiers) if run.spec is not None else [],
        tier1_median_ms=stats.median_ms if stats else None,
        tier1_ci_pct=stats.ci_rel_halfwidth * 100.0 if stats else None,
        tier1_n=stats.n if stats else None, tier1_mode=t1.mode if t1 is not None else None,
        why=_why(events), is_baseline=run.is_baseline, baseline_of=run.baseline_of,
        code=code)


def why_failed(store: Store, run_id: str) -> str:
    """Why a run failed, was cancelled or gave no results of a tier, in one line.

    Built from what the run itself recorded: the tiers that failed or were skipped (with
    their reasons), the run's own error, and its error diagnoses when nothing else says
    more. Empty for a run that did everything it was asked to (or is still running).
    """
    return _why(store.run_events(run_id, ["run_finished", "tier_started", "tier_finished",
                                          "diagnosis"]))


def _why(events: list[protocol.Events]) -> str:
    """:func:`why_failed` from the run's events (others among them are passed over)."""
    finished: protocol.RunFinished | None = None
    started: set[int] = set()
    parts: list[str] = []
    failed: list[str] = []
    diagnoses: list[str] = []
    for ev in events:
        if isinstance(ev, protocol.RunFinished):
            finished = ev
        elif isinstance(ev, protocol.TierStarted):
            started.add(ev.tier)
        elif isinstance(ev, protocol.TierFinished):
            started.discard(ev.tier)
            if ev.status in ("failed", "skipped"):
                why = f": {ev.reason}" if ev.reason else ""
                parts.append(f"tier {ev.tier} {ev.status}{why}")
                if ev.status == "failed":
                    failed.append(parts[-1])
        elif isinstance(ev, protocol.Diagnosis) and ev.severity == "error":
            diagnoses.append(f"{ev.title}: {ev.cause}" if ev.cause else ev.title)
    if finished is None:
        return ""
    if finished.status == "cancelled":
        # The cancel stopped the command (exit code -15): that tier did not fail.
        parts = [p for p in parts if p not in failed]
        during = f" during tier {min(started)}" if started else ""
        parts.insert(0, f"cancelled{during}")
    error = (finished.error or "").strip()
    # "tier 3 failed" says less than "tier 3 failed: ERR_NVGPUCTRPERM …": keep the longer.
    if error and not any(error in part for part in parts):
        parts.insert(0, error)
    if finished.status == "failed" and not parts:
        parts = diagnoses[:1] or [f"the run failed (exit code {finished.exit_code})"]
    return "; ".join(parts)
