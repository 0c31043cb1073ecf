"""The clocks behind a Tier-1 figure: what they were, and when to distrust the figure.

The agent reads the GPU's SM and memory clocks, power, temperature and clock-event
(throttle) reasons through NVML while Tier 1 samples, and sends their range with the
result (:class:`gpuws.protocol.ClockRange`). A median taken while the SM clock climbs from
the H200's 345 MHz idle is not the one the same code gives at its 1,980 MHz boost, and on
a rented pod the person cannot lock the
clocks: so every face that shows a Tier-1 figure (the CLI, the TUI, the export,
``compare``) shows these clocks beside it, and a caution when they undermine it.

The rules live here once, so every face cautions for the same reasons:

- a clock-event reason other than idle or an application-clock setting was seen
  (a power cap, a thermal or hardware slowdown, a power brake, sync boost, or a reason
  this gpuws does not know): the GPU ran slower than it can;
- the SM clock varied by more than :data:`SPREAD_LIMIT` of its median while sampling
  (``(max - min) / median``; exactly 3% is still fine): the samples mix clock speeds,
  as in a cold start where the first samples run at the 345 MHz idle clock.

A result without clocks (an older agent, NVML not readable) is "clocks not recorded":
no number is ever made up for it. No Textual and no Rich here: plain strings.
"""

from __future__ import annotations

from .. import protocol
from ..text import humanfmt
from ..text.textsafe import visible

#: The SM clock may vary this much (``(max - min) / median``) before the figure is
#: cautioned. NVML moves the H200's clock in 15 MHz steps: one step at 1,980 MHz is 0.8%.
SPREAD_LIMIT = 0.03

#: Clock-event reasons that do not slow a busy GPU: idle (the GPU waits for work, as it
#: does between cold samples) and the clock set by the application or administrator.
BENIGN_EVENTS = frozenset({
    "gpu_idle", "idle", "none",
    "applications_clocks_setting", "application_clocks_setting", "app_clocks_setting",
    "app_clock_setting", "applications_clock_setting",
})

#: How a person reads NVML's clock-event reasons (by the names the agent sends).
EVENT_LABELS = {
    "sw_power_cap": "software power cap",
    "hw_slowdown": "hardware slowdown",
    "sw_thermal": "software thermal slowdown",
    "sw_thermal_slowdown": "software thermal slowdown",
    "hw_thermal": "hardware thermal slowdown",
    "hw_thermal_slowdown": "hardware thermal slowdown",
    "hw_power_brake": "hardware power brake",
    "hw_power_brake_slowdown": "hardware power brake",
    "sync_boost": "sync boost",
    "display_clock_setting": "display clock setting",
    "display_clocks_setting": "display clock setting",
    "gpu_idle": "idle",
    "applications_clocks_setting": "application clocks set",
}

NOT_RECORDED = "clocks not recorded"


def event_label(name: str) -> str:
    """A clock-event reason as a person reads it (an unknown name shown as sent)."""
    return EVENT_LABELS.get(name) or visible(name, 40)


def throttle_events(events: list[str]) -> list[str]:
    """The reasons among ``events`` that mean the GPU ran slower than it can."""
    seen: list[str] = []
    for name in events:
        if name not in BENIGN_EVENTS and name not in seen:
            seen.append(name)
    return seen


def spread(clocks: protocol.ClockRange) -> float | None:
    """``(max - min) / median`` of the SM clock, or None when it cannot be told."""
    lo, mid, hi = clocks.sm_mhz_min, clocks.sm_mhz_median, clocks.sm_mhz_max
    if lo is None or mid is None or hi is None or mid <= 0:
        return None
    return (hi - lo) / mid


def caution(clocks: protocol.ClockRange | None) -> str | None:
    """Why the figure taken at these clocks should not be trusted as the GPU's own, or None.

    Args:
        clocks: the clocks recorded with a Tier-1 result (None: not recorded, which is
            not a caution in itself: :func:`describe` says so).

    Returns:
        One line naming each reason (throttling seen, the SM clock's spread), or None.
    """
    if clocks is None:
        return None
    reasons: list[str] = []
    throttled = throttle_events(clocks.clock_events)
    if throttled:
        names = ", ".join(event_label(e) for e in throttled)
        reasons.append(f"throttled while sampling ({names}): the figure is lower than this "
                       "GPU gives unthrottled")
    varied = spread(clocks)
    if varied is not None and varied > SPREAD_LIMIT:
        reasons.append(f"the SM clock varied {_sm_range(clocks)} while sampling "
                       f"({humanfmt.pct(varied * 100, 0)} of its median): the samples mix "
                       "clock speeds; more --warmup lets the clock settle")
    return "; ".join(reasons) or None


def describe(clocks: protocol.ClockRange | None) -> str:
    """The clocks in one line: ``SM 345–1,980 MHz (median 1,980), mem 3,201 MHz, 126 W
    max, 41 °C``; ``clocks not recorded`` when there are none."""
    if clocks is None:
        return NOT_RECORDED
    parts: list[str] = []
    if clocks.sm_mhz_median is not None or clocks.sm_mhz_min is not None:
        sm = f"SM {_sm_range(clocks)}"
        if (clocks.sm_mhz_median is not None and clocks.sm_mhz_min is not None
                and clocks.sm_mhz_max is not None and clocks.sm_mhz_min != clocks.sm_mhz_max):
            sm += f" (median {humanfmt.num(clocks.sm_mhz_median)})"
        parts.append(sm)
    if clocks.mem_mhz_min is not None or clocks.mem_mhz_max is not None:
        parts.append(f"mem {_range(clocks.mem_mhz_min, clocks.mem_mhz_max, 'MHz')}")
    if clocks.power_w_max is not None:
        parts.append(f"{humanfmt.watts(clocks.power_w_max)} max")
    if clocks.temp_c_max is not None:
        parts.append(humanfmt.celsius(clocks.temp_c_max))
    if not parts:
        return ("clocks not read (NVML gave no reading while Tier 1 sampled)"
                if clocks.samples == 0 else NOT_RECORDED)
    return ", ".join(parts)


def line(clocks: protocol.ClockRange | None) -> str:
    """The clocks as a labelled line: ``clocks: SM 1,980 MHz, …`` or ``clocks not recorded``."""
    return NOT_RECORDED if clocks is None else f"clocks: {describe(clocks)}"


def cycles_per_call(median_ms: float, clocks: protocol.ClockRange | None) -> float | None:
    """SM cycles per call: the median time × the median SM clock (None without the clock)."""
    if clocks is None or clocks.sm_mhz_median is None or clocks.sm_mhz_median <= 0:
        return None
    return median_ms * 1e-3 * clocks.sm_mhz_median * 1e6


def cycle_ratio(median_a_ms: float, clocks_a: protocol.ClockRange | None,
                median_b_ms: float, clocks_b: protocol.ClockRange | None) -> float | None:
    """A's cycles per call over B's, the speedup with the clock difference taken out.

    Above 1 means B needs fewer cycles, as a speedup above 1 means B takes less time.
    None unless both runs' median SM clocks are known.
    """
    a = cycles_per_call(median_a_ms, clocks_a)
    b = cycles_per_call(median_b_ms, clocks_b)
    if a is None or b is None or b <= 0:
        return None
    return a / b


def _sm_range(clocks: protocol.ClockRange) -> str:
    lo = clocks.sm_mhz_min if clocks.sm_mhz_min is not None else clocks.sm_mhz_median
    hi = clocks.sm_mhz_max if clocks.sm_mhz_max is not None else clocks.sm_mhz_median
    return _range(lo, hi, "MHz")


def _range(lo: float | None, hi: float | None, unit: str) -> str:
    if lo is None or hi is None or round(lo) == round(hi):
        return humanfmt.num(lo if lo is not None else hi, unit)
    return f"{humanfmt.num(lo)}–{humanfmt.num(hi, unit)}"
