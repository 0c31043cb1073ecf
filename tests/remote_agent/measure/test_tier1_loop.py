"""Tier 1's timing loop: batching, holds, cold flushes, rounds and the stop rule.

The timer here is a stand-in because no GPU exists on CI machines: :class:`FakeGpu`
plays CUDA events and a deterministic wall clock. It charges each call ``call_ms`` of
GPU time, and models the host launching slower than a short kernel runs (``launch_ms``
per call): a batch not queued behind a hold runs at the host's pace, as on a real GPU.
The real CuPy timer, flush and hold are exercised by the lead on an H100/H200.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuws import protocol
from gpuws.kernels.registry import make_builtin
from gpuws.kernels.workload import Workload, load_file_workload
from gpuws.remote_agent.measure.tier1 import (
    BATCH_BELOW_MS,
    COLD_GAP_MS,
    ROUND_MAX_SAMPLES,
    TIMER_SAMPLES,
    L2Flush,
    datasheet_peaks,
    derive_rates,
    run_tier1,
    timing_loop,
)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "ncu-2025.3.1-h200"
H200_PEAKS = {"gpu_name": "NVIDIA H200", "copy_gbps": 4256.0,
              "copy_source": "measured: device-to-device copy", "datasheet_gbps": 4800.0,
              "fp32_tflops": 67.0, "tensor_tflops": 989.0,
              "flops_source": "datasheet: H200 SXM (dense)"}


class FakeGpu:
    """Deterministic CUDA events + clock. Times in ms; the clock in seconds."""

    def __init__(self, call_ms: float, *, launch_ms: float = 0.0, noise: float = 0.0,
                 seed: int = 0, event_ms: float = 0.0) -> None:
        self.call_ms = call_ms
        self.event_ms = event_ms  # what an event pair reads beyond the work it brackets
        self.launch_ms = launch_ms
        self.noise = noise
        self.rng = random.Random(seed)
        self.now = 0.0
        self.ops: list[str] = []
        self.calls = 0
        self._held_ms = 0.0
        self._open: tuple[int, float] | None = None
        self._pairs: list[tuple[int, float]] = []  # (calls, hold before them)
        self.holds: list[float] = []
        self._gated = False  # a gate is enqueued and not yet opened
        self._gated_pairs: set[int] = set()  # indexes of pairs behind an opened gate

    # the workload
    def run(self) -> None:
        self.calls += 1
        self.ops.append("run")
        self.now += self.launch_ms / 1000.0  # the host's time to launch

    # Timer
    def start(self) -> None:
        self.ops.append("start")
        self._open = (self.calls, self._held_ms)
        self._held_ms = 0.0

    def stop(self) -> None:
        self.ops.append("stop")
        assert self._open is not None
        first, held = self._open
        self._pairs.append((self.calls - first, held))
        self._open = None

    def elapsed_ms(self) -> list[float]:
        out = []
        for i, (calls, held) in enumerate(self._pairs):
            gpu = calls * self.call_ms
            # Not queued behind a long enough hold, the GPU waits for each launch; behind
            # a gate the host opened after the stop event, it never does.
            if held < calls * self.launch_ms and i not in self._gated_pairs:
                gpu = max(gpu, calls * self.launch_ms)
            gpu *= 1.0 + self.noise * self.rng.random()
            gpu += self.event_ms
            out.append(gpu)
            self.now += (gpu + held) / 1000.0
        self._pairs = []
        self._gated_pairs = set()
        return out

    # cold flush and hold
    def flush(self) -> None:
        self.ops.append("flush")

    def hold(self, ms: float) -> None:
        self.ops.append("hold")
        self.holds.append(ms)
        self._held_ms = ms

    # GateLike: a hold the host ends once the sample is enqueued
    def close(self, ms: float) -> None:
        self.ops.append("gate")
        self.holds.append(ms)
        self._held_ms = ms
        self._gated = True

    def open(self) -> None:
        self.ops.append("open")
        if self._gated and self._pairs:
            self._gated_pairs.add(len(self._pairs) - 1)
        self._gated = False

    def clock(self) -> float:
        return self.now


def _loop(gpu: FakeGpu, **kw: Any) -> tuple[Any, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    result = timing_loop(gpu.run, timer=gpu, emit=events.append, clock=gpu.clock, **kw)
    return result, events


def test_long_calls_are_not_batched() -> None:
    gpu = FakeGpu(0.5, noise=0.002)
    result, events = _loop(gpu, hold=gpu.hold)
    assert result.batch == 1 and gpu.holds == []
    assert result.est_ms == pytest.approx(0.5, rel=0.01)
    assert all(v == pytest.approx(0.5, rel=0.01) for e in events for v in e["values_ms"])
    assert result.stop_reason == "ci_reached"


def test_short_calls_are_batched_behind_a_hold() -> None:
    # A 2 µs kernel whose launch takes the host 5 µs: held, the batch runs at GPU pace.
    gpu = FakeGpu(0.002, launch_ms=0.005, noise=0.001)
    result, events = _loop(gpu, hold=gpu.hold, warmup=3)
    assert result.est_ms == pytest.approx(0.002, rel=0.01)
    assert result.batch == math.ceil(0.050 / result.est_ms) == 25
    assert all(e["batch"] == 25 for e in events)
    values = [v for e in events for v in e["values_ms"]]
    assert values == pytest.approx([0.002] * len(values), rel=0.01)  # per call, not per batch
    # Every sample is hold → start → 25 runs → stop, and the hold covers 25 launches.
    text = " ".join(gpu.ops)
    sample = "hold start " + "run " * 25 + "stop"
    assert text.count(sample) == len(values)
    assert min(gpu.holds[1:]) >= 25 * 0.005


def test_without_a_hold_the_host_sets_the_pace() -> None:
    gpu = FakeGpu(0.002, launch_ms=0.005)
    result, _ = _loop(gpu)
    assert result.est_ms == pytest.approx(0.005)
    assert result.batch == 10
    assert "hold" not in gpu.ops


def _cold_sample_order(gpu: FakeGpu, n: int) -> None:
    """The timer's empty pairs, then every sample, each flush → hold(COLD_GAP_MS) → start
    → one run → stop: the empty pairs are taken as the samples are."""
    ops = gpu.ops
    assert ops.count("flush") == TIMER_SAMPLES + n
    text = " ".join(ops[ops.index("flush"):])
    assert text == " ".join(["flush hold start stop"] * TIMER_SAMPLES
                            + ["flush hold start run stop"] * n)
    assert gpu.holds[-n - TIMER_SAMPLES:] == [COLD_GAP_MS] * (n + TIMER_SAMPLES)


def test_cold_flushes_and_idles_before_every_sample_outside_the_timed_region() -> None:
    gpu = FakeGpu(0.003, noise=0.001)
    result, events = _loop(gpu, mode="cold", flush=gpu.flush, hold=gpu.hold, min_samples=20)
    assert result.batch == 1  # only the first call of a batch would be cold
    assert (result.mode, result.gap_ms) == ("cold", COLD_GAP_MS)
    _cold_sample_order(gpu, sum(len(e["values_ms"]) for e in events))


def test_auto_is_cold_for_long_calls_and_hot_in_batches_for_short_ones() -> None:
    gpu = FakeGpu(0.2, noise=0.001)
    result, events = _loop(gpu, mode="auto", flush=gpu.flush, hold=gpu.hold)
    assert (result.mode, result.batch) == ("cold", 1)
    _cold_sample_order(gpu, sum(len(e["values_ms"]) for e in events))

    short = FakeGpu(0.002, launch_ms=0.005, noise=0.001)
    result, events = _loop(short, mode="auto", flush=short.flush, hold=short.hold)
    assert (result.mode, result.batch, result.gap_ms) == ("hot", 25, 0.0)
    assert "flush" not in short.ops

    # Without a flush there is nothing to make samples cold: auto runs hot, cold refuses.
    nothing = FakeGpu(0.2)
    assert _loop(nothing, mode="auto")[0].mode == "hot"
    with pytest.raises(ValueError, match="flush"):
        _loop(FakeGpu(0.2), mode="cold")
    with pytest.raises(ValueError, match="unknown Tier 1 mode"):
        _loop(FakeGpu(0.2), mode="lukewarm")


def test_hot_never_flushes_even_when_given_a_flush() -> None:
    gpu = FakeGpu(0.2)
    result, _ = _loop(gpu, mode="hot", flush=gpu.flush, hold=gpu.hold)
    assert result.mode == "hot" and "flush" not in gpu.ops and gpu.holds == []


def test_cold_run_tier1_warns_about_unbatched_short_calls() -> None:
    gpu = FakeGpu(0.003)
    w = _fake_workload(gpu, make_builtin("saxpy", {"n": 4096}))
    events: list[dict[str, Any]] = []
    result = run_tier1(w, emit=events.append, mode="cold", timer=gpu,
                       flush=L2Flush(gpu.flush, 100 * 2**20, "read"), hold=gpu.hold,
                       clock=gpu.clock)
    logs = [e for e in events if e["type"] == "log"]
    assert len(logs) == 2 and "not batched" in logs[0]["message"]
    msgspec.convert(logs[0], protocol.Log)
    # No CUPTI timer with a stand-in event timer: the event figure stays, cautioned.
    assert logs[1]["message"] == result["caution"] and "the floor" in result["caution"]
    assert result["timing_source"] == "CUDA events" and result["events_median_ms"] is None
    assert result["mode"] == result["requested_mode"] == "cold" and result["batch"] == 1
    assert result["l2_flush_bytes"] == 100 * 2**20 and result["l2_flush_method"] == "read"
    assert result["cold_gap_ms"] == COLD_GAP_MS
    msgspec.convert(result, protocol.Tier1Result)


def test_without_memory_for_the_flush_auto_times_hot_and_cold_refuses(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuws.remote_agent.measure import tier1

    def no_memory(l2_bytes: int | None = None) -> L2Flush:
        raise MemoryError("Out of memory allocating 125,829,120 bytes")

    monkeypatch.setattr(tier1, "make_l2_flush", no_memory)
    gpu = FakeGpu(0.2)
    w = _fake_workload(gpu, make_builtin("saxpy", {"n": 4096}))
    events: list[dict[str, Any]] = []
    result = run_tier1(w, emit=events.append, timer=gpu, hold=gpu.hold, clock=gpu.clock)
    assert (result["requested_mode"], result["mode"]) == ("auto", "hot")
    (log,) = [e for e in events if e["type"] == "log"]
    assert log["level"] == "warning" and "timing hot" in log["message"]
    assert "Out of memory" in log["message"]
    with pytest.raises(RuntimeError, match="free GPU memory or use --hot"):
        run_tier1(w, emit=events.append, mode="cold", timer=gpu, hold=gpu.hold,
                  clock=gpu.clock)


def test_auto_run_tier1_says_when_short_calls_were_timed_hot() -> None:
    gpu = FakeGpu(0.002, launch_ms=0.005)
    w = _fake_workload(gpu, make_builtin("saxpy", {"n": 4096}))
    events: list[dict[str, Any]] = []
    result = run_tier1(w, emit=events.append, timer=gpu,
                       flush=L2Flush(gpu.flush, 100 * 2**20, "read"), hold=gpu.hold,
                       clock=gpu.clock)
    assert (result["requested_mode"], result["mode"], result["batch"]) == ("auto", "hot", 25)
    assert result["l2_flush_bytes"] is None and result["cold_gap_ms"] is None
    logs = [e for e in events if e["type"] == "log"]
    assert len(logs) == 2 and "batches of 25" in logs[0]["message"]
    assert logs[0]["level"] == "info"
    assert logs[1]["level"] == "warning" and logs[1]["message"] == result["caution"]


def test_stops_when_ci_reached_but_not_before_min_samples() -> None:
    gpu = FakeGpu(0.2, noise=0.001)
    result, events = _loop(gpu, min_samples=600, target_ci=0.01)
    assert result.stop_reason == "ci_reached"
    assert len(result.samples_ms) >= 600
    assert len(events) >= 3  # 600 samples need at least three rounds of ≤ 256


def test_stops_at_max_seconds_when_too_noisy() -> None:
    gpu = FakeGpu(1.0, noise=3.0, seed=7)
    result, _ = _loop(gpu, target_ci=1e-6, max_seconds=2.0)
    assert result.stop_reason == "max_seconds"
    assert 2.0 <= gpu.now < 2.0 + 0.25  # rounds are sized to the time left
    assert result.wall_s == pytest.approx(gpu.now)


def test_a_call_longer_than_the_budget_still_gives_a_sample() -> None:
    gpu = FakeGpu(400.0)
    result, _ = _loop(gpu, max_seconds=0.1, warmup=1)
    assert result.stop_reason == "max_seconds"
    assert len(result.samples_ms) == 1 and result.samples_ms[0] == 400.0


def test_rounds_are_about_100_ms_and_at_most_256_samples() -> None:
    gpu = FakeGpu(20.0, noise=0.5, seed=3)
    _, events = _loop(gpu, target_ci=1e-6, max_seconds=1.5)
    assert all(1 <= len(e["values_ms"]) <= 6 for e in events)  # 100 ms / 20 ms = 5
    fast = FakeGpu(0.02, noise=0.5, seed=3)
    _, fast_events = _loop(fast, target_ci=1e-6, max_seconds=0.5)
    assert max(len(e["values_ms"]) for e in fast_events) == ROUND_MAX_SAMPLES
    for e in events + fast_events:
        msgspec.convert(e, protocol.Samples)  # the wire shape, strictly


def _fake_workload(gpu: FakeGpu, w: Workload) -> Workload:
    w.run = gpu.run  # type: ignore[method-assign]
    return w


def test_run_tier1_result_on_the_fixture_saxpy() -> None:
    # The fixture machine measured saxpy (2^26 floats) at 0.240 ms by CUDA events.
    gpu = FakeGpu(0.240, noise=0.001)
    w = _fake_workload(gpu, make_builtin("saxpy"))
    events: list[dict[str, Any]] = []
    result = run_tier1(w, emit=events.append, timer=gpu, hold=gpu.hold, clock=gpu.clock,
                       flush=L2Flush(gpu.flush, 100 * 2**20, "read"), peaks=H200_PEAKS)
    decoded = msgspec.convert(result, protocol.Tier1Result)
    # auto: a 0.24 ms call is timed cold, as ncu times it.
    assert decoded.mode == "cold" and decoded.requested_mode == "auto"
    assert decoded.batch == 1 and decoded.warmup == 5 and decoded.cold_gap_ms == COLD_GAP_MS
    assert decoded.stop_reason == "ci_reached" and decoded.l2_flush_bytes == 100 * 2**20
    median = decoded.stats.median_ms
    assert median == pytest.approx(0.240, rel=0.002)
    assert decoded.bytes == 12 * 2**26 and decoded.flops == 2 * 2**26
    assert decoded.gbps is not None and decoded.tflops is not None
    assert decoded.gbps == pytest.approx(12 * 2**26 / (median / 1e3) / 1e9)
    assert decoded.gbps == pytest.approx(3355, rel=0.003)  # the README's ≈ 3.36 TB/s
    assert decoded.pct_peak_bw == pytest.approx(100 * decoded.gbps / 4256.0)
    assert decoded.peak_tflops == 67.0
    assert decoded.pct_peak_flops == pytest.approx(100 * decoded.tflops / 67.0)
    assert decoded.peak_source == ("bandwidth: measured: device-to-device copy; "
                                   "FP32 FLOPs: datasheet: H200 SXM (dense)")
    assert sum(len(e["values_ms"]) for e in events) == decoded.stats.n


def test_run_tier1_on_a_file_workload(tmp_path: Path) -> None:
    path = tmp_path / "bench.py"
    path.write_text("FLOPS = 1e12\nFLOPS_KIND = 'tensor'\ndef run():\n    pass\n",
                    encoding="utf-8")
    w = load_file_workload(str(path))
    gpu = FakeGpu(2.0)
    w.run = gpu.run  # type: ignore[method-assign]
    result = run_tier1(w, emit=lambda e: None, mode="hot", timer=gpu, clock=gpu.clock,
                       peaks=H200_PEAKS)
    decoded = msgspec.convert(result, protocol.Tier1Result)
    assert decoded.tflops == pytest.approx(500.0)
    assert decoded.peak_tflops == 989.0 and decoded.gbps is None and decoded.peak_gbps is None


def test_derive_rates_without_peaks_or_declarations() -> None:
    w = make_builtin("copy", {"n": 1000})
    rates = derive_rates(w, 0.001, None)
    assert rates["gbps"] == pytest.approx(8.0) and rates["tflops"] is None
    assert rates["peak_gbps"] is None and rates["pct_peak_bw"] is None
    assert rates["peak_source"] is None
    fallback = derive_rates(w, 0.001, {**H200_PEAKS, "copy_gbps": None})
    assert fallback["peak_gbps"] == 4800.0  # datasheet when nothing was measured


def test_datasheet_rows() -> None:
    smi = (FIXTURES / "nvidia_smi_query.csv").read_text(encoding="utf-8")
    fixture_name = smi.split(",")[1].strip()
    assert fixture_name == "NVIDIA H200"
    row = datasheet_peaks(fixture_name)
    assert row is not None and (row.model, row.memory_gbps) == ("H200 SXM", 4800.0)
    cases = {
        "NVIDIA H100 80GB HBM3": "H100 SXM",
        "NVIDIA A100-SXM4-80GB": "A100 SXM 80GB",
        "NVIDIA L4": "L4",
        "NVIDIA GeForce RTX 4090": "RTX 4090",
    }
    for name, model in cases.items():
        found = datasheet_peaks(name)
        assert found is not None and found.model == model, name
    for other in ("NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL",
                  "NVIDIA A100-SXM4-40GB", "NVIDIA L40S", "Tesla T4"):
        assert datasheet_peaks(other) is None, other


def test_thresholds_are_what_the_docs_say() -> None:
    assert BATCH_BELOW_MS == 0.010 and ROUND_MAX_SAMPLES == 256


def test_a_gate_keeps_a_launcher_slower_than_the_hold_out_of_cold_samples() -> None:
    """A Python launcher that takes longer than the 1 ms cold hold to launch one call
    (a loaded host, a launcher doing work per call) is timed at its own pace behind a
    timed hold, and at the GPU's behind a gate that waits for the host."""
    slow = FakeGpu(call_ms=0.09, launch_ms=2.0)
    held, _ = _loop(slow, mode="cold", flush=slow.flush, hold=slow.hold, min_samples=20)
    assert min(held.samples_ms) >= 2.0  # the launch leaked into every sample
    gated_gpu = FakeGpu(call_ms=0.09, launch_ms=2.0)
    gated, _ = _loop(gated_gpu, mode="cold", flush=gated_gpu.flush, gate=gated_gpu,
                     min_samples=20)
    assert gated.samples_ms and all(math.isclose(v, 0.09) for v in gated.samples_ms)
    assert gated.mode == "cold" and gated.gap_ms == COLD_GAP_MS


def test_a_gated_sample_is_flush_gate_start_run_stop_open() -> None:
    """The gate is enqueued before the start event and opened only after the stop event
    is on the stream; the timed hold is never used when a gate is given."""
    gpu = FakeGpu(call_ms=0.2)
    result, _ = _loop(gpu, mode="cold", flush=gpu.flush, hold=gpu.hold, gate=gpu,
                      min_samples=12)
    n = len(result.samples_ms)
    assert " ".join(gpu.ops[-6 * n:]) == " ".join(["flush gate start run stop open"] * n)
    assert "hold" not in gpu.ops
    assert gpu.holds[-n:] == [COLD_GAP_MS] * n


def test_short_calls_batch_behind_a_gate_sized_like_the_hold() -> None:
    """Hot batches of short calls wait behind the gate too, opened after the batch."""
    gpu = FakeGpu(call_ms=0.002, launch_ms=0.005)
    result, _ = _loop(gpu, gate=gpu, warmup=3)
    assert result.batch == 25 and result.mode == "hot"
    assert all(math.isclose(v, 0.002) for v in result.samples_ms)
    sample = "gate start " + "run " * 25 + "stop open"
    assert sample in " ".join(gpu.ops)


def test_the_timers_own_cost_leaves_every_sample() -> None:
    """Events that read 1.6 µs beyond the work (an H100's, bench/tier1_launch_bias.py):
    cold single calls and hot batches both come out at the work's own time, and the cost
    taken out is reported."""
    cold = FakeGpu(0.095, event_ms=0.0016)
    result, _ = _loop(cold, mode="cold", flush=cold.flush, gate=cold, min_samples=20)
    assert result.timer_ms == pytest.approx(0.0016)
    assert result.samples_ms == pytest.approx([0.095] * len(result.samples_ms))
    hot = FakeGpu(0.002, launch_ms=0.005, event_ms=0.0016)
    result, _ = _loop(hot, gate=hot, warmup=3)
    assert result.batch > 1
    # Without the subtraction a batch of B would read 0.002 + 0.0016 / B per call.
    assert result.samples_ms == pytest.approx([0.002] * len(result.samples_ms), rel=1e-6)


def test_run_tier1_reports_the_timer_cost_it_took_out() -> None:
    gpu = FakeGpu(0.2, event_ms=0.0016)
    w = _fake_workload(gpu, make_builtin("saxpy"))
    res = run_tier1(w, emit=lambda e: None, timer=gpu, gate=gpu, clock=gpu.clock,
                    flush=L2Flush(gpu.flush, 100 * 2**20, "read"))
    decoded = msgspec.convert(res, protocol.Tier1Result)
    assert decoded.timer_ms == pytest.approx(0.0016)
    assert decoded.stats.median_ms == pytest.approx(0.2, rel=0.01)
