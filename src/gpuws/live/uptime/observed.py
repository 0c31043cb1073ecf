"""Stops gpuws did not perform but learnt of (issue 22, point 4): billed time ends there.

The pod's lease stops the pod when no laptop is there to see it, so the laptop learns of
the stop in one of two ways, and records it as a host action either way:

- **from the lease's log** (``by = "lease"``), at the next connection: every lease status
  carries the last stops the pod logged, with the pod's clock; they are read against the
  pod's own ``now_ts`` and recorded on the laptop's clock, once each.
- **from the host's silence** (``by = "estimated"``): the laptop saw the lease armed, kept
  its last contact, and later finds the host not answering after that contact plus the
  idle time. The stop is recorded as a window: from the earliest the lease could fire to
  when the silence was seen. The log, read back later (a disk that survives the stop),
  replaces the estimate with the exact time.

Every time from the pod is its word: a stop in the future, before the lease's own
history could begin, or with nonsense idle times is left out, never stored, and counted
in the status's ``left_out``; the other stops are kept. A stop the laptop's own contacts
deny is not recorded either: one dated while a session of gpuws had the host answering
(the lease never fires with a laptop connected), or after the status was read.
"""

from __future__ import annotations

import time

import msgspec

from ... import protocol
from ...sessions.store import Store
from .power import clock

#: The laptop's and the pod's clocks may differ by a round trip; later than this past the
#: pod's ``now_ts`` is no stop that happened.
FUTURE_SLACK_S = 60.0
#: Older stops than this are history no export reads (and a forged ``ts = 0`` is refused).
MAX_AGE_S = 400 * 86_400.0
#: How far a stop may lie inside a session's span and still be the lease's: the span's
#: ends are the laptop's times of connecting and disconnecting, the stop's the pod's
#: moved onto the laptop's clock, which is good to about a round trip.
CONTACT_SLACK_S = 2.0


def to_laptop_clock(status: protocol.LeaseStatus, received: float) -> protocol.LeaseStatus:
    """``status`` with every pod time moved onto the laptop's clock (``received``: when it
    arrived), its stops bounded and checked. An agent without ``now_ts`` is trusted to
    share the laptop's clock (older agents; the boundary already checked the values)."""
    offset = received - status.now_ts if status.now_ts is not None else 0.0
    stops = []
    left_out = status.left_out
    for stop in status.stops[-protocol.MAX_LEASE_STOPS:]:
        ts = stop.at + offset
        # A stop logged after the pod's own now was written by no lease that ran; without
        # a ``now_ts`` (an older agent) the laptop's clock, with its slack, is the bound.
        future = stop.at > status.now_ts if status.now_ts is not None else \
            ts > received + FUTURE_SLACK_S
        if future or ts < received - MAX_AGE_S:
            left_out += 1
            continue
        ended = stop.ended_at + offset if stop.ended_at is not None else None
        stops.append(msgspec.structs.replace(
            stop, at=ts, ended_at=None if ended is None else min(max(ended, ts), received)))
    deadline = status.deadline_ts + offset if status.deadline_ts is not None else None
    return msgspec.structs.replace(status, now_ts=received, deadline_ts=deadline,
                                   stops=stops, left_out=left_out)


def lease_seen(store: Store, host: str, status: protocol.LeaseStatus,
               now: float) -> tuple[int, int]:
    """A lease status read at ``now`` (laptop clock): remember an armed lease for the
    silence to come, record the stops its log holds that the laptop's own contacts allow
    (:func:`contradicted`). Returns how many stops were new, and how many the laptop's
    contacts denied (:func:`disbelief` puts those and the status's ``left_out`` in words)."""
    if status.armed and status.idle_s is not None:
        store.set_pod_lease(host, status.idle_s, now)
    else:
        store.clear_pod_lease(host)
    new = denied = 0
    spans = store.session_spans(host)
    for stop in status.stops:
        if contradicted(stop, spans, now):
            denied += 1
            continue
        outcome = ("its stop_on_pod said it worked" if stop.ok else
                   "its stop_on_pod failed" if stop.ok is False else
                   "the pod went down before its stop_on_pod returned")
        detail = (f"the pod's lease ran stop_on_pod after {clock(stop.idle_for_s)} with no "
                  f"laptop and no run; {outcome} (from the pod's lease log)")
        ended = stop.ended_at if stop.ended_at is not None else stop.at
        # Nor did it end after gpuws next found the host answering (the billed time ends
        # at the stop's end: a forged late ``stopped`` line would stretch it).
        ended = min([ended, now] + [s for s, _ in spans if s >= stop.at])
        if store.add_lease_stop(host, stop.at, ended, ok=stop.ok is not False, detail=detail):
            new += 1
    return new, denied


def disbelief(status: protocol.LeaseStatus, denied: int) -> str:
    """The stops of the pod's lease log the laptop did not believe, in one line ("" when
    none): a person reading a bill must know the log claimed more than was counted."""
    if not status.left_out and not denied:
        return ""
    why = [f"{status.left_out} impossible (dated in the future, before the lease could "
           "exist, or malformed)"] if status.left_out else []
    if denied:
        why.append(f"{denied} while gpuws had the pod answering")
    count = status.left_out + denied
    return (f"{count} stop{'s' if count != 1 else ''} in the pod's lease log not believed: "
            f"{'; '.join(why)}; the billed time is not cut at them")


def contradicted(stop: protocol.LeaseStop, spans: list[tuple[float, float | None]],
                 now: float) -> bool:
    """Whether the laptop's own contacts deny ``stop`` (on the laptop's clock): it lies
    after ``now``, or inside a session's span (``(started, ended)``; one not ended yet
    runs to ``now``), when the host answered gpuws and the lease does not fire."""
    if stop.at > now:
        return True
    for started, ended in spans:
        end = now if ended is None else ended
        if started + CONTACT_SLACK_S < stop.at < end - CONTACT_SLACK_S:
            return True
    return False


def contact(store: Store, host: str, now: float) -> None:
    """The laptop was in touch with ``host`` until ``now`` (a disconnect, a lost link)."""
    store.touch_pod_lease(host, now)


def host_silent(store: Store, host: str, now: float | None = None) -> str | None:
    """``host`` does not answer at ``now``: where its lease was seen armed and its deadline
    has passed since the laptop's last contact, record the stop that silence implies and
    return the sentence that says so (None: nothing to record)."""
    now = time.time() if now is None else now
    lease = store.pod_lease(host)
    if lease is None:
        return None
    last = lease.last_contact  # (a disconnect, a lost link, or the last session's end)
    # The lease looks every idle/20 s (0.2 to 5 s) and both clocks have a second's slack:
    # the earliest it could fire is that much before the idle time's end.
    earliest = last + lease.idle_s - min(max(lease.idle_s / 20.0, 0.2), 5.0) - 1.0
    if now < earliest:
        return None  # silent, but not because of the lease (or not yet): nothing learnt
    if any(a.started >= last for a in store.host_actions(host)):
        store.clear_pod_lease(host)
        return None  # a start or stop after the last contact says more than this would
    store.add_host_action(
        host, "stop", earliest, now, ok=True, by="estimated",
        detail=(f"the host no longer answered at {_hhmm(now)}, after its lease's "
                f"{clock(lease.idle_s)} with nobody there (from {_hhmm(last)}): stopped by "
                f"the lease between {_hhmm(earliest)} and {_hhmm(now)}"))
    store.clear_pod_lease(host)
    return (f"{host} does not answer: its lease was due to stop it at {_hhmm(earliest)} "
            "(recorded as its stop, for the billed time)")


def _hhmm(ts: float) -> str:
    return time.strftime("%H:%M", time.localtime(ts))
