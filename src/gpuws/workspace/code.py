"""The code a run measured, as the laptop records it (no heavy imports: the store uses it)."""

from __future__ import annotations

from dataclasses import dataclass, field


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
