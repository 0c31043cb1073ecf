"""One artifact of a run: size, sha256, where it is, pull progress, how to open it."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import ProgressBar, Static

from ....sessions.store import ArtifactRow
from ....text.textsafe import visible
from ... import fmt

_STATUS = {"pulled": ("✓ pulled", "green"), "remote": ("on the pod", "yellow"),
           "sha256_mismatch": ("✗ sha256 mismatch", "bold red")}


class ArtifactItem(Vertical):
    """Renders an :class:`~gpuws.sessions.store.ArtifactRow` and its pull progress."""

    DEFAULT_CSS = """
    ArtifactItem { height: auto; padding: 0 1; margin-bottom: 1; border-left: thick $primary; }
    ArtifactItem ProgressBar { margin: 0 0; }
    """

    def __init__(self, row: ArtifactRow) -> None:
        super().__init__()
        self.row = row

    def compose(self) -> ComposeResult:
        yield Static(render_artifact(self.row), id="art-text")
        bar = ProgressBar(total=max(1, self.row.size), show_eta=False, id="art-bar")
        bar.progress = self.row.size if self.row.status == "pulled" else 0
        yield bar

    def show(self, row: ArtifactRow) -> None:
        """Redraw after the store's row changed (e.g. pulled)."""
        self.row = row
        self.query_one("#art-text", Static).update(render_artifact(row))
        if row.status == "pulled":
            self.query_one(ProgressBar).update(total=max(1, row.size), progress=row.size)

    def progress(self, done: int, total: int) -> None:
        """Bytes pulled so far."""
        self.query_one(ProgressBar).update(total=max(1, total), progress=done)


def render_artifact(row: ArtifactRow) -> Text:
    """Name, status, size and hash; the local copy and how to open it once pulled."""
    label, style = _STATUS.get(row.status, (row.status, ""))
    text = Text()
    # The name and the pod's path are the pod's words: visible.
    text.append(visible(row.name, 400), "bold")
    text.append(f"  {fmt.size(row.size)}  ")
    text.append(label, style)
    text.append(f"\nsha256 {visible(row.sha256, 80)}", "dim")
    if row.local_path:
        text.append(f"\n{visible(row.local_path)}")
        if row.name.endswith(".ncu-rep"):
            text.append(f"\nopen it:   ncu-ui {visible(row.local_path)}", "cyan")
            text.append(f"\nread here: gpuws report {visible(row.local_path)}", "cyan")
    else:
        text.append(f"\non the pod: {visible(row.remote_path)}", "dim")
    return text
