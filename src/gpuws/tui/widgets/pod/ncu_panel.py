"""Which Nsight Compute fits the pod, and the install plan when none does."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Button, Static

from .... import protocol
from ....remote_agent.profilers.ncu_select import step_text
from ....text.textsafe import visible


class NcuPanel(Vertical):
    """The ncu plan; an *Install* button appears only when a plan exists and none fits."""

    DEFAULT_CSS = """
    NcuPanel { height: auto; }
    /* The plan's usual size (the ncu chosen, why, one more line) is kept from the start,
       so the answer does not push what is below it. */
    NcuPanel #ncu-text { padding: 0 1; min-height: 3; }
    NcuPanel Button { margin: 0 1; }
    """

    class InstallRequested(Message):
        """The person asked to run the install plan (still to be confirmed)."""

        def __init__(self, plan: protocol.NcuPlan) -> None:
            self.plan = plan
            super().__init__()

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.plan: protocol.NcuPlan | None = None

    def compose(self) -> ComposeResult:
        yield Static(Text("asking the agent which ncu fits…", "dim"), id="ncu-text")
        yield Button("Install ncu", id="ncu-install", variant="warning", disabled=True)

    def on_mount(self) -> None:
        self.query_one(Button).display = False

    def show(self, plan: protocol.NcuPlan) -> None:
        """Redraw from the agent's plan."""
        self.plan = plan
        self.query_one("#ncu-text", Static).update(render_plan(plan))
        button = self.query_one(Button)
        can_install = bool(plan.install_plan) and not plan.selected and not plan.installed
        button.display = can_install
        button.disabled = not can_install
        if plan.install_target_version:
            button.label = f"Install ncu {plan.install_target_version}…"

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if self.plan is not None:
            self.post_message(self.InstallRequested(self.plan))


def render_plan(plan: protocol.NcuPlan) -> Text:
    """Selected ncu (or none) with the reason, the other installs, and the plan's steps
    (every path, version and reason the pod's word, made visible)."""
    text = Text()
    if plan.selected:
        text.append("✓ ", "green")
        text.append(visible(f"ncu {plan.selected_version or '?'}", 200), "bold")
        text.append(f"  {visible(plan.selected)}\n", "dim")
    else:
        text.append("✗ no ncu fits this pod\n", "bold red")
    text.append(visible(plan.reason))
    others = [c for c in plan.choices if c.path != plan.selected]
    for c in others:
        mark, style = ("✓", "green") if c.compatible else ("✗", "red")
        text.append(f"\n{mark} ", style)
        text.append(visible(f"{c.version or '?'} {c.path} — {c.reason}"), "dim")
    if plan.verified:
        text.append(f"\nverified: {visible(plan.verified)}", "green")
    if plan.install_plan and not plan.selected and not plan.installed:
        version = visible(plan.install_target_version or "?", 80)
        text.append(f"\ninstall plan ({version}), runs only when you confirm:", "bold")
        for step in plan.install_plan:
            text.append(f"\n  $ {visible(step_text(step))}", "dim")
    return text
