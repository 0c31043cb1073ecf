"""The run's verdicts: what bounds the program, what bounds each kernel, what Tier 3 missed.

The same pane in the live run and in the results screen; the verdicts come from
:mod:`gpuws.live.verdicts` (today's logic over the run's events).
"""

from __future__ import annotations

from rich.text import Text

from ....live import verdicts
from ....text.textsafe import visible
from ... import fmt
from ..quiet import QuietStatic
from .rules import SPEEDUP_NOTE

_BOUND_STYLE = {"gpu": "bold green", "launch": "bold yellow", "transfer": "bold yellow",
                "host": "bold yellow", "communication": "bold yellow"}


def render_verdicts(v: verdicts.Verdicts, empty: str = "") -> Text:
    """The verdicts as text: the first finding in bold, evidence and remedies under it."""
    text = Text()
    if not v:
        text.append(visible(empty) if empty else "no verdict yet: it comes with Tier 2's "
                    "kernel table and Tier 3's metrics", "dim")
        return text
    p = v.program
    if p is not None:
        text.append("Program", "underline")
        text.append(f"  (kernel times from {visible(p.source, 40)})\n", "dim")
        if p.window:
            text.append("judged: " + visible(p.window, 200) + "\n", "bold")
        if p.left_out:
            text.append("left out: " + visible(p.left_out, 600) + "\n", "dim")
        for i, f in enumerate(p.findings):
            text.append("★ " if i == 0 else "· ", _BOUND_STYLE.get(p.bound, "bold"))
            text.append(visible(f.title, 400) + "\n", "bold" if i == 0 else "")
            if f.detail:
                text.append("  " + visible(f.detail, 600) + "\n", "dim")
            for e in f.evidence:
                text.append("  " + visible(verdicts.evidence_text(e), 200) + "\n", "cyan")
            for remedy in f.remedies:
                text.append("  → " + visible(remedy, 300) + "\n")
        if p.families:
            text.append("families: " + ", ".join(
                f"{visible(fam.family, 40)} {fmt.pct(fam.share_pct, 0)}" for fam in p.families)
                + "\n", "dim")
        if p.tier3_advice:
            text.append(visible(p.tier3_advice, 600) + "\n", "italic")
    for k in v.kernels:
        text.append("\nKernel ", "underline")
        text.append(visible(k.short_name or k.kernel, 120), "bold cyan")
        text.append("\n" + visible(k.sentence, 600) + "\n", "bold")
        shown = [e for e in k.evidence if e.value is not None]
        if shown:
            text.append("  " + visible("; ".join(verdicts.evidence_text(e) for e in shown),
                                       1200) + "\n", "dim")
        if any(r.est_speedup_pct is not None for r in k.rules[:6]):
            text.append("  " + SPEEDUP_NOTE + "\n", "italic dim")
        for r in k.rules[:6]:
            speed = (f"▲ {fmt.pct(r.est_speedup_pct, 0)} " if r.est_speedup_pct is not None
                     else "  ")
            text.append("  " + speed, "bold green")
            text.append(visible(r.rule, 80), "magenta")
            if r.evidence:
                text.append(" — " + visible(r.evidence, 120), "dim")
            text.append("\n")
    c = v.coverage
    if c is not None and (c.profiled or c.missed):
        text.append("\nTier 3 against Tier 2\n", "underline")
        for row in c.profiled:
            text.append(f"  ✓ {visible(row.short_name or row.name, 120)} "
                        f"({fmt.pct(row.share_pct, 0)})\n", "green")
        for row in c.missed:
            text.append(f"  ✗ {visible(row.short_name or row.name, 120)} "
                        f"({fmt.pct(row.share_pct, 0)}): {visible(row.why, 300)}\n", "yellow")
    text.rstrip()
    return text


class VerdictView(QuietStatic):
    """The verdicts of one run (:func:`render_verdicts`)."""

    DEFAULT_CSS = """
    VerdictView { height: auto; padding: 0 1; }
    """

    def show(self, v: verdicts.Verdicts, empty: str = "") -> None:
        """Redraw when the verdicts changed."""
        self.show_if_changed((v.program, tuple(v.kernels), v.coverage, empty),
                             render_verdicts(v, empty))
