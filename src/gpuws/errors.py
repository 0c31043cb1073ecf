"""One error hierarchy: every failure a person can cause has a title, a cause and a remedy.

The UI decides how to show one (a banner in the TUI, one line and an exit code headless).
``OSError`` and ``asyncssh.Error`` are mapped to these at the transport boundary.
"""

from __future__ import annotations


class GpuwsError(Exception):
    """Base of every error gpuws shows to a person.

    Args:
        message: what happened, in one line.
        title: a short heading for banners.
        remedy: what the person can do about it (may be empty).
    """

    title = "gpuws error"
    exit_code = 1

    def __init__(self, message: str, title: str | None = None, remedy: str = "") -> None:
        super().__init__(message)
        self.message = message
        if title is not None:
            self.title = title
        self.remedy = remedy

    def one_line(self) -> str:
        """The error as the single line a headless command prints."""
        tail = f" — {self.remedy}" if self.remedy else ""
        # A message that already opens with its title ("nothing to compare between …")
        # would stutter behind it: said once.
        if self.message.lower().startswith(self.title.lower()):
            return f"{self.message}{tail}"
        return f"{self.title}: {self.message}{tail}"


class ConfigError(GpuwsError):
    title = "Configuration error"
    exit_code = 2


class UsageError(GpuwsError):
    title = "Usage error"
    exit_code = 2


class WorkspaceError(UsageError):
    """A workspace refused before anything is sent (a link out of the tree, a file or a
    tree over its cap, not a directory)."""

    title = "Workspace refused"


class ConnectError(GpuwsError):
    """The pod could not be reached or would not let us in."""

    title = "Cannot connect"
    exit_code = 3


class HostKeyError(ConnectError):
    title = "Host key not trusted"


class AuthError(ConnectError):
    title = "Authentication failed"


class DeployError(GpuwsError):
    title = "Agent deploy failed"
    exit_code = 4


class NoPythonError(DeployError):
    title = "No usable python3 on the pod"


class ProtocolError(GpuwsError):
    title = "Protocol error"
    exit_code = 5


class AgentError(GpuwsError):
    """The agent answered with an Error event."""

    title = "Agent error"
    exit_code = 6

    def __init__(self, message: str, title: str | None = None, remedy: str = "",
                 code: str = "agent") -> None:
        super().__init__(message, title, remedy)
        self.code = code


class RunError(GpuwsError):
    title = "Run failed"
    exit_code = 7


class StoreError(GpuwsError):
    title = "Session store error"
    exit_code = 8


class TransferError(GpuwsError):
    title = "Transfer failed"
    exit_code = 9
