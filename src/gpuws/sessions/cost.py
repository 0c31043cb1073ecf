"""Session economics: what the connected time cost, and what it was spent on.

A pod bills for wall time, so the session's cost is its connected time × the rate.
Phases (each run's tiers, transfers, provisioning) say where that time went; whatever no
phase covers is idle, and idle time is shown and warned about, because it is the part a
person can most easily stop paying for.
"""

from __future__ import annotations

import datetime
import time

import msgspec

from gpuws import physical
from gpuws.config import Config, host_config
from gpuws.errors import UsageError
from gpuws.sessions.store import PhaseRow, Store

#: Warn when the session's cost reaches this share of its budget.
BUDGET_WARN_FRACTION = 0.8
#: Warn when more than this share of connected time was idle (and at least IDLE_WARN_MIN_S).
IDLE_WARN_FRACTION = 0.5
IDLE_WARN_MIN_S = 300.0


class PhaseCost(msgspec.Struct, frozen=True, kw_only=True):
    """One row of the economics table (``cost_usd`` is ``None`` when the rate is unknown)."""

    phase: str
    run_id: str | None
    started: float
    duration_s: float
    gpu_s: float | None
    cost_usd: float | None
    #: True while the phase has not reported its end (its duration runs to now/session end).
    open: bool = False


class Economics(msgspec.Struct, frozen=True, kw_only=True):
    """Where a session's time and money went.

    ``busy_s`` counts overlapping phases once; ``idle_s = connected_s − busy_s``.
    """

    session_id: str
    rate_usd_per_hour: float | None
    budget_usd: float | None
    connected_s: float
    busy_s: float
    idle_s: float
    gpu_s: float
    rows: list[PhaseCost]
    idle_cost_usd: float | None
    total_cost_usd: float | None
    #: The session is still connected; its figures run up to ``now``.
    live: bool
    #: Cost has reached BUDGET_WARN_FRACTION of the budget.
    budget_warning: bool
    over_budget: bool
    idle_warning: bool

    @property
    def idle_pct(self) -> float:
        """Idle share of connected time, in percent (0 for an empty session)."""
        return 100.0 * self.idle_s / self.connected_s if self.connected_s > 0 else 0.0


def resolve_rate(flag: float | None, host_alias: str | None, config: Config) -> float | None:
    """The $/hour for a session: the command-line flag, else the host's config, else defaults.

    Returns:
        The rate, or ``None`` when nobody said (the UI then asks once).

    Raises:
        UsageError: the flag is negative.
    """
    if flag is not None:
        if flag < 0:
            raise UsageError(f"a rate of {flag} $/hour is negative")
        return flag
    return host_config(config, host_alias).rate_usd_per_hour


def resolve_budget(flag: float | None, host_alias: str | None, config: Config) -> float | None:
    """The host's budget in dollars (per pod start and per day, :class:`BudgetWindow`),
    resolved like :func:`resolve_rate`."""
    if flag is not None:
        if flag < 0:
            raise UsageError(f"a budget of {flag} $ is negative")
        return flag
    return host_config(config, host_alias).budget_usd


class BudgetWindow(msgspec.Struct, frozen=True, kw_only=True):
    """What a host's budget counts (``budget_usd`` is per pod start and per day): the host's
    sessions since the latest of the last start and the last stop gpuws recorded for it
    (a stop ends what the provider bills; the next stretch is a new start, perhaps in the
    provider's console) and local midnight.

    A session reads it once, when it opens, and adds its own cost as it goes: a session
    that runs past midnight keeps counting in the window it opened in, and another
    ``gpuws`` connected at the same time is counted up to that moment only.

    Attributes:
        since: the window's start (epoch seconds).
        began: what started it: ``"start"``, ``"stop"`` or ``"day"`` (local midnight).
        spent_usd: what the host's sessions cost in it up to the moment it was read.
        sessions: how many sessions that was.
    """

    since: float
    began: str
    spent_usd: float
    sessions: int

    def words(self) -> str:
        """``since its start at 09:40`` (local time), for the budget's messages."""
        at = time.strftime("%H:%M", time.localtime(self.since))
        return {"start": f"since its start at {at}",
                "stop": f"since it was stopped at {at}"}.get(self.began, "since midnight")


def budget_window(store: Store, host: str, now: float) -> BudgetWindow:
    """The host's budget window up to ``now``, with what it has cost so far.

    Args:
        store: the session store (its sessions and host actions).
        host: the host as its sessions record it.
        now: the end of the window (a new session's start: its own cost is not in it).

    Returns:
        The window; see :class:`BudgetWindow` for where it begins.
    """
    since, began = local_midnight(now), "day"
    for action in store.host_actions(host):
        # Billing begins when a start is asked for and ends when a stop has stopped; only
        # what had its effect counts: a stop that did not stop ended no billing.
        at = action.started if action.action == "start" else action.ended
        if action.ok and since < at <= now:
            since, began = at, action.action
    spent, count = store.host_spend(host, since, now)
    return BudgetWindow(since=since, began=began, spent_usd=spent, sessions=count)


def local_midnight(now: float) -> float:
    """The start of ``now``'s day on the laptop's clock (epoch seconds)."""
    day = datetime.datetime.fromtimestamp(now).astimezone()
    return day.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()


def economics(store: Store, session_id: str, now: float | None = None) -> Economics:
    """Compute a session's phase table, idle time, cost and warnings.

    Args:
        store: the session store.
        session_id: a session id or unique prefix.
        now: the time an open session (or an open phase) is measured up to; defaults
            to the current time.
    """
    session = store.session(session_id)
    end = session.ended if session.ended is not None else (time.time() if now is None else now)
    connected = max(0.0, end - session.started)
    rate = session.rate_usd_per_hour

    def cost(seconds: float) -> float | None:
        return None if rate is None else seconds * rate / 3600.0

    rows: list[PhaseCost] = []
    intervals: list[tuple[float, float]] = []
    for p in store.phases(session.id):
        stop = p.ended if p.ended is not None else max(end, p.started)
        duration = stop - p.started
        rows.append(PhaseCost(phase=p.phase, run_id=p.run_id, started=p.started,
                              # A stored 1e308 (before the boundary refused it) summed to
                              # inf and crashed the export: not measured, then.
                              duration_s=duration, gpu_s=physical.sane(p.gpu_s, "s"),
                              cost_usd=cost(duration),
                              open=p.ended is None))
        intervals.append(_clip(p, stop, session.started, end))
    busy = _union_length(intervals)
    idle = max(0.0, connected - busy)
    total = cost(connected)
    budget = session.budget_usd
    return Economics(
        session_id=session.id, rate_usd_per_hour=rate, budget_usd=budget,
        connected_s=connected, busy_s=busy, idle_s=idle,
        gpu_s=sum(r.gpu_s for r in rows if r.gpu_s is not None),
        rows=rows, idle_cost_usd=cost(idle), total_cost_usd=total,
        live=session.ended is None,
        budget_warning=(total is not None and budget is not None
                        and total >= BUDGET_WARN_FRACTION * budget),
        over_budget=total is not None and budget is not None and total > budget,
        idle_warning=idle >= IDLE_WARN_MIN_S and idle > IDLE_WARN_FRACTION * connected,
    )


def _clip(p: PhaseRow, stop: float, lo: float, hi: float) -> tuple[float, float]:
    # A phase replayed from a run that outlived its connection can reach outside the
    # session; only the part inside the connected window is busy time of this session.
    return max(p.started, lo), min(stop, hi)


def _union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals, counting overlaps once."""
    total = 0.0
    cur_start: float | None = None
    cur_end = 0.0
    for start, stop in sorted(i for i in intervals if i[1] > i[0]):
        if cur_start is None or start > cur_end:
            if cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, stop
        else:
            cur_end = max(cur_end, stop)
    if cur_start is not None:
        total += cur_end - cur_start
    return total
