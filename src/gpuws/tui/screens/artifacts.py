"""A run's artifacts: size, sha256, where the copy is, pull progress, how to open it."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from ...text.textsafe import visible
from ..messages import ArtifactsData, PullDone, PullProgress
from ..widgets.run.artifact_item import ArtifactItem

if TYPE_CHECKING:
    from ..app import GpuwsApp


class ArtifactsScreen(Screen[None]):
    """Lists the run's files; ``p`` pulls what is not home yet (resumable, verified)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("p", "pull", "Pull"),
        Binding("question_mark", "app.help", "Help"),
    ]
    DEFAULT_CSS = """
    ArtifactsScreen #art-status { height: auto; padding: 0 1; }
    ArtifactsScreen #art-list { padding: 1 1; }
    """

    app: GpuwsApp

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(Text("reading the store…", "dim"), id="art-status")
        yield VerticalScroll(id="art-list")
        yield Footer()

    def on_mount(self) -> None:
        self.title = f"artifacts · {visible(self.run_id, 80)}"
        self.app.load_artifacts(self)

    def on_artifacts_data(self, message: ArtifactsData) -> None:
        box = self.query_one("#art-list", VerticalScroll)
        items = {item.row.name: item for item in self.query(ArtifactItem)}
        for row in message.rows:
            if row.name in items:
                items[row.name].show(row)
            else:
                box.mount(ArtifactItem(row))
        home = sum(r.status == "pulled" for r in message.rows)
        noun = "artifact" if len(message.rows) == 1 else "artifacts"
        status = (f"{len(message.rows)} {noun}, {home} home" if message.rows
                  else "this run announced no artifacts")
        hint = "" if home == len(message.rows) else (
            " · p pulls the rest" if self.app.can_reach_pod() else
            self._replay_hint() if self.app.replaying_file else
            " · connect to the pod to pull them")
        self.query_one("#art-status", Static).update(Text(status + hint))

    def _replay_hint(self) -> str:
        """A replayed recording's artifacts stay on the pod that recorded it (no pod is
        connected, so "connect to pull" would be a dead end); a report shipped beside the
        recording under its name is named, with the command that reads it."""
        source = getattr(self.app.start, "source", "")
        beside = Path(source).with_suffix(".ncu-rep") if source else None
        if beside is not None and beside.is_file():
            return (f" · a replay: they stay on the pod that recorded it; the report beside "
                    f"the recording: gpuws report {visible(shlex.quote(str(beside)), 300)}")
        return " · a replay: they stay on the pod that recorded it"

    def on_pull_progress(self, message: PullProgress) -> None:
        for item in self.query(ArtifactItem):
            if item.row.name == message.name:
                item.progress(message.done, message.total)

    def on_pull_done(self, message: PullDone) -> None:
        self.app.load_artifacts(self)

    def action_pull(self) -> None:
        """Pull every artifact not home yet."""
        self.app.pull(self.run_id)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "pull":
            return self.app.can_reach_pod()
        return True
