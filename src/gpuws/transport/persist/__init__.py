"""One SSH connection per host, kept between commands (OpenSSH's ControlPersist).

The first command to a host with ``persist`` set starts a master (:mod:`.master`) that
keeps the connection; later commands reach it through a 0600 unix socket in the
person's private runtime directory (:mod:`.place`) and each gets its own exec channel
on it (:mod:`.client`). The master closes after the idle time ``persist`` names.

``persist`` in a host's config table (or ``[defaults]``): ``"10m"``, ``"90s"``, ``"1h"``,
a bare number of seconds, ``"yes"``/``true`` (:data:`DEFAULT_IDLE_S`), or
``"no"``/``false``. Left out, connections are not kept (:data:`DEFAULT_PERSIST`), and
``--no-persist`` turns it off for one command.

The package's import is light (the setting only): :mod:`.client` (asyncssh) is imported
by the transport that uses it.
"""

from __future__ import annotations

from .setting import DEFAULT_IDLE_S, DEFAULT_PERSIST, idle_for, parse_persist

__all__ = ["DEFAULT_IDLE_S", "DEFAULT_PERSIST", "idle_for", "parse_persist"]
