"""Which code a run measured, in git's words: the commit, and what differs from it."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import WorkspaceError
from .safegit import SafeGit


@dataclass(frozen=True)
class GitState:
    """The work tree's state under the workspace directory.

    Attributes:
        commit: ``HEAD``'s full hash; None in a repository without a commit yet.
        dirty: whether any file under the directory differs from ``HEAD`` (an edit, a
            staged change, a deletion, a new file git does not ignore).
        changed: those files, relative to the workspace directory, sorted.
    """

    commit: str | None
    dirty: bool
    changed: list[str] = field(default_factory=list)


def git_state(root: Path, safegit: SafeGit | None = None) -> GitState | None:
    """The git state of ``root`` (a directory inside a work tree); None when git cannot
    say (not a work tree, git missing). ``safegit``: the scan's, its drivers already read."""
    _git = safegit or SafeGit(root)  # the project's config runs no program (safegit)
    try:
        head = _git("rev-parse", "--verify", "-q", "HEAD")
        commit = head.stdout.decode().strip() if head.returncode == 0 else None
        # Against HEAD (staged and unstaged alike); paths relative to the directory and
        # limited to it (--relative), as the workspace holds them.
        diff = (_git("diff", "--no-ext-diff", "--no-textconv", "--name-only", "-z",
                     "--relative", "HEAD", "--")
                if commit else _git("ls-files", "--cached", "-z"))
        new = _git("ls-files", "--others", "--exclude-standard", "-z")
    except (OSError, subprocess.TimeoutExpired, WorkspaceError):
        return None
    if diff.returncode != 0 or new.returncode != 0:
        return None
    changed = sorted({os.fsdecode(p) for out in (diff.stdout, new.stdout)
                      for p in out.split(b"\0") if p})
    return GitState(commit, bool(changed), changed)
