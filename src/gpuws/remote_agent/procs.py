"""Running the workload's processes: stream their output as events, keep their exit codes."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

Emit = Callable[[Dict[str, Any]], Any]


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
_CURRENT: List["subprocess.Popen[bytes]"] = []


def terminate_children() -> None:
    for proc in list(_CURRENT):
        try:
            proc.send_signal(signal.SIGTERM)
        except OSError:
            pass


def run_streaming(argv: Sequence[str], *, emit: Emit, tier: Optional[int], cwd: str,
                  env: Dict[str, str], timeout_s: Optional[float] = None,
                  on_chunk: Optional[Callable[[str, str], None]] = None,
                  line_filter: Optional[Callable[[str], bool]] = None,
                  child_events: bool = False, tail_chars: int = 65536) -> ProcResult:
    """Run ``argv``, emitting each complete output line as an ``output`` event.

    ``on_chunk(stream, text)`` sees raw chunks as they arrive (ncu's progress dots come
    without newlines). ``line_filter(line)`` returning False keeps a line out of the
    output events (ncu's own ==PROF== lines are shown as progress instead).
    With ``child_events`` the child gets a pipe in ``GPUWS_EVENT_FD`` and every JSON line
    it writes there is emitted as an event: a workload's own prints on stdout can never
    be mistaken for protocol frames.
    """
    start = time.time()
    read_fd = write_fd = -1
    if child_events:
        read_fd, write_fd = os.pipe()
        env = dict(env, GPUWS_EVENT_FD=str(write_fd))
    try:
        proc = subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=(write_fd,) if child_events else ())
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
    partial = {"stdout": b"", "stderr": b"", "events": b""}
    tails = {"stdout": "", "stderr": ""}
    timed_out = False
    batch: List[Dict[str, object]] = []
    last_flush = time.time()

    def flush() -> None:
        for ev in batch:
            emit(ev)
        del batch[:]

    try:
        while open_streams:
            if timeout_s is not None and time.time() - start > timeout_s and not timed_out:
                timed_out = True
                proc.kill()
            for key, _ in sel.select(timeout=0.1):
                name = str(key.data)
                fd = key.fileobj if isinstance(key.fileobj, int) else key.fileobj.fileno()
                data = os.read(fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                    if partial[name] and name != "events":
                        _line(partial[name], name, tier, batch, line_filter)
                    partial[name] = b""
                    continue
                if name == "events":
                    lines = (partial[name] + data).split(b"\n")
                    partial[name] = lines.pop()
                    flush()  # keep output and child events in the order they happened
                    for raw in lines:
                        if raw.strip():
                            _child_event(raw, emit)
                    continue
                text = data.decode("utf-8", "replace")
                tails[name] = (tails[name] + text)[-tail_chars:]
                if on_chunk is not None:
                    on_chunk(name, text)
                lines = (partial[name] + data).split(b"\n")
                partial[name] = lines.pop()
                for raw in lines:
                    _line(raw, name, tier, batch, line_filter)
            if batch and (len(batch) >= 200 or time.time() - last_flush > 0.05):
                flush()
                last_flush = time.time()
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
    except ValueError as exc:
        emit({"type": "log", "level": "warning",
              "message": "unreadable event from the workload process dropped: %s" % exc})
        return
    emit(event)


def _line(raw: bytes, stream: str, tier: Optional[int], batch: List[Dict[str, object]],
          line_filter: Optional[Callable[[str], bool]]) -> None:
    text = raw.decode("utf-8", "replace").rstrip("\r")
    if line_filter is not None and not line_filter(text):
        return
    ev: Dict[str, object] = {"type": "output", "stream": stream, "text": text,
                             "ts": time.time()}
    if tier is not None:
        ev["tier"] = tier
    batch.append(ev)
