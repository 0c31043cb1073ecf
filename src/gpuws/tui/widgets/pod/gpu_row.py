"""One GPU's telemetry in two lines, for pods with several GPUs (eight fit on a laptop)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, Sparkline

from .... import protocol
from ....gpu import clocks
from ....live.telemetry import TelemetryHistory
from ....text.textsafe import visible
from ... import fmt


class GpuRow(Vertical):
    """``GPU 1 ▁▂▅▇█▇ 97%`` over ``1,980 MHz · 23.5 GiB · 412 W · 61 °C · power cap``."""

    DEFAULT_CSS = """
    GpuRow { height: 2; }
    GpuRow Horizontal { height: 1; }
    GpuRow .gpu-label { width: 7; text-style: bold; }
    GpuRow Sparkline { width: 1fr; height: 1; }
    GpuRow .gpu-util { width: 6; text-align: right; }
    GpuRow .gpu-detail { padding: 0 0 0 7; color: $text-muted; width: 1fr; }
    """

    def __init__(self, gpu: protocol.Gpu) -> None:
        super().__init__(id=f"gpu-row-{gpu.index}")
        self.gpu = gpu

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Label(f"GPU {self.gpu.index}", classes="gpu-label")
            yield Sparkline([], id="spark")
            yield Label(fmt.DASH, classes="gpu-util")
        yield Label(Text(visible(self.gpu.name, 60), "dim"), classes="gpu-detail")

    def show(self, history: TelemetryHistory) -> None:
        """Redraw from the telemetry history (its utilisation sparkline, latest readings)."""
        util = history.values(self.gpu.index, "util_pct")
        self.query_one(Sparkline).data = util[-120:]
        self.query_one(".gpu-util", Label).update(fmt.pct(util[-1], 0) if util else fmt.DASH)
        sample = history.latest.get(self.gpu.index)
        if sample is not None:
            self.query_one(".gpu-detail", Label).update(detail(sample))


def detail(s: protocol.GpuSample) -> Text:
    """The latest reading of one GPU; throttling reasons in yellow."""
    parts = [fmt.mhz(s.sm_clock_mhz), fmt.mib(s.mem_used_mib), fmt.watts(s.power_w),
             fmt.celsius(s.temp_c)]
    text = Text(" · ".join(parts))
    throttled = clocks.throttle_events(s.clock_events)
    if throttled:
        text.append(" · " + ", ".join(clocks.event_label(e) for e in throttled), "yellow")
    return text
