"""A yes/no question that changes something (installing ncu on the pod, say)."""

from __future__ import annotations

from typing import ClassVar

from rich.console import RenderableType
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmScreen(ModalScreen[bool]):
    """Dismisses with True only when the person confirms."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,n", "dismiss(False)", "No"), Binding("y", "dismiss(True)", "Yes")]
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical { width: 90%; max-width: 100; height: auto; max-height: 90%;
                               border: thick $warning; background: $surface; padding: 1 2; }
    ConfirmScreen #question { text-style: bold; margin-bottom: 1; }
    ConfirmScreen Horizontal { height: auto; margin-top: 1; }
    ConfirmScreen Button { margin-right: 2; }
    ConfirmScreen #keys { color: $text-muted; margin-top: 1; }
    """

    def __init__(self, question: str, body: RenderableType, yes: str) -> None:
        super().__init__()
        self.question = question
        self.body = body
        self.yes = yes

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.question, id="question")
            yield Static(self.body)
            with Horizontal():
                yield Button(self.yes, id="yes", variant="warning")
                yield Button("Cancel", id="no")
            # The dialog has no footer: its keys are said here. Cancel holds the focus (a
            # stray Enter must not install or launch anything), so Enter cancels.
            yield Static(f"y  {self.yes}    n, Esc or Enter  Cancel", id="keys", markup=False)

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")
