"""What a command and its master say over the unix socket.

Every message is a frame: one kind byte, a 4-byte big-endian length, the payload. JSON
control frames (``J``) open the conversation; then the bytes of one remote process go
as ``I`` (its stdin) and ``N`` (stdin's end) one way, ``O``/``E`` (its stdout/stderr),
``X`` (its end: exit status and, when the link died, why) and ``R`` (an error, as the
:class:`~gpuws.errors.GpuwsError` it was) the other. A frame's payload is at most
:data:`MAX_FRAME` bytes; a larger length, an unknown kind or bad JSON ends the
conversation (the master is the same user's, but a bug must not become a hang or a
gigabyte buffer).
"""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

from ... import errors

#: The most bytes one frame carries (the relays cut bigger writes into pieces).
MAX_FRAME = 1 << 20
KINDS = frozenset(b"JINOEXR")
_HEAD = struct.Struct(">cI")

#: The errors a master may hand back, by name: each comes back as its own class, so a
#: host-key refusal is still a HostKeyError on the command's side.
_ERRORS: dict[str, type[errors.GpuwsError]] = {
    cls.__name__: cls for cls in (
        errors.GpuwsError, errors.ConfigError, errors.UsageError, errors.ConnectError,
        errors.HostKeyError, errors.AuthError, errors.DeployError, errors.NoPythonError,
        errors.ProtocolError, errors.TransferError)}


class WireError(Exception):
    """The other side broke the socket's protocol."""


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    """One frame (payloads over :data:`MAX_FRAME` must be cut by the caller)."""
    if len(payload) > MAX_FRAME:
        raise ValueError("frame payload too large")
    return _HEAD.pack(kind, len(payload)) + payload


def frames(kind: bytes, data: bytes) -> bytes:
    """``data`` as as many ``kind`` frames as it takes."""
    return b"".join(frame(kind, data[i:i + MAX_FRAME])
                    for i in range(0, len(data), MAX_FRAME))


def control(doc: dict[str, Any]) -> bytes:
    """A ``J`` frame."""
    return frame(b"J", json.dumps(doc).encode())


async def read_frame(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """The next ``(kind, payload)``, or None at a clean end between frames.

    Raises:
        WireError: a bad kind or length, or the stream ended inside a frame.
    """
    try:
        head = await reader.readexactly(_HEAD.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise WireError("the socket closed inside a frame") from exc
    kind, size = _HEAD.unpack(head)
    if kind[0] not in KINDS:
        raise WireError(f"unknown frame kind {kind!r}")
    if size > MAX_FRAME:
        raise WireError(f"a frame of {size} bytes (at most {MAX_FRAME})")
    try:
        return kind, await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise WireError("the socket closed inside a frame") from exc


def decode(payload: bytes) -> dict[str, Any]:
    """A ``J``/``X``/``R`` payload.

    Raises:
        WireError: not a JSON object.
    """
    try:
        doc = json.loads(payload)
    except ValueError as exc:
        raise WireError("a control frame that is not JSON") from exc
    if not isinstance(doc, dict):
        raise WireError("a control frame that is not a JSON object")
    return doc


def error_frame(exc: errors.GpuwsError, **extra: Any) -> bytes:
    """An ``R`` frame carrying ``exc`` (its class by name, message, title, remedy)."""
    doc = {"error": type(exc).__name__, "message": exc.message, "title": exc.title,
           "remedy": exc.remedy, **extra}
    return frame(b"R", json.dumps(doc).encode())


def error_of(doc: dict[str, Any]) -> errors.GpuwsError:
    """The error an ``R`` payload carries (an unknown class name: a plain GpuwsError)."""
    cls = _ERRORS.get(str(doc.get("error")), errors.GpuwsError)
    return cls(str(doc.get("message", "")), str(doc.get("title") or cls.title),
               str(doc.get("remedy", "")))
