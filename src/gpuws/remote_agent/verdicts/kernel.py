"""The kernel verdict: what bounds one kernel, in one sentence, with its evidence.

With counters (Tier 3) it reads ncu's speed-of-light figures (SM and memory throughput
as a share of peak), DRAM throughput, tensor-pipe activity, occupancy, the launch's grid
and the top warp-stall reason, then ranks ncu's own rule findings by estimated speedup.
Without counters it uses what there is: Tier 1's achieved GB/s and FLOP/s against the
GPU's peaks (CUDA events), NVML GPM's device-level activity where sampled, and the
theoretical occupancy from static analysis; it says which evidence it used.

Also here: Tier 3 checked against Tier 2 (:func:`coverage`).
"""

from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Optional, Tuple

from .kernelnames import EXACT, TEMPLATE, same_kernel
from .names import short_name
from .program import evidence

#: A unit at this share of its peak is what bounds the kernel.
BUSY_UNIT_PCT = 60.0
#: DRAM carries most of the memory traffic when its throughput is at least this share of
#: the busiest memory unit's; below it, L1/L2/shared is the busy one.
DRAM_OF_MEMORY = 0.8
#: Tensor pipes this busy make a compute-bound kernel tensor-bound.
TENSOR_BUSY_PCT = 50.0
#: Achieved occupancy under this, with neither unit near peak: too few warps to hide latency.
LOW_OCCUPANCY_PCT = 25.0
#: How many of Tier 2's kernels :func:`coverage` checks.
COVERAGE_TOP = 5
#: What a stall reason means, for the latency sentence.
STALLS = {
    "long_scoreboard": "waiting on global/local memory (L1TEX)",
    "short_scoreboard": "waiting on shared memory or special-function results",
    "barrier": "waiting at __syncthreads barriers",
    "mio_throttle": "memory-instruction queues full",
    "lg_throttle": "the local/global memory queue full",
    "math_pipe_throttle": "math pipes busy",
    "wait": "fixed-latency dependencies",
    "not_selected": "ready but not selected (enough warps)",
    "gmma": "waiting on warpgroup MMA (tensor cores)",
    "membar": "memory barriers",
    "branch_resolving": "branch resolution",
    "no_instruction": "instruction cache misses",
    "drain": "draining memory writes at exit",
    "dispatch_stall": "dispatch stalls",
    "tex_throttle": "the texture queue full",
    "imc_miss": "constant cache misses",
    "sleeping": "sleeping warps",
    "selected": "issuing",
}
#: The metric that speaks for a rule's finding, shown beside it.
RULE_EVIDENCE = {
    "AchievedOccupancy": ("achieved_occupancy_pct", "achieved occupancy"),
    "TheoreticalOccupancy": ("theoretical_occupancy_pct", "theoretical occupancy"),
    "CPIStall": ("", "top stall"),
    "IssueSlotUtilization": ("sm_throughput_pct", "SM throughput"),
    "HighPipeUtilization": ("sm_throughput_pct", "SM throughput"),
    "SOLBottleneck": ("memory_throughput_pct", "memory throughput"),
    "MemoryL2Compression": ("l2_hit_pct", "L2 hit rate"),
    "UncoalescedGlobalAccess": ("l1_hit_pct", "L1 hit rate"),
    "LaunchConfiguration": ("", "grid"),
    "WorkloadImbalance": ("achieved_occupancy_pct", "achieved occupancy"),
}


def _num(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def grid_blocks(grid: Optional[str]) -> Optional[int]:
    """Blocks in a launch's grid as ncu writes it (``(2, 66, 1)``), or None."""
    if not grid:
        return None
    dims = re.findall(r"\d+", grid)
    if not dims or len(dims) > 3:
        return None
    total = 1
    for d in dims:
        total *= int(d)
    return total


def ranked_rules(rules: List[Dict[str, Any]], metrics: Dict[str, Any],
                 stalls: List[Dict[str, Any]], grid: Optional[str]) -> List[Dict[str, Any]]:
    """ncu's findings that suggest a change (OPT, WRN), largest estimated speedup first,
    each with the measured figure that speaks for it (``protocol.RankedRule``)."""
    out: List[Dict[str, Any]] = []
    for rule in rules:
        if str(rule.get("kind")) not in ("OPT", "WRN") or "could not be found" in str(
                rule.get("message")):
            continue
        key, label = RULE_EVIDENCE.get(str(rule.get("rule")), ("", ""))
        ev = ""
        if key and _num(metrics.get(key)) is not None:
            ev = "%s %.1f%% (ncu)" % (label, float(metrics[key]))
        elif label == "top stall" and stalls:
            ev = "top stall %s %.1f%% (ncu)" % (stalls[0].get("reason"),
                                                float(stalls[0].get("pct") or 0))
        elif label == "grid" and grid:
            ev = "grid %s (ncu)" % grid
        out.append({"rule": str(rule.get("rule")), "kind": str(rule.get("kind")),
                    "message": str(rule.get("message")),
                    "est_speedup_pct": _num(rule.get("est_speedup_pct")),
                    "speedup_type": rule.get("speedup_type"), "evidence": ev})
    out.sort(key=lambda r: -(float(r["est_speedup_pct"]) if r["est_speedup_pct"] is not None
                             else -1.0))
    return out


def kernel_verdict(launch: Dict[str, Any], rules: Optional[List[Dict[str, Any]]] = None,
                   sm_count: Optional[int] = None, tier1: Optional[Dict[str, Any]] = None,
                   gpm: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The ``kernel_verdict`` for one profiled launch (a ``kernel_metrics`` event).

    Args:
        launch: the ``kernel_metrics`` event (metrics, stalls, grid, block).
        rules: ncu's rule findings for that kernel (``protocol.Rule`` dicts).
        sm_count: the GPU's SM count from the probe, to tell a grid too small to fill
            it; ncu's own (``launch__sm_count``, in the metrics) wins where it gave one.
        tier1: the ``tier1_result`` event, whose achieved rates go beside ncu's figures.
        gpm: NVML GPM figures (see :func:`kernel_verdict_without_counters`), likewise.
    """
    m = dict(launch.get("metrics") or {})
    stalls = list(launch.get("stalls") or [])
    name = str(launch.get("kernel") or "")
    sm, mem = _num(m.get("sm_throughput_pct")), _num(m.get("memory_throughput_pct"))
    dram, tensor = _num(m.get("dram_throughput_pct")), _num(m.get("tensor_pipe_active_pct"))
    occ = _num(m.get("achieved_occupancy_pct"))
    blocks = grid_blocks(launch.get("grid"))
    ncu_sms = _num(m.get("sm_count"))
    sms_source = "CUDA driver"  # the probe's cuDeviceGetAttribute
    if ncu_sms is not None and 1 <= ncu_sms <= 100_000:
        sm_count, sms_source = int(ncu_sms), "ncu"
    waves = _num(m.get("waves_per_sm"))
    ev = [evidence("SM throughput (of peak)", sm, "%", "ncu"),
          evidence("memory throughput (of peak)", mem, "%", "ncu"),
          evidence("DRAM throughput (of peak)", dram, "%", "ncu"),
          evidence("tensor pipe active", tensor, "%", "ncu"),
          evidence("achieved occupancy", occ, "%", "ncu"),
          evidence("duration", _num(m.get("duration_ns")), "ns", "ncu")]
    if _num(m.get("arithmetic_intensity")) is not None:
        ev.append(evidence("arithmetic intensity", _num(m.get("arithmetic_intensity")),
                           "FLOP/byte", "ncu"))
    if blocks is not None:
        ev.append(evidence("blocks in the grid", float(blocks), "", "ncu"))
    if sm_count:
        ev.append(evidence("SMs on the GPU", float(sm_count), "", sms_source))
    if waves is not None:
        ev.append(evidence("waves of blocks per SM", waves, "", "ncu"))
    top = stalls[0] if stalls else None
    if top is not None:
        ev.append(evidence("top stall: %s" % top.get("reason"), _num(top.get("pct")), "%",
                           "ncu"))
    bound, sentence = _bound_with_counters(sm, mem, dram, tensor, occ, blocks, sm_count,
                                           waves, top)
    sources = ["ncu"]
    for more, source in ((_tier1_evidence(tier1), "CUDA events"), (_gpm_evidence(gpm),
                                                                     "NVML GPM")):
        if more:
            ev += more
            sources.append(source)
    return {"kernel": name, "short_name": short_name(name), "launch": launch.get("launch"),
            "bound": bound, "sentence": sentence, "counters": True,
            "sources": sources, "evidence": ev,
            "rules": ranked_rules(rules or [], m, stalls, launch.get("grid"))}


def _bound_with_counters(sm: Optional[float], mem: Optional[float], dram: Optional[float],
                         tensor: Optional[float], occ: Optional[float],
                         blocks: Optional[int], sm_count: Optional[int],
                         waves: Optional[float], top: Optional[Dict[str, Any]]
                         ) -> Tuple[str, str]:
    if sm is None and mem is None:
        return "unknown", "ncu gave no speed-of-light figures for this launch"
    sm_v, mem_v = sm or 0.0, mem or 0.0
    if max(sm_v, mem_v) >= BUSY_UNIT_PCT:
        if sm_v >= mem_v or (tensor is not None and tensor >= TENSOR_BUSY_PCT
                             and sm_v >= BUSY_UNIT_PCT):
            if tensor is not None and tensor >= TENSOR_BUSY_PCT:
                return "compute_tensor", (
                    "Compute-bound on the tensor cores: tensor pipe active %.0f%%, SM "
                    "throughput %.0f%% of peak (ncu)" % (tensor, sm_v))
            return "compute_sm", ("Compute-bound: SM throughput %.0f%% of peak against memory "
                                  "%.0f%% (ncu)" % (sm_v, mem_v))
        if dram is not None and dram >= DRAM_OF_MEMORY * mem_v:
            return "dram", ("DRAM bandwidth-bound: DRAM throughput %.0f%% of peak, SM %.0f%% "
                            "(ncu)" % (dram, sm_v))
        return "cache", ("On-chip memory-bound (L1/L2/shared): memory throughput %.0f%% of "
                         "peak while DRAM is at %s (ncu)"
                         % (mem_v, "?" if dram is None else "%.0f%%" % dram))
    # Neither unit busy: a grid with fewer blocks than SMs leaves SMs idle whatever the
    # kernel does; one that makes less than a wave (ncu's waves per SM) with few warps
    # resident leaves each SM's warp slots empty, which is the grid, not the code.
    if blocks is not None and sm_count and blocks < sm_count:
        return "small_grid", ("Too small a grid: %d block(s) for %d SMs leave %d SMs idle; "
                              "SM %.0f%%, memory %.0f%% of peak (ncu)"
                              % (blocks, sm_count, sm_count - blocks, sm_v, mem_v))
    if waves is not None and 0 < waves < 1 and occ is not None and occ < LOW_OCCUPANCY_PCT:
        return "small_grid", ("Too small a grid: %s block(s) make %.2f of a wave on %s SMs, "
                              "so each SM holds fewer warps than it could (achieved "
                              "occupancy %.0f%%); SM %.0f%%, memory %.0f%% of peak (ncu)"
                              % ("?" if blocks is None else blocks, waves,
                                 sm_count or "the", occ, sm_v, mem_v))
    stall = ""
    if top is not None:
        reason = str(top.get("reason"))
        stall = "; warps stall most on %s (%s, %.0f%%)" % (
            reason, STALLS.get(reason, "see ncu"), float(top.get("pct") or 0))
    if occ is not None and occ < LOW_OCCUPANCY_PCT:
        return "occupancy", ("Latency-bound with too few warps: achieved occupancy %.0f%%, "
                             "SM %.0f%% and memory %.0f%% of peak%s (ncu)"
                             % (occ, sm_v, mem_v, stall))
    return "latency", ("Latency-bound: neither compute (%.0f%%) nor memory (%.0f%%) is near "
                       "peak%s (ncu)" % (sm_v, mem_v, stall))


def kernel_verdict_without_counters(
        kernel: str, tier1: Optional[Dict[str, Any]] = None,
        static: Optional[Dict[str, Any]] = None, gpm: Optional[Dict[str, Any]] = None,
        sm_count: Optional[int] = None) -> Dict[str, Any]:
    """The best verdict there is when ncu cannot read counters.

    Args:
        kernel: the kernel's name.
        tier1: the ``tier1_result`` event (achieved GB/s, TFLOP/s, and the peaks).
        static: the ``static_analysis`` event (theoretical occupancy and its limiter).
        gpm: NVML GPM figures sampled over a window (:func:`gpm_window`), as percentages
            keyed ``sm_active_pct``, ``sm_occupancy_pct``, ``tensor_active_pct``,
            ``dram_bw_pct`` (any may be missing), with ``scope`` (what the window was) and
            ``share_pct`` (the share of it the GPU ran the work) where known.
        sm_count: the GPU's SM count (unused without a grid; kept for one signature).
    """
    del sm_count
    ev: List[Dict[str, Any]] = []
    sources: List[str] = []
    bw = fl = None
    if tier1:
        bw, fl = _num(tier1.get("pct_peak_bw")), _num(tier1.get("pct_peak_flops"))
        ev += _tier1_evidence(tier1)
        sources.append("CUDA events")
    g = gpm if gpm and any(_num(gpm.get(k)) is not None for k in GPM_KEYS) else None
    dram_g = tensor_g = sm_g = None
    share = _num((g or {}).get("share_pct"))
    unused = ""
    if g is not None:
        ev += _gpm_evidence(g)
        sources.append("NVML GPM")
        scope = str(g.get("scope") or "its window")
        if share is not None:
            ev.append(evidence("GPU's work share of the GPM window (%s)" % scope, share, "%",
                               str(g.get("share_source") or "CUDA events")))
        if share is not None and share < GPM_MIN_SHARE_PCT:
            # Device-wide averages over a window the GPU mostly idled through say nothing
            # of the kernel: divided by a share this small they would be mostly noise.
            unused = ("NVML GPM over %s is not used: the GPU ran the work only %.1f%% of "
                      "that window" % (scope, share))
        else:
            dram_g, tensor_g, sm_g = (_during(_num(g.get(k)), share) for k in
                                      ("dram_bw_pct", "tensor_active_pct", "sm_active_pct"))
            if share is not None and share < 100.0:
                ev += [evidence("%s while the work ran (GPM ÷ work share)" % label, value,
                                "%", "NVML GPM") for label, value in (
                    ("DRAM bandwidth utilisation", dram_g), ("tensor activity", tensor_g),
                    ("SM active", sm_g)) if value is not None]
    theo = _num((static or {}).get("theoretical_occupancy_pct"))
    if static:
        ev.append(evidence("theoretical occupancy", theo, "%", "static analysis"))
        sources.append("static analysis")
    # Tier 1's FLOP/s against a tensor-core peak (the datasheet's dense FP16/BF16, TF32 or
    # FP8 figure): a kernel past BUSY_UNIT_PCT of that peak ran on the tensor cores, since
    # the SMs' other pipes top out near a fifteenth of it (H100: 67 of 989 TFLOP/s). GPM's
    # device average can read low over Tier 1's short cold window, where L2 flushes fill
    # most of it (a bf16 GEMM at 79% of the tensor peak read tensor pipes 26% active).
    tensor_peak = "tensor" in str((tier1 or {}).get("peak_source") or "").lower()
    bound, sentence = _bound_without_counters(bw, fl, dram_g, tensor_g, sm_g, theo,
                                              (static or {}).get("limiter"), unused,
                                              tensor_peak)
    used = ", ".join(sources) if sources else "nothing"
    return {"kernel": kernel, "short_name": short_name(kernel), "launch": None,
            "bound": bound,
            "sentence": "%s (from %s, without hardware counters)" % (sentence, used),
            "counters": False, "sources": sources, "evidence": ev, "rules": []}


#: The GPM figures a verdict reads (``protocol.GpmMetrics``).
GPM_KEYS = ("dram_bw_pct", "tensor_active_pct", "sm_active_pct", "sm_occupancy_pct")
#: Below this share of the GPM window running the work, GPM does not speak for a kernel.
GPM_MIN_SHARE_PCT = 10.0


def _during(value: Optional[float], share: Optional[float]) -> Optional[float]:
    """A GPM window average as it was while the work ran: GPM averages over its whole
    window, and the rest of the window (Tier 1's L2 flushes and idle holds, a command's
    start-up) is idle for the tensor pipes and SMs. The flushes do move DRAM, so DRAM
    read this way is high by at most their share; Tier 1's own GB/s decides first."""
    if value is None or not math.isfinite(value):
        return None
    if share is None or not 0 < share <= 100.0:
        return value  # a share that is no share (0, negative, over 100, NaN) scales nothing
    return max(0.0, min(100.0, value * 100.0 / share))


def gpm_window(tier1_gpm: Optional[Dict[str, Any]], run_gpm: Optional[Dict[str, Any]],
               table: Optional[List[Dict[str, Any]]] = None) -> Optional[Dict[str, Any]]:
    """The GPM figures a verdict without counters reads, with what their window was.

    Tier 1's (``tier_finished`` tier 1: its timed rounds, whose ``timed_share_pct`` says
    how much of the window the timed calls took) when it sampled, else a ``cmd:``'s whole
    run (tier 0), whose work share is Tier 2's kernel time over the window (another run
    of the same command: an estimate, said so by its source). None: no figures.
    """
    if tier1_gpm and tier1_gpm.get("window_s"):
        return dict(tier1_gpm, scope="Tier 1's timed rounds",
                    share_pct=_num(tier1_gpm.get("timed_share_pct")),
                    share_source="CUDA events")
    if run_gpm and run_gpm.get("window_s"):
        window = _num(run_gpm.get("window_s"))
        kernel_ns = sum(float(_num(r.get("total_ns")) or 0.0) for r in table or [])
        share = (min(100.0, 100.0 * kernel_ns / (window * 1e9))
                 if table and window and window > 0 else None)
        return dict(run_gpm, scope="the command's run", share_pct=share,
                    share_source="Tier 2's kernel time")
    return None


def gpm_of(tier1: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """NVML GPM figures in a ``tier1_result``-shaped dict's ``gpm`` map, if any (Tier 1's
    GPM rides on its ``tier_finished``: see :func:`gpm_window`)."""
    gpm = (tier1 or {}).get("gpm")
    return gpm if isinstance(gpm, dict) else None


def _tier1_evidence(tier1: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    if not tier1:
        return []
    return [evidence("achieved bandwidth", _num(tier1.get("gbps")), "GB/s", "CUDA events"),
            evidence("bandwidth (of peak)", _num(tier1.get("pct_peak_bw")), "%", "CUDA events"),
            evidence("achieved compute", _num(tier1.get("tflops")), "TFLOP/s", "CUDA events"),
            evidence("compute (of peak)", _num(tier1.get("pct_peak_flops")), "%",
                     "CUDA events")]


def _gpm_evidence(gpm: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    if not gpm:
        return []
    return [evidence("DRAM bandwidth utilisation", _num(gpm.get("dram_bw_pct")), "%",
                     "NVML GPM"),
            evidence("tensor activity", _num(gpm.get("tensor_active_pct")), "%", "NVML GPM"),
            evidence("SM active", _num(gpm.get("sm_active_pct")), "%", "NVML GPM"),
            evidence("SM occupancy", _num(gpm.get("sm_occupancy_pct")), "%", "NVML GPM")]


def _bound_without_counters(bw: Optional[float], fl: Optional[float], dram_g: Optional[float],
                            tensor_g: Optional[float], sm_g: Optional[float],
                            theo: Optional[float], limiter: Any, unused: str = "",
                            tensor_peak: bool = False) -> Tuple[str, str]:
    tensor_said = "" if tensor_g is None else ", tensor pipes %.0f%% active (NVML GPM)" % tensor_g
    dram_said = "" if dram_g is None else ", DRAM bandwidth %.0f%% utilised (NVML GPM)" % dram_g
    if fl is not None and fl >= BUSY_UNIT_PCT and (bw is None or fl >= bw):
        if tensor_peak:
            gpm_low = tensor_g is not None and tensor_g < TENSOR_BUSY_PCT
            return "compute_tensor", (
                "Compute-bound on the tensor cores: %.0f%% of the GPU's peak tensor FLOP/s, "
                "which only the tensor cores reach%s" % (
                    fl, "; NVML GPM read tensor pipes %.0f%% active, too few of its samples "
                        "fell inside Tier 1's short timed calls to see them" % tensor_g
                    if gpm_low and tensor_g is not None else tensor_said))
        if tensor_g is not None and tensor_g >= TENSOR_BUSY_PCT:
            return "compute_tensor", ("Compute-bound on the tensor cores: %.0f%% of the GPU's "
                                      "peak FLOP/s%s" % (fl, tensor_said))
        return "compute_sm", "Compute-bound: %.0f%% of the GPU's peak FLOP/s%s" % (
            fl, tensor_said)
    if bw is not None and bw >= BUSY_UNIT_PCT:
        return "dram", "DRAM bandwidth-bound: %.0f%% of the GPU's peak bandwidth%s" % (
            bw, dram_said)
    if dram_g is not None and dram_g >= BUSY_UNIT_PCT and (tensor_g is None
                                                           or dram_g >= tensor_g):
        return "dram", "DRAM bandwidth-bound: DRAM bandwidth %.0f%% utilised (NVML GPM)" % dram_g
    if tensor_g is not None and tensor_g >= BUSY_UNIT_PCT:
        return "compute_tensor", ("Compute-bound on the tensor cores: tensor pipes %.0f%% "
                                  "active (NVML GPM)%s" % (tensor_g, dram_said))
    if theo is not None and theo < LOW_OCCUPANCY_PCT:
        return "occupancy", ("Likely latency-bound with too few warps: theoretical occupancy "
                             "%.0f%% (limited by %s)" % (theo, limiter or "?"))
    if bw is None and fl is None and dram_g is None and sm_g is None:
        return "unknown", ("Not known: %s" % unused if unused else
                           "Not known: the workload declares no bytes or FLOPs and no device "
                           "activity was sampled")
    parts = []
    if bw is not None:
        parts.append("bandwidth %.0f%%" % bw)
    if fl is not None:
        parts.append("compute %.0f%%" % fl)
    if sm_g is not None:
        parts.append("SM active %.0f%%" % sm_g)
    return "latency", ("Latency- or launch-bound: neither near peak (%s)%s"
                       % (", ".join(parts), "; " + unused if unused else ""))


def first_match(table: Optional[List[Dict[str, Any]]], regex: Optional[str]
                ) -> Optional[str]:
    """The name of Tier 2's first kernel that ``regex`` matches (the top one without a
    regex), else the regex itself: the kernel Tier 3 meant to profile."""
    for row in table or []:
        try:
            if not regex or re.search(regex, str(row.get("name") or "")):
                return str(row.get("name"))
        except re.error:
            break
    return regex


def coverage(table: Optional[Dict[str, Any]], profiled: List[str], *,
             regex: Optional[str], launch_skip: int, launch_count: int,
             top: int = COVERAGE_TOP) -> Dict[str, Any]:
    """Tier 3 checked against Tier 2: which of Tier 2's top kernels ncu profiled, which it
    missed, and why (``protocol.Tier3Coverage``).

    Args:
        table: Tier 2's ``kernel_table`` event (None when Tier 2 did not run).
        profiled: the names of the kernels ncu profiled (``kernel_metrics`` events).
        regex: the filter ncu was given (``-k regex:…``), None for none.
        launch_skip: ``--launch-skip``; launch_count: ``--launch-count``.
    """
    rows = list((table or {}).get("kernels") or [])[:top]
    seen = set(profiled)
    try:
        pattern = re.compile(regex) if regex else None
        bad = None
    except re.error as exc:
        pattern, bad = None, str(exc)
    hit, missed = [], []
    for row in rows:
        name = str(row.get("name") or "")
        entry = {"name": name, "short_name": short_name(name),
                 "share_pct": _num(row.get("share_pct")) or 0.0, "why": ""}
        # The same kernel under each tool's spelling; a sibling instance (same short
        # name, other template arguments) is not it.
        if name in seen or any(same_kernel(name, p) in (EXACT, TEMPLATE) for p in seen):
            hit.append(entry)
            continue
        if bad is not None:
            entry["why"] = "the filter regex:%s could not be checked here (%s)" % (
                _cut_regex(regex), bad)
        elif pattern is not None and not pattern.search(name):
            entry["why"] = "not matched by the filter regex:%s" % _cut_regex(regex)
        elif len(profiled) >= launch_count:
            entry["why"] = ("matched, but --launch-count %d stopped ncu after %d launch(es)"
                            "%s" % (launch_count, len(profiled),
                                    " (after skipping %d)" % launch_skip if launch_skip else ""))
        else:
            entry["why"] = ("matched, but ncu saw no launch of it: another process, or "
                            "launched outside the profiled range")
        missed.append(entry)
    return {"regex": regex, "launch_skip": launch_skip, "launch_count": launch_count,
            "profiled": hit, "missed": missed,
            "others": [p for p in profiled if not any(
                p == str(r["name"]) or same_kernel(str(r["name"]), p) in (EXACT, TEMPLATE)
                for r in hit)]}


def _cut_regex(regex: Optional[str], limit: int = 100) -> str:
    """A filter as a sentence shows it: the one Tier 3 writes from Tier 2's name runs to
    thousands of characters (the event's ``regex`` keeps it whole)."""
    text = str(regex)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def kernel_verdicts(launches: List[Dict[str, Any]], sm_count: Optional[int] = None
                    ) -> List[Dict[str, Any]]:
    """The ``kernel_verdict`` of each profiled kernel, from its first launch: what the
    run states after Tier 3 and what ``gpuws report`` prints for a report file.

    Args:
        launches: ``kernel_metrics``-shaped launches, each with its ``rules``.
        sm_count: the GPU's SM count where known (ncu's own in a launch's metrics wins).
    """
    done = set()
    out = []
    for launch in launches:
        name = str(launch.get("kernel"))
        if name in done:
            continue
        done.add(name)
        rules = [r for r in launch.get("rules") or [] if r.get("kernel") in (None, name)]
        out.append(kernel_verdict(launch, rules, sm_count))
    return out
