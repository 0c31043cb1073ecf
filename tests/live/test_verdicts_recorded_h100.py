"""The verdicts on four programs recorded on a real H100 (tests/fixtures/verdict-h100).

Recorded 2026-11-24 by ``bash tests/gpu/record_verdict_characters.sh`` (device tool,
NVIDIA H100 80GB HBM3, driver 580.159.04, ncu 2025.3.1, torch 2.11+cu130): each workload
through ``gpuws run local --tiers 2,3 --json``. The laptop's logic (``live.verdicts``) is
run again over the recorded events, as a replay or an export of an old session does, and
must reach what a kernel engineer would say of each.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gpuws import protocol
from gpuws.live.verdicts import derive, inputs_from_events
from gpuws.remote_agent.verdicts import program as program_rules

FIX = Path(__file__).parents[1] / "fixtures" / "verdict-h100"


def events_of(name: str) -> list[protocol.Events]:
    # (recorded before `run --json` kept its "pulled" lines off stdout: they are skipped)
    events = [protocol.decode_event(line) for line in (FIX / f"{name}.ndjson").read_bytes()
              .splitlines() if line.startswith(b"{")]
    assert not any(isinstance(e, protocol.BadLine) for e in events)
    return [e for e in events if not isinstance(e, protocol.BadLine)]


def verdicts_of(name: str, sm_count: int | None = None
                ) -> tuple[protocol.ProgramVerdict, list[protocol.KernelVerdict]]:
    got = inputs_from_events(events_of(name))
    if sm_count is not None:
        got.sm_count = sm_count
    found = derive(got)
    assert found.program is not None
    return found.program, found.kernels


@pytest.mark.parametrize(("name", "bound", "words"), [
    # A batch-1 decode loop with .item() every step: an idle gap before nearly every one
    # of its short kernels, the host's per-op cost (the rule on its numbers below).
    ("decode", "launch", "Launch-bound: the GPU is idle 97%"),
    # 200 launches of an 8-block kernel: short kernels, gaps between them (nsys gave no
    # gaps here, so the 6.5 µs mean kernel decides).
    ("tiny_grid", "launch", "Launch-bound"),
    # saxpy alone: the GPU is busy with one kernel.
    ("saxpy", "gpu", "saxpy takes 100%"),
    # 23 bf16 8192³ GEMMs after cuBLAS's start-up: one 89 ms gap is set aside, the rest
    # of the span is 99% busy.
    ("gemm", "gpu", "GPU-bound: nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT takes 99%"),
])
def test_the_program_verdict_names_what_bounds_it(name: str, bound: str, words: str) -> None:
    program, _ = verdicts_of(name)
    assert program.bound == bound and words in program.summary, program.summary


def test_the_launch_rule_on_the_recorded_decode_and_gemm() -> None:
    """The rule on the fixtures' own figures: the decode's gaps are short (70.9 µs < 200)
    and come with its launches (3,210 gaps for 3,012 launches, 1.07 per launch): launch-
    bound, whose remedies are CUDA graphs and torch.compile. Before this rule (a 50 µs
    mark on the mean gap alone) it read host- or sync-bound. The GEMM script's one 89 ms
    start-up gap holds all but 0.3 ms of its idle time: without it the GPU is busy."""
    decode, _ = verdicts_of("decode")
    ev = {e.name: e.value for e in decode.evidence}
    assert (ev["kernel launches"], ev["idle gaps in the span"]) == (3012, 3210)
    assert ev["mean idle gap"] == pytest.approx(70_903, rel=1e-3)
    assert ev["mean idle gap"] < program_rules.LAUNCH_GAP_NS
    first = decode.findings[0]
    per_launch = next(e.value for e in first.evidence if e.name == "idle gaps per launch")
    assert per_launch == pytest.approx(3210 / 3012) and per_launch >= program_rules.GAPS_PER_LAUNCH
    assert first.code == "launch_bound" and any("CUDA graph" in r for r in first.remedies)
    assert "with 70.9 µs idle between them (1.07 gaps per launch)" in first.detail
    gemm, _ = verdicts_of("gemm")
    assert gemm.gpu_busy_pct == pytest.approx(26.6, abs=0.1)  # the whole span, as measured
    steady = {e.name: e.value for e in gemm.evidence}
    assert steady["GPU busy share without the longest gap"] == pytest.approx(99.0, abs=0.1)
    assert [f.code for f in gemm.findings] == ["dominant_kernel", "one_off_gap"]


def test_the_kernel_verdicts_name_the_bound_from_the_counters() -> None:
    _, saxpy = verdicts_of("saxpy")
    assert saxpy[0].bound == "dram" and "DRAM bandwidth-bound" in saxpy[0].sentence
    _, gemm = verdicts_of("gemm", sm_count=132)
    # 132 blocks on 132 SMs: a persistent kernel on every SM, bound by its tensor cores.
    assert gemm[0].bound == "compute_tensor" and "tensor cores" in gemm[0].sentence


def test_the_tiny_grid_is_too_small_a_grid_with_the_sm_count() -> None:
    """8 blocks on the H100's 132 SMs. The recording predates RunStarted.gpu.sm_count and
    ncu's launch__sm_count in the metrics, so the count a probe of that H100 now carries
    (the CUDA driver's; ncu's H200/H100 reports say 132 too) is set on the inputs."""
    events = events_of("tiny_grid")
    started = next(e for e in events if isinstance(e, protocol.RunStarted))
    assert started.gpu is not None and started.gpu.name == "NVIDIA H100 80GB HBM3"
    assert started.gpu.sm_count is None  # recorded by an agent before the field
    _, without = verdicts_of("tiny_grid")
    assert without[0].bound == "occupancy"  # all it could say without the count
    _, tiny = verdicts_of("tiny_grid", sm_count=132)
    assert tiny[0].bound == "small_grid", tiny[0].sentence
    assert tiny[0].sentence.startswith(
        "Too small a grid: 8 block(s) for 132 SMs leave 124 SMs idle; SM 0%, memory 2% of "
        "peak (ncu)")
    sms = next(e for e in tiny[0].evidence if e.name == "SMs on the GPU")
    assert (sms.value, sms.source) == (132, "CUDA driver")
    # The same through the event a newer agent sends (RunStarted.gpu.sm_count).
    newer = [msgspec.structs.replace(e, gpu=msgspec.structs.replace(e.gpu, sm_count=132))
             if isinstance(e, protocol.RunStarted) and e.gpu is not None else e
             for e in events]
    assert derive(inputs_from_events(newer)).kernels[0].bound == "small_grid"


def test_the_runs_recorded_with_the_probe_s_sm_count() -> None:
    """The decode and the tiny grid recorded again on 2026-11-25 by tests/gpu/
    test_gpu_verdicts.py (H100, device tool), after the SM count became a metric Tier 3
    reads: nothing set by hand this time. (The run's GPU record still has no SM count:
    the worker lists GPUs before the probe that asks libcuda for it, so the count comes
    from ncu's ``launch__sm_count`` here; the pod's own verdict has the probe's.)"""
    got = inputs_from_events(events_of("tiny_grid_probe"))
    assert got.sm_count is None
    kernels = derive(got).kernels  # (Tier 3 alone: no program verdict)
    assert kernels[0].bound == "small_grid"
    assert "8 block(s) for 132 SMs" in kernels[0].sentence
    decode, _ = verdicts_of("decode_probe")
    assert decode.bound == "launch" and decode.summary.startswith("Launch-bound"), decode.summary
