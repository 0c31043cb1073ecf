"""Per-tier progress: one line per tier, pending, running, or how it ended."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ....gpu import evidence
from ....live.model import TIER_NAMES, RunModel, TierState
from ....text.textsafe import visible
from ... import fmt
from ...fmt import duration
from ..quiet import QuietStatic

#: Icon and style of each tier status.
STATUS_LOOK: dict[str, tuple[str, str]] = {
    "pending": ("○", "dim"),
    "running": ("●", "bold cyan"),
    "ok": ("✓", "green"),
    "fallback": ("↺", "yellow"),
    "skipped": ("–", "dim"),
    "failed": ("✗", "bold red"),
    "cancelled": ("✗", "yellow"),
}


class TierStrip(QuietStatic):
    """Shows every tier of a run: planned ones as pending, then live state and timing."""

    DEFAULT_CSS = """
    TierStrip { height: auto; padding: 0 1; }
    """

    def show(self, model: RunModel, now: float | None = None) -> None:
        """Redraw from the model; ``now`` (unix seconds) ages running tiers while live."""
        grid = Table.grid(padding=(0, 1), expand=True)
        grid.add_column(width=1)
        grid.add_column(no_wrap=True)
        grid.add_column(no_wrap=True, justify="right", min_width=9)
        grid.add_column(ratio=1, no_wrap=True, overflow="ellipsis")
        planned = list(model.spec.tiers) if model.spec is not None else []
        for tier in sorted(set(planned) | set(model.tiers)):
            state = model.tiers.get(tier)
            if state is None:
                icon, style = STATUS_LOOK["pending"]
                status = "pending" if model.finished is None else "not run"
                grid.add_row(Text(icon, style), Text(f"T{tier} {TIER_NAMES.get(tier, '')}", style),
                             "", Text(status, "dim"))
                continue
            grid.add_row(*_row(state, model, now))
        if not grid.rows:
            grid.add_row("", Text("waiting for the run to start…", "dim"), "", "")
        key = tuple(tuple(str(c) for c in col.cells) for col in grid.columns)
        self.show_if_changed(key, grid, rows=grid.row_count)


def _row(state: TierState, model: RunModel, now: float | None) -> tuple[Text, Text, str, Text]:
    icon, style = STATUS_LOOK.get(state.status, ("?", ""))
    # The tier's name, source and reason are the pod's words: made visible.
    name = Text(f"T{state.tier} {visible(state.name, 80)}",
                style if state.status == "running" else "")
    if state.status == "running":
        end = now if now is not None else (model.last_ts or state.started)
        took = duration(max(0.0, end - state.started))
        detail = Text("running", "cyan")
        if state.estimate is not None:
            usd = evidence.estimate_cost(state.estimate, model.rate_usd_per_hour)
            detail.append(f" · est. {duration(state.estimate.seconds)}"
                          + (f" ({fmt.usd(usd)})" if usd is not None else ""), "dim")
    elif _cancelled_by_user(state, model):
        # The agent reports the signal the cancel sent as the command's exit code
        # ("exit code -15"); a person reads that as a failure of their program.
        took = duration(state.wall_s)
        icon, style = STATUS_LOOK["cancelled"]
        detail = Text("cancelled (SIGTERM)", style)
    else:
        took = duration(state.wall_s)
        detail = Text()
        detail.append(visible(state.status, 20), style)
        if state.gpu_s:
            detail.append(f" · GPU {duration(state.gpu_s)}", "dim")
        if state.source:
            detail.append(f" · {visible(state.source, 200)}")
        gpm = evidence.gpm_short(state.gpm)
        if gpm:
            detail.append(f" · {gpm}", "" if evidence.gpm_measured(state.gpm) else "dim")
        if state.reason:
            detail.append(f" — {visible(state.reason)}", "dim")
    return Text(icon, style), name, took, detail


def _cancelled_by_user(state: TierState, model: RunModel) -> bool:
    """The tier "failed" only because the run's cancel sent SIGTERM to its command."""
    return (state.status == "failed" and model.finished is not None
            and model.finished.status == "cancelled" and state.reason.strip() == "exit code -15")
