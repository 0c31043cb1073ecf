"""The clocks behind a Tier-1 figure: NVML read while Tier 1 takes its samples.

The worker (not the CuPy child: this is stdlib and the worker already has NVML open)
reads the run's GPU — SM and memory clocks, power, temperature and the active
clock-event reasons — :data:`PERIOD_S` apart on a thread of its own, while the child's
timing loop runs. So that the readings cover the timed window and nothing else, the child
writes two private markers on its event pipe, :data:`WINDOW_EVENT` with ``edge``
``start`` right before its first timed round and ``end`` right after its last; the worker
takes a reading at each marker as it arrives (within a millisecond: the pipe is read as
it is written) and the periodic ones in between. The markers never reach the run's log.

What comes out is a ``protocol.ClockRange`` dict, or None when NVML cannot be read:
no number is ever made up for a clock nobody read.

An NVML reading costs tens of microseconds in this process and no GPU work, so 10 Hz
does not disturb the timed work in the child (which owns the GPU's only context).
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any, Callable, Dict, List, Optional

#: The marker event type the Tier-1 child writes around its timed rounds (never logged).
WINDOW_EVENT = "gpuws_clock_window"
#: Seconds between periodic readings inside the window. The window's two edges are read
#: as well, so even a window shorter than this is covered at both ends.
PERIOD_S = 0.1
#: Readings kept at most (10 Hz for over five hours); later ones are counted, not kept.
MAX_READINGS = 200_000

Reading = Dict[str, Any]


class ClockSampler:
    """Reads one GPU's clocks while a window is open.

    Args:
        read: Returns one reading (``sm_clock_mhz``, ``mem_clock_mhz``, ``power_w``,
            ``temp_c``, ``clock_events``), as ``gpuinfo.Nvml.clocks`` does.
        ceiling_mhz: The GPU's highest SM clock, for ``sm_mhz_ceiling``.
        power_limit_w: The power limit enforced now.
        period_s: Seconds between periodic readings.
    """

    def __init__(self, read: Callable[[], Reading], ceiling_mhz: Optional[float] = None,
                 power_limit_w: Optional[float] = None, period_s: float = PERIOD_S) -> None:
        self._read = read
        self.ceiling_mhz = ceiling_mhz
        self.power_limit_w = power_limit_w
        self.period_s = period_s
        self._lock = threading.Lock()
        self._readings: List[Reading] = []
        self._open = False
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.failures = 0

    def start(self) -> "ClockSampler":
        """Start the reading thread (it reads only while a window is open)."""
        self._thread = threading.Thread(target=self._loop, name="gpuws-clocks", daemon=True)
        self._thread.start()
        return self

    def mark(self, edge: str) -> None:
        """The child's marker: ``start`` opens the window, ``end`` closes it; each is read."""
        if edge == "start":
            with self._lock:
                self._open = True
            self._take()
            self._wake.set()
        elif edge == "end":
            self._take()
            with self._lock:
                self._open = False

    def stop(self) -> None:
        """Close the window and end the thread."""
        with self._lock:
            self._open = False
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def readings(self) -> List[Reading]:
        """A copy of the readings taken so far."""
        with self._lock:
            return list(self._readings)

    def summary(self) -> Optional[Dict[str, Any]]:
        """The window's ``protocol.ClockRange`` dict, or None if nothing was read."""
        return summarize(self.readings(), self.ceiling_mhz, self.power_limit_w)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                is_open = self._open
            if not is_open:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            self._stop.wait(self.period_s)
            with self._lock:
                still = self._open
            if still and not self._stop.is_set():
                self._take()

    def _take(self) -> None:
        try:
            reading = self._read()
        except Exception:  # a GPU that fell off the bus: the summary says what was read
            self.failures += 1
            return
        reading = dict(reading, t=time.monotonic())
        with self._lock:
            if len(self._readings) < MAX_READINGS:
                self._readings.append(reading)


def summarize(readings: List[Reading], ceiling_mhz: Optional[float] = None,
              power_limit_w: Optional[float] = None) -> Optional[Dict[str, Any]]:
    """A ``protocol.ClockRange`` dict from readings, or None when none read an SM clock.

    ``clock_events`` is every reason seen in any reading, ``gpu_idle`` left out (cold
    samples idle the GPU 1 ms on purpose, and idle is not a slowdown of work).
    """
    from .gpuinfo import sort_clock_events

    sm = [float(r["sm_clock_mhz"]) for r in readings if r.get("sm_clock_mhz") is not None]
    if not sm:
        return None
    mem = [float(r["mem_clock_mhz"]) for r in readings if r.get("mem_clock_mhz") is not None]
    power = [float(r["power_w"]) for r in readings if r.get("power_w") is not None]
    temp = [float(r["temp_c"]) for r in readings if r.get("temp_c") is not None]
    events: set[str] = set()
    for r in readings:
        events.update(str(e) for e in r.get("clock_events") or [])
    events.discard("gpu_idle")
    return {
        "samples": len(readings),
        "sm_mhz_min": min(sm),
        "sm_mhz_median": float(statistics.median(sm)),
        "sm_mhz_max": max(sm),
        "sm_mhz_ceiling": ceiling_mhz,
        "mem_mhz_min": min(mem) if mem else None,
        "mem_mhz_max": max(mem) if mem else None,
        "power_w_max": max(power) if power else None,
        "power_limit_w": power_limit_w,
        "temp_c_max": max(temp) if temp else None,
        "clock_events": sort_clock_events(events),
        "source": "nvml",
    }


def sampler_for(index: Optional[int]) -> Optional[ClockSampler]:
    """A sampler of NVML GPU ``index``, or None without NVML or without a known GPU."""
    if index is None:
        return None
    from .gpuinfo import nvml_session

    nvml = nvml_session()
    if nvml is None or not 0 <= index < nvml.count:
        return None

    def read() -> Reading:
        return nvml.clocks(index)

    return ClockSampler(read, nvml.max_sm_clock_mhz(index), nvml.power_limit_w(index))
