"""Writing protocol frames by hand (the agent cannot import msgspec).

Every frame is ``json.dumps`` of a dict with ``ensure_ascii=True``: 7-bit clean, so it
survives a PTY and any locale, one line per message.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import IO, Any, Dict, Optional

PROTOCOL_VERSION = 1
MAX_LINE = 8 * 1024 * 1024


def dumps(event: Dict[str, Any]) -> bytes:
    """One event as an NDJSON line (with its newline)."""
    return (json.dumps(event, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
            + "\n").encode("ascii")


def make(type_: str, **fields: Any) -> Dict[str, Any]:
    """A new event dict with its tag and timestamp."""
    event: Dict[str, Any] = {"type": type_, "ts": time.time()}
    event.update(fields)
    return event


class Writer:
    """Thread-safe frame writer over a binary stream (stdout of ``serve``)."""

    def __init__(self, stream: Optional[IO[bytes]] = None) -> None:
        self._stream = stream if stream is not None else sys.stdout.buffer
        self._lock = threading.Lock()
        self.closed = False

    def send(self, event: Dict[str, Any]) -> None:
        self.send_raw(dumps(event))

    def send_raw(self, line: bytes) -> None:
        """Forward an already-encoded line (a run event read from events.ndjson)."""
        with self._lock:
            if self.closed:
                return
            try:
                self._stream.write(line)
                self._stream.flush()
            except (BrokenPipeError, OSError):
                # The laptop went away; runs go on, nothing to tell anyone.
                self.closed = True


def error(code: str, title: str, message: str, remedy: str = "",
          req: Optional[int] = None) -> Dict[str, Any]:
    event = make("error", code=code, title=title, message=message, remedy=remedy)
    if req is not None:
        event["req"] = req
    return event


