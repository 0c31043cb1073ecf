"""Counters blocked: the kernel verdict from Tier 1, NVML GPM and static analysis, on the
laptop (``live.verdicts``) and on the pod (``measure.findings``), each number labelled.

Real streams: the H100 ``cmd:`` recordings (tests/fixtures/verdict-h100, with NVML GPM
over each command's run on tier 0's ``tier_finished``) and the H200 saxpy run with Tier 1
and static analysis (tests/fixtures/recorded/saxpy_h200.ndjson). Their Tier 3 ran with
counters; here it is replaced by the fallback a pod with ``ERR_NVGPUCTRPERM`` sends (the
counters_blocked diagnosis and ``tier_finished`` status ``fallback``): a fake, because
no pod here can block counters. No recording holds Tier 1 *with* GPM yet (the H200 run
predates GPM on Tier 1's ``tier_finished``): tests/gpu/test_gpu_verdicts.py records
those on the GPU machine; the GPM windows below are synthetic and said so.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from gpuws import protocol
from gpuws.live import verdicts
from gpuws.live.model import RunModel
from gpuws.remote_agent.measure import findings

FIXTURES = Path(__file__).parents[1] / "fixtures"
#: What Tier 3 leaves behind with counters; the fallback has none of it.
TIER3_OUTPUT = ("kernel_metrics", "rule_findings", "kernel_verdict", "tier3_coverage",
                "ncu_progress")


def blocked(path: Path, gpm1: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A recorded stream with Tier 3 replaced by the counters-blocked fallback (the fake),
    and, where given, a GPM window on Tier 1's ``tier_finished`` (synthetic)."""
    out: list[dict[str, Any]] = []
    for line in path.read_bytes().splitlines():
        if not line.startswith(b"{"):
            continue
        ev = json.loads(line)
        if ev["type"] in TIER3_OUTPUT or (ev["type"] == "artifact" and ev["name"].startswith(
                "profile")):
            continue
        if ev["type"] == "tier_finished" and ev["tier"] == 1 and gpm1 is not None:
            ev["gpm"] = gpm1
        if ev["type"] == "tier_finished" and ev["tier"] == 3:
            envelope = {k: ev[k] for k in ("run_id", "seq", "ts", "req")}
            out.append(dict(envelope, type="diagnosis", code="counters_blocked",
                            severity="warning",
                            title="GPU performance counters are blocked (ncu said so)",
                            cause="ncu: ERR_NVGPUCTRPERM - the user does not have permission "
                                  "to access NVIDIA GPU performance counters"))
            ev.update(status="fallback", reason="ERR_NVGPUCTRPERM", gpu_s=None,
                      source=None)
        out.append(ev)
    return out


def decoded(events: list[dict[str, Any]]) -> list[protocol.Events]:
    got = [protocol.decode_event(json.dumps(e).encode()) for e in events]
    assert not any(isinstance(e, protocol.BadLine) for e in got), got
    return [e for e in got if not isinstance(e, protocol.BadLine)]


def laptop(events: list[dict[str, Any]]) -> protocol.KernelVerdict:
    evs = decoded(events)
    got = verdicts.derive(verdicts.inputs_from_events(evs))
    model = RunModel(evs[0].run_id or "")
    model.apply(evs)
    assert verdicts.derive(verdicts.inputs_from_model(model)) == got  # a replay says the same
    assert len(got.kernels) == 1
    return got.kernels[0]


def pod(events: list[dict[str, Any]], tmp_path: Path) -> dict[str, Any]:
    """What the pod's worker states from the same events in its own log (the real
    ``findings.without_counters`` over a real events.ndjson; the context is the two
    attributes it reads)."""
    (tmp_path / "events.ndjson").write_text("".join(
        json.dumps(e, separators=(",", ":")) + "\n" for e in events))
    said: list[dict[str, Any]] = []
    ctx = SimpleNamespace(run_dir=str(tmp_path), emit=said.append)
    table = next((e["kernels"] for e in events if e["type"] == "kernel_table"), None)
    findings.without_counters(ctx, table[0]["name"] if table else None)  # type: ignore[arg-type]
    assert [e["type"] for e in said] == ["kernel_verdict"], said
    return said[0]


def ev_of(k: protocol.KernelVerdict) -> dict[str, tuple[float | None, str]]:
    return {e.name: (e.value, e.source) for e in k.evidence}


@pytest.mark.parametrize(("name", "share"), [("gemm", 1.0), ("decode", 0.25)])
def test_a_cmd_runs_gpm_is_weighed_by_how_much_of_the_run_the_gpu_worked(
        name: str, share: float, tmp_path: Path) -> None:
    """GPM over a short script's whole run is mostly its start-up: the recorded GEMM
    script ran 32 ms of kernels in a 3.2 s window (1.0%), the decode 7.5 ms in 3.0 s. The
    verdict shows GPM's figures with their source and says it does not read them as the
    kernel's, rather than calling a tensor-bound GEMM idle."""
    events = blocked(FIXTURES / "verdict-h100" / f"{name}.ndjson")
    k = laptop(events)
    assert k.counters is False and k.sources == ["NVML GPM"]
    assert k.bound == "unknown"
    assert k.sentence.startswith("Not known: NVML GPM over the command's run is not used: "
                                 "the GPU ran the work only ")
    assert k.sentence.endswith("% of that window (from NVML GPM, without hardware counters)")
    ev = ev_of(k)
    work = ev["GPU's work share of the GPM window (the command's run)"]
    assert work[0] == pytest.approx(share, abs=0.05) and work[1] == "Tier 2's kernel time"
    assert ev["tensor activity"][1] == "NVML GPM"
    # The kernel is Tier 2's top one; the pod, reading its own log, says the same.
    table = next(e for e in events if e["type"] == "kernel_table")
    assert k.kernel == table["kernels"][0]["name"]
    assert msgspec.convert(pod(events, tmp_path), protocol.KernelVerdict, strict=False) \
        .sentence == k.sentence


def test_tier1_and_static_speak_where_tier1_ran(tmp_path: Path) -> None:
    events = blocked(FIXTURES / "recorded" / "saxpy_h200.ndjson")
    k = laptop(events)
    assert (k.bound, k.sources) == ("dram", ["CUDA events", "static analysis"])
    assert k.sentence == ("DRAM bandwidth-bound: 102% of the GPU's peak bandwidth (from "
                          "CUDA events, static analysis, without hardware counters)")
    assert pod(events, tmp_path)["sentence"] == k.sentence


# Synthetic GPM windows on the recorded H200 Tier 1 (a cold Tier 1 of 0.26 ms calls, each
# after a 1 ms idle hold and an L2 flush, spends about a fifth of its window timed).
COPY_GPM = {"window_s": 2.0, "dram_bw_pct": 17.0, "tensor_active_pct": 0.0,
            "sm_active_pct": 19.0, "sm_occupancy_pct": 16.0, "timed_share_pct": 20.0}


def test_gpm_over_tier1_is_read_for_the_time_the_calls_ran(tmp_path: Path) -> None:
    events = blocked(FIXTURES / "recorded" / "saxpy_h200.ndjson", gpm1=COPY_GPM)
    k = laptop(events)
    assert k.sources == ["CUDA events", "NVML GPM", "static analysis"]
    assert k.bound == "dram"
    assert k.sentence == ("DRAM bandwidth-bound: 102% of the GPU's peak bandwidth, DRAM "
                          "bandwidth 85% utilised (NVML GPM) (from CUDA events, NVML GPM, "
                          "static analysis, without hardware counters)")
    ev = ev_of(k)
    assert ev["DRAM bandwidth utilisation"] == (17.0, "NVML GPM")  # as sampled
    assert ev["DRAM bandwidth utilisation while the work ran (GPM ÷ work share)"] == (
        85.0, "NVML GPM")
    assert ev["GPU's work share of the GPM window (Tier 1's timed rounds)"] == (
        20.0, "CUDA events")
    assert pod(events, tmp_path)["sentence"] == k.sentence


def test_a_tensor_gemm_and_a_gpm_only_verdict() -> None:
    from gpuws.remote_agent.verdicts.kernel import gpm_window, kernel_verdict_without_counters

    # A bf16 GEMM's Tier 1: 78% of peak FLOP/s (the recorded H100 script's 778 TFLOP/s of
    # ~990), GPM tensor 17% over a window it was timed 20% of: tensor pipes 85% busy.
    tier1 = {"pct_peak_flops": 78.0, "pct_peak_bw": 3.0, "tflops": 778.0, "gbps": 100.0}
    gemm_gpm = dict(COPY_GPM, dram_bw_pct=5.0, tensor_active_pct=17.0)
    v = kernel_verdict_without_counters("nvjet", tier1, None, gpm_window(gemm_gpm, None))
    assert v["bound"] == "compute_tensor"
    assert v["sentence"].startswith("Compute-bound on the tensor cores: 78% of the GPU's peak "
                                    "FLOP/s, tensor pipes 85% active (NVML GPM)")
    # The same FLOP/s with tensor pipes idle: compute on the SMs' own pipes.
    idle = gpm_window(dict(gemm_gpm, tensor_active_pct=0.5), None)
    assert kernel_verdict_without_counters("k", tier1, None, idle)["bound"] == "compute_sm"
    # A workload that declares nothing (a cmd:): GPM alone, where the run was busy enough.
    busy = gpm_window(None, {"window_s": 1.0, "tensor_active_pct": 70.0, "dram_bw_pct": 20.0,
                             "sm_active_pct": 90.0},
                      [{"name": "nvjet", "total_ns": 0.8e9}])
    v = kernel_verdict_without_counters("nvjet", None, None, busy)
    assert (v["bound"], v["sources"]) == ("compute_tensor", ["NVML GPM"])
    assert v["sentence"].startswith("Compute-bound on the tensor cores: tensor pipes 88% active "
                                    "(NVML GPM), DRAM bandwidth 25% utilised (NVML GPM)")
    # GPM that answered nothing (a reason, no window) is no evidence.
    none = gpm_window({"window_s": None, "reason": "GPM not supported"}, None)
    assert none is None


@pytest.mark.parametrize("bad", [
    {"timed_share_pct": 0.0}, {"timed_share_pct": -5.0}, {"timed_share_pct": 1e9},
    {"timed_share_pct": float("nan")}, {"dram_bw_pct": 1e9}, {"dram_bw_pct": -3.0},
    {"dram_bw_pct": float("nan")}, {"window_s": 0.0},
])
def test_hostile_gpm_figures_never_make_more_than_100_percent(bad: dict[str, Any]) -> None:
    from gpuws.remote_agent.verdicts.kernel import gpm_window, kernel_verdict_without_counters

    g = gpm_window(dict(COPY_GPM, **bad), None)
    v = kernel_verdict_without_counters("k", None, None, g)
    for e in v["evidence"]:
        if "while the work ran" in e["name"]:
            assert e["value"] is None or 0.0 <= e["value"] <= 100.0, (bad, e)


@pytest.mark.parametrize(("name", "bound", "words"), [
    # builtin:gemm?dtype=bf16 with GPUWS_COUNTERS=blocked: Tier 1 784 TFLOP/s, 79% of the
    # dense bf16 tensor peak; GPM over Tier 1's 0.1 s cold window read tensor 3.7% (26%
    # divided by the 14% timed share): low, as the L2 flushes fill the window.
    ("gemm_bf16_blocked", "compute_tensor", "only the tensor cores reach"),
    # builtin:saxpy blocked: 3.1 TB/s, past the measured copy bandwidth.
    ("saxpy_blocked", "dram", "DRAM bandwidth-bound"),
])
def test_real_h100_runs_with_counters_blocked(name: str, bound: str, words: str) -> None:
    # Recorded 2026-11-25 by tests/gpu/test_gpu_verdicts.py on the H100 (device tool): the
    # first recordings of Tier 1 *with* NVML GPM on its tier_finished. The kernel verdict is
    # computed again from them as the pod computes it.
    from gpuws.remote_agent.verdicts.kernel import gpm_window, kernel_verdict_without_counters

    events = [json.loads(line) for line in
              (FIXTURES / "verdict-h100" / f"{name}.ndjson").read_text().splitlines()
              if line.startswith("{")]
    assert any(e["type"] == "diagnosis" and e.get("code") == "counters_blocked"
               for e in events)
    tier1 = next(e for e in events if e["type"] == "tier1_result")
    gpm1 = next(e for e in events if e["type"] == "tier_finished" and e["tier"] == 1)["gpm"]
    assert gpm1["window_s"] > 0 and gpm1["source"] == "NVML GPM"
    v = kernel_verdict_without_counters("k", tier1, None, gpm_window(gpm1, None))
    assert v["bound"] == bound and words in v["sentence"], v["sentence"]
    assert v["sources"][:2] == ["CUDA events", "NVML GPM"]
    assert v["sentence"].endswith("without hardware counters)")
