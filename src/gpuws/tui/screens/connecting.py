"""Connecting: each step with its timing; an unknown host key asks; a failure explains."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Button, Footer, Header, Static

from ...errors import GpuwsError
from ...live.link import Target, UnknownHostKey
from ...text.textsafe import visible, visible_lines
from ..messages import StepChanged
from ..widgets.pod.steps import ConnectSteps

if TYPE_CHECKING:
    from ..app import GpuwsApp


class ConnectingScreen(Screen[None]):
    """Shows the connection to ``target`` happening, and what to do when it fails."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "retry", "Retry"),
        Binding("a", "accept_key", "Accept key"),
        Binding("escape,b", "back", "Back"),
        Binding("question_mark", "app.help", "Help"),
    ]
    DEFAULT_CSS = """
    ConnectingScreen #where { padding: 1 2 0 2; text-style: bold; }
    ConnectingScreen .panel { height: auto; margin: 0 2; padding: 0 1; display: none; }
    ConnectingScreen #hostkey { border: thick $warning; }
    ConnectingScreen #failure { border: thick $error; }
    ConnectingScreen .panel Horizontal { height: auto; margin-top: 1; }
    ConnectingScreen .panel Button { margin-right: 2; }
    """

    app: GpuwsApp

    def __init__(self, target: Target) -> None:
        super().__init__()
        self.target = target
        self.state = "connecting"  # connecting | host_key | failed

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(f"Connecting to {self.target.host}", id="where")
        yield ConnectSteps(id="steps")
        with Vertical(id="hostkey", classes="panel"):
            yield Static(id="hostkey-text")
            with Horizontal():
                yield Button("Accept and connect", id="accept", variant="warning")
                yield Button("Back", id="back-key")
        with Vertical(id="failure", classes="panel"):
            yield Static(id="failure-text")
            with Horizontal():
                yield Button("Retry", id="retry", variant="primary")
                yield Button("Back", id="back-fail")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "gpuws"
        self.sub_title = f"connecting to {visible(self.target.host, 200)}"
        self.start()

    def start(self, target: Target | None = None) -> None:
        """(Re)start connecting, optionally to a changed target."""
        self.target = target or self.target
        self.state = "connecting"
        self.query_one(ConnectSteps).reset()
        for panel in self.query(".panel"):
            panel.display = False
        self.refresh_bindings()
        self.app.start_connect(self.target, self)

    def on_step_changed(self, message: StepChanged) -> None:
        self.query_one(ConnectSteps).set_step(message.step, message.state, message.seconds,
                                              message.detail)

    def ask_host_key(self, exc: UnknownHostKey) -> None:
        """Show the unknown key's fingerprint and ask whether to trust it."""
        self.state = "host_key"
        text = Text()
        text.append("This host's key is not known yet\n", "bold")
        # The key and its type are the server's: visible, like every error's words below
        # (a failure can quote the pod's stderr).
        text.append(f"{visible_lines(exc.message)}\n\n")
        text.append(f"  {visible(exc.key_type, 80)}  ", "bold")
        text.append(f"{visible(exc.fingerprint, 200)}\n\n", "bold yellow")
        text.append("Compare it with the fingerprint your provider shows for this pod. "
                    f"Accepting records it in {exc.known_hosts or 'known_hosts'}; a key that "
                    "changes later is refused.")
        self.query_one("#hostkey-text", Static).update(text)
        self.query_one("#hostkey").display = True
        self.query_one("#accept", Button).focus()
        self.refresh_bindings()

    def show_failure(self, exc: BaseException) -> None:
        """Show why connecting failed and what to do about it."""
        self.state = "failed"
        text = Text()
        if isinstance(exc, GpuwsError):
            text.append(f"✗ {visible(exc.title, 200)}\n", "bold red")
            text.append(visible_lines(exc.message))
            if exc.remedy:
                text.append("\n→ ", "bold")
                text.append(visible_lines(exc.remedy))
        else:
            text.append(f"✗ {type(exc).__name__}\n", "bold red")
            text.append(visible_lines(str(exc)) or "an unexpected error")
        self.query_one("#failure-text", Static).update(text)
        self.query_one("#failure").display = True
        self.query_one("#retry", Button).focus()
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "retry":
            return self.state == "failed"
        if action == "accept_key":
            return self.state == "host_key"
        return True

    def action_retry(self) -> None:
        """Try the same connection again."""
        self.start()

    def action_accept_key(self) -> None:
        """Trust the shown host key (recorded like ssh's accept-new) and connect."""
        self.start(self.target.accepting_new_key())

    def action_back(self) -> None:
        """Stop and go back to Home."""
        self.app.cancel_connect()
        self.app.go_home()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        actions = {"accept": self.action_accept_key, "retry": self.action_retry,
                   "back-key": self.action_back, "back-fail": self.action_back}
        actions[event.button.id or ""]()
