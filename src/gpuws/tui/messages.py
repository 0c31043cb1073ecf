"""The typed messages workers and the app post.

Discrete happenings (a stored batch of run events, a connection step, a link that
came up or went down, a finished pull) are never merged. Gauges (telemetry, transfer
progress, the cost ticker) replace a pending message of their kind, so a busy screen
redraws them once with the newest value instead of replaying every tick.
"""

from __future__ import annotations

from textual.message import Message

from .. import protocol
from ..live.link import Link
from ..live.watchloop import Iteration, WatchStatus
from ..sessions.cost import Economics
from ..sessions.store import ArtifactRow, RunRow
from .hosts import HostEntry, SessionSummary
from .results import RunResults


class RunEvents(Message, bubble=False):
    """Run events, already stored, for the panes of one run (discrete: never merged).

    ``arrived`` holds when each event was received, for the arrival-to-pane latency.
    """

    def __init__(self, run_id: str, events: list[protocol.Events], arrived: list[float]) -> None:
        self.run_id = run_id
        self.events = events
        self.arrived = arrived
        super().__init__()


class StepChanged(Message, bubble=False):
    """A connection step changed state (discrete)."""

    def __init__(self, step: str, state: str, seconds: float | None, detail: str) -> None:
        self.step = step
        self.state = state
        self.seconds = seconds
        self.detail = detail
        super().__init__()


class StartWaiting(Message, bubble=False):
    """The host's ``start`` command ran; SSH is tried until it answers, ``seconds_left``
    at most (a gauge: a newer reading replaces a pending one)."""

    def __init__(self, what: str, seconds_left: float) -> None:
        self.what = what
        self.seconds_left = seconds_left
        super().__init__()

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, StartWaiting)


class HostStarted(Message, bubble=False):
    """The host answers SSH after its ``start`` command: connect again (discrete)."""


class LinkUp(Message, bubble=False):
    """The pod is connected, probed, and its session is open."""

    def __init__(self, link: Link) -> None:
        self.link = link
        super().__init__()


class LinkDown(Message, bubble=False):
    """The connection closed (runs on the pod go on)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__()


class NcuPlanReady(Message, bubble=False):
    """The agent's answer about which ncu fits (after an install, too)."""

    def __init__(self, plan: protocol.NcuPlan) -> None:
        self.plan = plan
        super().__init__()


class NsysPlanReady(Message, bubble=False):
    """The agent's answer about which nsys works, or how to install one (after an install,
    too)."""

    def __init__(self, plan: protocol.NsysPlan) -> None:
        self.plan = plan
        super().__init__()


class AgentLog(Message, bubble=False):
    """A log line from the agent that belongs to no run (e.g. ncu install steps)."""

    def __init__(self, log: protocol.Log) -> None:
        self.log = log
        super().__init__()


class TelemetryTick(Message, bubble=False):
    """New telemetry is in the history (a gauge: a newer tick replaces a pending one)."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, TelemetryTick)


class EconomicsTick(Message, bubble=False):
    """The session's cost figures, recomputed (a gauge)."""

    def __init__(self, econ: Economics) -> None:
        self.econ = econ
        super().__init__()

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, EconomicsTick)


class PullProgress(Message, bubble=False):
    """Bytes of one artifact pulled so far (a gauge per artifact)."""

    def __init__(self, run_id: str, name: str, done: int, total: int) -> None:
        self.run_id = run_id
        self.name = name
        self.done = done
        self.total = total
        super().__init__()

    def can_replace(self, message: Message) -> bool:
        return (isinstance(message, PullProgress) and message.run_id == self.run_id
                and message.name == self.name)


class PullDone(Message, bubble=False):
    """A run's artifacts are home (or some failed: ``error``)."""

    def __init__(self, run_id: str, pulled: list[str], error: str | None = None) -> None:
        self.run_id = run_id
        self.pulled = pulled
        self.error = error
        super().__init__()


class Exported(Message, bubble=False):
    """A session was written as markdown to ``path``."""

    def __init__(self, session_id: str, path: str, size: int) -> None:
        self.session_id = session_id
        self.path = path
        self.size = size
        super().__init__()


class HomeData(Message, bubble=False):
    """What Home lists: hosts and recent sessions."""

    def __init__(self, hosts: list[HostEntry], sessions: list[SessionSummary]) -> None:
        self.hosts = hosts
        self.sessions = sessions
        super().__init__()


class SessionsData(Message, bubble=False):
    """Every session, and the runs of the one asked about."""

    def __init__(self, sessions: list[SessionSummary], session_id: str | None,
                 runs: list[RunRow]) -> None:
        self.sessions = sessions
        self.session_id = session_id
        self.runs = runs
        super().__init__()


class Backfill(Message, bubble=False):
    """A run's events already in the store, for a run screen that just opened."""

    def __init__(self, run_id: str, events: list[protocol.Events]) -> None:
        self.run_id = run_id
        self.events = events
        super().__init__()


class ResultsData(Message, bubble=False):
    """What the results screen shows, read from the store."""

    def __init__(self, results: RunResults) -> None:
        self.results = results
        super().__init__()


class ArtifactsData(Message, bubble=False):
    """A run's artifacts as the store has them."""

    def __init__(self, run_id: str, rows: list[ArtifactRow]) -> None:
        self.run_id = run_id
        self.rows = rows
        super().__init__()


class WatchIterationDone(Message, bubble=False):
    """An iteration of the watch loop ended, or its comparison with the baseline changed
    (discrete: never merged). ``baseline_n`` is the iteration that is the baseline (None:
    a stored run, or none yet), ``baseline_ms`` its median."""

    def __init__(self, iteration: Iteration, baseline_n: int | None,
                 baseline_ms: float | None) -> None:
        self.iteration = iteration
        self.baseline_n = baseline_n
        self.baseline_ms = baseline_ms
        super().__init__()


class WatchStatusChanged(Message, bubble=False):
    """Where the watch loop is (a gauge: the newest replaces a pending one)."""

    def __init__(self, status: WatchStatus) -> None:
        self.status = status
        super().__init__()

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, WatchStatusChanged)
