"""Recorded runs played back through the live panes (no Textual here).

A recording is a run's ``events.ndjson`` (one protocol event per line, exactly as the
pod wrote it) or a session in the store. Playback pushes the events into the same feed
a live link does, spaced as they were recorded (divided by ``speed``), or all at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from .. import protocol
from ..errors import UsageError
from ..sessions.store import Store

#: Longest pause between two events during playback; a recorded run that waited
#: minutes (an ncu install, say) should not make the person wait minutes again.
MAX_GAP_S = 3.0


@dataclass(frozen=True)
class Recording:
    """Events to play, and what could not be read.

    Attributes:
        label: where they came from (a file name or ``session ID``).
        events: run events, in recorded order.
        bad_lines: lines of a file that were not protocol events (reported, skipped).
    """

    label: str
    events: list[protocol.Events]
    bad_lines: list[protocol.BadLine]

    @property
    def run_ids(self) -> list[str]:
        """The runs in the recording, in order of first appearance."""
        seen: dict[str, None] = {}
        for ev in self.events:
            if ev.run_id is not None:
                seen.setdefault(ev.run_id)
        return list(seen)


def read_file(path: Path) -> Recording:
    """Read an NDJSON recording (blocking: call it from a thread).

    Raises:
        UsageError: the file cannot be read or holds no run event.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}",
                         remedy="give a run's events.ndjson, or a session id") from exc
    events: list[protocol.Events] = []
    bad: list[protocol.BadLine] = []
    for line in raw.splitlines():
        if not line.strip():
            continue
        ev = protocol.decode_event(line)
        if isinstance(ev, protocol.BadLine):
            bad.append(ev)
        elif ev.run_id is not None and ev.seq is not None:
            events.append(ev)
    if not events:
        raise UsageError(f"{path} holds no run events ({len(bad)} unreadable lines)",
                         remedy="give a run's events.ndjson (one protocol event per line)")
    return Recording(path.name, events, bad)


def read_session(store: Store, session: str, run: str | None = None) -> tuple[str, Recording]:
    """A stored session's runs (or one of them) as a recording (run on the store thread).

    Returns:
        The full session id, and the recording.

    Raises:
        StoreError: no such session or run.
    """
    row = store.session(session)
    runs = [store.run(run)] if run else store.runs(row.id)
    events: list[protocol.Events] = []
    for r in runs:
        events.extend(store.events(r.run_id))
    return row.id, Recording(f"session {row.id}", events, [])


async def play(events: list[protocol.Events], push: Callable[[protocol.Events], None], *,
               speed: float | None, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
               on_run: Callable[[str], Awaitable[None]] | None = None,
               max_gap: float = MAX_GAP_S) -> None:
    """Push events as recorded: spaced by their timestamps / ``speed``, or at once (``None``).

    ``on_run`` is awaited before the first event of each run (to open its panes). At
    once still yields to the event loop every few hundred events, so the screen keeps
    painting while a long recording loads.
    """
    prev: float | None = None
    opened: set[str] = set()
    for i, ev in enumerate(events):
        if speed is not None and prev is not None:
            gap = min(max(0.0, (ev.ts - prev) / speed), max_gap)
            if gap > 0.001:
                await sleep(gap)
        elif speed is None and i % 500 == 499:
            await sleep(0)
        prev = ev.ts
        if on_run is not None and ev.run_id is not None and ev.run_id not in opened:
            opened.add(ev.run_id)
            await on_run(ev.run_id)
        push(ev)
