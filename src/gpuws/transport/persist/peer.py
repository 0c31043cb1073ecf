"""Who is at the other end of a unix socket (the kernel's word, not the peer's)."""

from __future__ import annotations

import socket
import struct
from typing import Any

#: ``struct ucred``: pid, uid, gid (Linux ``SO_PEERCRED``).
_UCRED = struct.Struct("=iII")
#: ``struct xucred``'s head: version, uid (macOS/BSD ``LOCAL_PEERCRED``, level SOL_LOCAL 0).
_XUCRED_HEAD = struct.Struct("=IIh")
_XUCRED_SIZE = 76


def peer_uid(sock: Any) -> int | None:
    """The uid of the process at the other end of the connected unix socket ``sock``
    (as of its ``connect``/``listen``), or None where this system cannot tell.

    Args:
        sock: a :class:`socket.socket` or asyncio's ``TransportSocket``.
    """
    if hasattr(socket, "SO_PEERCRED"):
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        return int(_UCRED.unpack(raw)[1])
    local_peercred = getattr(socket, "LOCAL_PEERCRED", None)
    if local_peercred is not None:  # macOS and the BSDs (not tested here: Linux only)
        raw = sock.getsockopt(0, local_peercred, _XUCRED_SIZE)
        return int(_XUCRED_HEAD.unpack_from(raw)[1])
    return None
