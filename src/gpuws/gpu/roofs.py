"""What a rate above 100% of its roof means, in one caption: shared by the CLI's Tier-1
table and the TUI's Timing tab (issue 34, finding 28)."""

from __future__ import annotations

from ..text import humanfmt
from ..text.textsafe import visible


def roof_caption(pct: float | None, peak: float | None, unit: str,
                 source: str | None) -> str | None:
    """What a figure above 100% of its roof means, or None (at or under it).

    "4,300 GB/s (102% of 4,230)" reads as a measurement error to a kernel engineer
    (issue 34, finding 28): the roof is a measured copy's bandwidth or a datasheet
    figure, not the hardware's limit, and the caption says which and what passing it
    means.

    Args:
        pct: the figure's share of the roof, in percent.
        peak: the roof.
        unit: the roof's unit (GB/s, TFLOP/s).
        source: where the roofs came from (Tier 1's ``peak_source``: ``bandwidth: …;
            FP32 FLOPs: …``).
    """
    if pct is None or peak is None or not pct > 100.0:  # NaN included
        return None
    kind = "bandwidth" if unit == "GB/s" else "FLOPs"
    said = next((part.strip() for part in (source or "").split(";")
                 if kind.lower() in part.lower()), "")
    # "bandwidth: measured: device-to-device cudaMemcpyAsync of 1.00 GiB, …"
    said = said.split(":", 1)[1].strip() if ":" in said else said
    if kind == "bandwidth" and said.startswith("measured"):
        meaning = ("what a device copy reaches, not the memory's limit: a kernel at or just "
                   "past it is at the memory roof; well past it, its declared bytes "
                   "overcount what reaches DRAM (L2 hits)")
    elif kind == "bandwidth":
        meaning = ("a datasheet figure: past it, the declared bytes overcount what reaches "
                   "DRAM (L2 hits)")
    else:
        meaning = ("a datasheet figure: past it, the clock ran above the datasheet's or the "
                   "declared FLOPs overcount the work")
    where = f" ({visible(said, 200)})" if said else ""
    return (f"! {humanfmt.pct(pct, 0)} of its roof: the roof, {humanfmt.num(peak, unit)}, "
            f"is {meaning}{where}")
