"""Verdicts on real tool output: the H200 recordings in tests/fixtures.

Characters covered by real recordings: a DRAM-bound kernel (saxpy, ncu with counters and
Tier 1 without), a tensor-core GEMM (torch bf16 8192³ through cuBLAS's nvjet kernel,
ncu --set full), an attention call dominated by one cuDNN flash kernel (torch.profiler),
and one-kernel kernel tables. A launch-bound decode and a tiny-grid kernel have no
recording yet: bench/workloads/verdict_characters.py records them on a GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuws.remote_agent.measure.tier2_parse import parse_torch_key_averages, rank_kernels
from gpuws.remote_agent.profilers.ncu_reader import read_details_csv, read_raw_csv
from gpuws.remote_agent.verdicts.kernel import (
    coverage,
    kernel_verdict,
    kernel_verdict_without_counters,
)
from gpuws.remote_agent.verdicts.names import MAX_SHORT, short_name
from gpuws.remote_agent.verdicts.program import family, program_verdict, tier3_advice

FIXTURES = Path(__file__).parents[2] / "fixtures"
H200 = FIXTURES / "ncu-2025.3.1-h200"
SAXPY_RUN = FIXTURES / "recorded" / "saxpy_h200.ndjson"


def recorded(kind: str) -> dict[str, Any]:
    """The last event of ``kind`` in the recorded saxpy run (H200, all three tiers)."""
    found = [json.loads(line) for line in SAXPY_RUN.read_text().splitlines()]
    return [e for e in found if e["type"] == kind][-1]


def gemm() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    launch = read_raw_csv((H200 / "gemm_raw.csv").read_text())[0]
    rules = read_details_csv((H200 / "gemm_details.csv").read_text())[0]["rules"]
    return launch, rules


# ------------------------------------------------------------------ short names
# Demangled names as ncu (--kernel-name-base demangled), nsys and torch.profiler print
# them; the torch ones from PyTorch 2.x's ATen kernels, the CUTLASS and flash-attention
# ones as their templates demangle.
REAL_NAMES = [
    ("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT",
     "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT"),
    ("saxpy", "saxpy"),
    ("Memset (Device)", "Memset (Device)"),
    ("Memcpy DtoD (Device -> Device)", "Memcpy DtoD (Device -> Device)"),
    ("triton_poi_fused_add_mul_0", "triton_poi_fused_add_mul_0"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
     "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, "
     "at::detail::Array<char*, 1>)", "vectorized_elementwise_kernel"),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<"
     "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()"
     "() const::{lambda()#7}::operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&,"
     " at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()"
     "() const::{lambda()#7}::operator()() const::{lambda(float)#1} const&)::{lambda(int)#1}>"
     "(int, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda("
     "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() "
     "const::{lambda(float)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda("
     "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() "
     "const::{lambda(float)#1} const&)::{lambda(int)#1})", "elementwise_kernel"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>("
     "cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)",
     "Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>"),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>"
     "(float*, float const*, int, int, int, bool const*, int, bool)", "softmax_warp_forward"),
    ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
     "cutlass::half_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::half_t> >, false, true, "
     "false, false, true, true, false>(Flash_fwd_params)", "flash_fwd_kernel"),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, "
     "false, cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, "
     "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, "
     "float> >(cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, "
     "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, "
     "float>, float, float)", "gemv2T_kernel_val"),
]


#: As nsys, rocprof and torch.profiler printed them in published profiles (PyTorch 2.x):
#: whole, and cut by torch.profiler's table at 55 characters with "...".
PUBLISHED_NAMES = [
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
     "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)",
     "vectorized_elementwise_kernel", "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16tofloat32_copy_"
     "kernel_cuda(at::TensorIteratorBase&)::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> "
     ">(int, at::native::bfloat16tofloat32_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda("
     "c10::BFloat16)#1}, std::array<char*, 2ul>)", "vectorized_elementwise_kernel",
     "copy/memset"),
    ("void at::native::vectorized_elementwise_kernel<4, at...",
     "vectorized_elementwise_kernel", "elementwise"),
    ("void at::native::(anonymous namespace)::conv_depthwi...", "conv_depthwi...", "GEMM"),
    ("void tiled<float, 32>(float const*, float const*, float*, int)", "tiled", "other"),
]


@pytest.mark.parametrize(("full", "short", "fam"), PUBLISHED_NAMES)
def test_short_names_and_families_of_published_names(full: str, short: str, fam: str) -> None:
    assert (short_name(full), family(full)) == (short, fam)


@pytest.mark.parametrize(("full", "short"), REAL_NAMES)
def test_short_name_is_nsights_function_name(full: str, short: str) -> None:
    assert short_name(full) == short


def test_short_name_never_runs_long_and_survives_garbage() -> None:
    # The recorded cuDNN name as torch.profiler's table cut it, and hostile shapes.
    cut = parse_torch_key_averages((H200 / "torch_profiler_key_averages.txt").read_text())[0]
    assert short_name(cut["name"]) == cut["name"]
    for name in ("x" * 5000, "<" * 3000, ")" * 100 + "(", "", "::", "void (", "a<b>(c"):
        assert len(short_name(name)) <= MAX_SHORT


def test_families_of_real_kernels() -> None:
    assert family("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT") == "GEMM"
    assert family("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wg...") == "attention"
    assert family("Memset (Device)") == "copy/memset"
    assert family(REAL_NAMES[5][0]) == "copy/memset"  # FillFunctor: a fill
    assert family(REAL_NAMES[8][0]) == "normalisation"
    assert family(REAL_NAMES[10][0]) == "GEMM"
    assert family("saxpy") == "elementwise"
    assert family("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)") == "communication"
    assert family("mystery") == "other"


# ------------------------------------------------------------------ program verdicts
def test_one_kernel_table_without_a_timeline_says_busy_is_unknown() -> None:
    # Recorded: torch.profiler's table of 10 saxpy calls, no idle/memcpy share.
    v = program_verdict(recorded("kernel_table"))
    assert v["bound"] == "gpu" and v["gpu_busy_pct"] is None
    assert v["findings"][0]["code"] == "dominant_kernel"
    assert not v["summary"].startswith("GPU-bound")  # not measured, so not claimed
    assert [f["code"] for f in v["findings"]] == ["dominant_kernel", "busy_unknown"]
    assert all(e["source"] == "torch.profiler" for e in v["evidence"])
    assert v["families"][0]["family"] == "elementwise" and v["launches"] == 10


def test_attention_call_is_dominated_by_its_flash_kernel() -> None:
    rows = rank_kernels(parse_torch_key_averages(
        (H200 / "torch_profiler_key_averages.txt").read_text(), include_memops=True))
    v = program_verdict({"source": "torch.profiler", "kernels": rows})
    assert [f["family"] for f in v["families"]] == ["attention", "copy/memset"]
    assert v["families"][0]["share_pct"] == pytest.approx(97.59, abs=0.01)
    assert v["findings"][0]["code"] == "dominant_kernel"
    assert v["mean_kernel_ns"] == pytest.approx((234433 + 5792) / 12)


def _with_timeline(idle: float, memcpy: float) -> dict[str, Any]:
    """The recorded attention table with a timeline's shares set beside it (the
    recording has none; the thresholds are what is tested)."""
    rows = rank_kernels(parse_torch_key_averages(
        (H200 / "torch_profiler_key_averages.txt").read_text(), include_memops=True))
    return {"source": "nsys", "kernels": rows, "gpu_idle_pct": idle, "memcpy_pct": memcpy}


def test_short_kernels_with_an_idle_gpu_are_launch_bound_first() -> None:
    v = program_verdict(_with_timeline(99.5, 0.1))
    first = v["findings"][0]
    # 12 kernels averaging 20 µs: the attention call's own kernels are 47 µs and 0.8 µs.
    assert v["mean_kernel_ns"] == pytest.approx(20018.75)
    assert v["bound"] == "host"  # mean just over the 20 µs mark: not launch overhead
    v = program_verdict(dict(_with_timeline(99.5, 0.1), kernels=[
        dict(r, calls=r["calls"] * 10) for r in _with_timeline(0, 0)["kernels"]]))
    first = v["findings"][0]
    assert v["bound"] == "launch" and first["code"] == "launch_bound"
    assert "idle 100%" in first["title"] and any("CUDA graph" in r for r in first["remedies"])
    assert {e["source"] for e in first["evidence"]} == {"nsys"}
    advice = tier3_advice(v, v_rows(v), None)
    assert "at most 0.2% of the run" in advice and "launch bound comes first" in advice


def v_rows(v: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": v["top_kernel"], "share_pct": v["top_share_pct"]}]


def test_copies_over_a_fifth_of_the_span_are_transfer_bound() -> None:
    v = program_verdict(_with_timeline(10.0, 35.0))
    assert v["bound"] == "transfer" and v["findings"][0]["code"] == "transfer_bound"
    assert program_verdict(_with_timeline(70.0, 35.0))["bound"] == "transfer"


def test_a_busy_gpu_is_gpu_bound_and_tier3_target_is_worth_it() -> None:
    v = program_verdict(_with_timeline(5.0, 1.0))
    assert v["bound"] == "gpu" and v["summary"].startswith("GPU-bound: cudnn_generated")
    rows = _with_timeline(5, 1)["kernels"]
    assert "a faster" in tier3_advice(v, rows, None)
    assert "only 2.4% of kernel time" in tier3_advice(v, rows, "Memset")
    assert "none of which Tier 2 ranked" in tier3_advice(v, rows, "nothing_here")


# ------------------------------------------------------------------ kernel verdicts
def test_recorded_saxpy_is_dram_bound_with_ranked_rules() -> None:
    v = kernel_verdict(recorded("kernel_metrics"), recorded("rule_findings")["rules"])
    assert v["bound"] == "dram" and v["counters"] is True
    assert v["sentence"] == "DRAM bandwidth-bound: DRAM throughput 89% of peak, SM 30% (ncu)"
    assert [r["rule"] for r in v["rules"]] == ["CPIStall", "AchievedOccupancy"]
    assert v["rules"][0]["est_speedup_pct"] == pytest.approx(86.2, abs=0.1)
    assert v["rules"][0]["evidence"] == "top stall long_scoreboard 86.2% (ncu)"
    assert v["rules"][1]["evidence"] == "achieved occupancy 81.6% (ncu)"
    assert all(e["source"] == "ncu" for e in v["evidence"])


def test_bf16_gemm_is_tensor_core_bound() -> None:
    launch, rules = gemm()
    v = kernel_verdict(launch, rules, sm_count=132)
    assert v["bound"] == "compute_tensor"
    assert v["sentence"].startswith("Compute-bound on the tensor cores: tensor pipe active 97%")
    speedups = [r["est_speedup_pct"] for r in v["rules"]]
    assert speedups[0] == pytest.approx(15.59) and speedups == sorted(
        speedups, key=lambda s: -(s if s is not None else -1))
    assert not any("could not be found" in r["message"] for r in v["rules"])
    # 132 blocks on 132 SMs: a persistent kernel, not a grid too small
    assert v["short_name"] == launch["kernel"]


def test_saxpy_csv_capture_is_dram_bound_too() -> None:
    v = kernel_verdict(read_raw_csv((H200 / "saxpy_raw.csv").read_text())[0])
    assert v["bound"] == "dram" and "66% of peak" in v["sentence"]


def test_without_counters_tier1_and_static_speak_and_say_so() -> None:
    v = kernel_verdict_without_counters("saxpy", recorded("tier1_result"),
                                        recorded("static_analysis"))
    assert v["bound"] == "dram" and v["counters"] is False
    assert v["sources"] == ["CUDA events", "static analysis"]
    assert v["sentence"] == ("DRAM bandwidth-bound: 102% of the GPU's peak bandwidth (from "
                             "CUDA events, static analysis, without hardware counters)")
    gpm = {"dram_bw_pct": 89.0, "sm_active_pct": 98.0}
    with_gpm = kernel_verdict_without_counters("saxpy", None, None, gpm)
    assert with_gpm["bound"] == "dram" and with_gpm["sources"] == ["NVML GPM"]
    assert "NVML GPM" in with_gpm["sentence"]
    nothing = kernel_verdict_without_counters("k", None, None)
    assert nothing["bound"] == "unknown" and "from nothing" in nothing["sentence"]


# ------------------------------------------------------------------ Tier 3 vs Tier 2
def test_coverage_names_what_tier3_missed_and_why() -> None:
    rows = rank_kernels(parse_torch_key_averages(
        (H200 / "torch_profiler_key_averages.txt").read_text(), include_memops=True))
    table = {"kernels": rows}
    flash = rows[0]["name"]
    c = coverage(table, [flash], regex="cudnn", launch_skip=0, launch_count=1)
    assert [r["name"] for r in c["profiled"]] == [flash]
    assert c["missed"][0]["why"] == "not matched by the filter regex:cudnn"
    c = coverage(table, [flash], regex="cudnn|Memset", launch_skip=2, launch_count=1)
    assert c["missed"][0]["why"].startswith("matched, but --launch-count 1 stopped ncu")
    assert "after skipping 2" in c["missed"][0]["why"]
    c = coverage(table, [], regex=None, launch_skip=0, launch_count=1)
    assert all("another process" in r["why"] for r in c["missed"])
    c = coverage(table, ["other"], regex="(", launch_skip=0, launch_count=1)
    assert "could not be checked here" in c["missed"][0]["why"] and c["others"] == ["other"]


def test_tier1_and_gpm_evidence_go_beside_ncus_with_their_sources() -> None:
    gpm = {"dram_bw_pct": 89.0, "sm_active_pct": 98.0}  # the figures issue 21 read over a copy
    v = kernel_verdict(recorded("kernel_metrics"), [], tier1=recorded("tier1_result"), gpm=gpm)
    assert v["bound"] == "dram" and v["sources"] == ["ncu", "CUDA events", "NVML GPM"]
    by_source = {e["source"] for e in v["evidence"]}
    assert by_source == {"ncu", "CUDA events", "NVML GPM"}
    achieved = next(e for e in v["evidence"] if e["name"] == "achieved bandwidth")
    assert achieved["value"] == pytest.approx(4300.38, abs=0.01)


def test_the_timelines_gaps_tell_launch_waits_from_host_waits() -> None:
    # The recorded attention table (12 launches) with a timeline's figures beside it (the
    # recording has none), idle 76% of the span.
    table = _with_timeline(76.0, 0.0)
    # 152 µs idle in 11 gaps of 13.8 µs: waiting for launches.
    many_short = program_verdict(dict(table, span_ns=200_000.0, gap_count=11,
                                      largest_gap_ns=20_000.0))
    assert many_short["bound"] == "launch"
    assert "with 13.8 µs idle between them" in many_short["findings"][0]["detail"]
    # The same idle share in a 1 ms span, in 2 gaps of 380 µs: the host away.
    few_long = program_verdict(dict(table, span_ns=1_000_000.0, gap_count=2,
                                    largest_gap_ns=500_000.0))
    assert few_long["bound"] == "host"
    assert "waits 380.0 µs between kernels on average" in few_long["findings"][0]["detail"]
    gaps = {e["name"]: e["value"] for e in few_long["evidence"]}
    assert gaps["mean idle gap"] == pytest.approx(380_000.0)
    assert gaps["longest idle gap"] == 500_000.0


def test_gaps_of_several_processes_add_up() -> None:
    from gpuws.remote_agent.measure.tier2_parse import merge_timelines

    got = merge_timelines([{"span_ns": 100, "idle_ns": 40, "gap_count": 3,
                            "largest_gap_ns": 20},
                           {"span_ns": 50, "idle_ns": 10, "gap_count": 1,
                            "largest_gap_ns": 10}])
    assert (got["gap_count"], got["largest_gap_ns"], got["gpu_idle_pct"]) == (
        4, 20, pytest.approx(100 * 50 / 150))


def test_gaps_per_launch_tell_launch_cost_from_a_host_away_between_bursts() -> None:
    # The recorded attention table (12 launches), idle 76% of a 10 ms span (7.6 ms idle).
    table = _with_timeline(76.0, 0.0)
    # 12 gaps of 633 µs, one per launch: each wait is far longer than a launch costs the
    # host (tens of µs): the host does something else each step.
    slow_steps = program_verdict(dict(table, span_ns=10e6, gap_count=12,
                                      largest_gap_ns=700_000.0))
    assert slow_steps["bound"] == "host"
    assert "(1.00 gaps per launch)" in slow_steps["findings"][0]["detail"]
    # Ten times the launches in a 400 µs span (304 µs idle) in 5 gaps of 60.8 µs: short
    # waits, but one per 24 launches: bursts of launches, the host away between them.
    bursts = dict(table, kernels=[dict(r, calls=r["calls"] * 10) for r in table["kernels"]])
    few = program_verdict(dict(bursts, span_ns=400_000.0, gap_count=5,
                               largest_gap_ns=100_000.0))
    ev = {e["name"]: e["value"] for e in few["findings"][0]["evidence"]}
    assert ev["mean idle gap"] == pytest.approx(60_800.0)
    assert ev["idle gaps per launch"] == pytest.approx(5 / 120)
    assert few["bound"] == "host"
    # 120 gaps of 2.5 µs for those 120 launches: launch-bound.
    many = program_verdict(dict(bursts, span_ns=400_000.0, gap_count=120,
                                largest_gap_ns=10_000.0))
    assert many["bound"] == "launch"


def test_a_one_off_gap_is_set_aside_only_among_many() -> None:
    table = _with_timeline(90.0, 0.0)  # 9 ms idle in a 10 ms span
    # One 8.5 ms gap (94% of the idle) among 20: set aside; the other 19 gaps hold 0.5 ms
    # of a 1.5 ms rest: busy 67%, GPU-bound, with the one-off said.
    v = program_verdict(dict(table, span_ns=10e6, gap_count=20, largest_gap_ns=8.5e6))
    assert v["bound"] == "gpu" and v["gpu_busy_pct"] == pytest.approx(10.0)
    one_off = next(f for f in v["findings"] if f["code"] == "one_off_gap")
    assert one_off["title"] == "One idle gap of 8.5 ms (85% of the span) is set aside"
    assert "busy 67% of the time" in one_off["detail"]
    # Among 9 gaps the rest shows no rhythm: nothing is set aside.
    v = program_verdict(dict(table, span_ns=10e6, gap_count=9, largest_gap_ns=8.5e6))
    assert v["bound"] != "gpu" and not any(f["code"] == "one_off_gap" for f in v["findings"])
    # A hostile table (largest gap over the idle time, negative figures) sets nothing aside.
    for bad in ({"largest_gap_ns": 50e6}, {"largest_gap_ns": -1.0}, {"span_ns": -5.0}):
        v = program_verdict({**table, "span_ns": 10e6, "gap_count": 20,
                             "largest_gap_ns": 8.5e6, **bad})
        assert not any(f["code"] == "one_off_gap" for f in v["findings"]), bad


def test_ncus_own_sm_count_and_waves_tell_a_grid_too_small() -> None:
    # The recorded H200 saxpy launch (ncu's raw page): launch__sm_count 132, 248 waves.
    launch = read_raw_csv((H200 / "saxpy_raw.csv").read_text())[0]
    assert (launch["metrics"]["sm_count"], launch["grid"]) == (132.0, "(262144, 1, 1)")
    assert launch["metrics"]["waves_per_sm"] == pytest.approx(248.24, abs=0.01)
    v = kernel_verdict(launch, sm_count=7)  # ncu's count wins over a probe's
    sms = next(e for e in v["evidence"] if e["name"] == "SMs on the GPU")
    assert (sms["value"], sms["source"]) == (132.0, "ncu")
    # The same launch cut to 8 blocks with both units idle (as the recorded H100 tiny grid
    # read: SM 0.1%, memory 2.2%, occupancy 12%): too small a grid, from ncu's count alone.
    idle = dict(launch["metrics"], sm_throughput_pct=0.1, memory_throughput_pct=2.2,
                dram_throughput_pct=0.5, achieved_occupancy_pct=12.0, waves_per_sm=0.004)
    tiny = kernel_verdict(dict(launch, grid="(8, 1, 1)", metrics=idle))
    assert tiny["bound"] == "small_grid" and "8 block(s) for 132 SMs" in tiny["sentence"]
    # 132 blocks, one per SM, but a twentieth of a wave: each SM holds one small block.
    one_each = kernel_verdict(dict(launch, grid="(132, 1, 1)",
                                   metrics=dict(idle, waves_per_sm=0.06)))
    assert one_each["bound"] == "small_grid"
    assert "make 0.06 of a wave on 132 SMs" in one_each["sentence"]
    # A full wave with few warps is latency with too few warps, not the grid's size.
    full = kernel_verdict(dict(launch, grid="(2112, 1, 1)",
                               metrics=dict(idle, waves_per_sm=1.0)))
    assert full["bound"] == "occupancy"
    # A hostile count (0, negative, absurd) is not believed: the probe's is used.
    for bad in (0.0, -132.0, 1e12):
        v = kernel_verdict(dict(launch, grid="(8, 1, 1)", metrics=dict(idle, sm_count=bad)),
                           sm_count=16)
        assert "8 block(s) for 16 SMs" in v["sentence"], bad
