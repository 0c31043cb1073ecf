"""Tier 1: time a workload with CUDA events until the median is known well enough.

The loop (:func:`timing_loop`) is written against a small :class:`Timer` interface so
its batching and stopping rules can be checked without a GPU; the real timer records
``cupy.cuda.Event`` pairs on the current stream (:class:`CupyEventTimer`).

How a run goes:

1. ``warmup`` calls, so module loading, JIT compilation and library heuristics stay out
   of the numbers.
2. An estimate of one call's time, from back-to-back calls so that launch latency is
   amortised.
3. The mode. ``cold`` times each call alone under the conditions Nsight Compute measures
   in (``--cache-control all``): before every sample L2 is flushed *clean* (a read of a
   buffer twice its size, so the dirty lines of the last call are written back before
   the timed region, not during it) and the GPU waits 1 ms in a gate kernel, so the work
   just before (the flush, the last call) does not slow this one. The gate also waits
   until the host has enqueued the sample (start event, call, stop event: nvbench's
   blocking kernel), so however slow a launcher is (Triton's Python launch takes ~13-20
   µs against CuPy's ~9), its latency never falls inside the timed region. ``hot`` runs
   samples back to back: steady-state throughput, L2 as the last call left it. Calls
   under 10 µs are timed hot in batches of B calls (a batch ≥ 50 µs) queued behind a
   GPU-side wait (a "hold") so the host's launch rate does not set their pace. ``auto``
   (the default) is cold for calls of 10 µs and more, hot in batches below.
4. The timer's own cost: event pairs around nothing, taken as the samples will be; their
   median (~1.6 µs on an H100) is taken out of every sample, so a sample is the work's
   time, as ncu's ``gpu__time_duration`` is, not the work plus the events.
5. Rounds of samples. Each sample is one event pair around ``batch`` calls; a round
   enqueues up to 256 samples (about 100 ms of work) before waiting once, so in hot
   mode the GPU runs samples back to back instead of idling while the host reads each
   result. Each round is emitted as a ``samples`` event.
6. Stop when the median's 95% CI half-width is at most ``target_ci`` of the median and
   at least ``min_samples`` were taken (``stop_reason="ci_reached"``), or when
   ``max_seconds`` of wall time have passed (``"max_seconds"``).

Why cold looks like this (bench/tier1_vs_ncu.py on an H200, docs/performance.md): for
saxpy over 2^26 floats ncu reads 181.2 µs; back-to-back event pairs read 186.6 µs
(+3.0%) and a memset flush, which leaves L2 full of dirty lines, 188.3 µs (+3.9%); a
clean flush reads 183.7 µs and a clean flush plus 1 ms of idle 183.2 µs (+1.1%). A
cuBLAS fp16 gemm right after other work reads 205–210 µs against ncu's 179.7 µs, and
181.1 µs after the 1 ms hold.

Standard library only at import; CuPy is imported inside the functions that use it.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Protocol, Tuple

from ...kernels.workload import Workload
from .device_time import (
    CUPTI_BELOW_MS,
    SOURCE_EVENTS,
    DeviceLoop,
    DeviceTimer,
    device_loop,
    floor_caution,
    make_device_timer,
    ncu_note,
)
from .stats import MIN_CI_SAMPLES, ci_reached, summarize

#: Calls faster than this are timed in batches (CUDA event resolution is about 0.5 µs).
BATCH_BELOW_MS = 0.010
#: A batch is sized to take at least this long on the GPU.
BATCH_TARGET_MS = 0.050
#: Samples are emitted and the stop rule checked about this often...
ROUND_S = 0.1
#: ...or after this many samples, whichever comes first.
ROUND_MAX_SAMPLES = 256
#: The estimate of one call's time runs back-to-back calls for about this long.
PROBE_MS = 1.0
#: Event pairs around nothing, taken as the samples are, whose median is the timer's own
#: cost. An event pair reads ~1.6 µs more than ncu's ``gpu__time_duration`` of the kernel
#: it brackets on an H100, whatever launched it (bench/tier1_launch_bias.py: CuPy +2.1%,
#: torch +1.9%, Triton +1.7% at ~100 µs; the empty pair read 1.60-1.66 µs, and with it
#: taken out +0.54%, +0.20%, +0.03%).
TIMER_SAMPLES = 24
#: Slack added to a hold, for the event records and the launch of the hold itself.
HOLD_MARGIN_MS = 0.02
#: Cold samples wait this long on the GPU (a hold kernel) after the flush.
COLD_GAP_MS = 1.0
#: Timing modes a run may ask for; a result's ``mode`` is the one used (cold or hot).
MODES = ("auto", "cold", "hot")

#: Receives each event dict. A runtime alias, so spelled with `typing` (python3.8 pods).
Emit = Callable[[Dict[str, Any]], None]


class Timer(Protocol):
    """Marks regions of GPU work and reads their durations.

    ``start``/``stop`` enqueue a pair of marks on the stream without waiting; several
    pairs may be outstanding. ``elapsed_ms`` waits for all of them and returns each
    pair's duration in milliseconds, oldest first, then forgets them.
    """

    def start(self) -> None:
        """Mark the start of a timed region on the stream."""

    def stop(self) -> None:
        """Mark the end of the region opened by the last :meth:`start`."""

    def elapsed_ms(self) -> List[float]:
        """Wait for every outstanding pair; their durations in ms, oldest first."""


class GateLike(Protocol):
    """A GPU wait the host ends (:class:`Gate`): ``close(ms)`` enqueues it, ``open()``
    lets it end once ``ms`` have passed."""

    def close(self, min_ms: float) -> None:
        """Enqueue the wait."""

    def open(self) -> None:
        """Let the last enqueued wait end."""


class CupyEventTimer:
    """:class:`Timer` over ``cupy.cuda.Event`` pairs recorded on the current stream.

    Torch workloads run on torch's current stream; both libraries default to the legacy
    default stream, which orders them with these events.
    """

    def __init__(self) -> None:
        import cupy

        self._cupy = cupy
        self._free: List[Tuple[Any, Any]] = []
        self._pending: List[Tuple[Any, Any]] = []
        self._open: Optional[Tuple[Any, Any]] = None

    def start(self) -> None:
        """Record a start event on the current stream."""
        if self._free:
            pair = self._free.pop()
        else:
            pair = (self._cupy.cuda.Event(), self._cupy.cuda.Event())
        pair[0].record()
        self._open = pair

    def stop(self) -> None:
        """Record the matching stop event."""
        if self._open is None:
            raise RuntimeError("Timer.stop() without start()")
        self._open[1].record()
        self._pending.append(self._open)
        self._open = None

    def elapsed_ms(self) -> List[float]:
        """Synchronize on the newest stop event and read every outstanding pair."""
        if not self._pending:
            return []
        # Events on one stream complete in order: the last one done means all are.
        self._pending[-1][1].synchronize()
        get = self._cupy.cuda.get_elapsed_time
        out = [float(get(start, stop)) for start, stop in self._pending]
        self._free.extend(self._pending)
        self._pending = []
        return out


_FLUSH_SRC = r"""
extern "C" __global__ void gpuws_l2_read(const uint4* __restrict__ p, long long n,
                                         unsigned int* sink) {
    unsigned int acc = 0;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;  // never true for a zero buffer: loads stay live
}
"""


class L2Flush(NamedTuple):
    """An L2 flush for cold samples.

    Attributes:
        fn: Enqueues the flush on the current stream (never waits).
        nbytes: Size of the buffer it goes through (twice the L2 size).
        method: ``"read"`` (L2 left holding clean lines) or ``"memset"`` (the fallback
            when no kernel can be built: L2 left dirty, which slows the next call).
    """

    fn: Callable[[], None]
    nbytes: int
    method: str


#: CUPTI-timed samples per ``samples`` event (a line stays far under the wire's limit).
CUPTI_SAMPLES_EVENT = 2000

def memset_flush(buf: Any, size: int) -> Callable[[], None]:
    """A flush that memsets ``size`` bytes of the CuPy array ``buf`` (leaves L2 dirty)."""
    state = {"value": 0}

    def memset() -> None:
        # Alternate the byte so each flush really writes; enqueued, never waited on.
        state["value"] ^= 0xA5
        buf.data.memset_async(state["value"], size)

    return memset


def make_l2_flush(l2_bytes: Optional[int] = None) -> L2Flush:
    """A flush that evicts L2 by reading a zeroed buffer twice its size.

    Reading, not writing: a memset leaves L2 full of dirty lines, and writing them back
    is then charged to the timed call (+2.5% on a 0.18 ms saxpy on an H200). A read
    leaves clean lines, which the next call evicts for free, as after ncu's own flush.
    Falls back to a memset when the read kernel cannot be built.

    Args:
        l2_bytes: L2 size; ``None`` reads ``L2CacheSize`` of the current device.
    """
    import cupy

    dev = cupy.cuda.Device()
    if l2_bytes is None:
        l2_bytes = int(dev.attributes["L2CacheSize"])
    size = max(2 * int(l2_bytes), 1 << 20) // 16 * 16
    buf = cupy.zeros(size, dtype=cupy.uint8)
    try:
        kernel = cupy.RawKernel(_FLUSH_SRC, "gpuws_l2_read")
        kernel.compile()
    except Exception:  # CuPy's compile errors share no narrower base
        return L2Flush(memset_flush(buf, size), size, "memset")
    sink = cupy.zeros(1, dtype=cupy.uint32)
    grid = int(dev.attributes["MultiProcessorCount"]) * 4
    n16 = cupy.int64(size // 16)

    def read() -> None:
        kernel((grid,), (512,), (buf, n16, sink))

    return L2Flush(read, size, "read")


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown Tier 1 mode {mode!r}; one of {', '.join(MODES)}")


class LoopResult(NamedTuple):
    """What :func:`timing_loop` measured.

    Attributes:
        samples_ms: Per-call times (a batch's time divided by ``batch``), in order.
        batch: Calls per timed sample.
        stop_reason: ``"ci_reached"`` or ``"max_seconds"``.
        est_ms: The estimate of one call's time that chose ``batch``.
        wall_s: Wall time of the whole loop, warm-up included.
        mode: ``"cold"`` or ``"hot"``: the mode the samples were taken in.
        gap_ms: GPU idle before each cold sample (0 when hot or without a hold).
        timer_ms: The event pair's own cost, taken out of every sample (see
            :data:`TIMER_SAMPLES`).
    """

    samples_ms: List[float]
    batch: int
    stop_reason: str
    est_ms: float
    wall_s: float
    mode: str = "hot"
    gap_ms: float = 0.0
    timer_ms: float = 0.0


def timing_loop(
    run: Callable[[], None],
    *,
    timer: Timer,
    emit: Emit,
    mode: str = "hot",
    target_ci: float = 0.01,
    max_seconds: float = 10.0,
    min_samples: int = 10,
    warmup: int = 5,
    flush: Optional[Callable[[], None]] = None,
    hold: Optional[Callable[[float], None]] = None,
    clock: Callable[[], float] = time.perf_counter,
    on_window: Optional[Callable[[str], None]] = None,
    gate: Optional[GateLike] = None,
) -> LoopResult:
    """Warm up, choose the mode and batch size, and sample until the stop rule holds.

    Args:
        run: Enqueues one call of the work (no synchronization).
        timer: Marks and reads timed regions.
        emit: Receives a ``samples`` event dict after every round.
        mode: ``"cold"``, ``"hot"`` or ``"auto"`` (cold for calls of 10 µs and more).
        target_ci: Stop once the median's CI half-width / median is at most this...
        max_seconds: ...or once this much wall time has passed (warm-up included).
        min_samples: Fewest samples before ``target_ci`` may stop the loop.
        warmup: Untimed calls before the estimate.
        flush: Evicts L2 (needed for cold samples); called before each, outside its
            timed region. Without it ``auto`` runs hot.
        hold: Enqueues a GPU wait of the given ms: the ``COLD_GAP_MS`` before each cold
            sample, and before each batched hot sample so the host queues the whole
            batch while the GPU waits (see :func:`make_hold`).
        clock: Wall clock in seconds (a stand-in in tests).
        on_window: Called with ``"start"`` right before the first timed round and with
            ``"end"`` right after the last, so the clocks read meanwhile (:mod:`.clocks`)
            are those of the samples, not of the warm-up.
        gate: Used instead of ``hold`` where given: the same waits, each also lasting
            until the host has enqueued the sample's calls and stop event (:class:`Gate`).

    Returns:
        The samples and how they were taken.

    Raises:
        ValueError: ``mode`` is unknown, or cold without a ``flush``.
    """
    _check_mode(mode)
    if mode == "cold" and flush is None:
        raise ValueError("cold samples need an L2 flush")
    if gate is not None:
        hold = gate.close
    t0 = clock()
    for _ in range(max(0, warmup)):
        run()
    est = _estimate(run, timer, clock, hold, gate)
    cold = mode == "cold" or (mode == "auto" and flush is not None
                              and est.gpu_ms >= BATCH_BELOW_MS)
    batch = 1
    if not cold and est.gpu_ms < BATCH_BELOW_MS:
        # CUDA events resolve about 0.5 µs, so a 3 µs call would carry ±15% of pure
        # quantisation; timing B back-to-back calls and dividing by B shrinks that B-fold.
        # Cold samples are never batched: only the first call of a batch would be cold.
        batch = max(1, math.ceil(BATCH_TARGET_MS / max(est.gpu_ms, 1e-6)))
    # Launching a short kernel can take the host longer than the GPU takes to run it, and
    # then a batch would time the host's launch rate. Behind a hold the host queues the
    # whole batch first, so the batch runs back to back at the GPU's own pace (nvbench's
    # hot mode does the same behind a blocking kernel).
    if hold is None:
        hold_ms = 0.0
    elif cold:
        hold_ms = COLD_GAP_MS
    else:
        hold_ms = _hold_ms(batch, est.enqueue_ms) if batch > 1 else 0.0
    pre = flush if cold else None

    def enqueue(calls: int) -> None:
        if pre is not None:
            pre()
        if hold is not None and hold_ms > 0.0:
            hold(hold_ms)
        timer.start()
        for _ in range(calls):
            run()
        timer.stop()
        if gate is not None:
            gate.open()

    # The timer's own cost, under the samples' conditions: what an event pair reads with
    # nothing between its events. It is no part of the work, so it leaves every sample.
    for _ in range(TIMER_SAMPLES):
        enqueue(0)
    empty = sorted(timer.elapsed_ms())
    timer_ms = empty[len(empty) // 2] if empty else 0.0
    samples: List[float] = []
    sample_s = max(batch * est.gpu_ms + hold_ms, 1e-6) / 1000.0  # refined every round
    reason = "max_seconds"
    if on_window is not None:
        on_window("start")
    while True:
        remaining = max_seconds - (clock() - t0)
        count = int(min(ROUND_MAX_SAMPLES, ROUND_S / sample_s, max(remaining, 0.0) / sample_s))
        count = max(1, count)
        started = clock()
        for _ in range(count):
            enqueue(batch)
        # Never below a tenth of the raw reading: a sample shorter than the timer's own
        # cost is noise, not a negative duration.
        values = [max(ms - timer_ms, 0.1 * ms) / batch for ms in timer.elapsed_ms()]
        sample_s = max((clock() - started) / max(len(values), 1), 1e-7)
        samples.extend(values)
        emit({"type": "samples", "values_ms": values, "batch": batch})
        if len(samples) >= min_samples and ci_reached(samples, target_ci):
            reason = "ci_reached"
            break
        if clock() - t0 >= max_seconds:
            break
    if on_window is not None:
        on_window("end")
    return LoopResult(samples, batch, reason, est.gpu_ms, clock() - t0,
                      "cold" if cold else "hot", hold_ms if cold else 0.0, timer_ms)


class _Estimate(NamedTuple):
    gpu_ms: float  # one call's GPU time
    enqueue_ms: float  # host time to enqueue one call (0 when not measured)


def _hold_ms(calls: int, enqueue_ms: float) -> float:
    """A hold long enough for the host to enqueue ``calls`` calls, with room to spare."""
    return 1.5 * calls * enqueue_ms + HOLD_MARGIN_MS


def _estimate(run: Callable[[], None], timer: Timer, clock: Callable[[], float],
              hold: Optional[Callable[[float], None]],
              gate: Optional[GateLike] = None) -> _Estimate:
    """One call's GPU time in ms, with launch latency amortised for short calls."""
    timer.start()
    run()
    timer.stop()
    first = timer.elapsed_ms()[0]
    if first >= PROBE_MS:
        return _Estimate(first, 0.0)
    # A lone call on an idle GPU is timed from the start event, which runs before the
    # kernel arrives: back-to-back calls hide that latency behind the previous call.
    calls = int(min(1000, max(2, math.ceil(PROBE_MS / max(first, 1e-4)))))
    timer.start()
    t = clock()
    for _ in range(calls):
        run()
    enqueue_ms = (clock() - t) * 1000.0 / calls
    timer.stop()
    gpu_ms = timer.elapsed_ms()[0] / calls
    if hold is not None and gpu_ms < BATCH_BELOW_MS:
        # The host may have set that pace: time the same calls queued behind a hold.
        hold(_hold_ms(calls, enqueue_ms))
        timer.start()
        for _ in range(calls):
            run()
        timer.stop()
        if gate is not None:
            gate.open()
        gpu_ms = timer.elapsed_ms()[0] / calls
    return _Estimate(gpu_ms, enqueue_ms)


_HOLD_SRC = r"""
extern "C" __global__ void gpuws_hold(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""


_GATE_SRC = r"""
extern "C" __global__ void gpuws_gate(const volatile unsigned long long* opened,
                                      unsigned long long ticket, unsigned long long min_ns,
                                      unsigned long long max_ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(500);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while ((now - start < min_ns || *opened < ticket) && now - start < max_ns);
}
"""

#: A gate opens by itself after this long, so a host that died (or a GC pause) never
#: leaves the GPU spinning: the sample is then timed as a hold would time it.
GATE_MAX_MS = 500.0


class Gate:
    """A GPU wait that ends only once the host has enqueued the timed region (nvbench's
    blocking kernel), and no sooner than a given time.

    :meth:`close` enqueues a one-thread kernel that spins until a counter in mapped host
    memory reaches its ticket (and at least ``min_ms`` have passed); :meth:`open` writes
    that ticket from the host once the start event, the calls and the stop event are all
    on the stream. The GPU therefore reaches the start event with the calls already
    queued behind it, however long the host took to launch them: a Python launcher's
    latency (Triton's is tens of µs) can never fall inside the event interval. A timed
    hold (:func:`make_hold`) only hides it when the host is quicker than the hold.
    Tickets only grow, so gates of several outstanding samples need no reset.
    """

    def __init__(self) -> None:
        import ctypes

        import cupy
        import numpy

        self._np = numpy
        self._kernel = cupy.RawKernel(_GATE_SRC, "gpuws_gate")
        self._kernel.compile()
        rt = cupy.cuda.runtime
        # cudaHostAllocMapped (2): the device reads the host's writes without a copy.
        self._host = int(rt.hostAlloc(8, 2))
        self._free: Callable[[int], None] = rt.freeHost
        self._sync: Callable[[], None] = rt.deviceSynchronize
        get_dev = getattr(rt, "hostGetDevicePointer", None)
        # Under unified addressing (every 64-bit CUDA >= 4) the host pointer is the
        # device's; older CuPy builds lack hostGetDevicePointer.
        self._dev = int(get_dev(self._host, 0)) if get_dev is not None else self._host
        self._opened = ctypes.c_uint64.from_address(self._host)
        self._opened.value = 0
        self._ticket = 0

    def close(self, min_ms: float) -> None:
        """Enqueue a wait of at least ``min_ms`` that also lasts until the next :meth:`open`."""
        self._ticket += 1
        u64 = self._np.uint64
        self._kernel((1,), (1,), (u64(self._dev), u64(self._ticket),
                                  u64(max(0, int(min_ms * 1e6))), u64(int(GATE_MAX_MS * 1e6))))

    def open(self) -> None:
        """Let the last closed gate end (once its minimum time has passed)."""
        self._opened.value = self._ticket

    def release(self) -> None:
        """Open every gate, wait for them to run, then free the mapped host memory."""
        if not self._host:
            return
        self._opened.value = self._ticket
        try:
            self._sync()
        except Exception:  # a broken context: keep 8 bytes rather than free them under a gate
            return
        self._free(self._host)
        self._host = 0


def make_gate() -> Gate:
    """A :class:`Gate` on the current device.

    Raises:
        Exception: Whatever CuPy raises when the kernel cannot be built or mapped host
            memory cannot be had.
    """
    return Gate()


def make_hold() -> Callable[[float], None]:
    """A function that enqueues a one-thread kernel waiting the given ms on the GPU.

    Raises:
        Exception: Whatever CuPy raises when the kernel cannot be built (``__nanosleep``
            needs compute capability 7.0).
    """
    import cupy
    import numpy

    kernel = cupy.RawKernel(_HOLD_SRC, "gpuws_hold")
    kernel.compile()

    def hold(ms: float) -> None:
        kernel((1,), (1,), (numpy.uint64(max(0, int(ms * 1e6))),))

    return hold


def run_tier1(
    workload: Workload,
    *,
    emit: Emit,
    mode: str = "auto",
    target_ci: float = 0.01,
    max_seconds: float = 10.0,
    min_samples: int = 10,
    warmup: int = 5,
    l2_bytes: Optional[int] = None,
    peaks: Optional[Dict[str, Any]] = None,
    timer: Optional[Timer] = None,
    flush: Optional[L2Flush] = None,
    hold: Optional[Callable[[float], None]] = None,
    clock: Callable[[], float] = time.perf_counter,
    on_window: Optional[Callable[[str], None]] = None,
    gate: Optional[GateLike] = None,
    device: Optional[DeviceTimer] = None,
) -> Dict[str, Any]:
    """Time a set-up workload and derive bandwidth and FLOP rate.

    Calls whose CUDA-event median is under ``device_time.CUPTI_BELOW_MS`` are timed again
    from CUPTI activity records (:mod:`.device_time`), under the same cold or hot
    conditions, and that figure is the result's, the event median kept beside it, with a
    note of how far ncu reads above it; where no records can be had the event figure stays
    with a caution naming the timer's floor.

    Args:
        workload: The workload; its ``setup()`` must already have run.
        emit: Receives ``samples`` events, and ``log`` events saying how short calls were
            handled or which fallback was taken.
        mode: ``"auto"`` (cold for calls ≥ 10 µs, hot in batches below), ``"cold"`` or
            ``"hot"``; see the module docstring.
        target_ci: Relative half-width of the median's 95% CI that ends sampling.
        max_seconds: Wall-time budget.
        min_samples: Fewest samples before the CI may end sampling.
        warmup: Untimed calls first.
        l2_bytes: L2 size for the flush buffer (``None``: read from the device).
        peaks: :func:`measure_peaks`'s dict, for % of peak; ``None`` leaves them out.
        timer: Stand-in timer (tests); default :class:`CupyEventTimer`.
        flush: Stand-in L2 flush (tests); default :func:`make_l2_flush` unless hot.
        hold: Stand-in GPU wait (tests); with the default timer, :func:`make_hold` where
            no gate can be had.
        clock: Wall clock in seconds.
        on_window: Told when the timed rounds start and end (see :func:`timing_loop`).
        gate: Stand-in host-released wait (tests); with the default timer, a
            :class:`Gate`, so a slow launcher can never pace a sample.
        device: Stand-in CUPTI timer (tests); with the default timer,
            ``torch.profiler`` where this Python has torch. With a stand-in ``timer`` and
            no ``device``, short calls keep their event figure and the caution.

    Returns:
        A dict that decodes as ``protocol.Tier1Result`` (``type`` included, envelope
        fields left to the caller). It is returned, not emitted.

    Raises:
        ValueError: ``mode`` is not one of :data:`MODES`.
    """
    _check_mode(mode)  # before the flush buffer is allocated
    own_gate: Optional[Gate] = None
    own_timer = timer is None
    if timer is None:
        timer = CupyEventTimer()
        if hold is None and gate is None:
            try:
                gate = own_gate = make_gate()
            except Exception as exc:  # CuPy's errors share no narrower base
                emit({"type": "log", "level": "info", "message": (
                    f"no GPU gate ({type(exc).__name__}: {exc}): samples wait behind a timed "
                    "hold instead, which hides the host's launch only while the host is "
                    "quicker than the hold")})
        if hold is None and gate is None:
            try:
                hold = make_hold()
            except Exception as exc:  # CuPy's compile errors share no narrower base
                emit({"type": "log", "level": "warning", "message": (
                    f"no GPU hold kernel ({type(exc).__name__}: {exc}); cold samples get no "
                    "idle gap and batches of short calls may be timed at the host's "
                    "launch rate")})
    loop_mode = mode
    if mode != "hot" and flush is None:
        try:
            flush = make_l2_flush(l2_bytes)
        except Exception as exc:  # cupy.cuda.memory.OutOfMemoryError and kin
            if mode == "cold":
                raise RuntimeError(
                    "cold timing needs a flush buffer twice the L2 size and could not get "
                    f"it ({type(exc).__name__}: {exc}); free GPU memory or use --hot") from exc
            emit({"type": "log", "level": "warning", "message": (
                f"no L2 flush buffer ({type(exc).__name__}: {exc}): timing hot (back to "
                "back) instead of cold; free some GPU memory for ncu-like cold samples")})
            loop_mode = "hot"
        if flush is not None and flush.method != "read":
            emit({"type": "log", "level": "warning", "message": (
                "no L2 read kernel could be built: cold samples use a memset flush, which "
                "leaves L2 dirty and reads a few % slow on memory-bound calls")})
    try:
        result = timing_loop(
            workload.run, timer=timer, emit=emit, mode=loop_mode, target_ci=target_ci,
            max_seconds=max_seconds, min_samples=min_samples, warmup=warmup,
            flush=flush.fn if flush is not None else None, hold=hold, clock=clock,
            on_window=on_window, gate=gate,
        )
        events_median = float(summarize(result.samples_ms)["median_ms"])
        dev: Optional[DeviceLoop] = None
        why = "a stand-in timer"
        if events_median < CUPTI_BELOW_MS:
            if device is None and own_timer:
                device, why = make_device_timer()
            if device is not None:
                cold_dev = result.mode == "cold"
                try:
                    dev = device_loop(
                        workload.run, device=device, cold=cold_dev,
                        flush=flush.fn if cold_dev and flush is not None else None,
                        gap=(gate.close if gate is not None else hold) if cold_dev else None,
                        gap_ms=result.gap_ms, release=gate.open if gate is not None else None,
                        target_ci=target_ci, min_samples=min_samples,
                        max_seconds=max_seconds, clock=clock)
                except Exception as exc:  # torch.profiler/CUPTI errors share no base
                    why = f"the profiler failed ({type(exc).__name__}: {exc})"
                if dev is not None and len(dev.samples_ms) < MIN_CI_SAMPLES:
                    why = ("the profiler gave no kernel records (is another profiler "
                           "holding CUPTI?)")
                    dev = None
    finally:
        if own_gate is not None:
            own_gate.release()
    short = result.est_ms < BATCH_BELOW_MS
    if mode == "cold" and short:
        emit({"type": "log", "level": "warning", "message": (
            f"{workload.name}: one call takes ~{result.est_ms * 1000:.1f} µs; cold samples are "
            "not batched (each needs its own L2 flush), so CUDA-event resolution (~0.5 µs) "
            "limits their precision; --hot batches them")})
    elif mode == "auto" and short and result.mode == "hot":
        emit({"type": "log", "level": "info", "message": (
            f"{workload.name}: one call takes ~{result.est_ms * 1000:.1f} µs, so it was timed "
            f"hot in batches of {result.batch} (a flush per call would dwarf it); --cold "
            "times single calls")})
    stats = summarize(result.samples_ms)
    cold = result.mode == "cold"
    source = SOURCE_EVENTS
    caution: Optional[str] = None
    if dev is not None and device is not None:
        source = device.source
        stats = summarize(dev.samples_ms)
        # The reported figure's own samples, which the laptop reads in place of the event
        # samples streamed above (a compare of two short runs must not judge the events'
        # figures while the runs report CUPTI's).
        for i in range(0, len(dev.samples_ms), CUPTI_SAMPLES_EVENT):
            emit({"type": "samples", "values_ms": dev.samples_ms[i:i + CUPTI_SAMPLES_EVENT],
                  "batch": 1, "source": "cupti"})
        caution = ncu_note(float(stats["median_ms"]))
        emit({"type": "log", "level": "info", "message": (
            f"{workload.name}: CUDA events read {events_median * 1000:.2f} µs a call, "
            f"under {CUPTI_BELOW_MS * 1000:.0f} µs where the event pair's own floor shows; "
            f"timed again from CUPTI activity records ({source}): "
            f"{float(stats['median_ms']) * 1000:.2f} µs over {stats['n']} calls, "
            "the figure reported")})
        if dev.outside_count:
            emit({"type": "log", "level": "warning", "message": (
                f"{dev.outside_count} device activities ran outside every timed call "
                f"(another stream ahead of or after the call?) and are not counted: "
                f"{', '.join(n[:80] for n in dev.outside)}")})
    else:
        caution = floor_caution(events_median, why)
        if caution is not None:
            emit({"type": "log", "level": "warning", "message": caution})
    out: Dict[str, Any] = {
        "type": "tier1_result",
        "stats": stats,
        "mode": result.mode,
        "requested_mode": mode,
        "batch": 1 if dev is not None else result.batch,
        "warmup": warmup,
        "stop_reason": dev.stop_reason if dev is not None else result.stop_reason,
        "timing_source": source,
        "events_median_ms": events_median if dev is not None else None,
        "caution": caution,
        "l2_flush_bytes": flush.nbytes if cold and flush is not None else None,
        "l2_flush_method": flush.method if cold and flush is not None else None,
        "cold_gap_ms": result.gap_ms if cold else None,
        "timer_ms": result.timer_ms,
    }
    out.update(derive_rates(workload, float(stats["median_ms"]), peaks))
    return out


def derive_rates(
    workload: Workload, median_ms: float, peaks: Optional[Dict[str, Any]]
) -> Dict[str, Any]:
    """GB/s and TFLOP/s from the declared work, and their share of the peaks.

    Returns:
        ``bytes``, ``flops``, ``gbps``, ``tflops``, ``peak_gbps``, ``peak_tflops``,
        ``pct_peak_bw``, ``pct_peak_flops`` and ``peak_source`` (``None`` where unknown).
    """
    seconds = median_ms / 1000.0
    nbytes = workload.bytes_moved
    flops = workload.flops
    gbps = nbytes / seconds / 1e9 if nbytes is not None and seconds > 0 else None
    tflops = flops / seconds / 1e12 if flops is not None and seconds > 0 else None
    peak_gbps: Optional[float] = None
    peak_tflops: Optional[float] = None
    sources: List[str] = []
    if peaks:
        if gbps is not None:
            if peaks.get("copy_gbps"):
                peak_gbps = float(peaks["copy_gbps"])
                sources.append(f"bandwidth: {peaks.get('copy_source', 'measured copy')}")
            elif peaks.get("datasheet_gbps"):
                peak_gbps = float(peaks["datasheet_gbps"])
                sources.append(f"bandwidth: {peaks.get('flops_source', 'datasheet')}")
        if tflops is not None and workload.flops_kind in ("fp32", "tensor"):
            value = peaks.get(f"{workload.flops_kind}_tflops")
            if value:
                peak_tflops = float(value)
                label = "FP32" if workload.flops_kind == "fp32" else "FP16/BF16 tensor"
                sources.append(f"{label} FLOPs: {peaks.get('flops_source', 'datasheet')}")
    return {
        "bytes": nbytes,
        "flops": flops,
        "gbps": gbps,
        "tflops": tflops,
        "peak_gbps": peak_gbps,
        "peak_tflops": peak_tflops,
        "pct_peak_bw": 100.0 * gbps / peak_gbps if gbps is not None and peak_gbps else None,
        "pct_peak_flops": (100.0 * tflops / peak_tflops
                           if tflops is not None and peak_tflops else None),
        "peak_source": "; ".join(sources) if sources else None,
    }


class DatasheetPeaks(NamedTuple):
    """Dense datasheet peaks of one GPU model (from reference/ncu-compat.md)."""

    model: str
    fp32_tflops: float
    tensor_tflops: float
    memory_gbps: float


# Order matters: the first row whose test accepts the name wins.
_DATASHEET: Tuple[Tuple[Callable[[str], bool], DatasheetPeaks], ...] = (
    (lambda s: "H200" in s and "NVL" not in s, DatasheetPeaks("H200 SXM", 67.0, 989.0, 4800.0)),
    (lambda s: "H100" in s and "PCIE" not in s and "NVL" not in s,
     DatasheetPeaks("H100 SXM", 67.0, 989.0, 3350.0)),
    (lambda s: "A100" in s and "SXM" in s and "80GB" in s,
     DatasheetPeaks("A100 SXM 80GB", 19.5, 312.0, 2040.0)),
    (lambda s: " L4" in f" {s}" and "L40" not in s, DatasheetPeaks("L4", 30.3, 121.0, 300.0)),
    (lambda s: "RTX 4090" in s, DatasheetPeaks("RTX 4090", 82.6, 165.0, 1010.0)),
)


def datasheet_peaks(gpu_name: str) -> Optional[DatasheetPeaks]:
    """The datasheet row for a GPU name as the driver reports it, or ``None``.

    Variants whose peaks differ from the table's (H100 PCIe/NVL, H200 NVL, A100 40GB or
    PCIe) get ``None`` rather than a wrong number.
    """
    name = gpu_name.upper()
    for accepts, row in _DATASHEET:
        if accepts(name):
            return row
    return None


def measure_peaks(*, nbytes: int = 1 << 30, repeats: int = 20) -> Dict[str, Any]:
    """The pod's measured copy bandwidth and the datasheet compute peaks of its GPU.

    The copy is ``cudaMemcpyAsync`` device-to-device of ``nbytes`` (1 GiB, less only when
    free memory is short), timed with CUDA events after a warm-up; the rate counts bytes
    read plus bytes written, as the workloads' ``bytes_moved`` do. The buffers are
    returned to CuPy's pool and the pool emptied afterwards.

    Returns:
        ``gpu_name``, ``copy_gbps``, ``copy_source``, ``datasheet_gbps``,
        ``fp32_tflops``, ``tensor_tflops``, ``flops_source`` (``None`` where unknown).
    """
    import cupy

    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    raw_name = props["name"]
    name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)
    free, _total = cupy.cuda.runtime.memGetInfo()
    size = min(int(nbytes), int(free) // 4) // (1 << 20) * (1 << 20)
    copy_gbps: Optional[float] = None
    copy_source = "not measured: too little free GPU memory"
    if size > 0:
        src = cupy.empty(size, dtype=cupy.uint8)
        dst = cupy.empty(size, dtype=cupy.uint8)
        src.data.memset_async(1, size)
        timer = CupyEventTimer()
        for _ in range(3):
            dst.data.copy_from_device_async(src.data, size)
        for _ in range(max(1, repeats)):
            timer.start()
            dst.data.copy_from_device_async(src.data, size)
            timer.stop()
        times = sorted(timer.elapsed_ms())
        median_ms = summarize(times)["median_ms"]
        copy_gbps = 2.0 * size / (float(median_ms) / 1000.0) / 1e9
        copy_source = (f"measured: device-to-device cudaMemcpyAsync of {size / (1 << 30):.2f} GiB, "
                       f"median of {len(times)} CUDA-event timings, read+write bytes")
        del src, dst
        cupy.get_default_memory_pool().free_all_blocks()
    sheet = datasheet_peaks(name)
    return {
        "gpu_name": name,
        "copy_gbps": copy_gbps,
        "copy_source": copy_source,
        "datasheet_gbps": sheet.memory_gbps if sheet else None,
        "fp32_tflops": sheet.fp32_tflops if sheet else None,
        "tensor_tflops": sheet.tensor_tflops if sheet else None,
        "flops_source": (f"datasheet: {sheet.model} (dense)" if sheet
                         else f"no datasheet entry for {name!r}"),
    }
