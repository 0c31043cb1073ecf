"""One telemetry gauge: its label, a sparkline of its history, and the current value."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, Sparkline

from ....live.telemetry import Gauge
from ... import fmt


class SparkGauge(Horizontal):
    """``GPU util ▁▂▅▇█▇ 97 %`` — a row of the dashboard's telemetry panel."""

    DEFAULT_CSS = """
    SparkGauge { height: 2; }
    SparkGauge .gauge-label { width: 10; color: $text-muted; }
    SparkGauge Sparkline { width: 1fr; height: 2; }
    SparkGauge .gauge-value { width: 11; text-align: right; }
    """

    def __init__(self, gauge: Gauge, gpu: int = 0) -> None:
        super().__init__(id=f"gauge-{gpu}-{gauge.key}")
        self.gauge = gauge
        self.gpu = gpu

    def compose(self) -> ComposeResult:
        yield Label(self.gauge.label, classes="gauge-label")
        yield Sparkline([], id="spark")
        yield Label("—", classes="gauge-value")

    def show(self, values: list[float]) -> None:
        """Redraw with this history (oldest first)."""
        self.query_one(Sparkline).data = values[-120:]
        value = fmt.quantity(values[-1], self.gauge.unit) if values else fmt.DASH
        self.query_one(".gauge-value", Label).update(value)
