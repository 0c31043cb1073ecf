"""Transports: how gpuws reaches a pod (``local`` or ``ssh``)."""

from __future__ import annotations

from .base import CommandResult, RemoteProcess, Transport, TransportInfo

__all__ = ["CommandResult", "RemoteProcess", "Transport", "TransportInfo", "make_transport"]


def make_transport(destination: str, *, config_file: str | None = None, port: int | None = None,
                   user: str | None = None, accept_new: bool = False) -> Transport:
    """The transport for a destination: ``local`` for this machine, SSH otherwise."""
    if destination == "local":
        from .local import LocalTransport

        return LocalTransport()
    from .ssh import SSHTransport  # asyncssh is only imported when a pod is remote

    return SSHTransport(destination, config_file=config_file, port=port, user=user,
                        accept_new=accept_new)
