"""The one data flow: every event goes into the store first, then to the panes.

Events arrive from the agent link (or a replay) one by one, on the event loop. The
feed collects them, stores a whole batch in one transaction on the store's thread,
and only then hands the batch to the panes. While one batch is being stored the next
one gathers, so the batch size follows the arrival rate by itself: one event at a
time when the stream is slow, thousands per transaction (and one repaint) when it is
fast. Batching is how bursts coalesce; nothing is ever dropped or reordered.

The backlog is bounded: the agent client asks :meth:`EventFeed.room` after each chunk it
hands on, and waits while more than :data:`MAX_BACKLOG_BYTES` (of the wire's bytes) or
:data:`MAX_BACKLOG_EVENTS` events wait to be stored and delivered. While it waits it reads
nothing, so the SSH channel's window fills and the pod's ``serve`` stops sending; the run
goes on writing its ``events.ndjson`` on the pod's disk, and the rest comes when the store
has caught up. Nothing is lost by waiting, and the backlog stays bounded however fast
the pod sends.
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
#: Events received but not yet stored and delivered before the reader waits (two batches).
MAX_BACKLOG_EVENTS = 2 * MAX_BATCH
#: Bytes (as they came over the wire) of those events before the reader waits. A `yes`
#: flood held 479 MB to 2.97 GB on the laptop while the store lagged, before this bound.
MAX_BACKLOG_BYTES = 8 << 20


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
        #: Wire bytes of each pending event (0 until the reader says what they cost).
        self._sizes: list[int] = []
        self._unsized = 0
        #: Wire bytes of the events received and not yet stored and delivered.
        self.backlog_bytes = 0
        #: Events of that backlog (pending, or in the batch being stored).
        self._held = 0
        #: The most bytes / events the backlog ever held, and how often the reader waited.
        self.peak_backlog_bytes = 0
        self.peak_backlog = 0
        self.pauses = 0
        self._room = asyncio.Event()
        self._room.set()
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
        self._sizes.append(0)
        self._unsized += 1
        self._held += 1
        self.peak_backlog = max(self.peak_backlog, self._held)
        self._idle.clear()
        self._wake.set()

    @property
    def backlog(self) -> int:
        """Events received but not yet stored and delivered."""
        return self._held

    def received(self, nbytes: int) -> None:
        """The events pushed since the last call came in ``nbytes`` bytes of the wire.

        The reader calls it after each chunk it hands on; the bytes are shared among those
        events, so the backlog is known in bytes as well as in events.
        """
        if self._unsized:
            share, extra = divmod(nbytes, self._unsized)
            sizes = self._sizes
            for i in range(len(sizes) - self._unsized, len(sizes)):
                sizes[i] = share
            sizes[-1] += extra
            self._unsized = 0
            self.backlog_bytes += nbytes
            self.peak_backlog_bytes = max(self.peak_backlog_bytes, self.backlog_bytes)
        if self.backlog_bytes > MAX_BACKLOG_BYTES or self._held > MAX_BACKLOG_EVENTS:
            self._room.clear()

    async def room(self) -> None:
        """Wait until the backlog is back under half its bounds (at once when it is)."""
        if not self._room.is_set():
            self.pauses += 1
            await self._room.wait()

    def _released(self, events: int, nbytes: int) -> None:
        self._held -= events
        self.backlog_bytes -= nbytes
        # Half the bounds: the reader resumes with room for a good run of reads, rather
        # than waking for every batch the store finishes.
        if (self.backlog_bytes <= MAX_BACKLOG_BYTES // 2
                and self._held <= MAX_BACKLOG_EVENTS // 2):
            self._room.set()

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
                sizes, self._sizes = self._sizes[:MAX_BATCH], self._sizes[MAX_BATCH:]
                self._unsized = min(self._unsized, len(self._sizes))
                try:
                    new = await self._store(events)
                    self.deliver(Batch(events, arrived, new))
                finally:
                    self._released(len(events), sum(sizes))
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
