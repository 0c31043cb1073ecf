"""A stored run and a comparison of two, as the structured answers the tools return.

Read from the session store only: what a tool returns is what was recorded, the same
figures ``gpuws history``, ``compare`` and ``export`` show. Each run carries a provenance
record (GPU, clocks, driver, the code, gpuws's version), and two runs whose provenance
says their figures were not taken alike are refused, not compared.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .. import __version__, protocol
from ..errors import GpuwsError, StoreError, UsageError
from ..sessions.agent_actions import provenance_of
from ..sessions.compare import (
    change_text,
    compare_runs,
    refuse_if_empty,
    run_gpu,
    verdict_word,
)
from ..sessions.runlist import RUN_LISTING_REMEDY, list_runs
from ..sessions.store import Store

#: Median SM clocks further apart than this share make two runs incomparable for an
#: agent (compare's own line is drawn at 1%, one or two NVML steps: a caution for people;
#: 5% is past any boost jitter and is a different operating point).
CLOCKS_FAR = 0.05
#: The most output lines a result carries (the end of the run's output, where errors are).
OUTPUT_TAIL_LINES = 40
#: The most characters of one output line a result carries.
OUTPUT_LINE_CHARS = 2000


class NotComparable(GpuwsError):
    """Two runs whose figures were not taken alike (another GPU, clocks far apart)."""

    title = "not comparable"
    exit_code = 10


def find(store: Store, run_id: str) -> str:
    """The full id of a stored run (id or unique prefix).

    Raises:
        UsageError: unknown or ambiguous, pointing to the history tool.
    """
    try:
        return store.run(run_id).run_id
    except StoreError as exc:
        raise UsageError(exc.message, remedy=RUN_LISTING_REMEDY.replace(
            "`gpuws history`", "the history tool")) from None


def provenance(store: Store, run_id: str) -> dict[str, Any]:
    """Where a run's figures come from: the GPU (model, UUID, index, driver), the clocks
    Tier 1 saw, the code (tree hash, commit, dirty), the host and gpuws's version.

    ``gpuws_version`` is the version that made the run when an agent made it through
    ``gpuws mcp`` (recorded then), else None: the store does not say which gpuws made it.
    """
    recorded = provenance_of(store, run_id)
    if recorded is not None:
        return recorded
    return _provenance(store, run_id, gpuws_version=None)


def _provenance(store: Store, run_id: str, gpuws_version: str | None) -> dict[str, Any]:
    run = store.run(run_id)
    session = store.session(run.session_id)
    gpu = run_gpu(store, run.run_id)
    tier1 = store.tier1(run.run_id)
    code = store.code(run.run_id)
    return {
        "run_id": run.run_id,
        "host": session.host,
        "hostname": session.probe.hostname if session.probe is not None else None,
        "gpu_name": gpu.name or None,
        "gpu_uuid": gpu.uuid,
        "gpu_index": gpu.index,
        "driver": gpu.driver or None,
        "clocks": msgspec.to_builtins(tier1.clocks) if tier1 and tier1.clocks else None,
        "timing_mode": tier1.mode if tier1 is not None else None,
        "tree_sha256": code.tree_sha256 if code is not None else None,
        "git_commit": code.git_commit if code is not None else None,
        "git_dirty": code.git_dirty if code is not None else None,
        "gpuws_version": gpuws_version,
    }


def provenance_now(store: Store, run_id: str) -> dict[str, Any]:
    """The provenance of a run this process just made (its gpuws version is this one)."""
    return _provenance(store, run_id, __version__)


def run_result(store: Store, run_id: str) -> dict[str, Any]:
    """Everything recorded of one run, for an agent: status, Tier-1 figures, verdicts,
    the kernel table, diagnoses, the code it ran, the end of its output, provenance."""
    rid = find(store, run_id)
    run = store.run(rid)
    summary = next((r for r in list_runs(store, run.session_id) if r.run_id == rid), None)
    tier1 = store.tier1(rid)
    events = store.run_events(rid, ["program_verdict", "kernel_verdict", "kernel_table",
                                    "tier_finished"])
    verdicts: list[dict[str, Any]] = []
    kernels: list[dict[str, Any]] = []
    tiers: list[dict[str, Any]] = []
    for ev in events:
        if isinstance(ev, protocol.ProgramVerdict):
            verdicts.append({"kind": "program", "bound": ev.bound, "summary": ev.summary,
                             "findings": [f.title for f in ev.findings]})
        elif isinstance(ev, protocol.KernelVerdict):
            verdicts.append({"kind": "kernel", "kernel": ev.short_name or ev.kernel,
                             "summary": ev.sentence})
        elif isinstance(ev, protocol.KernelTable):
            kernels = [msgspec.to_builtins(k) for k in ev.kernels[:20]]
        elif isinstance(ev, protocol.TierFinished):
            tiers.append({"tier": ev.tier, "status": ev.status, "wall_s": ev.wall_s,
                          "reason": ev.reason or ""})
    code = store.code(rid)
    return {
        "run_id": rid,
        "session_id": run.session_id,
        "workload": run.workload,
        "status": run.status,
        "why": summary.why if summary is not None else "",
        "wall_s": run.wall_s,
        "exit_code": run.exit_code,
        "tiers": tiers,
        "tier1": None if tier1 is None else {
            "median_ms": tier1.stats.median_ms, "ci_low_ms": tier1.stats.ci_low_ms,
            "ci_high_ms": tier1.stats.ci_high_ms, "n": tier1.stats.n, "mode": tier1.mode,
            "stop_reason": tier1.stop_reason, "gbps": tier1.gbps, "tflops": tier1.tflops},
        "verdicts": verdicts,
        "kernels": kernels,
        "diagnoses": [{"severity": d.severity, "title": d.title, "cause": d.cause,
                       "remedies": list(d.remedies)} for d in store.diagnoses(rid)],
        "code": None if code is None else msgspec.to_builtins(code),
        "output_tail": output_tail(store, rid),
        "provenance": provenance(store, rid),
    }


def output_tail(store: Store, run_id: str) -> list[str]:
    """The last lines the run printed (``stream: text``), each cut to a bound."""
    lines: list[str] = []
    partial: dict[str, str] = {}
    for ev in store.run_events(run_id, ["output"]):
        if not isinstance(ev, protocol.Output):
            continue
        text = partial.pop(ev.stream, "") + ev.text
        if ev.cont:
            partial[ev.stream] = text[:OUTPUT_LINE_CHARS]
            continue
        for line in text.splitlines() or [""]:
            lines.append(f"{ev.stream}: {line[:OUTPUT_LINE_CHARS]}")
        del lines[:-OUTPUT_TAIL_LINES]
    return lines


def why_not_comparable(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """The reason two provenance records make the runs' figures incomparable, or None."""
    if a["gpu_name"] and b["gpu_name"] and a["gpu_name"] != b["gpu_name"]:
        return f"they ran on different GPU models (A {a['gpu_name']}, B {b['gpu_name']})"
    sm_a = (a.get("clocks") or {}).get("sm_mhz_median")
    sm_b = (b.get("clocks") or {}).get("sm_mhz_median")
    if sm_a and sm_b and abs(sm_a - sm_b) > CLOCKS_FAR * max(sm_a, sm_b):
        return (f"their SM clocks were far apart (A median {sm_a:.0f} MHz, B {sm_b:.0f} MHz, "
                f"more than {CLOCKS_FAR:.0%}): the difference would be the clock's")
    if a["timing_mode"] and b["timing_mode"] and a["timing_mode"] != b["timing_mode"]:
        return (f"they were timed differently (A {a['timing_mode']}, B {b['timing_mode']}): "
                "the medians differ by how they were taken")
    return None


def comparison(store: Store, run_a: str, run_b: str) -> dict[str, Any]:
    """B against A: the time ratio with its 95% CI and the verdict (faster, slower, no
    difference), as ``gpuws compare`` and ``gpuws watch`` decide it.

    Raises:
        UsageError: an unknown id, the same run twice, or a run without Tier-1 samples.
        NotComparable: their provenance differs in a way that makes the ratio the GPU's
            or the clock's rather than the code's.
    """
    a, b = find(store, run_a), find(store, run_b)
    if a == b:
        raise UsageError(f"{run_a} and {run_b} are the same run ({a})",
                         remedy="compare two different runs (the history tool lists them)")
    prov_a, prov_b = provenance(store, a), provenance(store, b)
    why = why_not_comparable(prov_a, prov_b)
    if why is not None:
        raise NotComparable(f"{b} cannot be compared with {a}: {why}",
                            remedy="compare runs made on the same GPU model, at like clocks "
                                   "and in the same timing mode")
    cmp = compare_runs(store, a, b)
    refuse_if_empty(cmp)
    t = cmp.tier1
    assert t is not None  # refuse_if_empty raised otherwise
    return {
        "run_a": a, "run_b": b,
        "median_a_ms": t.median_a_ms, "median_b_ms": t.median_b_ms,
        "speedup": t.speedup, "ci_low": t.ci_low, "ci_high": t.ci_high,
        "confidence": cmp.confidence,
        "verdict": verdict_word(t), "change": change_text(t),
        "cliffs_delta": t.cliffs_delta, "n_a": t.n_a, "n_b": t.n_b,
        "differences": list(cmp.differences),
        "code_changes": cmp.code_changes,
        "provenance_a": prov_a, "provenance_b": prov_b,
    }
