"""Tier 1 live: the running median and its CI, the latest samples, their histogram.

The final figure comes with the clocks it was taken at, and a caution when they undermine
it (throttling, a varying SM clock): :mod:`gpuws.gpu.clocks` decides, as for every face.
NVML GPM over the same window (or over a ``cmd:``'s whole run) follows, labelled with its
source, or the one line saying why GPM gave nothing (:mod:`gpuws.gpu.evidence`).
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, Sparkline, Static

from .... import protocol
from ....gpu import clocks, evidence
from ....gpu.roofs import roof_caption
from ....live.model import RunModel
from ....text.textsafe import visible
from ... import fmt
from ...notes import why_missing
from .histogram import Histogram

#: Samples the sparkline shows (the latest ones).
SPARK_SAMPLES = 240


class TimingPane(Vertical):
    """Statistics line, sparkline of the latest samples, and the histogram of all."""

    DEFAULT_CSS = """
    TimingPane { height: 1fr; }
    TimingPane #t1-stats { height: 3; padding: 0 1; }
    TimingPane #t1-clocks { height: auto; padding: 0 1; display: none; }
    TimingPane #t1-gpm { height: auto; padding: 0 1; display: none; }
    TimingPane Horizontal { height: 2; padding: 0 1; }
    TimingPane .caption { color: $text-muted; width: 9; }
    TimingPane Sparkline { height: 2; width: 1fr; }
    TimingPane Histogram { margin: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield Static(Text("Tier 1 has not sent samples yet", "dim"), id="t1-stats")
        yield Static(id="t1-clocks")
        yield Static(id="t1-gpm")
        with Horizontal():
            yield Label("latest\nsamples", classes="caption")
            yield Sparkline([], id="t1-spark")
        yield Histogram(id="t1-hist")

    def show(self, model: RunModel) -> None:
        """Redraw from the model (the final Tier1Result wins over running figures)."""
        if model.spec is not None and 1 not in model.spec.tiers:
            self._no_tier1(model)
            return
        stats_text, marks = _stats(model)
        # A fixed three lines: redrawing the figures needs no layout pass.
        self.query_one("#t1-stats", Static).update(stats_text, layout=False)
        if model.tier1 is not None and not self.query_one("#t1-clocks").display:
            # Once, when the final result arrives: the only layout pass this pane makes.
            self.query_one("#t1-clocks", Static).update(clock_text(model.tier1))
            self.query_one("#t1-clocks").display = True
        gpm = gpm_text(model)
        if gpm is not None and not self.query_one("#t1-gpm").display:
            self.query_one("#t1-gpm", Static).update(gpm)
            self.query_one("#t1-gpm").display = True
        self.query_one("#t1-spark", Sparkline).data = model.samples[-SPARK_SAMPLES:]
        self.query_one("#t1-hist", Histogram).show(model.sorted_samples, marks,
                                                   _empty_histogram(model))


    def _no_tier1(self, model: RunModel) -> None:
        """A run without Tier 1 (every ``cmd:``) will never have samples: say why once,
        and what there is instead, with no empty chart under it (issue 34, finding 20)."""
        self.query_one(Horizontal).display = False
        self.query_one("#t1-hist", Histogram).display = False
        stats = self.query_one("#t1-stats", Static)
        stats.styles.height = "auto"
        stats.update(no_tier1_text(model))
        gpm = gpm_text(model)
        if gpm is not None:
            self.query_one("#t1-gpm", Static).update(gpm)
            self.query_one("#t1-gpm").display = True


def no_tier1_text(model: RunModel) -> Text:
    """Why a run has no Tier-1 samples, and the command's own run where it had one."""
    spec = model.spec
    workload = spec.workload if spec is not None else ""
    text = Text()
    if workload.startswith("cmd:"):
        text.append("No Tier-1 samples: a command runs whole. Tier 1 times many calls of one "
                    "bundled kernel or Python benchmark file (builtin: or file:); a command "
                    "is run once, as Tier 0, and its kernels are in the Kernels and Timeline "
                    "tabs.", "yellow")
    else:
        chosen = ", ".join(str(t) for t in spec.tiers) if spec is not None else "?"
        text.append(f"No Tier-1 samples: Tier 1 was not asked for (tiers {chosen}).", "yellow")
    own = model.tiers.get(0)
    if own is not None:
        text.append("\nTier 0, the workload's own run: ", "bold")
        if own.status == "running":
            text.append("running")
        else:
            text.append(f"{visible(own.status, 40)} in {fmt.duration(own.wall_s)}")
    return text


def gpm_text(model: RunModel) -> Text | None:
    """NVML GPM over Tier 1's window (or a ``cmd:``'s run), or None before it arrives."""
    mode = model.tier1.mode if model.tier1 is not None else None
    for tier in (1, 0):
        state = model.tiers.get(tier)
        line = evidence.gpm_line(state.gpm if state is not None else None,
                                 evidence.gpm_over(tier, mode))
        if line is not None:
            measured = evidence.gpm_measured(state.gpm if state is not None else None)
            return Text(line, "" if measured else "dim")
    return None


def clock_text(result: protocol.Tier1Result) -> Text:
    """``clocks: SM 345–1,980 MHz (median 1,980), …`` and, in yellow, any caution."""
    text = Text(clocks.line(result.clocks), "dim" if result.clocks is None else "")
    caution = clocks.caution(result.clocks)
    if caution is not None:
        text.append("\n! caution: ", "bold yellow")
        text.append(caution, "yellow")
    return text


def _stats(model: RunModel) -> tuple[Text, tuple[float, float, float] | None]:
    result = model.tier1
    if result is not None:
        s = result.stats
        text = Text.assemble(
            ("final ", "bold green"), f"n={s.n}  median ", (fmt.ms(s.median_ms), "bold"),
            f"  95% CI [{fmt.ms(s.ci_low_ms)}, {fmt.ms(s.ci_high_ms)}] "
            f"±{fmt.share(s.ci_rel_halfwidth, 2)}",
            f"\nmean {fmt.ms(s.mean_ms)}  sd {fmt.ms(s.stdev_ms)}  p5 {fmt.ms(s.p5_ms)}"
            f"  p95 {fmt.ms(s.p95_ms)} · {result.mode} · {result.stop_reason}")
        rates = []
        if result.gbps is not None:
            of = (f" ({fmt.pct(result.pct_peak_bw, 0)} of {fmt.num(result.peak_gbps)})"
                  if result.pct_peak_bw is not None and result.peak_gbps else "")
            rates.append(f"{fmt.num(result.gbps, 'GB/s')}{of}")
        if result.tflops is not None:
            of = (f" ({fmt.pct(result.pct_peak_flops)} of {fmt.num(result.peak_tflops)})"
                  if result.pct_peak_flops is not None and result.peak_tflops else "")
            rates.append(f"{result.tflops:.3g} TFLOP/s{of}")
        if rates:
            text.append("\n" + " · ".join(rates), "cyan")
        # A rate past its roof reads as an error to a kernel engineer: say what the roof is.
        for caption in (roof_caption(result.pct_peak_bw, result.peak_gbps, "GB/s",
                                     result.peak_source),
                        roof_caption(result.pct_peak_flops, result.peak_tflops, "TFLOP/s",
                                     result.peak_source)):
            if caption is not None:
                text.append("\n" + caption, "yellow")
        if result.events_median_ms is not None:  # a short call, timed again from CUPTI
            text.append(f"\ntimed by {visible(result.timing_source or '?', 40)}; CUDA events "
                        f"read {fmt.ms(result.events_median_ms)}", "dim")
        if result.caution:
            text.append("\n! ", "bold yellow")
            text.append(visible(result.caution, 500), "yellow")
        return text, (s.ci_low_ms, s.median_ms, s.ci_high_ms)
    running = model.running_stats()
    if running is None:
        why = why_missing(model, 1, "Tier-1 samples")
        if why is not None:
            return Text(visible(why), "yellow"), None
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


def _empty_histogram(model: RunModel) -> str:
    """What the histogram says with no samples: "yet" only while the run may send some."""
    if model.finished is None:
        return "no samples yet"
    if model.finished.status == "ok":
        return "no samples"
    return f"{model.finished.status} — no samples"
