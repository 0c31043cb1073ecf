"""The connection's steps, each with its state, timing and what it found."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ....live.link import STEPS
from ....text.textsafe import visible
from ...fmt import duration

_LOOK = {"waiting": ("○", "dim"), "running": ("●", "bold cyan"), "ok": ("✓", "green"),
         "failed": ("✗", "bold red"), "skipped": ("–", "dim")}


class ConnectSteps(Static):
    """resolve → connect → host key → deploy → probe."""

    DEFAULT_CSS = """
    ConnectSteps { height: auto; padding: 1 2; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.states: dict[str, tuple[str, float | None, str]] = {}
        self.reset()

    def reset(self) -> None:
        """Every step back to waiting."""
        self.states = {step: ("waiting", None, "") for step in STEPS}
        self._redraw()

    def set_step(self, step: str, state: str, seconds: float | None, detail: str) -> None:
        """Record one step's new state and redraw."""
        old = self.states.get(step, ("waiting", None, ""))
        self.states[step] = (state, seconds if seconds is not None else old[1],
                             detail or old[2] if state != "running" else detail)
        self._redraw()

    def _redraw(self) -> None:
        grid = Table.grid(padding=(0, 1), expand=True)
        grid.add_column(width=1)
        grid.add_column(width=9, no_wrap=True)
        grid.add_column(width=8, justify="right", no_wrap=True)
        grid.add_column(ratio=1, overflow="fold")
        for step in STEPS:
            state, seconds, detail = self.states[step]
            icon, style = _LOOK.get(state, ("?", ""))
            took = duration(seconds) if seconds is not None else ""
            shown = detail or ("…" if state == "running" else "")
            # Text of visible(): a step's detail quotes the pod (its hostname, its GPUs).
            grid.add_row(Text(icon, style), Text(step, style if state != "ok" else ""),
                         Text(took, "dim"), Text(visible(shown, 400)))
        self.update(grid)
