"""Tier 1 for short calls: per-call device time from CUPTI activity records.

A Tier-1 sample brackets calls with a CUDA event pair. For a call of a few µs the pair
itself is a visible part of the reading: its records and the launch around them add a
fraction of a µs to a µs that no subtraction of an empty pair fully removes (issue 32: a
5.18 µs kernel by ncu read 5.95 µs, +14.8%). CUPTI's activity records stamp each kernel's
start and end on the GPU's own clock; they are what Nsight Systems reports, so a call
timed from them carries no timer of its own. Nsight Compute's ``gpu__time_duration`` is
not quite that: it times its own range around the kernel and reads ~0.9 µs more per
kernel (:data:`NCU_OFFSET_US`), so a CUPTI figure of a short kernel sits below ncu's and
its result says by how much.

The pod agent takes no dependency for this: the Tier-1 child runs under the workload's
Python, and where that has torch, ``torch.profiler`` (Kineto over CUPTI's activity API)
collects the records. Each call is enqueued between two empty marker kernels
(``gpuws_mark_begin`` / ``gpuws_mark_end``), so the records that belong to it are exactly
those between its marks: the L2 flush, the gate and any fill kernel gpuws issues run
outside them and are never counted. A call's device time is the sum of the durations of
the kernels, memcpys and memsets between its marks, as ncu sums the
``gpu__time_duration`` of a call's kernels.

Where no torch is there, or the profiler gives no records (another profiler holds CUPTI),
the CUDA-event figure stays and the result carries a caution naming the timer's floor.

Standard library only at import; torch and CuPy are imported inside the class that uses
them.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any, Callable, List, Mapping, NamedTuple, Optional, Protocol, Sequence, Tuple

from .stats import ci_reached

#: Calls whose CUDA-event median is under this are timed again from CUPTI records.
#: On short calls Tier 1's event pair reads about :data:`EVENT_FLOOR_US` beyond the
#: kernels' device time, more than 2% of a call under 50 µs; the excess is not a
#: constant (it comes from the launch and record around a short call) and calls of 60 µs
#: and more keep their event timing (within -0.2…+0.6% of ncu on an H200 for torch,
#: cuBLAS, Triton and CuPy, issue 32).
CUPTI_BELOW_MS = 0.050
#: What Tier 1's CUDA events read beyond the device time of a short call, after the empty
#: pair's cost was taken out: 7.87 µs against CUPTI's 6.46 µs for the 25 MB add of
#: tests/gpu/programs/short_kernel.py, cold, on an H200 (tests/gpu/programs/
#: short_cupti_probe.py, 2026-11-28; hot in batches: 4.80 against 3.87 µs). The caution
#: names it when no CUPTI records can be had.
EVENT_FLOOR_US = 1.41
#: What ncu's ``gpu__time_duration`` reads beyond CUPTI's activity record of the same
#: kernel: its own measured range. An empty kernel reads 1.50 µs by ncu (median of 30,
#: ``--cache-control all --clock-control none``; 1.66 µs with ``base``) and 0.61-0.64 µs
#: by CUPTI, on an H200; the add above reads 7.65 µs by ncu (lead's recording, 60
#: launches) against CUPTI's 6.46 µs. So a CUPTI figure of a short kernel sits this far
#: per kernel below ncu's, and the result says so.
NCU_OFFSET_US = 0.89
#: Calls timed per profiling session, and the most sessions; each session starts with
#: :data:`CUPTI_WARMUP` calls that are dropped (the first records after the profiler
#: starts carry its set-up).
CUPTI_ROUND = 200
CUPTI_MAX_ROUNDS = 10
CUPTI_WARMUP = 3
#: What ``Tier1Result.timing_source`` says.
SOURCE_EVENTS = "CUDA events"
SOURCE_TORCH = "CUPTI (torch.profiler)"
#: The marker kernels around each call, and the kernels gpuws issues between calls.
MARK_BEGIN = "gpuws_mark_begin"
MARK_END = "gpuws_mark_end"
#: torch.profiler's Chrome-trace categories of device activities.
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")

_MARK_SRC = r"""
extern "C" __global__ void gpuws_mark_begin() {}
extern "C" __global__ void gpuws_mark_end() {}
"""


class DeviceRecord(NamedTuple):
    """One device activity from a CUPTI-backed trace (times on the GPU's clock, ns).

    Attributes:
        name: Kernel name, or ``Memcpy …``/``Memset …``.
        start_ns: Start.
        end_ns: End.
        device: CUDA device index.
        stream: CUDA stream id (``None`` when the trace does not say).
    """

    name: str
    start_ns: int
    end_ns: int
    device: int
    stream: Optional[int]


class CallTimes(NamedTuple):
    """Per-call device times and what fell outside every call.

    Attributes:
        ns: Each call's device time (sum of its activities' durations), oldest first.
        outside: Names of activities that ran outside every call's marks and are not
            gpuws's own (work on another stream that ran ahead of, or after, the marks).
    """

    ns: List[int]
    outside: List[str]


def device_records(trace: Mapping[str, Any]) -> List[DeviceRecord]:
    """The device activities of a ``torch.profiler`` Chrome trace, by start time.

    ``prof.export_chrome_trace()`` writes complete events (``"ph": "X"``) of category
    ``kernel``/``gpu_memcpy``/``gpu_memset`` with ``ts`` and ``dur`` in µs whose fractions
    carry the ns of CUPTI's stamps, and ``args.device`` / ``args.stream``. Events of other
    categories (host API calls, CPU ops) and malformed ones are skipped.
    """
    events = trace.get("traceEvents") if isinstance(trace, Mapping) else None
    out: List[DeviceRecord] = []
    if not isinstance(events, list):
        return out
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        if str(ev.get("cat", "")).lower() not in DEVICE_CATEGORIES:
            continue
        args = ev.get("args")
        args = args if isinstance(args, dict) else {}
        try:
            start = round(float(ev["ts"]) * 1000.0)
            end = start + round(float(ev["dur"]) * 1000.0)
            device = int(args.get("device", ev.get("pid")) or 0)
            stream = args.get("stream")
            stream = int(stream) if stream is not None else None
        except (KeyError, TypeError, ValueError, OverflowError):
            continue
        if end < start:
            continue
        out.append(DeviceRecord(str(ev.get("name", "")), start, end, device, stream))
    out.sort(key=lambda r: (r.start_ns, r.end_ns))
    return out


def _ours(name: str) -> bool:
    # gpuws's marks, L2 flush, gate and hold; a memset flush shows as a plain memset.
    return name.startswith("gpuws_") or name.startswith("Memset")


def call_times_ns(records: Sequence[DeviceRecord]) -> CallTimes:
    """Each call's device time: the activities between its begin and end marks, summed.

    Records run in start order; a call opens at a :data:`MARK_BEGIN` and closes at the
    next :data:`MARK_END` of the same device. Activities of that device starting in
    between belong to the call, whatever stream ran them (a side stream the call waited
    on); a begin without its end (the trace cut short) gives no call.
    """
    ns: List[int] = []
    outside: List[str] = []
    open_dev: Optional[int] = None
    total = 0
    for rec in records:
        if rec.name == MARK_BEGIN:
            open_dev, total = rec.device, 0
        elif rec.name == MARK_END:
            if open_dev is not None and rec.device == open_dev:
                ns.append(total)
                open_dev = None
        elif open_dev is not None and rec.device == open_dev:
            total += rec.end_ns - rec.start_ns
        elif not _ours(rec.name):
            outside.append(rec.name)
    return CallTimes(ns, outside)


class DeviceTimer(Protocol):
    """Collects device activity records and times calls between marks.

    ``open`` starts collecting; ``begin``/``end`` enqueue the marks around one call;
    ``close`` waits for the GPU, stops collecting and returns the calls' times.
    """

    source: str

    def open(self) -> None:
        """Start collecting records."""

    def begin(self) -> None:
        """Enqueue the mark before a call."""

    def end(self) -> None:
        """Enqueue the mark after a call."""

    def close(self) -> CallTimes:
        """Wait for the GPU, stop collecting; each marked call's time in ns."""


class TorchCuptiTimer:
    """:class:`DeviceTimer` over ``torch.profiler`` (CUDA activities only).

    The marks are CuPy kernels on the current stream, the stream the workload and the
    CUDA events use (see ``CupyEventTimer``).

    Args:
        trace_path: Where to keep the last session's Chrome trace (``None``: a temporary
            file, removed once read).

    Raises:
        ImportError: No torch (or no ``torch.profiler``) in this Python.
        Exception: Whatever CuPy raises when the marker kernels cannot be built.
    """

    source = SOURCE_TORCH

    def __init__(self, trace_path: Optional[str] = None) -> None:
        import cupy
        from torch.profiler import ProfilerActivity, profile

        module = cupy.RawModule(code=_MARK_SRC)
        self._begin = module.get_function(MARK_BEGIN)
        self._end = module.get_function(MARK_END)
        self._sync: Callable[[], None] = cupy.cuda.runtime.deviceSynchronize
        self._make: Callable[[], Any] = lambda: profile(activities=[ProfilerActivity.CUDA])
        self._prof: Any = None
        self._keep = trace_path

    def open(self) -> None:
        """Start a profiling session."""
        self._sync()
        self._prof = self._make()
        self._prof.start()

    def begin(self) -> None:
        """Enqueue the begin mark."""
        self._begin((1,), (1,), ())

    def end(self) -> None:
        """Enqueue the end mark."""
        self._end((1,), (1,), ())

    def close(self) -> CallTimes:
        """Stop the session and read its trace (written to a temporary file, removed)."""
        prof, self._prof = self._prof, None
        if prof is None:
            return CallTimes([], [])
        self._sync()
        prof.stop()
        if self._keep is not None:
            path = self._keep
        else:
            fd, path = tempfile.mkstemp(prefix="gpuws-cupti-", suffix=".json")
            os.close(fd)
        try:
            prof.export_chrome_trace(path)
            with open(path, "rb") as f:
                trace = json.loads(f.read().decode("utf-8", "replace"))
        finally:
            if self._keep is None:
                os.unlink(path)
        return call_times_ns(device_records(trace))


class DeviceLoop(NamedTuple):
    """What :func:`device_loop` measured.

    Attributes:
        samples_ms: Per-call device times in ms, oldest first (empty: no records came).
        outside: Names of activities that ran outside every call (at most 5 kept).
        outside_count: How many there were.
        stop_reason: ``"ci_reached"``, ``"max_seconds"``, ``"rounds"`` or ``"no_records"``.
    """

    samples_ms: List[float]
    outside: List[str]
    outside_count: int
    stop_reason: str


def device_loop(
    run: Callable[[], None],
    *,
    device: DeviceTimer,
    cold: bool,
    flush: Optional[Callable[[], None]] = None,
    gap: Optional[Callable[[float], None]] = None,
    gap_ms: float = 0.0,
    release: Optional[Callable[[], None]] = None,
    target_ci: float = 0.01,
    min_samples: int = 10,
    max_seconds: float = 5.0,
    clock: Callable[[], float] = time.perf_counter,
) -> DeviceLoop:
    """Time single calls between marks, under Tier 1's cold or hot conditions.

    Cold: before each call, the L2 flush and the GPU gap (the gate or hold of the event
    loop), both outside the marks. Hot: calls back to back, L2 as the last call left it.
    Sessions of :data:`CUPTI_ROUND` calls run until the median's CI is reached, the
    rounds or the time run out, or a session gives no records.

    Args:
        run: Enqueues one call.
        device: Collects the records and places the marks.
        cold: Flush and gap before each call.
        flush: The L2 flush (cold).
        gap: Enqueues the GPU wait before a cold call (a gate's ``close`` or a hold).
        gap_ms: Its length.
        release: Called after each call's end mark (a gate's ``open``).
        target_ci: Relative CI half-width that ends sampling.
        min_samples: Fewest calls before the CI may end sampling.
        max_seconds: Wall-time budget of the whole loop.
        clock: Wall clock in seconds.

    Returns:
        The calls' times and what ran outside them.
    """
    t0 = clock()
    samples: List[float] = []
    outside: List[str] = []
    count = 0
    reason = "rounds"
    for _ in range(CUPTI_MAX_ROUNDS):
        device.open()
        for _ in range(CUPTI_WARMUP + CUPTI_ROUND):
            if cold:
                if flush is not None:
                    flush()
                if gap is not None:
                    gap(gap_ms)
            device.begin()
            run()
            device.end()
            if cold and release is not None:
                release()
        got = device.close()
        count += len(got.outside)
        outside.extend(got.outside[:max(0, 5 - len(outside))])
        if len(got.ns) <= CUPTI_WARMUP:
            reason = "no_records"
            break
        samples.extend(ns / 1e6 for ns in got.ns[CUPTI_WARMUP:])
        if len(samples) >= min_samples and ci_reached(samples, target_ci):
            reason = "ci_reached"
            break
        if clock() - t0 >= max_seconds:
            reason = "max_seconds"
            break
    if reason == "no_records" and samples:
        reason = "rounds"  # a later session came back empty: keep what the earlier gave
    return DeviceLoop(samples, outside, count, reason)


def floor_caution(events_median_ms: float, why: str) -> Optional[str]:
    """The caution a short call timed by CUDA events carries, or ``None`` when long.

    Args:
        events_median_ms: The CUDA-event median (ms).
        why: Why no CUPTI figure replaced it (one short clause).
    """
    if not events_median_ms < CUPTI_BELOW_MS or events_median_ms <= 0.0:
        return None
    us = events_median_ms * 1000.0
    pct = 100.0 * min(EVENT_FLOOR_US / us, 1.0)
    return (f"under {CUPTI_BELOW_MS * 1000:.0f} µs ({us:.2f} µs): CUDA events read up to "
            f"~{EVENT_FLOOR_US:.2f} µs per call beyond the kernels' device time (the floor, "
            f"measured on an H200), so CUPTI/nsys times may be up to {pct:.0f}% lower; "
            f"no CUPTI figure: {why}")


def ncu_note(median_ms: float) -> Optional[str]:
    """What a CUPTI figure of a short call carries: ncu reads more, and by how much.

    Args:
        median_ms: The CUPTI median (ms).
    """
    if not 0.0 < median_ms < CUPTI_BELOW_MS:
        return None
    us = median_ms * 1000.0
    return (f"timed from CUPTI activity records ({us:.2f} µs, the kernels' device time as "
            f"nsys shows it); ncu's gpu__time_duration adds ~{NCU_OFFSET_US:.2f} µs per kernel "
            f"of its own (an empty kernel: 1.50 µs by ncu, 0.61 µs by CUPTI on an H200), so "
            f"ncu may read {100.0 * NCU_OFFSET_US / us:.0f}% or more above this")


def make_device_timer() -> Tuple[Optional[DeviceTimer], str]:
    """The CUPTI timer this Python can have, or ``None`` and why not.

    Returns:
        ``(timer, "")`` or ``(None, reason)``.
    """
    try:
        return TorchCuptiTimer(), ""
    except ImportError:
        return None, "no torch in the workload's Python (torch.profiler reads CUPTI)"
    except Exception as exc:  # CuPy's compile errors share no narrower base
        return None, f"the marker kernels could not be built ({type(exc).__name__}: {exc})"
