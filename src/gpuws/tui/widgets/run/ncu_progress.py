"""Nsight Compute's progress per kernel, parsed live from its ``==PROF==`` lines."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from .... import protocol
from ....text.textsafe import visible
from ..quiet import QuietStatic

_BAR = 20


class NcuProgressPane(QuietStatic):
    """One line per profiled kernel: a bar, the percent, and the passes ncu needed."""

    DEFAULT_CSS = """
    NcuProgressPane { height: auto; padding: 0 1; }
    """

    def show(self, progress: dict[str, protocol.NcuProgress]) -> None:
        """Redraw from the latest progress event of each kernel."""
        key = tuple((k, p.percent, p.passes, p.done) for k, p in progress.items())
        if not progress:
            self.show_if_changed(key, Text("ncu has not started profiling", "dim"), rows=1)
            return
        grid = Table.grid(padding=(0, 1), expand=True)
        grid.add_column(max_width=40, no_wrap=True, overflow="ellipsis")
        grid.add_column(no_wrap=True)
        grid.add_column(justify="right", no_wrap=True, min_width=4)
        grid.add_column(no_wrap=True, ratio=1)
        for kernel, p in progress.items():
            filled = round(_BAR * max(0, min(100, p.percent)) / 100)
            bar = Text()
            bar.append("█" * filled, "green" if p.done else "cyan")
            bar.append("░" * (_BAR - filled), "dim")
            passes = f"{p.passes} passes" if p.passes else ""
            state = Text("✓ done", "green") if p.done else Text("profiling", "cyan")
            # Text of visible(): a kernel's name is the pod's word, never markup.
            grid.add_row(Text(visible(kernel, 200)), bar, f"{p.percent}%",
                         Text.assemble(state, f" {passes}"))
        self.show_if_changed(key, grid, rows=len(progress))
