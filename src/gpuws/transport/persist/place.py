"""Where a kept connection's socket lives, and the checks before one is trusted.

The socket sits in ``<runtime dir>/gpuws/``: ``$XDG_RUNTIME_DIR`` (``/run/user/UID``, a
tmpfs the login manager makes 0700 and removes at logout) where it is set, else
platformdirs' runtime dir for the platform. The ``gpuws`` directory is made 0700 and
checked every time before use, never repaired: it must be a real directory (not a
symbolic link), owned by this user, with no group or other permission bits, in a parent
that only its owner (this user or root) can rename things in. Anything else is refused
in one line, and the command connects by itself as it did before persistence.

One socket per host identity: a hash of the target as OpenSSH's rules resolved it
(user, address, port, jump hosts, proxy command, keys...), the config file named with
``-F``, the transport asked for (``--pty``) and this gpuws's version, so a master of
another version or for a differently-configured spelling of the host is never reused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path

from ... import __version__
from ..sshconfig import SSHTarget

#: The socket conversation's version; a master answering another one is not used.
PERSIST_VERSION = 1
#: ``sun_path`` holds 108 bytes on Linux and 104 on macOS, with its NUL: beyond this a
#: socket cannot be bound, so the connection is not kept (one line says why).
MAX_SOCKET_PATH = 100


class PlaceError(Exception):
    """The runtime directory cannot be trusted or used; the message says why and what to do."""


@dataclass(frozen=True)
class Place:
    """The files of one host identity's master.

    Attributes:
        identity: the identity hash (hex), also told in the hello.
        socket: the unix socket later commands connect to.
        lock: held while a master is found or made, and by a master removing its socket.
        log: the master's stderr (0600), read when it fails before it is ready.
    """

    identity: str
    socket: Path
    lock: Path
    log: Path


def runtime_base() -> Path:
    """The person's runtime directory (not made here)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg):
        return Path(xdg)
    import platformdirs

    with warnings.catch_warnings():
        # Without XDG_RUNTIME_DIR platformdirs warns and falls back to /tmp/runtime-UID,
        # which private_dir then makes and checks like any other.
        warnings.simplefilter("ignore")
        return Path(platformdirs.user_runtime_dir())


def private_dir(base: Path | None = None) -> Path:
    """``<base>/gpuws``, made 0700 if missing, then checked.

    Raises:
        PlaceError: the directory (or its parent) is not this user's alone.
    """
    base = runtime_base() if base is None else base
    where = base / "gpuws"
    for directory in (base, where):
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise PlaceError(f"cannot make {directory}: {exc.strerror or exc} (set "
                             "XDG_RUNTIME_DIR to a private directory)") from exc
    check_parent(base)
    check_private(where)
    return where


def check_parent(base: Path) -> None:
    """``base`` must not let another user swap our directory: owned by us or root, and
    writable by nobody else unless sticky (``/tmp``).

    Raises:
        PlaceError: it does.
    """
    try:
        st = os.stat(base)
    except OSError as exc:
        raise PlaceError(f"cannot read {base}: {exc.strerror or exc}") from exc
    if st.st_uid not in (os.geteuid(), 0):
        raise PlaceError(f"{base} belongs to uid {st.st_uid}, not to you (uid "
                         f"{os.geteuid()}): set XDG_RUNTIME_DIR to a directory of your own")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise PlaceError(f"{base} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}) "
                         "and not sticky: set XDG_RUNTIME_DIR to a private directory")


def check_private(where: Path) -> None:
    """``where`` must be a directory (not a link) owned by us, mode 0700 or tighter.

    Raises:
        PlaceError: it is not; nothing is changed (a wrong mode is a sign, not a typo).
    """
    try:
        st = os.lstat(where)
    except OSError as exc:
        raise PlaceError(f"cannot read {where}: {exc.strerror or exc}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise PlaceError(f"{where} is a symbolic link: remove it (gpuws makes it again, 0700)")
    if not stat.S_ISDIR(st.st_mode):
        raise PlaceError(f"{where} is not a directory: remove it (gpuws makes it again, 0700)")
    if st.st_uid != os.geteuid():
        raise PlaceError(f"{where} belongs to uid {st.st_uid}, not to you (uid "
                         f"{os.geteuid()}): remove it")
    if st.st_mode & 0o077:
        raise PlaceError(f"{where} is mode {stat.S_IMODE(st.st_mode):04o}, not 0700: others "
                         f"could reach your pods through it; `chmod 700 {where}` or remove it")


def identity(target: SSHTarget, *, destination: str, config_file: str | None,
             pty: bool | None) -> str:
    """The identity hash of a host as resolved (see the module notes).

    Args:
        target: the target OpenSSH's rules resolved.
        destination: the host as given.
        config_file: ``-F FILE`` (made absolute: the same name from two directories is two
            files).
        pty: ``--pty`` (True) or detection (None).

    Returns:
        64 hex digits.
    """
    resolved = dataclasses.asdict(target)
    resolved.pop("notes", None)  # words about the config, not where it leads
    doc = {"target": resolved, "destination": destination,
           "config": os.path.abspath(config_file) if config_file else None,
           "pty": pty, "gpuws": __version__, "persist": PERSIST_VERSION}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def place_for(ident: str, directory: Path) -> Place:
    """The files of identity ``ident`` in the checked ``directory``.

    Raises:
        PlaceError: the socket's path is too long to bind.
    """
    name = ident[:32]  # 128 bits: a collision needs a second preimage of sha256
    sock = directory / f"{name}.sock"
    if len(os.fsencode(sock)) > MAX_SOCKET_PATH:
        raise PlaceError(f"{sock} is longer than a unix socket's path may be "
                         f"({MAX_SOCKET_PATH} bytes): set XDG_RUNTIME_DIR to a shorter path")
    return Place(ident, sock, directory / f"{name}.lock", directory / f"{name}.log")
