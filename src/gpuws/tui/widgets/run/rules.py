"""Nsight Compute's rule findings, biggest estimated speedup first."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from .... import protocol
from ....live import verdicts
from ....text.textsafe import visible
from ... import fmt
from ..quiet import QuietStatic

#: Order of rule kinds when speedups tie: what to optimise, then warnings, then notes.
_KIND_ORDER = {"OPT": 0, "WRN": 1, "ERR": 1, "INF": 2}
_KIND_STYLE = {"OPT": "bold magenta", "WRN": "yellow", "ERR": "red", "INF": "dim"}


def sort_rules(rules: Sequence[protocol.Rule]) -> list[protocol.Rule]:
    """By estimated speedup (largest first), then kind, then as ncu reported them."""
    indexed = list(enumerate(rules))
    indexed.sort(key=lambda ir: (-(ir[1].est_speedup_pct or 0.0),
                                 _KIND_ORDER.get(ir[1].kind, 3), ir[0]))
    return [r for _, r in indexed]


class RuleList(QuietStatic):
    """Each finding: its estimated speedup, the rule, its kernel, and ncu's advice."""

    DEFAULT_CSS = """
    RuleList { height: auto; padding: 0 1; }
    """

    def show(self, rules: Sequence[protocol.Rule], empty: str | None = None) -> None:
        """Redraw with these findings (sorted here); ``empty`` says why there are none,
        once there will be none."""
        key = (tuple(rules), empty)
        if key == self._shown_key:
            return
        if not rules:
            self.show_if_changed(key, Text(visible(empty), "yellow") if empty
                                 else Text("no rule findings yet", "dim"))
            return
        text = Text()
        if any(r.est_speedup_pct is not None for r in rules):
            text.append(SPEEDUP_NOTE + "\n\n", "italic dim")
        for i, r in enumerate(sort_rules(rules)):
            if i:
                text.append("\n\n")
            speedup = (f"▲ {fmt.pct(r.est_speedup_pct, 0)} " if r.est_speedup_pct is not None
                       else "  ")
            scope = f" ({r.speedup_type})" if r.speedup_type else ""
            text.append(speedup, "bold green")
            text.append(f"{visible(r.rule, 200)} ", _KIND_STYLE.get(r.kind, ""))
            text.append(f"[{visible(r.kind, 20)}] ", "dim")
            text.append(f"{visible(verdicts.short(r.kernel))}{visible(scope, 60)}\n", "cyan")
            text.append(visible(r.message))
        self.show_if_changed(key, text)


#: Said above ranked findings: the ▲ figure is ncu's model, and it orders the list.
SPEEDUP_NOTE = ("▲ ncu's estimated speedup if the issue were removed: an upper bound from "
                "ncu's model, not a measurement. The list is ranked by it, so weigh each "
                "against the kernel's measured pipe and memory use.")
