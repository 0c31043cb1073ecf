"""The one data flow: every event goes into the store first, then to the panes.

Events arrive from the agent link (or a replay) one by one, on the event loop. The
feed collects them, stores a whole batch in one transaction on the store's thread,
and only then hands the batch to the panes. While one batch is being stored the next
one gathers, so the batch size follows the arrival rate by itself: one event at a
time when the stream is slow, thousands per transaction (and one repaint) when it is
fast. Batching is how bursts coalesce; nothing is ever dropped or reordered.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass

from .. import protocol
from ..errors import GpuwsError, StoreError
from ..sessions.store import Store
from .storeio import StoreHandle

#: Most events stored in one transaction (bounds one batch's latency under a flood).
MAX_BATCH = 4096


@dataclass(frozen=True)
class Batch:
    """Events stored together, in arrival order.

    Attributes:
        events: the events.
        arrived: when each event was received (the feed's clock), for latency figures.
        new: how many of them the store had not seen before (a resend after an attach
            is stored once but still shown, so a pane that missed it catches up).
    """

    events: list[protocol.Events]
    arrived: list[float]
    new: int


Deliver = Callable[[Batch], None]
OnError = Callable[[GpuwsError], None]
#: Told of stored (run_id, seq) pairs that arrived again with a different body.
OnConflict = Callable[[list[tuple[str, int]]], None]


class EventFeed:
    """Stores events, then delivers them.

    Args:
        store: the session store.
        deliver: called on the event loop with each stored batch.
        on_error: called when a batch could not be stored; the batch is still
            delivered, so what happened is shown even if it is not recorded.
        clock: the clock arrival times are taken with.
    """

    def __init__(self, store: StoreHandle, deliver: Deliver, on_error: OnError,
                 clock: Callable[[], float] = time.perf_counter,
                 on_conflict: OnConflict | None = None) -> None:
        self.store = store
        self.deliver = deliver
        self.on_error = on_error
        self.on_conflict = on_conflict
        self.clock = clock
        self.session_id: str | None = None
        self._pending: list[protocol.Events] = []
        self._arrived: list[float] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._has_session = asyncio.Event()

    def set_session(self, session_id: str) -> None:
        """Store what follows in this session (events wait until one is set)."""
        self.session_id = session_id
        self._has_session.set()

    def push(self, event: protocol.Events) -> None:
        """Take one event (never blocks; safe to call from an agent listener)."""
        self._pending.append(event)
        self._arrived.append(self.clock())
        self._idle.clear()
        self._wake.set()

    @property
    def backlog(self) -> int:
        """Events received but not yet stored."""
        return len(self._pending)

    async def drained(self) -> None:
        """Wait until every event pushed so far has been stored and delivered."""
        await self._idle.wait()

    async def run(self) -> None:
        """Store and deliver until cancelled."""
        await self._has_session.wait()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                events, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                arrived, self._arrived = self._arrived[:MAX_BATCH], self._arrived[MAX_BATCH:]
                new = await self._store(events)
                self.deliver(Batch(events, arrived, new))
            self._idle.set()

    async def _store(self, events: list[protocol.Events]) -> int:
        session_id = self.session_id
        assert session_id is not None
        conflicts: list[tuple[str, int]] = []

        def store_batch(s: Store) -> int:
            try:
                return s.ingest_many(session_id, events, conflicts)
            except (GpuwsError, sqlite3.Error, OverflowError, ValueError):
                # One event the store cannot take must not cost the batch its honest
                # events: store them one by one and refuse only the one that fails.
                conflicts.clear()
                new = 0
                for ev in events:
                    try:
                        new += s.ingest_many(session_id, [ev], conflicts)
                    except (sqlite3.Error, OverflowError, ValueError) as exc:
                        failed.append(f"{type(ev).__name__} of run {ev.run_id} seq {ev.seq}: "
                                      f"{exc}")
                return new

        failed: list[str] = []
        try:
            new = await self.store.call(store_batch)
        except GpuwsError as exc:
            self.on_error(exc)
            return 0
        if failed:
            self.on_error(StoreError(f"{len(failed)} event(s) could not be stored and were "
                                     f"dropped; the first: {failed[0]}"))
        if conflicts and self.on_conflict is not None:
            self.on_conflict(conflicts)
        return new
