"""Opening files a workload could have planted, without blocking or following links.

A workload runs as the same user as the agent and owns its run directory: where a
regular file is expected it can leave a FIFO (``open`` blocks until a writer comes), a
device or a link to one (``/dev/zero`` never ends), a link out of the run directory, or
a file that keeps growing. Everything the worker and ``serve`` read from a run directory
goes through :func:`open_regular`, and reads stop at the size the file had when opened.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import time
from typing import Any, Dict, List, Optional, Tuple


class NotRegular(OSError):
    """The path is not a regular file (a FIFO, a device, a link, a directory)."""


def kind_of(mode: int) -> str:
    """What a file of ``mode`` is, in words ("a FIFO")."""
    for test, what in ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return what
    return "not a regular file"


def open_regular(path: str, flags: int = os.O_RDONLY, mode: int = 0o600
                 ) -> Tuple[int, os.stat_result]:
    """Open a regular file for reading without ever blocking or following a link.

    ``O_NOFOLLOW`` refuses a symlink at the last component; ``O_NONBLOCK`` makes opening
    a FIFO return at once; ``fstat`` of what was really opened (not an earlier ``lstat``,
    which a race could outdate) decides. ``flags`` add to ``O_RDONLY`` (``O_WRONLY |
    O_APPEND | O_CREAT`` for a log); opening a FIFO for writing without a reader fails
    with ``ENXIO`` instead of blocking. The fd is left non-blocking, which changes
    nothing for a regular file.

    Raises:
        NotRegular: it is a FIFO, device, socket, directory or symlink.
        OSError: it cannot be opened.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                     | getattr(os, "O_NOCTTY", 0), mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegular(errno.ELOOP, "it is a symlink, not a regular file") from exc
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO some systems refuse to open
            raise NotRegular(errno.ENXIO, "it is not a regular file") from exc
        raise
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegular(errno.EINVAL, "it is %s, not a regular file" % kind_of(st.st_mode))
    return fd, st


def sha256_regular(path: str, deadline: Optional[float] = None,
                   budget: Optional[List[int]] = None) -> Tuple[int, str]:
    """Size and sha256 of a regular file, up to the size it had when opened.

    A file still growing is hashed as it was at that size (the size announced, which is
    where a pull stops). ``deadline`` (``time.monotonic``) and ``budget`` (bytes left,
    decreased in place) bound the work.

    Raises:
        NotRegular: not a regular file; one that shrank while hashed; one over the
            deadline or the byte budget.
        OSError: it cannot be read.
    """
    fd, st = open_regular(path)
    try:
        size = st.st_size
        if budget is not None and size > budget[0]:
            raise NotRegular(errno.EFBIG, "its %d bytes are over the hashing budget left "
                                          "(%d bytes)" % (size, budget[0]))
        h = hashlib.sha256()
        left = size
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                raise NotRegular(errno.EIO, "it shrank while it was hashed (%d of %d bytes)"
                                 % (size - left, size))
            h.update(chunk)
            left -= len(chunk)
            if deadline is not None and time.monotonic() > deadline:
                raise NotRegular(errno.ETIME, "hashing it took over the time budget")
        if budget is not None:
            budget[0] -= size
        return size, h.hexdigest()
    finally:
        os.close(fd)


def read_regular(path: str, limit: int) -> bytes:
    """At most ``limit`` bytes from the start of a regular file (see :func:`open_regular`)."""
    fd, _st = open_regular(path)
    try:
        parts = []
        while limit > 0:
            chunk = os.read(fd, min(limit, 1 << 20))
            if not chunk:
                break
            parts.append(chunk)
            limit -= len(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def read_tail(path: str, limit: int) -> bytes:
    """The last ``limit`` bytes of a regular file, as its size was when opened."""
    fd, st = open_regular(path)
    try:
        start = max(0, st.st_size - limit)
        os.lseek(fd, start, os.SEEK_SET)
        parts = []
        left = st.st_size - start
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def read_json_dict(path: str) -> Dict[str, Any]:
    """A JSON object this pod's agent wrote (what it learnt), or ``{}`` when there is none
    or it is not one: such files are a cache, and a damaged one only costs a retry."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json_best_effort(path: str, data: Dict[str, Any]) -> None:
    """Write ``data`` whole or not at all (a temp file renamed over ``path``); a full or
    read-only cache leaves the old file and no temp file behind."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
