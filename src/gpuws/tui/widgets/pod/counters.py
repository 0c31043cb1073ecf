"""Whether ncu may read the GPU's performance counters, why, and what to do if not."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from .... import protocol
from ....remote_agent.measure.tiers import COUNTER_REMEDIES
from ....text.textsafe import visible


class CountersPanel(Static):
    """``allowed`` / ``blocked`` / ``unknown`` with the agent's reason and the remedies."""

    DEFAULT_CSS = """
    CountersPanel { height: auto; padding: 0 1; }
    """

    def show(self, counters: protocol.Counters | None) -> None:
        """Redraw from the probe's counter facts."""
        if counters is None:
            self.update(Text("not probed yet", "dim"))
            return
        look = {"allowed": ("✓ counters allowed", "bold green"),
                "blocked": ("✗ counters blocked", "bold red")}
        label, style = look.get(counters.verdict, ("? counters unknown", "bold yellow"))
        text = Text()
        text.append(label, style)
        facts = []
        if counters.rm_profiling_admin_only is not None:
            facts.append(f"RmProfilingAdminOnly {int(counters.rm_profiling_admin_only)}")
        if counters.cap_sys_admin is not None:
            facts.append(f"CAP_SYS_ADMIN {'yes' if counters.cap_sys_admin else 'no'}")
        if counters.cap_perfmon is not None:
            facts.append(f"CAP_PERFMON {'yes' if counters.cap_perfmon else 'no'}")
        if facts:
            text.append("  " + " · ".join(facts), "dim")
        if counters.reason:
            text.append(f"\n{visible(counters.reason)}")  # the pod's word
        if counters.verdict == "blocked":
            text.append("\nTier 3 falls back to Tier 1 + Tier 2 + static analysis. To allow "
                        "counters:", "italic")
            for remedy in COUNTER_REMEDIES:
                text.append("\n→ ", "bold")
                text.append(remedy)
        self.update(text)
