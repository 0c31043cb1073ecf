"""The program verdict from Tier 2's kernel table: what bounds the program as a whole.

Input is a ``kernel_table`` event (rows ranked by share of kernel time, the GPU idle and
memcpy shares of the kernel span where the timeline gave them); output is a
``program_verdict`` event. The first finding is the one that decides what to do next:
when the GPU waits, no kernel tuning helps until it is busy.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

from ..measure.trace_analysis import DECODE_FRAME
from .names import short_name

#: Below this share of the span busy, the GPU waits more than it works.
BUSY_LOW_PCT = 50.0
#: A mean kernel time under this is short enough that launch overhead (a few µs of host
#: time per launch through PyTorch's dispatcher) can keep the GPU waiting.
SHORT_KERNEL_NS = 20_000.0
#: Idle gaps averaging under this are the GPU waiting for the host's next launch. Eager
#: PyTorch costs the host tens of µs per op (Python, the dispatcher, the launch itself;
#: more under a profiler): the recorded H100 decode loop (tests/fixtures/verdict-h100/
#: decode.ndjson: batch 1, 15 kernels and one ``.item()`` a step) leaves 3,210 gaps for
#: 3,012 launches, 70.9 µs each on average. A host busy elsewhere or waiting on
#: the GPU (a synchronisation, data loading, a checkpoint) leaves gaps of milliseconds.
LAUNCH_GAP_NS = 200_000.0
#: At least this many idle gaps per launch: the gaps come with the launches (a wait
#: before nearly every kernel), the signature of per-launch host cost that CUDA graphs
#: and torch.compile remove. Fewer, longer gaps (gap_count ≪ launches) are the host away
#: between bursts of launches: host- or sync-bound.
GAPS_PER_LAUNCH = 0.5
#: One idle gap holding over this share of all idle time is a phase of the program
#: (start-up: cuBLAS loading its kernels, a compilation, a warm-up's wait), not its
#: steady rhythm; it is set aside when the others are many enough to show the rhythm.
ONE_OFF_SHARE = 0.5
ONE_OFF_MIN_GAPS = 10
#: Where the timeline has the host's API calls: with at least this many of the host's
#: waits for the GPU (cudaStreamSynchronize, .item(), …) per idle gap, the gaps follow
#: the waits (the host waits, then the GPU waits on the host): sync-bound. With fewer,
#: the host is away doing something else: host-bound.
SYNCS_PER_GAP = 0.5
#: Collectives not overlapped by compute over this share of the steady window make the
#: program communication-bound: the GPUs wait for each other more than for anything else.
COMM_EXPOSED_PCT = 40.0
#: Shares of the host's time in the window (``protocol.HostTime``) that decide what the
#: host does: waiting for the GPU, loading data. Below them, a host launching many short
#: kernels (under ``LAUNCH_GAP_NS`` of host time each) is dispatch-bound; else the time
#: is the program's other Python.
SYNC_HOST_SHARE = 0.5
DATA_HOST_SHARE = 0.3
#: A wait for the GPU taking this share of the host's time is named even when another
#: cost comes first.
SYNC_NOTE_SHARE = 0.1
#: Copies taking this share of the span make the program transfer-bound.
MEMCPY_HIGH_PCT = 20.0
#: One kernel, or one family, over this share of kernel time dominates.
DOMINANT_PCT = 50.0
#: Under that, a top kernel over this share is still the largest lever and is named so.
LEVER_PCT = 25.0
#: Kernel families, tested in order on the lower-cased full name (first match wins).
FAMILIES: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("communication", ("nccl", "all_reduce", "allreduce", "all_gather", "allgather",
                       "reduce_scatter", "alltoall", "sendrecv")),
    ("attention", ("flash", "fmha", "attention", "attn", "sdpa", "mha_")),
    ("copy/memset", ("memcpy", "memset", "copy_kernel", "direct_copy", "copy", "fillfunctor",
                     "fill_kernel", "cat_array", "catarraybatched")),
    ("normalisation", ("layer_norm", "layernorm", "rms_norm", "rmsnorm", "batch_norm",
                       "batchnorm", "group_norm", "groupnorm", "softmax", "norm_kernel")),
    ("GEMM", ("gemm", "gemv", "nvjet", "cutlass", "cublas", "xmma", "wgmma", "matmul",
              "triton_tem_", "_mm_", "splitkreduce", "conv")),
    ("reduction", ("reduce", "reduction", "triton_red_", "triton_per_", "argmax", "argmin",
                   "topk", "cub::", "scan", "sort")),
    ("elementwise", ("elementwise", "triton_poi_", "pointwise", "vectorized", "unrolled",
                     "activation", "gelu", "silu", "relu", "saxpy", "axpy", "add_kernel",
                     "mul_kernel")),
)
#: Where the figures of a kernel table come from, as a person names the tool (the
#: table's ``source`` starts with one of these).
SOURCE_TOOLS = ("nsys", "torch.profiler", "ncu")


def family(name: str) -> str:
    """The family of a kernel by its full name: GEMM, attention, normalisation,
    elementwise, reduction, copy/memset, communication, or other."""
    low = name.lower()
    for fam, marks in FAMILIES:
        if any(mark in low for mark in marks):
            return fam
    return "other"


def source_tool(source: str) -> str:
    """The tool behind a kernel table's ``source`` (``ncu gpu__time_duration`` is ncu)."""
    return next((t for t in SOURCE_TOOLS if source.startswith(t)), source or "?")


def evidence(name: str, value: Optional[float], unit: str, source: str) -> Dict[str, Any]:
    """One number behind a finding, with where it came from (``protocol.Evidence``)."""
    return {"name": name, "value": value, "unit": unit, "source": source}


def families(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Kernel time by family, largest first (``protocol.FamilyShare``)."""
    out: Dict[str, Dict[str, Any]] = {}
    for row in rows:
        fam = family(str(row.get("name") or ""))
        entry = out.setdefault(fam, {"family": fam, "share_pct": 0.0, "kernels": 0,
                                     "calls": 0, "total_ns": 0.0})
        entry["share_pct"] += float(row.get("share_pct") or 0.0)
        entry["kernels"] += 1
        entry["calls"] += int(row.get("calls") or 0)
        entry["total_ns"] += float(row.get("total_ns") or 0.0)
    return sorted(out.values(), key=lambda e: -e["total_ns"])


def program_verdict(table: Dict[str, Any]) -> Dict[str, Any]:
    """The ``program_verdict`` event (without envelope) for one ``kernel_table`` event."""
    rows = list(table.get("kernels") or [])
    src = source_tool(str(table.get("source") or ""))
    idle = _num(table.get("gpu_idle_pct"))
    memcpy = _num(table.get("memcpy_pct"))
    busy = None if idle is None else max(0.0, 100.0 - idle)
    launches = sum(int(r.get("calls") or 0) for r in rows)
    kernel_ns = sum(float(r.get("total_ns") or 0.0) for r in rows)
    mean_ns = kernel_ns / launches if launches else None
    tl = timeline(table)
    fams = families(rows)
    top = rows[0] if rows else None
    ev = [evidence("GPU busy share of the kernel span", busy, "%", src),
          evidence("memcpy share of the kernel span", memcpy, "%", src),
          evidence("kernel launches", float(launches), "", src),
          evidence("distinct kernels", float(len(rows)), "", src),
          evidence("mean kernel time", mean_ns, "ns", src),
          evidence("idle gaps in the span", _num(table.get("gap_count")), "", src),
          evidence("mean idle gap", tl.mean_gap_ns, "ns", src),
          evidence("longest idle gap", _num(table.get("largest_gap_ns")), "ns", src)]
    if _num(table.get("sync_count")) is not None:
        ev += [evidence("host waits for the GPU in the span", _num(table.get("sync_count")),
                        "", src),
               evidence("host time blocked in them", _num(table.get("sync_ns")), "ns", src)]
    if tl.one_off_ns is not None:
        ev += [evidence("GPU busy share without the longest gap", tl.busy_pct, "%", src),
               evidence("mean idle gap without the longest", tl.steady_gap_ns, "ns", src)]
    findings: List[Dict[str, Any]] = []
    bound = "gpu"
    window = table.get("window") if isinstance(table.get("window"), dict) else None
    host = table.get("host") if isinstance(table.get("host"), dict) else None
    comm = table.get("comm") if isinstance(table.get("comm"), dict) else None
    where = window_text(window)
    if window is not None:
        # The window already leaves the one-time phases out: no gap is set aside again.
        tl = Timeline(tl.span_ns, tl.idle_ns, tl.gaps, None)
    # The steady state decides: a one-off start-up gap does not make a program host-bound.
    steady_busy = tl.busy_pct if tl.busy_pct is not None else busy
    exposed = _num(comm.get("exposed_pct")) if comm else None
    if comm is not None and exposed is not None and exposed >= COMM_EXPOSED_PCT:
        bound = "communication"
        findings.append(_communication(comm, where, src))
    elif (steady_busy is not None and steady_busy < BUSY_LOW_PCT and busy is not None
            and host is not None and _num(host.get("wall_ns"))):
        bound, finding = _host_evidence(host, busy, memcpy, mean_ns, window, where, src)
        findings.append(finding)
        findings.extend(_sync_note(host, finding, src))
    elif steady_busy is not None and steady_busy < BUSY_LOW_PCT and busy is not None:
        bound, finding = _not_gpu_bound(busy, memcpy, launches, mean_ns, tl, src,
                                        _num(table.get("sync_count")))
        findings.append(finding)
    elif memcpy is not None and memcpy >= MEMCPY_HIGH_PCT:
        bound = "transfer"
        findings.append(_transfers(memcpy, src))
    if top is not None:
        findings.extend(_concentration(top, fams, rows, src,
                                       bound == "gpu" and busy is not None))
    if tl.one_off_ns is not None and tl.span_ns:
        findings.append({
            "code": "one_off_gap", "severity": "info",
            "title": "One idle gap of %.1f ms (%.0f%% of the span) is set aside"
                     % (tl.one_off_ns / 1e6, 100.0 * tl.one_off_ns / tl.span_ns),
            "detail": "it holds %.0f%% of the GPU's idle time in one piece: start-up (a "
                      "library loading its kernels, a compilation) or a one-off wait, not "
                      "the program's rhythm; without it the GPU is busy %.0f%% of the time"
                      % (100.0 * tl.one_off_ns / max(tl.idle_ns, 1.0), tl.busy_pct or 0.0),
            "remedies": [],
            "evidence": [evidence("longest idle gap", tl.one_off_ns, "ns", src),
                         evidence("GPU busy share without the longest gap", tl.busy_pct,
                                  "%", src)]})
    if busy is None:
        findings.append({
            "code": "busy_unknown", "severity": "info",
            "title": "GPU busy share not measured",
            "detail": "%s gave kernel times but no timeline of this run, so whether the GPU "
                      "waited between kernels is not known" % src,
            "remedies": ["install Nsight Systems on the pod for the timeline"],
            "evidence": []})
    if comm is not None and bound != "communication":
        findings.append(_communication(comm, where, src, first=False))
    return {"source": src, "bound": bound, "window": where,
            "left_out": left_out_text(window),
            "summary": findings[0]["title"] if findings else "no kernels recorded",
            "gpu_busy_pct": busy, "memcpy_pct": memcpy, "launches": launches,
            "kernels": len(rows), "mean_kernel_ns": mean_ns,
            "families": fams, "findings": findings, "evidence": ev,
            "top_kernel": str(top.get("name")) if top else None,
            "top_share_pct": _num(top.get("share_pct")) if top else None}


class Timeline:
    """The idle gaps of a kernel table's timeline, and its steady state without a one-off
    gap (see ``ONE_OFF_SHARE``). Every figure is None where the timeline did not give it."""

    def __init__(self, span_ns: Optional[float], idle_ns: float, gaps: Optional[float],
                 one_off_ns: Optional[float]) -> None:
        self.span_ns = span_ns
        self.idle_ns = idle_ns
        self.gaps = gaps
        self.one_off_ns = one_off_ns
        #: The mean idle gap over the whole span.
        self.mean_gap_ns = idle_ns / gaps if gaps and span_ns is not None else None
        rest_gaps = (gaps or 0.0) - (1.0 if one_off_ns is not None else 0.0)
        rest_idle = idle_ns - (one_off_ns or 0.0)
        rest_span = (span_ns or 0.0) - (one_off_ns or 0.0)
        #: The mean gap and busy share of the steady state (the whole span's where no
        #: gap was set aside).
        self.steady_gap_ns = rest_idle / rest_gaps if rest_gaps > 0 and span_ns else None
        self.busy_pct = (100.0 * max(0.0, rest_span - rest_idle) / rest_span
                         if one_off_ns is not None and rest_span > 0 else None)
        #: The steady state's gap count (None without a timeline).
        self.rest_gaps = rest_gaps if gaps else None


def timeline(table: Dict[str, Any]) -> Timeline:
    """The timeline figures of a ``kernel_table`` (gaps, the one-off gap set aside)."""
    gaps, span, idle = (_num(table.get("gap_count")), _num(table.get("span_ns")),
                        _num(table.get("gpu_idle_pct")))
    if not gaps or span is None or idle is None or span <= 0:
        return Timeline(None, 0.0, None, None)
    idle_ns = span * idle / 100.0
    largest = _num(table.get("largest_gap_ns"))
    one_off = (largest if largest is not None and gaps >= ONE_OFF_MIN_GAPS
               and idle_ns > 0 and largest > ONE_OFF_SHARE * idle_ns
               and largest <= idle_ns else None)
    return Timeline(span, idle_ns, gaps, one_off)


def _not_gpu_bound(busy: float, memcpy: Optional[float], launches: int,
                   mean_ns: Optional[float], tl: Timeline, src: str,
                   syncs: Optional[float] = None) -> Tuple[str, Dict[str, Any]]:
    idle = 100.0 - busy
    gap_ns = tl.steady_gap_ns
    base = [evidence("GPU busy share of the kernel span", busy, "%", src)]
    if gap_ns is not None:
        base.append(evidence("mean idle gap", gap_ns, "ns", src))
    if memcpy is not None and memcpy >= MEMCPY_HIGH_PCT:
        return "transfer", _transfers(memcpy, src)
    per_launch = (tl.rest_gaps / launches if tl.rest_gaps is not None and launches
                  else None)
    # Where the timeline gave its gaps, they decide: short ones, about one per launch,
    # are the host's per-launch cost (launch-bound); few long ones are the host away or
    # waiting on the GPU (host/sync-bound). Without gaps, short kernels suggest the first.
    if gap_ns is not None and per_launch is not None:
        short = gap_ns < LAUNCH_GAP_NS and per_launch >= GAPS_PER_LAUNCH
    else:
        short = mean_ns is not None and mean_ns < SHORT_KERNEL_NS
    if per_launch is not None:
        base.append(evidence("idle gaps per launch", per_launch, "", src))
    if short and mean_ns is not None:
        return "launch", {
            "code": "launch_bound", "severity": "warning",
            "title": "Launch-bound: the GPU is idle %.0f%% of the time between %d short "
                     "kernels" % (idle, launches),
            "detail": "kernels average %.1f µs%s, about what the host needs to launch one; "
                      "the GPU waits for the next launch, so no kernel tuning helps until "
                      "it is busy" % (mean_ns / 1e3, "" if gap_ns is None else
                                      " with %.1f µs idle between them (%.2f gaps per "
                                      "launch)" % (gap_ns / 1e3, per_launch or 0.0)),
            "remedies": ["capture the steady state in a CUDA graph (torch.cuda.graphs, "
                         "torch.compile(mode=\"reduce-overhead\"))",
                         "fuse small kernels: torch.compile, or fused ops (fused optimisers, "
                         "fused attention and norms)",
                         "give each launch more work: bigger batches, longer sequences",
                         "move Python-side work out of the loop (no .item(), no host syncs)"],
            "evidence": [*base, evidence("mean kernel time", mean_ns, "ns", src),
                         evidence("kernel launches", float(launches), "", src)]}
    if syncs is not None and tl.rest_gaps:
        return "host", _host_with_syncs(idle, syncs, tl, gap_ns, base, src)
    return "host", {
        "code": "host_bound", "severity": "warning",
        "title": "Host- or sync-bound: the GPU is idle %.0f%% of the time between kernels"
                 % idle,
        "detail": "%s: launching kernels is not the cost; the host is busy elsewhere or "
                  "waits on the GPU (synchronisation, data loading) between them, and %s "
                  "cannot tell which"
                  % ("the GPU waits %.1f µs between kernels on average%s"
                     % (gap_ns / 1e3, "" if per_launch is None else
                        " (%.2f gaps per launch)" % per_launch)
                     if gap_ns is not None else "kernels are long (%s on average)"
                     % ("%.1f µs" % (mean_ns / 1e3) if mean_ns is not None else "?"), src),
        # No data-loading or sync remedy: this timeline has no evidence of either.
        "remedies": ["profile the host to see where its time goes: torch.profiler with "
                     "CPU activity and with_stack=True (gpuws does this for a Python "
                     "workload), or nsys with --trace=cuda,osrt,nvtx"],
        "evidence": [*base, evidence("mean kernel time", mean_ns, "ns", src)]}


def _host_with_syncs(idle: float, syncs: float, tl: Timeline, gap_ns: Optional[float],
                     base: List[Dict[str, Any]], src: str) -> Dict[str, Any]:
    """Host- or sync-bound, told apart by the host's waits the timeline recorded."""
    per_gap = syncs / (tl.rest_gaps or 1.0)
    waits = "%.1f µs idle each" % (gap_ns / 1e3) if gap_ns is not None else "long gaps"
    ev = [*base, evidence("host waits for the GPU in the span", syncs, "", src),
          evidence("host waits per idle gap", per_gap, "", src)]
    if per_gap >= SYNCS_PER_GAP:
        return {
            "code": "sync_bound", "severity": "warning",
            "title": "Sync-bound: the GPU is idle %.0f%% of the time after the host waits on "
                     "it" % idle,
            "detail": "the host waited for the GPU %d times (%.2f per idle gap, %s): each "
                      "wait drains the GPU's queue, and the GPU then waits for the host's "
                      "next work" % (syncs, per_gap, waits),
            "remedies": ["remove host syncs from the loop: .item(), .cpu(), .tolist(), "
                         "printing tensors, torch.cuda.synchronize(); keep values on the GPU",
                         "check conditions on the GPU (torch.where) or every N steps",
                         "use non_blocking copies into pinned memory and an event instead "
                         "of a stream sync"],
            "evidence": ev}
    return {
        "code": "host_bound", "severity": "warning",
        "title": "Host-bound: the GPU is idle %.0f%% of the time between kernels" % idle,
        "detail": "the GPU waits for the host (%s) but the host waited for the GPU only %d "
                  "times (%.2f per idle gap): the host is busy with something else, which "
                  "this timeline does not show" % (waits, syncs, per_gap),
        "remedies": ["profile the host to see where its time goes: torch.profiler with "
                     "CPU activity and with_stack=True, py-spy, or nsys with "
                     "--trace=cuda,osrt,nvtx"],
        "evidence": ev}


def _transfers(memcpy: float, src: str) -> Dict[str, Any]:
    return {"code": "transfer_bound", "severity": "warning",
            "title": "Transfer-bound: copies take %.0f%% of the kernel span" % memcpy,
            "detail": "memory copies (host-device or device-device) occupy the GPU's time "
                      "line more than a fifth of the span",
            "remedies": ["keep data on the GPU between steps", "use pinned host memory "
                         "and non_blocking copies on a side stream to overlap them",
                         "copy fewer, larger buffers"],
            "evidence": [evidence("memcpy share of the kernel span", memcpy, "%", src)]}


def _concentration(top: Dict[str, Any], fams: List[Dict[str, Any]],
                   rows: List[Dict[str, Any]], src: str, first: bool
                   ) -> List[Dict[str, Any]]:
    share = float(top.get("share_pct") or 0.0)
    name = str(top.get("name") or "")
    if share >= DOMINANT_PCT:
        return [{"code": "dominant_kernel", "severity": "info",
                 "title": "%s%s takes %.0f%% of kernel time" % (
                     "GPU-bound: " if first else "", short_name(name), share),
                 "detail": "one kernel (%s%s) dominates: Tier 3 on it is where the time is"
                           % (family(name), _from(top)),
                 "remedies": [], "kernel": name,
                 "evidence": [evidence("share of kernel time", share, "%", src)]}]
    fam = fams[0] if fams else None
    if fam is not None and fam["share_pct"] >= DOMINANT_PCT and fam["kernels"] > 1:
        return [{"code": "dominant_family", "severity": "info",
                 "title": "%s%s kernels take %.0f%% of kernel time (%d kernels)" % (
                     "GPU-bound: " if first else "", fam["family"],
                     fam["share_pct"], fam["kernels"]),
                 "detail": "no single kernel dominates; the %s family does" % fam["family"],
                 "remedies": [],
                 "evidence": [evidence("share of kernel time", fam["share_pct"], "%", src)]}]
    if share >= LEVER_PCT:
        # Under "dominant" but a large part still: that kernel is the one lever worth
        # naming, and "any one kernel buys little" would be false.
        detail = "no kernel dominates; the top one, %s%s, is the largest single lever" % (
            short_name(name), _from(top))
    else:
        detail = "speeding up any one kernel buys little; fusion or a different algorithm " \
                 "is where the time is%s" % (
                     "; the top kernel: %s, %.0f%%%s" % (short_name(name), share, _from(top))
                     if top.get("code") else "")
    return [{"code": "spread", "severity": "info",
             "title": "%sKernel time is spread: the top kernel takes %.0f%% of it, across %d "
                      "kernels" % ("GPU-bound. " if first else "", share, len(rows)),
             "detail": detail,
             "remedies": [], "evidence": [evidence("share of kernel time", share, "%", src)]}]


def _from(row: Dict[str, Any]) -> str:
    """`` from modeling_llama.py:123 in forward`` where the row has its launching code."""
    code = row.get("code")
    return " from %s" % code if isinstance(code, str) and code else ""


def window_text(window: Optional[Dict[str, Any]]) -> str:
    """``decode steps 2-23, 8.1 ms each`` ("" without a window)."""
    if not window:
        return ""
    step = _num(window.get("step_ns"))
    return "%s %s\u2013%s%s" % (
        window.get("label") or "steps", window.get("first_step"), window.get("last_step"),
        ", %s each" % _duration(step) if step is not None else "")


def left_out_text(window: Optional[Dict[str, Any]]) -> str:
    """``2.1 s before the first kernel (main in train.py:3 1900 ms); …``."""
    parts = []
    for p in (window or {}).get("left_out") or []:
        ns = _num(p.get("ns"))
        if ns is None or ns <= 0:
            continue
        what = p.get("what") or ""
        parts.append("%s %s%s" % (_duration(ns), p.get("phase") or "",
                                  " (%s)" % what if what else ""))
    return "; ".join(parts)


def _duration(ns: float) -> str:
    if ns >= 1e9:
        return "%.2f s" % (ns / 1e9)
    if ns >= 1e6:
        return "%.1f ms" % (ns / 1e6)
    return "%.1f \u00b5s" % (ns / 1e3)


def _where(where: str) -> str:
    return " over %s" % where if where else ""


def _site(site: Dict[str, Any]) -> str:
    """``forward in modeling_llama.py:200`` from ``modeling_llama.py:200 in forward``."""
    code = str(site.get("code") or "?")
    place, _, func = code.partition(" in ")
    return "%s in %s" % (func, place) if func else code


def _host_evidence(host: Dict[str, Any], busy: float, memcpy: Optional[float],
                   mean_ns: Optional[float], window: Optional[Dict[str, Any]], where: str,
                   src: str) -> Tuple[str, Dict[str, Any]]:
    """What keeps the GPU waiting, from the host's own time in the window: waits for the
    GPU, data loading, PyTorch's per-op dispatch, or other Python; remedies only for
    what the trace shows."""
    if memcpy is not None and memcpy >= MEMCPY_HIGH_PCT:
        return "transfer", _transfers(memcpy, src)
    wall = float(host.get("wall_ns") or 0.0)
    launches = int(host.get("launches") or 0)
    sync_ns = float(host.get("sync_ns") or 0.0)
    data_ns = float(host.get("data_ns") or 0.0)
    dispatch_ns = float(host.get("dispatch_ns") or 0.0)
    python_ns = float(host.get("python_ns") or 0.0)
    comm_ns = float(host.get("comm_ns") or 0.0)
    idle = 100.0 - busy
    per_launch = wall / launches if launches else None
    steps = _num((window or {}).get("steps"))
    loop = host.get("loop")
    split = ("PyTorch ops (dispatch and launch) %.0f%%, other Python %.0f%%, waits for the "
             "GPU %.0f%%, data loading %.0f%%" % (
                 100.0 * dispatch_ns / wall, 100.0 * python_ns / wall, 100.0 * sync_ns / wall,
                 100.0 * data_ns / wall))
    if comm_ns:
        split += ", collectives %.0f%%" % (100.0 * comm_ns / wall)
    ev = [evidence("GPU busy share of the window", busy, "%", src),
          evidence("host time in the window", wall, "ns", src),
          evidence("host time in PyTorch ops", dispatch_ns, "ns", src),
          evidence("host time in other Python", python_ns, "ns", src),
          evidence("host time waiting for the GPU", sync_ns, "ns", src),
          evidence("host time loading data", data_ns, "ns", src),
          evidence("kernel launches in the window", float(launches), "", src)]
    if per_launch is not None:
        ev.append(evidence("host time per launch", per_launch, "ns", src))
    py_sites = [s for s in host.get("python_sites") or [] if isinstance(s, dict)]
    top_py = "; top Python: %s" % ", ".join(
        "%s %s" % (_site(s), _duration(float(s.get("ns") or 0.0))) for s in py_sites[:3]
    ) if py_sites else ""
    if sync_ns >= SYNC_HOST_SHARE * wall:
        sites = [s for s in host.get("sync_sites") or [] if isinstance(s, dict)]
        return "host", {
            "code": "sync_bound", "severity": "warning",
            "title": "Sync-bound: the host waits for the GPU %.0f%% of its time%s%s" % (
                100.0 * sync_ns / wall, _where(where),
                ", at %s" % _site(sites[0]) if sites else ""),
            "detail": "%d waits (%s); each drains the GPU's queue and the GPU then waits for "
                      "the host's next work (the GPU is idle %.0f%% of the window). Host "
                      "time: %s" % (int(host.get("sync_calls") or 0), ", ".join(
                          "%s: %d, %s" % (_site(s), int(s.get("count") or 0),
                                          _duration(float(s.get("ns") or 0.0)))
                          for s in sites[:3]) or "sites not known", idle, split),
            "remedies": ["remove the wait at %s: .item(), .cpu(), .tolist() or a print of a "
                         "tensor there blocks until the GPU is done; keep the value on the "
                         "GPU, or read it every N steps" % _site(s) for s in sites[:2]]
            + ["use non_blocking copies into pinned memory and an event instead of a "
               "stream sync"],
            "evidence": ev}
    if comm_ns >= SYNC_HOST_SHARE * wall:
        return "communication", {
            "code": "communication_bound", "severity": "warning",
            "title": "Communication-bound: the host waits in collectives %.0f%% of its time%s"
                     % (100.0 * comm_ns / wall, _where(where)),
            "detail": "the trace shows the host inside torch.distributed's collectives "
                      "(all_reduce and the like) while the GPU is idle %.0f%% of the window. "
                      "Host time: %s" % (idle, split),
            "remedies": ["overlap communication with compute: issue collectives with "
                         "async_op=True and wait later, or DDP's bucketed all-reduce during "
                         "backward",
                         "use the nccl backend where each rank has a GPU (gloo and MPI "
                         "reduce through host memory)"],
            "evidence": [*ev, evidence("host time in collectives", comm_ns, "ns", src)]}
    if data_ns >= DATA_HOST_SHARE * wall:
        return "host", {
            "code": "data_bound", "severity": "warning",
            "title": "Data-loading-bound: the host loads data %.0f%% of its time%s" % (
                100.0 * data_ns / wall, _where(where)),
            "detail": "the trace shows the host in DataLoader / Dataset code while the GPU "
                      "is idle %.0f%% of the window. Host time: %s" % (idle, split),
            "remedies": ["load in background workers: DataLoader(num_workers=N, "
                         "persistent_workers=True, prefetch_factor=2)",
                         "pin_memory=True and .to(device, non_blocking=True)",
                         "move decoding and augmentation to the GPU or preprocess once"],
            "evidence": ev}
    sites = [s for s in host.get("launch_sites") or [] if isinstance(s, dict)]
    short = per_launch is not None and per_launch < LAUNCH_GAP_NS and (
        mean_ns is None or mean_ns < LAUNCH_GAP_NS)
    if short and launches:
        decode = bool(window and window.get("label") == "decode steps") or bool(
            loop and DECODE_FRAME.search(str(loop).rsplit(" in ", 1)[-1]))
        origin = _site(sites[0]) if sites else "?"
        under = " under %s" % _site({"code": loop}) if loop else ""
        remedies = ["capture the %s in a CUDA graph: torch.compile(mode=\"reduce-overhead\"), "
                    "or torch.cuda.CUDAGraph around it" % ("decode step" if decode else "step")]
        if decode:
            remedies.append("use a static KV cache (generate(..., cache_implementation="
                            "\"static\"), or StaticCache) so the decode step has fixed "
                            "shapes and can be captured and compiled")
        remedies.append("fuse small kernels with torch.compile (fewer launches per step)")
        remedies.append("give each launch more work: bigger batches")
        per_step = ("%.0f launches a %s, " % (launches / steps, "decode step" if decode
                                              else "step")) if steps else ""
        known = sum(float(x.get("count") or 0.0) for x in sites)
        by_code = "; launches by code: %s" % ", ".join(
            "%s %.0f%%" % (_site(x), 100.0 * float(x.get("count") or 0.0)
                           / max(float(launches), known))
            for x in sites[:4]) if sites and known else ""
        ev.append(evidence("host time in PyTorch ops per launch", dispatch_ns / launches,
                           "ns", src))
        return "launch", {
            "code": "dispatch_bound", "severity": "warning",
            "title": "Dispatch-bound: the host spends %s per kernel launch, from %s%s" % (
                _duration(per_launch or 0.0), origin, under),
            "detail": "the GPU is idle %.0f%%%s while the host runs Python and PyTorch's "
                      "dispatch for each of %d short kernels (%smean kernel %s): the cost "
                      "is per launch, not in any kernel. Host time: %s%s%s" % (
                          idle, _where(where), launches, per_step,
                          _duration(mean_ns) if mean_ns is not None else "?", split, top_py,
                          by_code),
            "remedies": remedies, "evidence": ev}
    return "host", {
        "code": "python_bound", "severity": "warning",
        "title": "Host-bound: Python between kernels takes %.0f%% of the host's time%s%s" % (
            100.0 * python_ns / wall, _where(where),
            ", most in %s" % _site(py_sites[0]) if py_sites else ""),
        "detail": "the GPU is idle %.0f%% of the window; launching is not the cost "
                  "(%s per launch). Host time: %s%s" % (
                      idle, _duration(per_launch) if per_launch is not None else "?",
                      split, top_py),
        "remedies": ["move the work of %s out of the loop, or onto the GPU" % _site(s)
                     for s in py_sites[:2]]
        or ["profile the host with py-spy to see its Python"],
        "evidence": ev}


def _sync_note(host: Dict[str, Any], first: Dict[str, Any], src: str
               ) -> List[Dict[str, Any]]:
    """The host's waits for the GPU, by code, where they cost a tenth of its time and the
    first finding is not about them."""
    wall = float(host.get("wall_ns") or 0.0)
    sync_ns = float(host.get("sync_ns") or 0.0)
    sites = [s for s in host.get("sync_sites") or [] if isinstance(s, dict)]
    if first.get("code") == "sync_bound" or not wall or sync_ns < SYNC_NOTE_SHARE * wall \
            or not sites:
        return []
    return [{"code": "host_syncs", "severity": "info",
             "title": "The host waits for the GPU %.0f%% of its time, most at %s"
                      % (100.0 * sync_ns / wall, _site(sites[0])),
             "detail": ", ".join("%s: %d waits, %s" % (
                 _site(s), int(s.get("count") or 0), _duration(float(s.get("ns") or 0.0)))
                 for s in sites[:3]),
             "remedies": ["remove the wait at %s (.item(), .cpu(), .tolist()): keep the "
                          "value on the GPU, or read it every N steps" % _site(sites[0])],
             "evidence": [evidence("host time waiting for the GPU", sync_ns, "ns", src)]}]


def _communication(comm: Dict[str, Any], where: str, src: str, first: bool = True
                   ) -> Dict[str, Any]:
    exposed = _num(comm.get("exposed_pct")) or 0.0
    share = _num(comm.get("comm_pct")) or 0.0
    host_side = comm.get("where") == "host"
    ev = [evidence("communication share of the window", share, "%", src),
          evidence("communication not overlapped with compute", exposed, "%", src)]
    remedies = []
    if host_side:
        remedies.append("use the nccl backend where each rank has a GPU: gloo and MPI "
                        "reduce through host memory while the GPU waits")
    remedies += ["overlap communication with compute: DDP's bucketed all-reduce during "
                 "backward (bucket_cap_mb), or issue collectives async_op=True and wait later",
                 "communicate less often or less: gradient accumulation with no_sync(), "
                 "bf16 gradients (a compression hook)"]
    return {"code": "communication_bound" if first else "communication", "severity":
            "warning" if first else "info",
            "title": "%s: collectives not overlapped with compute take %.0f%% of the time%s"
                     % ("Communication-bound" if first else "Communication", exposed,
                        _where(where)),
            "detail": "collectives (%s) take %.0f%% of the window, %.0f%% of it with no "
                      "compute kernel running alongside: the GPUs wait for each other" % (
                          "on the host" if host_side else "NCCL kernels", share, exposed),
            "remedies": remedies if first else [], "evidence": ev}


def tier3_advice(verdict: Dict[str, Any], rows: List[Dict[str, Any]],
                 regex: Optional[str]) -> str:
    """Whether Tier 3's target is worth profiling, given the program verdict.

    Tier 3 profiles the first kernel its filter ``regex`` matches, or Tier 2's top kernel
    when there is no filter.
    """
    target = rows[0] if rows and not regex else None
    if regex:
        try:
            pattern = re.compile(regex)
        except re.error:
            pattern = None
        target = next((r for r in rows if pattern is not None
                       and pattern.search(str(r.get("name") or ""))), None)
    if target is None:
        return ("Tier 3 profiles what regex:%s matches, none of which Tier 2 ranked"
                % regex if regex else "Tier 3 has no target from Tier 2")
    name = short_name(str(target.get("name") or ""))
    share = float(target.get("share_pct") or 0.0)
    busy = _num(verdict.get("gpu_busy_pct"))
    if verdict.get("bound") != "gpu" and busy is not None:
        saved = share * busy / 200.0
        return ("Tier 3 profiles %s (%.0f%% of kernel time), but the GPU is busy only %.0f%% "
                "of the span: making it twice as fast saves at most %.1f%% of the run; the "
                "%s bound comes first" % (name, share, busy, saved, verdict.get("bound")))
    if share < 10.0:
        return ("Tier 3 profiles %s, only %.1f%% of kernel time: even a much faster %s "
                "changes the program little" % (name, share, name))
    return ("Tier 3 profiles %s: %.0f%% of kernel time, so a faster %s is a faster program"
            % (name, share, name))


def _num(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None
