"""GPU telemetry history for the dashboard's sparklines (no Textual here)."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from .. import protocol
from ..gpu.gpus import MAX_INDEX

#: Samples kept per gauge (at 1 Hz: ten minutes).
HISTORY = 600
#: Highest GPU index a telemetry sample may name (the boundary refuses others): the same
#: range ``--gpu`` accepts; no host has more GPUs.
MAX_GPU_INDEX = MAX_INDEX
#: GPUs whose history is kept; a GPU beyond them pushes out the one seen least recently.
#: A pod sending ever-new indexes once grew the laptop from 64 MB to 9.4 GB in a minute.
MAX_GPUS = MAX_GPU_INDEX + 1


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
    Memory is bounded whatever the pod sends: ``size`` samples per gauge, and at most
    ``max_gpus`` GPUs (the one seen least recently is dropped for a new one).
    """

    def __init__(self, size: int = HISTORY, max_gpus: int = MAX_GPUS) -> None:
        self.size = size
        self.max_gpus = max_gpus
        self.series: dict[tuple[int, str], deque[float]] = {}
        #: The latest sample per GPU, least recently seen first.
        self.latest: OrderedDict[int, protocol.GpuSample] = OrderedDict()
        self.count = 0
        #: GPUs whose history was dropped to make room for another.
        self.evicted = 0

    def add(self, event: protocol.Telemetry) -> None:
        """Record one Telemetry event (every GPU in it)."""
        self.count += 1
        for gpu in event.gpus:
            self.latest[gpu.index] = gpu
            self.latest.move_to_end(gpu.index)
            while len(self.latest) > self.max_gpus:
                old, _ = self.latest.popitem(last=False)
                self.evicted += 1
                for g in GAUGES:
                    self.series.pop((old, g.key), None)
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
