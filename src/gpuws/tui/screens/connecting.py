"""Connecting: each step with its timing; an unknown host key asks; a failure explains.

A host that does not answer and has a ``start`` command in the config is offered a start
(issue 22): the command runs, then SSH is tried with a visible countdown, then the screen
connects again. A pod that answers and refuses (its host key, the login) is never started.
"""

from __future__ import annotations

import shlex
import time
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Button, Footer, Header, Static

from ...config import host_config, load_config
from ...errors import AuthError, ConfigError, ConnectError, GpuwsError, HostKeyError
from ...live.link import Target, UnknownHostKey
from ...live.uptime import power
from ...text.textsafe import visible, visible_lines
from ..messages import HostStarted, StartWaiting, StepChanged
from ..widgets.pod.steps import ConnectSteps

if TYPE_CHECKING:
    from ..app import GpuwsApp


class ConnectingScreen(Screen[None]):
    """Shows the connection to ``target`` happening, and what to do when it fails."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "start_host", "Start pod"),
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
    ConnectingScreen #starting { border: thick $accent; }
    ConnectingScreen .panel Horizontal { height: auto; margin-top: 1; }
    ConnectingScreen .panel Button { margin-right: 2; }
    """

    app: GpuwsApp

    def __init__(self, target: Target) -> None:
        super().__init__()
        self.target = target
        self.state = "connecting"  # connecting | host_key | failed | starting
        #: The host's ``start`` argv, where the failure shown may be a stopped host.
        self.start_argv: list[str] | None = None
        self._start_line = ""
        self._wait: tuple[str, float] | None = None  # (what, monotonic deadline)
        self._ticker: Timer | None = None

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
                yield Button("Start pod", id="start-host", variant="warning")
                yield Button("Retry", id="retry", variant="primary")
                yield Button("Back", id="back-fail")
        with Vertical(id="starting", classes="panel"):
            yield Static(id="starting-text")
            with Horizontal():
                yield Button("Back", id="back-start")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "gpuws"
        self.sub_title = f"connecting to {visible(self.target.host, 200)}"
        self.start()

    def start(self, target: Target | None = None) -> None:
        """(Re)start connecting, optionally to a changed target."""
        self.target = target or self.target
        self.state = "connecting"
        self._stop_countdown()
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
        """Show why connecting failed and what to do about it (a start, where the host
        may be stopped and has a ``start`` command)."""
        self.state = "failed"
        self._stop_countdown()
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
        self.start_argv = None
        if may_be_stopped(exc):
            try:
                self.start_argv = start_command(self.target.host)
            except ConfigError as config_error:
                text.append(f"\n\nNo start offered: {visible_lines(config_error.one_line())}")
        if self.start_argv:
            host = visible(self.target.host, 200)
            # The config's words are shown like any text: visible, never markup.
            text.append(f"\n\n{host} has a start command: ")
            text.append(visible(shlex.join(self.start_argv), 400), "bold")
            text.append(f"\ns starts it, then waits for SSH to answer "
                        f"(at most {power.clock(power.WAIT_S)}).")
        self.query_one("#failure-text", Static).update(text)
        start_button = self.query_one("#start-host", Button)
        start_button.display = self.start_argv is not None
        self.query_one("#starting").display = False
        self.query_one("#failure").display = True
        (start_button if self.start_argv else self.query_one("#retry", Button)).focus()
        self.refresh_bindings()

    def show_starting(self) -> None:
        """Show the start under way: the command, then the countdown to the bound."""
        argv = self.start_argv
        if argv is None:
            return
        self.state = "starting"
        self._start_line = (f"Starting {visible(self.target.host, 200)} with "
                            f"`{visible(argv[0], 200)}` …")
        self._wait = None
        for panel in self.query(".panel"):
            panel.display = False
        self.query_one("#starting").display = True
        self._show_countdown()
        self.query_one("#back-start", Button).focus()
        # on_wait comes once per SSH try, which can take seconds: the clock ticks anyway.
        self._ticker = self.set_interval(1.0, self._show_countdown)
        self.refresh_bindings()

    def on_start_waiting(self, message: StartWaiting) -> None:
        if self.state == "starting":
            self._wait = (message.what, time.monotonic() + message.seconds_left)
            self._show_countdown()

    def on_host_started(self, message: HostStarted) -> None:
        if self.state == "starting":
            self.start()

    def _show_countdown(self) -> None:
        text = Text(self._start_line, "bold")
        if self._wait is not None:
            what, deadline = self._wait
            left = power.clock(deadline - time.monotonic())
            text.append(f"\nwaiting for {visible(self.target.host, 200)} {what}: {left} left")
        self.query_one("#starting-text", Static).update(text)

    def _stop_countdown(self) -> None:
        if self._ticker is not None:
            self._ticker.stop()
            self._ticker = None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "retry":
            return self.state == "failed"
        if action == "start_host":
            return self.state == "failed" and self.start_argv is not None
        if action == "accept_key":
            return self.state == "host_key"
        return True

    def action_retry(self) -> None:
        """Try the same connection again."""
        self.start()

    def action_start_host(self) -> None:
        """Run the host's ``start`` command, wait for SSH to answer, then connect."""
        if self.state == "failed" and self.start_argv is not None:
            self.show_starting()
            self.app.start_host(self.target, self.start_argv, self)

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
                   "start-host": self.action_start_host, "back-key": self.action_back,
                   "back-fail": self.action_back, "back-start": self.action_back}
        actions[event.button.id or ""]()


def may_be_stopped(exc: BaseException) -> bool:
    """Whether a failure may be a stopped host, which its ``start`` could help: it did
    not answer, or a start failed. A host that answered and refused (its key, the login)
    is up: starting it would only bill again."""
    if isinstance(exc, (HostKeyError, AuthError)):
        return False
    return isinstance(exc, (ConnectError, power.PowerError))


def start_command(host: str) -> list[str] | None:
    """The host's ``start`` argv from the config, or ``None`` (read now: the config may
    have changed since gpuws started)."""
    argv = host_config(load_config(), host).start
    return list(argv) if argv else None
