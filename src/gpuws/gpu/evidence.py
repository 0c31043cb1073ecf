"""How every face words NVML GPM figures and Tier 3's estimate (plain strings, no Rich).

GPM (:class:`gpuws.protocol.GpmMetrics`) comes with Tier 1 (its timed window) and with a
``cmd:`` workload's run (tier 0); each number is labelled with its source, "NVML GPM", and
where GPM gave nothing the one line the agent sent says why. Tier 3's estimate
(:class:`gpuws.protocol.Tier3Estimate`) is shown before ncu starts, in seconds and, at the
session's rate, dollars. The CLI printer, the run panes, the results screen and the export
all call these, so they say the same thing.
"""

from __future__ import annotations

from .. import protocol
from ..text import humanfmt
from ..text.textsafe import visible

SOURCE = "NVML GPM"

#: GPM's fields in the order people read them, with their labels.
GPM_LABELS: tuple[tuple[str, str], ...] = (
    ("sm_active_pct", "SM active"),
    ("sm_occupancy_pct", "SM occupancy"),
    ("tensor_active_pct", "tensor active"),
    ("hmma_active_pct", "FP16/BF16 tensor"),
    ("dram_bw_pct", "DRAM bandwidth"),
    ("fp64_pct", "FP64 pipe"),
    ("fp32_pct", "FP32 pipe"),
    ("fp16_pct", "FP16 pipe"),
)
#: The four a one-line summary shows.
GPM_SHORT = ("sm_active_pct", "tensor_active_pct", "dram_bw_pct", "sm_occupancy_pct")


def gpm_over(tier: int, mode: str | None = None) -> str:
    """What a tier's GPM window covered, for people: Tier 1's timed rounds (a cold Tier 1's
    flushes and idle holds inside them), or a ``cmd:``'s whole run."""
    if tier == 0:
        return "the command's whole run"
    if tier == 1:
        return "Tier 1's timed rounds" + (
            ", with the L2 flush and 1 ms idle before each cold sample" if mode == "cold"
            else "")
    return f"tier {tier}"


def gpm_measured(gpm: protocol.GpmMetrics | None) -> bool:
    """Whether GPM gave figures (not only a reason)."""
    return gpm is not None and gpm.window_s is not None


def gpm_rows(gpm: protocol.GpmMetrics) -> list[tuple[str, str]]:
    """``(label, value)`` for every metric GPM gave (``—`` for one it did not)."""
    return [(label, humanfmt.pct(getattr(gpm, key), 0)) for key, label in GPM_LABELS]


def gpm_line(gpm: protocol.GpmMetrics | None, over: str = "") -> str | None:
    """One line: ``NVML GPM over 2.1 s of Tier 1: SM active 98%, …`` or why not; None
    when nothing was sampled (an agent before GPM, a tier GPM does not cover)."""
    if gpm is None:
        return None
    where = f" ({over})" if over else ""
    if gpm.window_s is None:
        return f"{SOURCE}{where}: not measured — {visible(gpm.reason or 'no reason given', 300)}"
    parts = [f"{label} {humanfmt.pct(getattr(gpm, key), 0)}" for key, label in GPM_LABELS
             if getattr(gpm, key) is not None]
    share = (f" (the timed calls took {humanfmt.pct(gpm.timed_share_pct, 0)} of it)"
             if gpm.timed_share_pct is not None else "")
    return (f"{SOURCE} over {humanfmt.duration(gpm.window_s)}{where}: "
            + (", ".join(parts) if parts else "no metric answered") + share)


def gpm_short(gpm: protocol.GpmMetrics | None) -> str:
    """A few words for a narrow place (the tier strip): ``GPM SM 98% · DRAM 89%`` or
    ``GPM: —``."""
    if gpm is None:
        return ""
    if gpm.window_s is None:
        return "GPM: —"
    short = {"sm_active_pct": "SM", "tensor_active_pct": "tensor", "dram_bw_pct": "DRAM",
             "sm_occupancy_pct": "occ"}
    parts = [f"{short[k]} {humanfmt.pct(getattr(gpm, k), 0)}" for k in GPM_SHORT
             if getattr(gpm, k) is not None]
    return "GPM " + " · ".join(parts)


def gpm_probe_line(gpu: protocol.Gpu) -> str | None:
    """What the probe learnt by asking: ``NVML GPM answers`` or ``NVML GPM: no — why``;
    None when it was not asked (no NVML, an older agent)."""
    if gpu.gpm_supported is None:
        return None
    if gpu.gpm_supported:
        return f"{SOURCE} answers"
    return f"{SOURCE}: no — {visible(gpu.gpm_reason or 'no reason given', 300)}"


def estimate_cost(est: protocol.Tier3Estimate, rate_usd_per_hour: float | None) -> float | None:
    """The estimate in dollars at the session's rate (None without a rate)."""
    if rate_usd_per_hour is None:
        return None
    return est.seconds * rate_usd_per_hour / 3600.0


def estimate_line(est: protocol.Tier3Estimate, rate_usd_per_hour: float | None) -> str:
    """``Tier 3 estimate: about 4.1 s ($0.004 at $3.50/h) — 1 launch × 27 passes × …``."""
    usd = estimate_cost(est, rate_usd_per_hour)
    cost = (f" ({humanfmt.usd(usd)} at {humanfmt.usd(rate_usd_per_hour)}/h)"
            if usd is not None else " (no rate: pass --rate for dollars)")
    kernel = humanfmt.ms(est.kernel_s * 1000.0) if est.kernel_s is not None else humanfmt.DASH
    budget = (f"; budget {humanfmt.duration(est.budget_s)}"
              if est.budget_s is not None else "")
    return (f"Tier 3 estimate: about {humanfmt.duration(est.seconds)}{cost} — "
            f"{est.launches} launch(es) × {est.passes} passes × ({kernel} kernel + "
            f"{humanfmt.ms(est.pass_overhead_s * 1000.0)} per pass) + "
            f"{humanfmt.duration(est.start_s)} start + {humanfmt.duration(est.read_s)} "
            f"report{budget}")


def estimate_against(est: protocol.Tier3Estimate, fin: protocol.TierFinished) -> str | None:
    """``estimated 3.84 s, −17%``: the estimate beside the time Tier 3 took (None when
    ncu did not run: a skipped Tier 3 took nothing to compare)."""
    if fin.status == "skipped" or fin.wall_s <= 0:
        return None
    error = (est.seconds - fin.wall_s) / fin.wall_s * 100.0
    return f"estimated {humanfmt.duration(est.seconds)}, {error:+.0f}%"


def estimate_bases(est: protocol.Tier3Estimate) -> list[str]:
    """Where each input came from, one line each (for details and the export)."""
    return [visible(f"{what}: {basis}", 400) for what, basis in (
        ("passes", est.passes_basis), ("launches", est.launches_basis),
        ("kernel time", est.kernel_basis), ("start", est.start_basis)) if basis]
