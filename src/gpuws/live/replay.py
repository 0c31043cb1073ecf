"""Recorded runs played back through the live panes (no Textual here).

A recording is a run's ``events.ndjson`` (one protocol event per line, exactly as the
pod wrote it) or a session in the store. Playback pushes the events into the same feed
a live link does, spaced as they were recorded (divided by ``speed``), or all at once.
"""

from __future__ import annotations

import asyncio
import math
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from .. import protocol
from ..errors import StoreError, UsageError
from ..sessions.store import Store

#: Longest pause between two events during playback; a recorded run that waited
#: minutes (an ncu install, say) should not make the person wait minutes again.
MAX_GAP_S = 3.0
#: Largest recording file replayed. A run's events.ndjson is a few MB (the H200 saxpy run:
#: 34 events, 17 KB; a 10 s Tier 1 of 1 µs calls: ~4 MB); the file is read as it plays,
#: never whole, and this bounds what a hostile file can make the throwaway store hold.
MAX_RECORDING_BYTES = 256 * 2**20
#: Most runs one recording file may hold; events of runs past these are skipped and
#: counted (300 run ids in 100 KB once opened 300 screens and crashed the TUI).
MAX_RUNS = 256
#: Events read per step from the file (read off the event loop, a step at a time).
BATCH = 500
#: Events waiting to be stored before playback waits for the store (an instant replay of a
#: large file would otherwise hold all of it in the feed's queue).
MAX_BACKLOG = 20_000

_REMEDY = "give a run's events.ndjson (one protocol event per line), or a session id " \
          "(`gpuws sessions` lists them)"


def check_speed(speed: float | None) -> None:
    """Refuse a pace that is no pace (before anything opens).

    Raises:
        UsageError: ``speed`` is zero, negative or not a number.
    """
    if speed is not None and not (math.isfinite(speed) and speed > 0):
        raise UsageError(f"--speed {speed:g}: the speed must be a number above 0",
                         remedy="--speed 4 plays four times faster, --speed 0.5 at half "
                                "speed; --instant shows everything at once")


@dataclass
class RecordingFile:
    """A recording file, read a batch at a time (never whole).

    Attributes:
        path: the file.
        only_run: keep this run's events only (``--run``).
        bad_lines: lines that were not protocol events (counted; the first kept).
        first_bad: the first of them, for the notice.
        skipped_events: events of runs past the first :data:`MAX_RUNS`, skipped.
        events: run events handed out so far.
        run_ids: the runs seen, in order of first appearance.
    """

    path: Path
    only_run: str | None = None
    bad_lines: int = 0
    first_bad: protocol.BadLine | None = None
    skipped_events: int = 0
    events: int = 0
    run_ids: dict[str, None] = field(default_factory=dict)
    _file: BinaryIO | None = None
    _read: int = 0
    _back: list[protocol.Events] = field(default_factory=list)

    @property
    def at_end(self) -> bool:
        """Whether the whole file was read and handed out (or it was never opened)."""
        return self._file is None and not self._back

    @property
    def label(self) -> str:
        """The file's name, as notices say it."""
        return self.path.name

    def open(self) -> RecordingFile:
        """Open the file after checking it is a regular file within the size bound.

        Raises:
            UsageError: a folder, a FIFO or device, too large, or unreadable.
        """
        path = self.path
        try:
            # O_NONBLOCK: a FIFO planted under the name must not block the open; it is
            # refused just below as not a regular file.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror or exc}",
                             remedy=_REMEDY) from exc
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            what = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise UsageError(f"{path} is {what}", remedy=_REMEDY)
        if info.st_size > MAX_RECORDING_BYTES:
            os.close(fd)
            raise UsageError(f"{path} is {info.st_size:,} bytes; recordings of at most "
                             f"{MAX_RECORDING_BYTES // 2**20} MiB are replayed",
                             remedy="replay one run's events.ndjson, or the stored session "
                                    "by its id (`gpuws sessions` lists them)")
        os.set_blocking(fd, True)
        self._file = os.fdopen(fd, "rb")
        return self

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def batch(self, size: int = BATCH) -> list[protocol.Events]:
        """The next run events (blocking: call it from a thread); ``[]`` at the end."""
        out, self._back = self._back, []
        f = self._file
        while f is not None and len(out) < size:
            line = f.readline(protocol.MAX_LINE + 1)
            if not line:
                self.close()
                break
            self._read += len(line)
            if self._read > MAX_RECORDING_BYTES:  # it grew while being read
                self._bad(protocol.BadLine("the file grew past the replay bound", "", 0))
                self.close()
                break
            if len(line) > protocol.MAX_LINE and not line.endswith(b"\n"):
                self._skip_rest_of_line(f)
                self._bad(protocol.BadLine(f"a line over the {protocol.MAX_LINE}-byte limit",
                                           line[:120].decode("utf-8", "replace"), len(line)))
                continue
            if not line.strip():
                continue
            ev = protocol.decode_event(line)
            if isinstance(ev, protocol.BadLine):
                self._bad(ev)
            elif ev.run_id is not None and ev.seq is not None and self._admit(ev.run_id):
                out.append(ev)
        self.events += len(out)
        return out

    def unread(self, events: list[protocol.Events]) -> None:
        """Put events back: the next :meth:`batch` hands them out first."""
        self.events -= len(events)
        self._back = events + self._back

    def _admit(self, run_id: str) -> bool:
        if self.only_run is not None and run_id != self.only_run:
            return False
        if run_id in self.run_ids:
            return True
        if len(self.run_ids) >= MAX_RUNS:
            self.skipped_events += 1
            return False
        self.run_ids[run_id] = None
        return True

    def _skip_rest_of_line(self, f: BinaryIO) -> None:
        while True:
            chunk = f.readline(1 << 20)
            self._read += len(chunk)
            if not chunk or chunk.endswith(b"\n"):
                return

    def _bad(self, bad: protocol.BadLine) -> None:
        self.bad_lines += 1
        if self.first_bad is None:
            self.first_bad = bad


def check_file(path: Path, run: str | None = None) -> None:
    """Check a recording before anything opens: a regular file within the bound, holding at
    least one run event (of ``run``, when given). Reads only up to the first one.

    Raises:
        UsageError: why it cannot be replayed, with a remedy.
    """
    rec = RecordingFile(path, only_run=run).open()
    try:
        while not rec.at_end:
            if rec.batch(1):
                return
    finally:
        rec.close()
    which = f" of run {run}" if run else ""
    raise UsageError(f"{path} holds no run events{which} ({rec.bad_lines:,} unreadable "
                     "lines)", remedy=_REMEDY)


def check_session(store: Store, session: str, run: str | None = None) -> None:
    """Check that ``session`` (and ``run`` in it) is stored, before anything opens.

    Raises:
        UsageError: neither a file nor a stored session (or run) of that name.
    """
    try:
        row = store.session(session)
    except StoreError as exc:
        raise UsageError(f"{session}: no such file, nor a stored session ({exc.message})",
                         remedy=_REMEDY) from exc
    if run is None:
        return
    try:
        found = store.run(run)
    except StoreError as exc:
        found = None
        why = exc.message
    if found is None or found.session_id != row.id:
        raise UsageError(f"--run {run}: no such run in session {row.id}"
                         + (f" ({why})" if found is None else ""),
                         remedy=f"`gpuws history {row.id}` lists that session's runs")


async def stream(rec: RecordingFile) -> AsyncIterator[protocol.Events]:
    """The recording's events, a batch at a time read off the event loop."""
    try:
        while True:
            batch = await asyncio.to_thread(rec.batch)
            if not batch:
                return
            for ev in batch:
                yield ev
    finally:
        rec.close()


@dataclass(frozen=True)
class Recording:
    """A stored session's events, to play.

    Attributes:
        label: where they came from (``session ID``).
        events: run events, in recorded order.
    """

    label: str
    events: list[protocol.Events]


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
    return row.id, Recording(f"session {row.id}", events)


async def _each(events: Iterable[protocol.Events] | AsyncIterator[protocol.Events]
                ) -> AsyncIterator[protocol.Events]:
    if isinstance(events, AsyncIterator):
        async for ev in events:
            yield ev
    else:
        for ev in events:
            yield ev


async def play(events: Iterable[protocol.Events] | AsyncIterator[protocol.Events],
               push: Callable[[protocol.Events], None], *,
               speed: float | None, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
               on_run: Callable[[str], Awaitable[None]] | None = None,
               max_gap: float = MAX_GAP_S, backlog: Callable[[], int] | None = None,
               drained: Callable[[], Awaitable[None]] | None = None) -> int:
    """Push events as recorded: spaced by their timestamps / ``speed``, or at once (``None``).

    ``on_run`` is awaited before the first event of each run (to open its panes). At
    once still yields to the event loop every few hundred events, so the screen keeps
    painting while a long recording loads; and when ``backlog()`` passes
    :data:`MAX_BACKLOG`, playback waits for ``drained()`` (the store catching up).

    Returns:
        How many events were pushed.
    """
    check_speed(speed)
    prev: float | None = None
    opened: set[str] = set()
    i = 0
    async for ev in _each(events):
        if speed is not None and prev is not None:
            gap = min(max(0.0, (ev.ts - prev) / speed), max_gap)
            if gap > 0.001:
                await sleep(gap)
        elif speed is None and i % 500 == 499:
            await sleep(0)
            if backlog is not None and drained is not None and backlog() > MAX_BACKLOG:
                await drained()
        prev = ev.ts
        if on_run is not None and ev.run_id is not None and ev.run_id not in opened:
            opened.add(ev.run_id)
            await on_run(ev.run_id)
        push(ev)
        i += 1
    return i
