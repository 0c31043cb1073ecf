"""GPU telemetry history for the dashboard's sparklines (no Textual here)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .. import protocol

#: Samples kept per gauge (at 1 Hz: ten minutes).
HISTORY = 600


@dataclass(frozen=True)
class Gauge:
    """One telemetry quantity: its label, unit and how to read it off a sample."""

    key: str
    label: str
    unit: str


GAUGES: tuple[Gauge, ...] = (
    Gauge("util_pct", "GPU util", "%"),
    Gauge("sm_clock_mhz", "SM clock", "MHz"),
    Gauge("mem_used_mib", "memory", "MiB"),
    Gauge("power_w", "power", "W"),
    Gauge("temp_c", "temp", "°C"),
)


class TelemetryHistory:
    """The latest values of every gauge, per GPU.

    Appending is cheap and happens as each Telemetry event arrives; screens redraw from
    the history when they get to it, so a slow repaint skips frames, never samples.
    """

    def __init__(self, size: int = HISTORY) -> None:
        self.size = size
        self.series: dict[tuple[int, str], deque[float]] = {}
        self.latest: dict[int, protocol.GpuSample] = {}
        self.count = 0

    def add(self, event: protocol.Telemetry) -> None:
        """Record one Telemetry event (every GPU in it)."""
        self.count += 1
        for gpu in event.gpus:
            self.latest[gpu.index] = gpu
            for g in GAUGES:
                value = getattr(gpu, g.key)
                if value is not None:
                    self.series.setdefault((gpu.index, g.key),
                                           deque(maxlen=self.size)).append(float(value))

    def values(self, gpu: int, key: str) -> list[float]:
        """The history of one gauge of one GPU, oldest first."""
        return list(self.series.get((gpu, key), ()))

    @property
    def gpus(self) -> list[int]:
        """GPU indexes seen so far."""
        return sorted(self.latest)
