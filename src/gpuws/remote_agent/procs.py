"""Running the workload's processes: stream their output as events, keep their exit codes.

Whatever a workload prints reaches the laptop in events of bounded size: a line longer
than :data:`CHUNK_BYTES` is cut into several ``output`` events (nothing is dropped; each
piece but the last carries ``cont: true``, so the laptop can show the line whole), and
a ``\\r``-separated progress bar (tqdm writes one endless line of updates) arrives as its
updates, at most one per :data:`UPDATE_INTERVAL_S` per stream, plus every final state.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

Emit = Callable[[Dict[str, Any]], Any]
#: Starts a process as ``subprocess.Popen`` would: ``spawn(argv, cwd, env, pass_fds)``.
Spawn = Callable[[Sequence[str], str, Dict[str, str], Tuple[int, ...]], Any]

#: Longest text of one ``output`` event, in bytes of the workload's output. JSON with
#: ``ensure_ascii`` makes at most 6 bytes of one (a control byte as ``\\u00XX``), so an
#: event stays near 100 KB, far under the 8 MiB line limit of the laptop.
CHUNK_BYTES = 16 * 1024
#: Progress updates (text ended by ``\\r``) kept per stream per this many seconds: tqdm's
#: own default refresh (``mininterval=0.1``), so a tqdm bar arrives update for update,
#: while a loop that rewrites its line a million times a second cannot flood the log.
UPDATE_INTERVAL_S = 0.1
#: Longest JSON line a workload process may write to ``GPUWS_EVENT_FD``. Half the wire's
#: line limit leaves room for the envelope (run_id, seq) and for re-encoding.
EVENT_LINE_LIMIT = 4 * 1024 * 1024


class ProcResult:
    def __init__(self, argv: Sequence[str], returncode: int, wall_s: float, stdout_tail: str,
                 stderr_tail: str, timed_out: bool) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.wall_s = wall_s
        self.stdout_tail = stdout_tail
        self.stderr_tail = stderr_tail
        self.timed_out = timed_out


#: Set by the worker's SIGTERM handler; running children are terminated when it is set.
CANCELLED = {"flag": False}
#: The running children: Popen objects, or ``forkserver.ForkedProc`` (the same methods).
_CURRENT: List[Any] = []


def terminate_children() -> None:
    for proc in list(_CURRENT):
        try:
            proc.send_signal(signal.SIGTERM)
        except OSError:
            pass


#: One piece of output text: ``(text, cont)``; ``cont`` is True when the next piece of
#: the same stream continues the same line (a line cut at :data:`CHUNK_BYTES`).
Piece = Tuple[str, bool]


class OutputSplitter:
    """Cuts one output stream into bounded texts: lines, progress updates and chunks.

    A line ends at ``\\n`` (``\\r\\n`` too). Text ended by ``\\r`` alone is a progress
    update: a terminal shows it until the next text overwrites it. An update is kept
    when it has stood for ``interval_s`` (:meth:`tick`) or is the last thing the stream
    said (:meth:`close`); one overwritten sooner by a later update or by the line's end
    is dropped, as the terminal drops it. A line's end is never dropped. Any text longer
    than ``chunk_bytes`` is cut into pieces of at most that many bytes (never inside a
    UTF-8 character) whose ``cont`` flag says the next piece continues it.
    """

    def __init__(self, chunk_bytes: int = CHUNK_BYTES,
                 interval_s: float = UPDATE_INTERVAL_S) -> None:
        self.chunk_bytes = max(4, chunk_bytes)
        self.interval_s = interval_s
        self._buf = b""
        self._pending: Optional[bytes] = None  # the latest update not yet kept
        self._last_update = -1e18
        self._open_cut = False  # the text in ``_buf`` began in pieces already sent

    def feed(self, data: bytes, now: float) -> List[Piece]:
        """The pieces that ``data`` completes (the rest waits for more)."""
        out: List[Piece] = []
        buf = self._buf + data
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            cr = buf.find(b"\r", start)
            if cr < 0 or (0 <= nl < cr):
                if nl < 0:
                    break
                self._pending = None  # the line's end overwrites any unkept update
                self._cut(buf[start:nl], out, last=True)
                self._open_cut = False
                start = nl + 1
                continue
            end = cr
            while end < len(buf) and buf[end:end + 1] == b"\r":
                end += 1
            if end == len(buf):
                break  # "\r" at the end: a "\n" may follow, which makes it a line end
            segment = buf[start:cr]
            if buf[end:end + 1] == b"\n":
                self._pending = None
                self._cut(segment, out, last=True)
                self._open_cut = False
                start = end + 1
                continue
            start = end
            if self._open_cut:
                # The update began in pieces already sent: its end must follow them.
                self._cut(segment, out, last=True)
                self._pending, self._open_cut = None, False
            elif segment:
                self._update(segment, now, out)
        rest = buf[start:]
        while len(rest) > self.chunk_bytes:
            # A line with no end in sight (20 MB without a newline): send what is here.
            cut = _utf8_boundary(rest, self.chunk_bytes)
            self._pending, self._open_cut = None, True
            out.append((rest[:cut].decode("utf-8", "replace"), True))
            rest = rest[cut:]
        self._buf = rest
        return out

    def tick(self, now: float) -> List[Piece]:
        """The pending update, once it has stood for the interval."""
        out: List[Piece] = []
        if self._pending is not None and now - self._last_update >= self.interval_s:
            self._cut(self._pending, out, last=True)
            self._pending = None
            self._last_update = now
        return out

    def close(self) -> List[Piece]:
        """What is left when the stream ends: the unended line, else the last update."""
        out: List[Piece] = []
        rest = self._buf.rstrip(b"\r")
        if rest:
            self._cut(rest, out, last=True)
        elif self._pending is not None:
            self._cut(self._pending, out, last=True)
        elif self._open_cut:
            out.append(("", False))  # the cut line ended with the stream
        self._buf, self._pending, self._open_cut = b"", None, False
        return out

    def _update(self, segment: bytes, now: float, out: List[Piece]) -> None:
        if now - self._last_update >= self.interval_s:
            self._cut(segment, out, last=True)
            self._pending = None
            self._last_update = now
        else:
            self._pending = segment

    def _cut(self, raw: bytes, out: List[Piece], last: bool) -> None:
        while len(raw) > self.chunk_bytes:
            cut = _utf8_boundary(raw, self.chunk_bytes)
            out.append((raw[:cut].decode("utf-8", "replace"), True))
            raw = raw[cut:]
        out.append((raw.decode("utf-8", "replace"), not last))


def _utf8_boundary(data: bytes, limit: int) -> int:
    """The largest cut <= ``limit`` that does not split a UTF-8 character."""
    cut = limit
    # Step back over continuation bytes (10xxxxxx), at most 3: a character is <= 4 bytes.
    while cut > limit - 3 and data[cut] & 0xC0 == 0x80:
        cut -= 1
    return cut


class EventLines:
    """Lines of the ``GPUWS_EVENT_FD`` pipe, each at most ``limit`` bytes.

    A process that writes more than ``limit`` bytes without a newline gets that line
    dropped (one warning for it), and memory stays at ``limit`` whatever it writes.
    """

    def __init__(self, limit: int = EVENT_LINE_LIMIT) -> None:
        self.limit = limit
        self._buf = b""
        self._skipping = False

    def feed(self, data: bytes, warn: Callable[[str], None]) -> List[bytes]:
        lines = (self._buf + data).split(b"\n")
        self._buf = lines.pop()
        if self._skipping and lines:
            lines.pop(0)  # the end of the oversized line
            self._skipping = False
        if not self._skipping and len(self._buf) > self.limit:
            warn("an event from the workload process over %d bytes was dropped" % self.limit)
            self._skipping = True
        if self._skipping:
            self._buf = b""
        kept = []
        for line in lines:
            if len(line) > self.limit:
                warn("an event from the workload process over %d bytes was dropped"
                     % self.limit)
            elif line.strip():
                kept.append(line)
        return kept


def run_streaming(argv: Sequence[str], *, emit: Emit, tier: Optional[int], cwd: str,
                  env: Dict[str, str], timeout_s: Optional[float] = None,
                  on_chunk: Optional[Callable[[str, str], None]] = None,
                  line_filter: Optional[Callable[[str], bool]] = None,
                  child_events: bool = False, tail_chars: int = 65536,
                  spawn: Optional[Spawn] = None) -> ProcResult:
    """Run ``argv``, emitting its output as ``output`` events (see :class:`OutputSplitter`).

    ``on_chunk(stream, text)`` sees raw chunks as they arrive (ncu's progress dots come
    without newlines). ``line_filter(text)`` returning False keeps a text out of the
    output events (ncu's own ==PROF== lines are shown as progress instead).
    With ``child_events`` the child gets a pipe in ``GPUWS_EVENT_FD`` and every JSON line
    it writes there is emitted as an event: a workload's own prints on stdout can never
    be mistaken for protocol frames.
    ``spawn(argv, cwd, env, pass_fds)`` starts the process instead of ``subprocess.Popen``
    (the fork server's :class:`forkserver.ForkedProc`, which has Popen's methods).
    """
    start = time.time()
    read_fd = write_fd = -1
    if child_events:
        read_fd, write_fd = os.pipe()
        env = dict(env, GPUWS_EVENT_FD=str(write_fd))
    try:
        if spawn is not None:
            proc = spawn(list(argv), cwd, env, (write_fd,) if child_events else ())
        else:
            proc = subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    pass_fds=(write_fd,) if child_events else ())
    except BaseException:
        if read_fd >= 0:
            os.close(read_fd)
        raise
    finally:
        if write_fd >= 0:
            os.close(write_fd)
    _CURRENT.append(proc)
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    open_streams = 2
    if read_fd >= 0:
        sel.register(read_fd, selectors.EVENT_READ, "events")
        open_streams = 3
    splitters = {"stdout": OutputSplitter(), "stderr": OutputSplitter()}
    event_lines = EventLines()
    tails = {"stdout": "", "stderr": ""}
    timed_out = False
    batch: List[Dict[str, object]] = []
    last_flush = time.time()

    def flush() -> None:
        for ev in batch:
            emit(ev)
        del batch[:]

    def warn(message: str) -> None:
        flush()
        emit({"type": "log", "level": "warning", "message": message})

    # Per stream: inside a cut line (its first piece was seen), and whether that line was
    # filtered out. The filter sees a line's first piece only and drops all of its pieces,
    # so a kept piece with ``cont`` is always followed by the rest of its line.
    in_line = {"stdout": False, "stderr": False}
    dropping = {"stdout": False, "stderr": False}

    def add(stream: str, pieces: List[Piece]) -> None:
        for text, cont in pieces:
            if not in_line[stream]:
                dropping[stream] = line_filter is not None and not line_filter(text)
            in_line[stream] = cont
            if dropping[stream]:
                continue
            ev: Dict[str, object] = {"type": "output", "stream": stream, "text": text,
                                     "ts": time.time()}
            if tier is not None:
                ev["tier"] = tier
            if cont:
                # The next output event of this stream continues this line (the laptop
                # joins them for display; protocol.Output.cont).
                ev["cont"] = True
            batch.append(ev)

    try:
        while open_streams:
            if timeout_s is not None and time.time() - start > timeout_s and not timed_out:
                timed_out = True
                proc.kill()
            for key, _ in sel.select(timeout=UPDATE_INTERVAL_S):
                name = str(key.data)
                fd = key.fileobj if isinstance(key.fileobj, int) else key.fileobj.fileno()
                data = os.read(fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                    if name != "events":
                        add(name, splitters[name].close())
                    continue
                if name == "events":
                    lines = event_lines.feed(data, warn)
                    flush()  # keep output and child events in the order they happened
                    for raw in lines:
                        _child_event(raw, emit)
                    continue
                text = data.decode("utf-8", "replace")
                tails[name] = (tails[name] + text)[-tail_chars:]
                if on_chunk is not None:
                    on_chunk(name, text)
                add(name, splitters[name].feed(data, time.time()))
            now = time.time()
            for name, splitter in splitters.items():
                add(name, splitter.tick(now))
            if batch and (len(batch) >= 200 or now - last_flush > 0.05):
                flush()
                last_flush = now
        flush()
        returncode = proc.wait()
    finally:
        sel.close()
        if read_fd >= 0:
            os.close(read_fd)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _CURRENT.remove(proc)
    return ProcResult(argv, returncode, time.time() - start, tails["stdout"], tails["stderr"],
                      timed_out)


def _child_event(raw: bytes, emit: Emit) -> None:
    try:
        event = json.loads(raw.decode("utf-8"))
        if not isinstance(event, dict) or "type" not in event:
            raise ValueError("not an event object")
    except (ValueError, RecursionError) as exc:
        emit({"type": "log", "level": "warning",
              "message": "unreadable event from the workload process dropped: %s"
                         % ("%s" % exc)[:200]})
        return
    emit(event)
