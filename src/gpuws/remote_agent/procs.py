"""Running the workload's processes: stream their output as events, keep their exit codes."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from typing import Callable, Dict, List, Optional, Sequence

Emit = Callable[[Dict[str, object]], None]


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
                  pass_fds: Sequence[int] = (), line_filter: Optional[Callable[[str], bool]] = None,
                  tail_chars: int = 65536) -> ProcResult:
    """Run ``argv``, emitting each complete output line as an ``output`` event.

    ``on_chunk(stream, text)`` sees raw chunks as they arrive (ncu's progress dots come
    without newlines). ``line_filter(line)`` returning False keeps a line out of the
    output events (ncu's own ==PROF== lines are shown as progress instead).
    """
    start = time.time()
    proc = subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            pass_fds=tuple(pass_fds))
    _CURRENT.append(proc)
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    partial = {"stdout": b"", "stderr": b""}
    tails = {"stdout": "", "stderr": ""}
    timed_out = False
    batch: List[Dict[str, object]] = []
    last_flush = time.time()

    def flush() -> None:
        for ev in batch:
            emit(ev)
        del batch[:]

    try:
        open_streams = 2
        while open_streams:
            if timeout_s is not None and time.time() - start > timeout_s and not timed_out:
                timed_out = True
                proc.kill()
            for key, _ in sel.select(timeout=0.1):
                name = str(key.data)
                data = os.read(key.fileobj.fileno(), 65536)  # type: ignore[union-attr]
                if not data:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                    if partial[name]:
                        _line(partial[name], name, tier, batch, line_filter)
                        partial[name] = b""
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
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _CURRENT.remove(proc)
    return ProcResult(argv, returncode, time.time() - start, tails["stdout"], tails["stderr"],
                      timed_out)


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
