"""Realistic event streams for session tests, built from the real H200 fixtures.

The agent writes events as plain dicts through the standard library's json; this helper
does the same, so what the store ingests here is shaped exactly like what a pod sends.
Numbers come from ``tests/fixtures/ncu-2025.3.1-h200``: the saxpy kernel's 0.240 ms
median by CUDA events, its metrics from ``saxpy_raw.csv`` and its rule findings from
``saxpy_details.csv`` (both read by the agent's own ``ncu_reader``, so the events are the
ones a pod emits), the GPU from ``nvidia_smi_query.csv``, ncu from ``ncu_version.txt``.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from pathlib import Path
from typing import Any

from gpuws.remote_agent.measure.stats import summarize
from gpuws.remote_agent.profilers import ncu_reader

FIXTURES = Path(__file__).parent.parent / "fixtures" / "ncu-2025.3.1-h200"
#: A fixed start time, so exports (which print times) are reproducible.
T0 = 1_763_700_000.0
NCU = "/opt/nvidia/nsight-compute/2025.3.1/ncu"
SAXPY_BYTES = 3 * 4 * 2**26  # x read, y read, y written; 2^26 floats
SAXPY_FLOPS = 2 * 2**26
H200_PEAK_GBPS = 4800.0
SECTIONS = ["SpeedOfLight", "Occupancy", "LaunchStats", "ComputeWorkloadAnalysis",
            "MemoryWorkloadAnalysis", "WarpStateStats"]
#: Stand-in bytes for the saxpy .ncu-rep (no report file is among the fixtures).
REPORT_BYTES = (FIXTURES / "saxpy_raw.csv").read_bytes()


def probe() -> dict[str, Any]:
    """The H200 pod's probe, shaped like ``protocol.Probe``."""
    fields = [f.strip() for f in (FIXTURES / "nvidia_smi_query.csv").read_text().split(",")]
    version = re.search(r"Version (\d+\.\d+\.\d+)", (FIXTURES / "ncu_version.txt").read_text())
    assert version is not None
    return {
        "hostname": "h200-pod", "os": "Ubuntu 24.04.2 LTS", "kernel": "6.8.0-60-generic",
        "arch": "x86_64", "container": ["/.dockerenv"], "virtualization": ["hypervisor"],
        "python_path": "/usr/bin/python3.12", "python_version": "3.12.3", "uid": 0,
        "user": "root", "home": "/root", "cpu_count": 24, "memory_total_mib": 241_000.0,
        "gpus": [{
            "index": int(fields[0]), "name": fields[1], "uuid": fields[2],
            "memory_total_mib": float(fields[4]), "memory_used_mib": float(fields[5]),
            "sm_clock_mhz": float(fields[9]), "sm_clock_max_mhz": float(fields[10]),
            "compute_capability": fields[11], "pci_bus_id": "00000000:18:00.0",
            "sm_count": 132, "l2_bytes": 62_914_560,
        }],
        "gpu_source": "nvml", "driver": fields[3], "cuda_driver": "13.0",
        "toolkits": [],
        "python_packages": [
            {"name": "cupy-cuda13x", "version": "14.2.0", "cuda": "13"},
            {"name": "torch", "version": "2.11.0", "cuda": "13.0"},
        ],
        "ncu": [{"path": NCU, "version": version.group(1)}],
        "nsys": [{"path": "/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys",
                  "error": "the nsys inside an ncu install cannot produce reports"}],
        "counters": {"rm_profiling_admin_only": False, "cap_sys_admin": True,
                     "cap_perfmon": True, "uid": 0, "verdict": "allowed",
                     "reason": "RmProfilingAdminOnly is 0: any user may read the counters"},
        "probe_s": 0.41,
    }


def saxpy_kernel_metrics() -> dict[str, Any]:
    """saxpy's kernel_metrics event body, read from ``saxpy_raw.csv`` by the agent's reader."""
    (launch,) = ncu_reader.read_raw_csv((FIXTURES / "saxpy_raw.csv").read_text())
    event = ncu_reader.kernel_metrics_event(launch)
    del event["type"]
    return event


def saxpy_rules() -> list[dict[str, Any]]:
    """ncu's rule findings for saxpy, read from ``saxpy_details.csv`` by the agent's reader."""
    launches = ncu_reader.read_details_csv((FIXTURES / "saxpy_details.csv").read_text())
    rules: list[dict[str, Any]] = ncu_reader.rule_findings_event(launches)["rules"]
    return rules


def make_samples(n: int, median_ms: float, seed: int) -> list[float]:
    """``n`` CUDA-event timings around ``median_ms``: ~1% jitter plus rare slow outliers."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        value = median_ms * (1.0 + 0.01 * rng.gauss(0.0, 1.0))
        if rng.random() < 0.02:
            value *= 1.0 + rng.random() * 0.3  # a preemption or clock dip
        out.append(round(value, 6))
    return out


class _Stream:
    def __init__(self, run_id: str, t0: float) -> None:
        self.run_id = run_id
        self.t = t0
        self.lines: list[bytes] = []

    def add(self, type_: str, dt: float = 0.0, **fields: Any) -> None:
        self.t += dt
        event = {"type": type_, "run_id": self.run_id, "seq": len(self.lines),
                 "ts": round(self.t, 6), **fields}
        self.lines.append(json.dumps(event, separators=(",", ":")).encode() + b"\n")


def saxpy_run(run_id: str, *, t0: float = T0, median_ms: float = 0.240, n_samples: int = 200,
              batch: int = 50, seed: int = 1, workload: str = "builtin:saxpy",
              tiers: tuple[int, ...] = (1, 2, 3), mode: str = "hot") -> list[bytes]:
    """A full saxpy run's event lines, as a pod's ``events.ndjson`` would hold them.

    Args:
        run_id: the run's id.
        t0: when it starts (unix seconds).
        median_ms: the median of the Tier-1 samples.
        n_samples: how many Tier-1 samples; ``batch`` per Samples event.
        seed: the samples' random seed.
        workload: the RunSpec workload.
        tiers: which tiers ran (Tier 2 falls back to ncu, as nsys could not report there).
        mode: the Tier-1 mode the samples were taken in.
    """
    ev = _Stream(run_id, t0)
    run_dir = f"/root/.cache/gpuws/runs/{run_id}"
    target = ["/usr/bin/python3.12", f"{run_dir}/worker.py", "--workload", workload]
    spec = {"workload": workload, "tiers": list(tiers), "target_ci": 0.01, "max_seconds": 10.0,
            "kernel_regex": "saxpy", "clock_control": "none", "cache_control": "all"}
    ev.add("run_started", spec=spec, run_dir=run_dir, pid=4242, hostname="h200-pod")
    if 1 in tiers:
        samples = make_samples(n_samples, median_ms, seed)
        ev.add("tier_started", 0.2, tier=1, name="CUDA events", argv=[*target, "--tier", "1"])
        per_batch = 8.0 / max(1, math.ceil(n_samples / batch))
        for i in range(0, n_samples, batch):
            ev.add("samples", per_batch, values_ms=samples[i:i + batch], batch=1)
        stats = summarize(samples)
        gbps = SAXPY_BYTES / (stats["median_ms"] * 1e-3) / 1e9
        ev.add("tier1_result", 0.01, stats=stats, mode=mode, batch=1, warmup=5,
               stop_reason=f"CI half-width {stats['ci_rel_halfwidth']:.2%} under target 1.00%",
               bytes=float(SAXPY_BYTES), flops=float(SAXPY_FLOPS), gbps=gbps,
               tflops=SAXPY_FLOPS / (stats["median_ms"] * 1e-3) / 1e12, peak_gbps=H200_PEAK_GBPS,
               peak_tflops=67.0, pct_peak_bw=100 * gbps / H200_PEAK_GBPS,
               pct_peak_flops=100 * SAXPY_FLOPS / (stats["median_ms"] * 1e-3) / 67e12,
               peak_source="datasheet")
        ev.add("tier_finished", 0.01, tier=1, status="ok", wall_s=round(ev.t - (t0 + 0.2), 6),
               gpu_s=round(sum(samples) / 1000, 6), source="cuda_events")
    km = saxpy_kernel_metrics()
    dur = km["metrics"]["duration_ns"]
    if 2 in tiers:
        argv = [NCU, "--metrics", "gpu__time_duration.sum", "--csv", "--page", "raw", *target]
        start = ev.t + 0.1
        ev.add("tier_started", 0.1, tier=2, name="timeline", argv=argv)
        ev.add("diagnosis", 0.05, code="nsys_unusable", severity="warning",
               title="Nsight Systems cannot make reports on this pod",
               cause="The only nsys is the one inside the ncu install "
                     "(/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys).",
               meaning="Kernel times come from one ncu pass instead of a timeline.",
               remedies=["apt-get install nsight-systems-2025.3.2"],
               unmeasured=["GPU idle gaps", "memcpy share of the timeline"])
        ev.add("kernel_table", 2.9, source="ncu gpu__time_duration.sum", kernels=[
            {"name": "saxpy", "calls": 10, "total_ns": 10 * dur, "mean_ns": dur,
             "share_pct": 100.0}])
        ev.add("tier_finished", 0.01, tier=2, status="fallback", wall_s=round(ev.t - start, 6),
               gpu_s=10 * dur * 1e-9, source="ncu gpu__time_duration.sum",
               reason="nsys is not usable here")
    if 3 in tiers:
        argv = [NCU, "--kernel-name-base", "demangled", "-k", "regex:saxpy", "--launch-skip",
                "0", "--launch-count", "1"]
        for section in SECTIONS:
            argv += ["--section", section]
        argv += ["--clock-control", "none", "--cache-control", "all", "--target-processes",
                 "all", "-o", f"{run_dir}/saxpy", "-f", *target]
        start = ev.t + 0.1
        ev.add("tier_started", 0.1, tier=3, name="Nsight Compute", argv=argv)
        ev.add("output", 0.3, stream="stdout", tier=3,
               text="==PROF== Connected to process 671 (/usr/bin/python3.12)")
        for pct in (0, 50, 100):
            ev.add("ncu_progress", 1.2, kernel="saxpy", percent=pct,
                   passes=20 if pct == 100 else None, done=pct == 100)
        ev.add("output", 0.1, stream="stdout", tier=3,
               text=f"==PROF== Report: {run_dir}/saxpy.ncu-rep")
        ev.add("kernel_metrics", 0.8, **km)
        ev.add("rule_findings", 0.01, rules=saxpy_rules())
        ev.add("artifact", 0.01, name="saxpy.ncu-rep", path=f"{run_dir}/artifacts/saxpy.ncu-rep",
               size=len(REPORT_BYTES), sha256=hashlib.sha256(REPORT_BYTES).hexdigest(),
               kind="ncu-rep")
        ev.add("tier_finished", 0.01, tier=3, status="ok", wall_s=round(ev.t - start, 6),
               gpu_s=dur * 20 * 1e-9, source="ncu_report")
    ev.add("run_finished", 0.05, status="ok", wall_s=round(ev.t + 0.05 - t0, 6), exit_code=0)
    return ev.lines


def blocked_run(run_id: str, *, t0: float = T0) -> list[bytes]:
    """A run on a pod whose GPU counters are blocked: Tier 3 fails, static analysis stands in.

    The workload is a command with a pipe and backticks, and the kernel a templated name,
    so everything a markdown table must escape shows up.
    """
    ev = _Stream(run_id, t0)
    workload = 'cmd:python3 matmul.py --tile 32 | tee "out`date`.log"'
    kernel = "void tiled<float, 32>(float const*, float const*, float*, int)"
    usage = re.search(r"REG:(\d+) STACK:\d+ SHARED:(\d+) LOCAL:(\d+)",
                      (FIXTURES / "cuobjdump_resource_usage.txt").read_text())
    assert usage is not None
    run_dir = f"/home/user/.cache/gpuws/runs/{run_id}"
    target = ["/bin/sh", "-c", 'python3 matmul.py --tile 32 | tee "out`date`.log"']
    ev.add("run_started", spec={"workload": workload, "tiers": [1, 3]}, run_dir=run_dir,
           pid=777)
    ev.add("tier_started", 0.2, tier=1, name="CUDA events", argv=None)
    samples = make_samples(60, 1.7321, seed=9)
    ev.add("samples", 2.0, values_ms=samples)
    stats = summarize(samples)
    ev.add("tier1_result", 0.01, stats=stats, mode="cold", batch=1, warmup=3,
           stop_reason="time budget of 10 s reached", l2_flush_bytes=100_663_296)
    ev.add("tier_finished", 0.01, tier=1, status="ok", wall_s=2.01,
           gpu_s=round(sum(samples) / 1000, 6), source="cuda_events")
    ncu = "/opt/nvidia/nsight-compute/2025.1.1/ncu"  # what fits the L4's 570 driver
    argv = [ncu, "--kernel-name-base", "demangled", "-k", "regex:tiled", "--launch-count", "1",
            "--clock-control", "base", "--cache-control", "all", "-o", f"{run_dir}/tiled",
            "-f", *target]
    ev.add("tier_started", 0.1, tier=3, name="Nsight Compute", argv=argv)
    ev.add("output", 0.4, stream="stdout", tier=3,
           text="==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access "
                "NVIDIA GPU Performance Counters on the target device 0.")
    ev.add("diagnosis", 0.01, code="counters_blocked", severity="error",
           title="GPU performance counters are blocked",
           cause="RmProfilingAdminOnly is 1 and the agent has neither CAP_SYS_ADMIN nor "
                 "CAP_PERFMON (uid 1000).",
           meaning="Nsight Compute cannot read metrics | stalls | rules on this pod.",
           remedies=["on the host: options nvidia NVreg_RestrictProfilingToAdminUsers=0, "
                     "then reboot",
                     "run the container with --cap-add SYS_ADMIN"],
           unmeasured=["ncu metrics", "warp stall reasons", "ncu rule findings"])
    ev.add("static_analysis", 0.2, kernel=kernel, registers_per_thread=int(usage.group(1)),
           shared_mem_per_block=int(usage.group(2)), local_mem_per_thread=int(usage.group(3)),
           block_size=1024, theoretical_occupancy_pct=100.0, limiter="warps",
           source="cuobjdump --dump-resource-usage")
    log = b"==ERROR== ERR_NVGPUCTRPERM\n"
    ev.add("artifact", 0.01, name="ncu.log", path=f"{run_dir}/artifacts/ncu.log", size=len(log),
           sha256=hashlib.sha256(log).hexdigest())
    ev.add("tier_finished", 0.01, tier=3, status="failed", wall_s=0.73,
           reason="ERR_NVGPUCTRPERM: counters blocked")
    ev.add("run_finished", 0.05, status="failed", wall_s=round(ev.t + 0.05 - t0, 6),
           exit_code=1, error="tier 3 failed")
    return ev.lines


def cancelled_run(run_id: str, *, t0: float = T0) -> list[bytes]:
    """A run cancelled during Tier 1 (no result, no later tiers)."""
    ev = _Stream(run_id, t0)
    ev.add("run_started", spec={"workload": "builtin:saxpy", "tiers": [1, 2]},
           run_dir=f"/root/.cache/gpuws/runs/{run_id}", pid=4343)
    ev.add("tier_started", 0.2, tier=1, name="CUDA events", argv=None)
    ev.add("samples", 1.0, values_ms=make_samples(20, 0.240, seed=5))
    ev.add("run_finished", 0.5, status="cancelled", wall_s=1.7, exit_code=-15)
    return ev.lines


def probe_line() -> bytes:
    """The ``probe_result`` event (not a run event) for the H200 pod."""
    return json.dumps({"type": "probe_result", "ts": T0 - 5, "probe": probe()}).encode()
