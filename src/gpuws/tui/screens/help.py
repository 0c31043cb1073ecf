"""The help screen: what each screen is for, and the keys that work where you are."""

from __future__ import annotations

import re
from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

OVERVIEW = (
    "gpuws connects to a GPU pod over SSH, deploys a small agent, and profiles workloads in "
    "three tiers: Tier 1 times calls with CUDA events, Tier 2 ranks kernels by GPU time, "
    "Tier 3 runs Nsight Compute on the kernels that matter. Everything the pod sends is "
    "recorded first, then shown; a run goes on on the pod if you leave it or the link drops."
    "\n\n"
    "Home → pick a host (or type user@host[:port], or local) → Connecting → Dashboard. "
    "The dashboard shows the pod, its ncu, counter permission, live telemetry and what it "
    "costs. n starts a run and its screen fills live; r shows the results, f the artifacts. "
    "Sessions keep every run: open one to replay it; e exports a session as markdown."
    "\n\n"
    "Ctrl+P opens the command palette: every action is there by name. The mouse works too: "
    "click tabs, rows and buttons."
)


def screen_name(screen: Screen[object]) -> str:
    """A screen's name for people: ``DashboardScreen`` → ``dashboard``, ``ArtifactsScreen``
    → ``artifacts`` (the class name is an implementation detail)."""
    name = re.sub(r"Screen$", "", type(screen).__name__) or "this screen"
    return re.sub(r"(?<=[a-z])(?=[A-Z])", " ", name).lower()


class HelpScreen(ModalScreen[None]):
    """Explains gpuws and lists the keys of the screen it was opened from."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 90%; max-width: 100; height: 90%; border: thick $primary;
        background: $surface; padding: 1 2;
    }
    """

    def __init__(self, under: Screen[object]) -> None:
        super().__init__()
        self.under = under

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(self.keys_table())
            yield Static(Text("\nWhat gpuws does", "bold"))
            yield Static(OVERVIEW)

    def keys_table(self) -> Table:
        """The keys of the screen below, titled with its name."""
        table = Table(title=f"Keys on this screen ({screen_name(self.under)})",
                      title_justify="left", expand=True)
        table.add_column("key", no_wrap=True)
        table.add_column("action")
        seen: set[tuple[str, str]] = set()
        for key, active in self.under.active_bindings.items():
            b = active.binding
            # The screen's and the app's own keys; lists and inputs keep their usual ones.
            if not isinstance(active.node, (Screen, App)):
                continue
            if not b.description or (b.action, b.description) in seen:
                continue
            seen.add((b.action, b.description))
            shown = active.binding.key_display or self.app.get_key_display(b)
            # A key that waits for something (b on the watch screen before a median) is
            # still listed, saying it does nothing yet.
            table.add_row(shown or key, b.description if active.enabled
                          else Text.assemble(b.description, (" (not available now)", "dim")))
        for key, what in getattr(self.under, "HELP_KEYS", ()):
            # Keys a screen's list or table handles (Enter on a row), which it names.
            table.add_row(self.app.get_key_display(Binding(key, "")), what)
        table.caption = ("Arrows, Tab, Enter and the mouse work in lists, tabs and forms; "
                         "Ctrl+P finds any action by name. Esc, q or ? closes this help.")
        table.caption_justify = "left"  # a centred caption's last word sat alone mid-line
        return table
