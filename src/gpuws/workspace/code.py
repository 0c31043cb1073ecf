"""The code a run measured, as the laptop records it (no heavy imports: the store uses it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import protocol


@dataclass
class CodeRecord:
    """A run's code, recorded on the laptop when it starts (never taken from the pod).

    Attributes:
        directory: the workspace directory on this machine.
        name: its name on the pod.
        tree_sha256: the manifest's hash (:func:`gpuws.workspace.manifest.tree_sha256`).
        files: files in the tree.
        total_bytes: their size.
        git_commit: ``HEAD`` where the directory is in a git work tree with a commit.
        git_dirty: whether files differ from that commit (None outside git).
        git_changed: those files, relative to the directory.
    """

    directory: str
    name: str
    tree_sha256: str
    files: int
    total_bytes: int
    git_commit: str | None = None
    git_dirty: bool | None = None
    git_changed: list[str] = field(default_factory=list)

    def short(self) -> str:
        """``tree 1a2b3c4d5e6f · git 0a1b2c3d4e5f (dirty: 2 files)`` for one line."""
        text = f"tree {self.tree_sha256[:12]}"
        if self.git_commit:
            text += f" · git {self.git_commit[:12]}"
        elif self.git_dirty is not None:
            text += " · git (no commit)"
        if self.git_dirty:
            n = len(self.git_changed)
            text += f" (dirty: {n} file{'s' if n != 1 else ''})"
        return text


@dataclass(frozen=True)
class TreeDiff:
    """What changed from one manifest to another, each list sorted by path."""

    added: list[str]
    modified: list[str]
    removed: list[str]

    @property
    def paths(self) -> list[str]:
        return sorted(self.added + self.modified + self.removed)

    def __bool__(self) -> bool:
        return bool(self.added or self.modified or self.removed)

    def summary(self, limit: int = 5) -> str:
        """``3 files: +new.py, ~kern.py, -old.py`` (the first ``limit`` named)."""
        marks = sorted([(p, "+") for p in self.added] + [(p, "~") for p in self.modified]
                       + [(p, "-") for p in self.removed])
        if not marks:
            return "no files changed"
        named = ", ".join(f"{m}{p}" for p, m in marks[:limit])
        more = f", … {len(marks) - limit} more" if len(marks) > limit else ""
        return f"{len(marks)} file{'s' if len(marks) != 1 else ''}: {named}{more}"


def diff_entries(old: list[protocol.WsEntry], new: list[protocol.WsEntry]) -> TreeDiff:
    """Files added, modified (content or executable bit) and removed from ``old`` to ``new``."""
    before = {e.path: e for e in old}
    after = {e.path: e for e in new}
    return TreeDiff(
        added=sorted(p for p in after if p not in before),
        modified=sorted(p for p, e in after.items() if p in before
                        and (before[p].sha256, before[p].mode) != (e.sha256, e.mode)),
        removed=sorted(p for p in before if p not in after))
