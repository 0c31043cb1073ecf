"""Which Nsight Systems works on the pod, and its install plan when none does."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Button, Label, Static

from .... import protocol
from ....remote_agent.profilers.ncu_select import step_text
from ....text.textsafe import visible


class NsysPanel(Vertical):
    """The nsys plan (a placeholder of its usual size until the agent answers); *Install*
    only when a plan exists and no nsys works (the plan runs after the person confirms it)."""

    DEFAULT_CSS = """
    NsysPanel { height: auto; }
    NsysPanel .title { text-style: bold; background: $boost; padding: 0 1; margin-top: 1;
                       width: 100%; }
    NsysPanel #nsys-text { padding: 0 1; min-height: 2; }
    NsysPanel Button { margin: 0 1; }
    """

    class InstallRequested(Message):
        """The person asked to run the install plan (still to be confirmed)."""

        def __init__(self, plan: protocol.NsysPlan) -> None:
            self.plan = plan
            super().__init__()

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.plan: protocol.NsysPlan | None = None

    def compose(self) -> ComposeResult:
        yield Label("Nsight Systems", classes="title")
        yield Static(Text("asking the agent whether nsys works…", "dim"), id="nsys-text")
        yield Button("Install nsys…", id="nsys-install", variant="warning")

    def on_mount(self) -> None:
        self.query_one(Button).display = False

    def show(self, plan: protocol.NsysPlan) -> None:
        """Redraw from the agent's plan."""
        self.plan = plan
        self.query_one("#nsys-text", Static).update(render_nsys_plan(plan))
        button = self.query_one(Button)
        button.display = can_install(plan)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if self.plan is not None:
            self.post_message(self.InstallRequested(self.plan))


def can_install(plan: protocol.NsysPlan) -> bool:
    """Whether the plan offers an install (no nsys works and the pod has a plan)."""
    return bool(plan.install_plan) and not plan.selected and not plan.installed


def render_nsys_plan(plan: protocol.NsysPlan) -> Text:
    """The working nsys (or why none), and the plan's steps; pod text shown literally."""
    text = Text()
    if plan.selected:
        text.append("✓ ", "green")
        text.append(visible(f"nsys {plan.selected_version or '?'}"), "bold")
        text.append(visible(f"  {plan.selected}") + "\n", "dim")
        text.append("Tier 2 takes its kernel timeline from nsys")
    else:
        text.append("✗ no working nsys", "bold yellow")
        text.append(" — Tier 2 uses torch.profiler or one ncu pass instead\n", "dim")
        text.append(visible(plan.reason))
    if plan.verified:
        text.append("\nverified: " + visible(plan.verified), "green")
    if can_install(plan):
        text.append("\ninstall plan, " + visible(plan.install_how or "?")
                    + "; runs only when you confirm:", "bold")
        for step in plan.install_plan or []:
            text.append("\n  $ " + visible(step_text(step)), "dim")
    return text
