"""Tier 1 live: the running median and its CI, the latest samples, their histogram."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, Sparkline, Static

from ...live.model import RunModel
from .. import fmt
from .histogram import Histogram

#: Samples the sparkline shows (the latest ones).
SPARK_SAMPLES = 240


class TimingPane(Vertical):
    """Statistics line, sparkline of the latest samples, and the histogram of all."""

    DEFAULT_CSS = """
    TimingPane { height: 1fr; }
    TimingPane #t1-stats { height: 3; padding: 0 1; }
    TimingPane Horizontal { height: 2; padding: 0 1; }
    TimingPane .caption { color: $text-muted; width: 9; }
    TimingPane Sparkline { height: 2; width: 1fr; }
    TimingPane Histogram { margin: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield Static(Text("Tier 1 has not sent samples yet", "dim"), id="t1-stats")
        with Horizontal():
            yield Label("latest\nsamples", classes="caption")
            yield Sparkline([], id="t1-spark")
        yield Histogram(id="t1-hist")

    def show(self, model: RunModel) -> None:
        """Redraw from the model (the final Tier1Result wins over running figures)."""
        stats_text, marks = _stats(model)
        # A fixed three lines: redrawing the figures needs no layout pass.
        self.query_one("#t1-stats", Static).update(stats_text, layout=False)
        self.query_one("#t1-spark", Sparkline).data = model.samples[-SPARK_SAMPLES:]
        self.query_one("#t1-hist", Histogram).show(model.sorted_samples, marks)


def _stats(model: RunModel) -> tuple[Text, tuple[float, float, float] | None]:
    result = model.tier1
    if result is not None:
        s = result.stats
        text = Text.assemble(
            ("final ", "bold green"), f"n={s.n}  median ", (fmt.ms(s.median_ms), "bold"),
            f"  95% CI [{fmt.ms(s.ci_low_ms)}, {fmt.ms(s.ci_high_ms)}] "
            f"±{s.ci_rel_halfwidth * 100:.2f}%",
            f"\nmean {fmt.ms(s.mean_ms)}  sd {fmt.ms(s.stdev_ms)}  p5 {fmt.ms(s.p5_ms)}"
            f"  p95 {fmt.ms(s.p95_ms)} · {result.mode} · {result.stop_reason}")
        rates = []
        if result.gbps is not None:
            of = (f" ({result.pct_peak_bw:.0f}% of {result.peak_gbps:.0f})"
                  if result.pct_peak_bw is not None and result.peak_gbps else "")
            rates.append(f"{result.gbps:,.0f} GB/s{of}")
        if result.tflops is not None:
            of = (f" ({result.pct_peak_flops:.1f}% of {result.peak_tflops:.0f})"
                  if result.pct_peak_flops is not None and result.peak_tflops else "")
            rates.append(f"{result.tflops:.3g} TFLOP/s{of}")
        if rates:
            text.append("\n" + " · ".join(rates), "cyan")
        return text, (s.ci_low_ms, s.median_ms, s.ci_high_ms)
    running = model.running_stats()
    if running is None:
        tier = model.tiers.get(1)
        if tier is not None and tier.status != "running":
            return Text(f"Tier 1 {tier.status}" + (f": {tier.reason}" if tier.reason else ""),
                        "yellow"), None
        return Text("Tier 1 has not sent samples yet", "dim"), None
    target = model.spec.target_ci if model.spec is not None else None
    half = running.ci_rel_halfwidth * 100
    reached = target is not None and half <= target * 100 and running.n >= 6
    text = Text.assemble(
        ("running ", "bold cyan"), f"n={running.n}  median ", (fmt.ms(running.median_ms), "bold"),
        f"  95% CI [{fmt.ms(running.ci_low_ms)}, {fmt.ms(running.ci_high_ms)}] ",
        (f"±{half:.2f}%", "green" if reached else "yellow"),
        f" (target ±{target * 100:.2f}%)" if target is not None else "",
        f"\nmin {fmt.ms(running.min_ms)}  p5 {fmt.ms(running.p5_ms)}"
        f"  p95 {fmt.ms(running.p95_ms)}  max {fmt.ms(running.max_ms)}")
    return text, (running.ci_low_ms, running.median_ms, running.ci_high_ms)
