"""The program verdict from Tier 2's kernel table: what bounds the program as a whole.

Input is a ``kernel_table`` event (rows ranked by share of kernel time, the GPU idle and
memcpy shares of the kernel span where the timeline gave them); output is a
``program_verdict`` event. The first finding is the one that decides what to do next:
when the GPU waits, no kernel tuning helps until it is busy.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

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
#: Copies taking this share of the span make the program transfer-bound.
MEMCPY_HIGH_PCT = 20.0
#: One kernel, or one family, over this share of kernel time dominates.
DOMINANT_PCT = 50.0
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
    # The steady state decides: a one-off start-up gap does not make a program host-bound.
    steady_busy = tl.busy_pct if tl.busy_pct is not None else busy
    if steady_busy is not None and steady_busy < BUSY_LOW_PCT and busy is not None:
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
    return {"source": src, "bound": bound,
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
        "remedies": ["look for host syncs in the loop (.item(), .cpu(), "
                     "torch.cuda.synchronize, printing tensors)",
                     "overlap data loading with compute (DataLoader workers, pinned memory, "
                     "non_blocking copies)",
                     "run nsys with --trace=cuda,osrt,nvtx to see what the host does"],
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
                  "times (%.2f per idle gap): the host is busy elsewhere (Python, data "
                  "loading, I/O)" % (waits, syncs, per_gap),
        "remedies": ["overlap data loading with compute (DataLoader workers, pinned memory, "
                     "non_blocking copies)",
                     "profile the host: py-spy, or nsys with --trace=cuda,osrt,nvtx"],
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
                 "detail": "one kernel (%s) dominates: Tier 3 on it is where the time is"
                           % family(name),
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
    return [{"code": "spread", "severity": "info",
             "title": "%sKernel time is spread: the top kernel takes %.0f%% of %d" % (
                 "GPU-bound. " if first else "", share, len(rows)),
             "detail": "speeding up any one kernel buys little; fusion or a different "
                       "algorithm is where the time is",
             "remedies": [], "evidence": [evidence("share of kernel time", share, "%", src)]}]


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
