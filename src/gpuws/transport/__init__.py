"""Transports: how gpuws reaches a pod (``local``, ``ssh``, or ``pty``)."""

from __future__ import annotations

from .base import CommandResult, RemoteProcess, Transport, TransportInfo

__all__ = ["CommandResult", "RemoteProcess", "Transport", "TransportInfo", "make_transport"]


def make_transport(destination: str, *, config_file: str | None = None, port: int | None = None,
                   user: str | None = None, accept_new: bool = False,
                   pty: bool | None = None, persist_s: float | None = None) -> Transport:
    """The transport for a destination: ``local`` for this machine, SSH otherwise.

    Args:
        pty: True to reach the pod through terminal sessions only (``--pty``); None (the
            default) to use them only when the server refuses exec the way PTY-only
            proxies do, which is checked after connecting (``info.kind`` tells which).
        persist_s: keep the SSH connection for later commands, closing it after this
            many idle seconds (:mod:`.persist`, from :func:`.persist.idle_for`); None:
            this command's own connection, closed with it.
    """
    if destination == "local":
        from .local import LocalTransport

        return LocalTransport()
    if persist_s is not None:
        from .persist.client import PersistTransport

        return PersistTransport(destination, config_file=config_file, port=port, user=user,
                                accept_new=accept_new, pty=pty, idle_s=persist_s)
    from .pty import PTYTransport  # asyncssh is only imported when a pod is remote

    return PTYTransport(destination, config_file=config_file, port=port, user=user,
                        accept_new=accept_new, pty=pty)
