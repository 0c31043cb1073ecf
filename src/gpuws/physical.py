"""What a physical value is, for every number a pod can send (one table, two uses).

The trust boundary (:mod:`gpuws.live.boundary`) refuses an event holding a number no GPU,
clock or run can produce (a kernel time of 1e308 s, a negative duration, a share of
5,000 %); the views use the same bounds to leave out what an older gpuws stored before that
check existed, so a stored event can never make a later view crash.

Bounds are generous on purpose: they must never refuse an honest figure, only the ones
that would overflow arithmetic (``1e308 + 1e308`` is ``inf``; ``round(inf)`` raises) or
that no hardware reaches. Each is about a thousand times past what the fastest GPU of
2026 does (an H200 moves 4.8 TB/s; a B200 does 20 PFLOP/s at FP4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

S = TypeVar("S", bound=msgspec.Struct)


@dataclass(frozen=True)
class Bound:
    """The range a kind of number may take, and its unit (for the refusal's sentence)."""

    low: float
    high: float
    unit: str


#: The kinds of number, by what they measure.
BOUNDS: dict[str, Bound] = {
    # One call, or a statistic of calls: at most a day (Tier 1 stops after seconds).
    "ms": Bound(0.0, 86_400_000.0, "ms"),
    "ns": Bound(0.0, 1e17, "ns"),  # a whole Tier-2 table: about three years of GPU time
    "s": Bound(0.0, 1e9, "s"),  # a run's or a tier's wall time: about thirty years
    "time": Bound(0.0, 4e10, "s"),  # a unix time (0: unknown; year 3237; datetime: 9999)
    "ratio": Bound(0.0, 1e6, ""),  # the CI's relative half-width
    # A share of a whole (utilisation, occupancy, a stall's share, progress).
    "share": Bound(-1.0, 101.0, "%"),
    # A percentage of a peak or a speed-up: above 100 is possible (L2-resident data
    # beats the DRAM peak), thousands of times above is not.
    "pct": Bound(0.0, 100_000.0, "%"),
    # A share computed from overlapping spans (copies on several streams, kernels
    # overlapping a gap): a little outside 0..100 is honest, thousands of % are not.
    "span_pct": Bound(-1_000.0, 100_000.0, "%"),
    "gbps": Bound(0.0, 1e7, "GB/s"),
    "tflops": Bound(0.0, 1e7, "TFLOP/s"),
    "amount": Bound(0.0, 1e21, ""),  # bytes or FLOPs of one call (a zettabyte)
    "bytes": Bound(0.0, float(1 << 50), "B"),  # a memory, an L2, a flush buffer
    "mib": Bound(0.0, float(1 << 30), "MiB"),  # a memory in MiB: an exbibyte
    "mhz": Bound(0.0, 100_000.0, "MHz"),
    "w": Bound(0.0, 1_000_000.0, "W"),
    "c": Bound(-273.15, 1_000.0, "°C"),
    "count": Bound(0.0, 2.0**53, ""),  # calls, samples, passes, launches, SMs
    "small": Bound(0.0, 1_000_000.0, ""),  # registers, a block's threads, a batch
    "tier": Bound(0.0, 99.0, ""),
    "last_seq": Bound(-1.0, 2.0**31 - 1, ""),  # -1: a run with no event yet (the agent's)
    "index": Bound(0.0, 65_535.0, ""),  # a GPU's index
    "pid": Bound(0.0, 2.0**32, ""),
    "exit": Bound(-(2.0**31), 2.0**32, ""),
    "metric": Bound(-1e21, 1e21, ""),  # ncu's metrics: free-form units, finite and sane
}

#: Every numeric field of every event (and of the structs inside them), by kind.
#: ``tests/security/test_untrusted_numbers.py`` checks that no numeric field is missing.
FIELDS: dict[tuple[str, str], str] = {
    ("Hello", "protocol_version"): "count", ("Hello", "pid"): "pid",
    ("LeaseStatus", "idle_s"): "s", ("LeaseStatus", "deadline_ts"): "time",
    ("LeaseStatus", "connections"): "count", ("LeaseStatus", "runs"): "count",
    ("LeaseStatus", "now_ts"): "time", ("LeaseStop", "at"): "time",
    ("LeaseStatus", "left_out"): "count",
    ("LeaseStop", "idle_for_s"): "s", ("LeaseStop", "ended_at"): "time",
    ("GpuProcess", "pid"): "pid", ("GpuProcess", "used_mib"): "mib",
    ("Gpu", "index"): "index", ("Gpu", "memory_total_mib"): "mib",
    ("Gpu", "memory_used_mib"): "mib", ("Gpu", "sm_clock_mhz"): "mhz",
    ("Gpu", "sm_clock_max_mhz"): "mhz", ("Gpu", "sm_count"): "small",
    ("GpuTarget", "sm_count"): "small",
    ("Gpu", "l2_bytes"): "bytes", ("Gpu", "mem_clock_mhz"): "mhz",
    ("Gpu", "mem_clock_max_mhz"): "mhz", ("Gpu", "util_pct"): "share",
    ("Gpu", "power_w"): "w", ("Gpu", "power_limit_w"): "w", ("Gpu", "temp_c"): "c",
    ("Counters", "uid"): "pid",
    ("Probe", "uid"): "pid", ("Probe", "cpu_count"): "small",
    ("Probe", "memory_total_mib"): "mib", ("Probe", "probe_s"): "s",
    ("StatResult", "size"): "bytes",
    ("RunInfo", "started"): "time", ("RunInfo", "last_seq"): "last_seq", ("RunInfo", "pid"): "pid",
    ("GpuTarget", "index"): "index",
    ("RunStarted", "pid"): "pid",
    ("TierStarted", "tier"): "tier",
    ("TierFinished", "tier"): "tier", ("TierFinished", "wall_s"): "s",
    ("TierFinished", "gpu_s"): "s",
    ("Output", "tier"): "tier",
    ("Samples", "values_ms"): "ms", ("Samples", "batch"): "small",
    ("TimingStats", "n"): "count", ("TimingStats", "median_ms"): "ms",
    ("TimingStats", "mean_ms"): "ms", ("TimingStats", "stdev_ms"): "ms",
    ("TimingStats", "min_ms"): "ms", ("TimingStats", "max_ms"): "ms",
    ("TimingStats", "p5_ms"): "ms", ("TimingStats", "p95_ms"): "ms",
    ("TimingStats", "ci_low_ms"): "ms", ("TimingStats", "ci_high_ms"): "ms",
    ("TimingStats", "ci_rel_halfwidth"): "ratio",
    ("ClockRange", "samples"): "count", ("ClockRange", "sm_mhz_min"): "mhz",
    ("ClockRange", "sm_mhz_median"): "mhz", ("ClockRange", "sm_mhz_max"): "mhz",
    ("ClockRange", "sm_mhz_ceiling"): "mhz", ("ClockRange", "mem_mhz_min"): "mhz",
    ("ClockRange", "mem_mhz_max"): "mhz", ("ClockRange", "power_w_max"): "w",
    ("ClockRange", "power_limit_w"): "w", ("ClockRange", "temp_c_max"): "c",
    ("Tier1Result", "batch"): "small", ("Tier1Result", "warmup"): "count",
    ("Tier1Result", "bytes"): "amount", ("Tier1Result", "flops"): "amount",
    ("Tier1Result", "gbps"): "gbps", ("Tier1Result", "tflops"): "tflops",
    ("Tier1Result", "peak_gbps"): "gbps", ("Tier1Result", "peak_tflops"): "tflops",
    ("Tier1Result", "pct_peak_bw"): "pct", ("Tier1Result", "pct_peak_flops"): "pct",
    ("Tier1Result", "l2_flush_bytes"): "bytes", ("Tier1Result", "cold_gap_ms"): "ms",
    ("Tier1Result", "timer_ms"): "ms", ("Tier1Result", "events_median_ms"): "ms",
    ("KernelRow", "calls"): "count", ("KernelRow", "total_ns"): "ns",
    ("KernelRow", "mean_ns"): "ns", ("KernelRow", "share_pct"): "share",
    ("KernelRow", "launch_skip"): "count",
    ("KernelTable", "gpu_idle_pct"): "span_pct", ("KernelTable", "memcpy_pct"): "span_pct",
    ("NcuProgress", "percent"): "share", ("NcuProgress", "passes"): "count",
    ("Stall", "pct"): "span_pct",
    ("KernelMetrics", "launch"): "count", ("KernelMetrics", "metrics"): "metric",
    ("Rule", "est_speedup_pct"): "pct",
    ("StaticAnalysis", "registers_per_thread"): "small",
    ("StaticAnalysis", "shared_mem_per_block"): "bytes",
    ("StaticAnalysis", "local_mem_per_thread"): "bytes",
    ("StaticAnalysis", "block_size"): "small",
    ("StaticAnalysis", "theoretical_occupancy_pct"): "share",
    ("Artifact", "size"): "bytes",
    ("RunFinished", "wall_s"): "s", ("RunFinished", "exit_code"): "exit",
    ("GpuSample", "index"): "index", ("GpuSample", "util_pct"): "share",
    ("GpuSample", "mem_used_mib"): "mib", ("GpuSample", "sm_clock_mhz"): "mhz",
    ("GpuSample", "power_w"): "w", ("GpuSample", "temp_c"): "c",
    ("GpuSample", "mem_clock_mhz"): "mhz",
    # The timeline's gaps (launch- and host-bound verdicts read them).
    ("KernelTable", "span_ns"): "ns", ("KernelTable", "largest_gap_ns"): "ns",
    ("KernelTable", "gap_count"): "count",
    ("KernelTable", "sync_count"): "count", ("KernelTable", "sync_ns"): "ns",
    # The steady window, host time, communication and ranks of a kernel table.
    ("Phase", "ns"): "ns", ("SteadyWindow", "first_step"): "count",
    ("SteadyWindow", "last_step"): "count", ("SteadyWindow", "steps"): "count",
    ("SteadyWindow", "step_ns"): "ns", ("SteadyWindow", "kernels_per_step"): "count",
    ("HostSite", "count"): "count", ("HostSite", "ns"): "ns",
    ("HostTime", "wall_ns"): "ns", ("HostTime", "launches"): "count",
    ("HostTime", "launch_ns"): "ns", ("HostTime", "op_ns"): "ns",
    ("HostTime", "dispatch_ns"): "ns", ("HostTime", "sync_ns"): "ns",
    ("HostTime", "sync_calls"): "count", ("HostTime", "data_ns"): "ns",
    ("HostTime", "comm_ns"): "ns",
    ("HostTime", "python_ns"): "ns", ("CommShare", "comm_ns"): "ns",
    ("CommShare", "exposed_ns"): "ns", ("CommShare", "comm_pct"): "share",
    ("CommShare", "exposed_pct"): "share", ("RankTable", "rank"): "count",
    ("RankTable", "pid"): "pid", ("RankTable", "gpu_idle_pct"): "span_pct",
    ("RankTable", "span_ns"): "ns",
    # Verdicts and Tier 3's coverage of Tier 2 (remote_agent/verdicts).
    ("FamilyShare", "calls"): "count", ("FamilyShare", "kernels"): "count",
    ("FamilyShare", "share_pct"): "share", ("FamilyShare", "total_ns"): "ns",
    ("ProgramVerdict", "gpu_busy_pct"): "span_pct", ("ProgramVerdict", "memcpy_pct"): "span_pct",
    ("ProgramVerdict", "kernels"): "count", ("ProgramVerdict", "launches"): "count",
    ("ProgramVerdict", "mean_kernel_ns"): "ns", ("ProgramVerdict", "top_share_pct"): "share",
    ("KernelVerdict", "launch"): "count", ("Evidence", "value"): "metric",
    ("RankedRule", "est_speedup_pct"): "pct", ("CoverageRow", "share_pct"): "share",
    ("Tier3Coverage", "launch_count"): "count", ("Tier3Coverage", "launch_skip"): "count",
    # NVML GPM (percentages of the device, nvml.h) and Tier 3's estimate.
    ("GpmMetrics", "sm_active_pct"): "share", ("GpmMetrics", "sm_occupancy_pct"): "share",
    ("GpmMetrics", "tensor_active_pct"): "share", ("GpmMetrics", "hmma_active_pct"): "share",
    ("GpmMetrics", "dram_bw_pct"): "share", ("GpmMetrics", "fp64_pct"): "share",
    ("GpmMetrics", "fp32_pct"): "share", ("GpmMetrics", "fp16_pct"): "share",
    ("GpmMetrics", "timed_share_pct"): "share", ("GpmMetrics", "window_s"): "s",
    ("Tier3Estimate", "seconds"): "s", ("Tier3Estimate", "kernel_s"): "s",
    ("Tier3Estimate", "pass_overhead_s"): "s", ("Tier3Estimate", "start_s"): "s",
    ("Tier3Estimate", "read_s"): "s", ("Tier3Estimate", "budget_s"): "s",
    ("Tier3Estimate", "passes"): "count", ("Tier3Estimate", "launches"): "count",
    # A workspace sync's answers: files counted.
    ("WorkspaceStored", "stored"): "count", ("WorkspaceState", "written"): "count",
    ("WorkspaceState", "removed"): "count",
}

#: Numbers checked elsewhere: the envelope (``seq``, ``ts``: the boundary's own rules) and
#: the ``RunSpec`` a ``run_started`` echoes (the laptop's own choice, shown, never divided
#: by). ``Diagnosis.details`` is free-form (``Any``): shown as text, never computed with.
UNCHECKED: frozenset[tuple[str, str]] = frozenset({
    ("Event", "seq"), ("Event", "ts"), ("Event", "req"),
    ("RunSpec", "tiers"), ("RunSpec", "target_ci"), ("RunSpec", "max_seconds"),
    ("RunSpec", "min_samples"), ("RunSpec", "warmup"), ("RunSpec", "launch_skip"),
    ("RunSpec", "launch_count"), ("RunSpec", "timeout_s"), ("RunSpec", "profile_iters"),
    ("RunSpec", "max_tier3_s"), ("RunSpec", "rank"),
})

def within(value: float | None, kind: str) -> bool:
    """Whether ``value`` is a physical ``kind`` (None, "not measured", always is)."""
    if value is None:
        return True
    bound = BOUNDS[kind]
    return (isinstance(value, (int, float)) and math.isfinite(value)
            and bound.low <= value <= bound.high)


def sane(value: float | None, kind: str) -> float | None:
    """``value`` if it is a physical ``kind``, else None (shown as "not measured").

    For views: a number an older gpuws stored before the boundary checked it must read as
    missing, never crash a chart.
    """
    return value if value is not None and within(value, kind) else None


def problem(msg: msgspec.Struct) -> str | None:
    """The first non-physical number in ``msg`` (an event or a struct inside one), or None.

    The sentence names the field, the value and the range, e.g. ``stats.median_ms =
    1e+308 is not a physical value (0 … 8.64e+07 ms)``.
    """
    return _struct_problem(msg, "")


#: Per struct type: its ranged fields (with their kinds), and the fields that may hold
#: structs to look inside. Worked out once per type, so an ``output`` event (one ranged
#: field, nothing nested) costs one lookup and one comparison, not a walk of every field.
_PLANS: dict[type, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]] = {}
#: Per struct type: its ranged fields that may be None ("not measured").
_NULLABLE: dict[type, frozenset[str]] = {}


def _plan(cls: type) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    plan = _PLANS.get(cls)
    if plan is None:
        name = cls.__name__
        info = msgspec.inspect.type_info(cls)
        assert isinstance(info, msgspec.inspect.StructType)
        ranged = tuple((f.name, FIELDS[(name, f.name)]) for f in info.fields
                       if (name, f.name) in FIELDS)
        nested = tuple(f.name for f in info.fields
                       if (name, f.name) not in FIELDS and _holds_struct(f.type))
        _NULLABLE[cls] = frozenset(
            f.name for f in info.fields if (name, f.name) in FIELDS
            and isinstance(f.type, msgspec.inspect.UnionType)
            and any(isinstance(t, msgspec.inspect.NoneType) for t in f.type.types))
        plan = _PLANS[cls] = (ranged, nested)
    return plan


def blank(msg: S) -> tuple[S, list[str]]:
    """``msg`` with each number that may be missing and is not physical set to None ("not
    measured"), and where those were. Numbers that must be there are left for
    :func:`problem` to refuse.

    For a probe: one GPU's garbage reading (an NVML power of 4,294,967 W on a broken
    board) should not cost the person the whole dashboard.
    """
    where: list[str] = []
    return _blank(msg, "", where), where


def _blank(msg: S, path: str, where: list[str]) -> S:
    ranged, nested = _plan(type(msg))
    nullable = _NULLABLE[type(msg)]
    changes: dict[str, Any] = {}
    for field, kind in ranged:
        value = getattr(msg, field)
        if field in nullable and type(value) in (int, float) and not within(value, kind):
            changes[field] = None
            where.append(f"{path}{field} = {value!r:.40}")
    for field in nested:
        value = getattr(msg, field)
        if isinstance(value, msgspec.Struct):
            new: Any = _blank(value, f"{path}{field}.", where)
        elif isinstance(value, list):
            new = [_blank(item, f"{path}{field}[{i}].", where)
                   if isinstance(item, msgspec.Struct) else item
                   for i, item in enumerate(value)]
        else:
            continue
        if new is not value and new != value:
            changes[field] = new
    return msgspec.structs.replace(msg, **changes) if changes else msg


def _holds_struct(t: msgspec.inspect.Type) -> bool:
    if isinstance(t, msgspec.inspect.StructType):
        return True
    if isinstance(t, msgspec.inspect.UnionType):
        return any(_holds_struct(x) for x in t.types)
    if isinstance(t, msgspec.inspect.ListType):
        return _holds_struct(t.item_type)
    return False


def _struct_problem(msg: msgspec.Struct, path: str) -> str | None:
    ranged, nested = _plan(type(msg))
    for field, kind in ranged:
        value = getattr(msg, field)
        if value is None or (type(value) in (int, float) and within(value, kind)):
            continue  # the common case, without building a path
        why = _value_problem(value, kind, f"{path}{field}")
        if why is not None:
            return why
    for field in nested:
        value = getattr(msg, field)
        where = f"{path}{field}"
        if isinstance(value, msgspec.Struct):
            why = _struct_problem(value, where + ".")
        elif isinstance(value, list):
            why = next((w for i, item in enumerate(value) if isinstance(item, msgspec.Struct)
                        and (w := _struct_problem(item, f"{where}[{i}].")) is not None), None)
        else:
            why = None
        if why is not None:
            return why
    return None


def _value_problem(value: Any, kind: str, where: str) -> str | None:
    if isinstance(value, dict):
        for key, item in value.items():
            why = _value_problem(item, kind, f"{where}[{key!r}]")
            if why is not None:
                return why
        return None
    if isinstance(value, list):
        if value and all(type(v) is float for v in value):
            # Tier-1 batches hold thousands: min and max decide for all (NaN compares false,
            # so a NaN makes the range check below fail too).
            lo, hi = min(value), max(value)
            # The plain sum cannot overflow once min and max are in range; it is NaN if any is.
            if within(lo, kind) and within(hi, kind) and math.isfinite(sum(value)):
                return None
        for i, item in enumerate(value):
            why = _value_problem(item, kind, f"{where}[{i}]")
            if why is not None:
                return why
        return None
    if value is None or isinstance(value, bool) or within(value, kind):
        return None
    bound = BOUNDS[kind]
    unit = f" {bound.unit}" if bound.unit else ""
    return (f"{where} = {value!r:.40} is not a physical value "
            f"({bound.low:.6g} … {bound.high:.6g}{unit})")


def keep(values: list[float], kind: str) -> list[float]:
    """The physical ones of ``values`` (all of them, the common case, without a copy)."""
    if not values:
        return values
    if within(min(values), kind) and within(max(values), kind) and math.isfinite(sum(values)):
        return values
    return [v for v in values if within(v, kind)]
