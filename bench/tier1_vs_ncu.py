"""Where CUDA-event timing and ncu's ``gpu__time_duration`` part ways (run on a GPU).

Tier 1 must agree with ncu on the same kernel. ncu times one launch in isolation, with
the caches flushed *and clean* before it (``--cache-control all``), from the kernel's
first to its last cycle. CUDA events around back-to-back launches see other things:
the event records themselves, the launch front end, and — for kernels that write a lot —
the previous call's dirty L2 lines being written back while this call runs. This bench
times each workload several ways in one process so those effects can be told apart, then
asks ncu for the same kernel's duration with caches flushed and not::

    PYTHONPATH=src python3 bench/tier1_vs_ncu.py --out gap.json

Modes (median per-call µs over ~1 s of samples each):

* ``hot``          event pair around one call, samples back to back (Tier 1's old hot)
* ``hot_b16``      event pair around 16 back-to-back calls, divided by 16
* ``memset_flush`` 2×L2 memset before each sample (Tier 1's old cold): L2 left dirty
* ``clean_flush``  2×L2 *read* before each sample: L2 left clean, as ncu leaves it
* ``idle``         a 1 ms GPU-side wait before each sample (L2 as the last call left it)
* ``clean_flush_idle`` both: Tier 1's cold mode (the default for calls ≥ 10 µs)
* ``isolated``     host sync and 10 ms sleep before each sample (clocks may drop)
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from gpuws.kernels.registry import make_builtin, parse_workload
from gpuws.remote_agent.measure.tier1 import (
    COLD_GAP_MS,
    CupyEventTimer,
    make_hold,
    make_l2_flush,
    memset_flush,
)

WORKLOADS = ("builtin:saxpy", "builtin:copy?impl=kernel",
             "builtin:gemm?m=4096&n=4096&k=4096&dtype=fp16", "builtin:tiled_matmul?n=2048")
TARGET = ("import sys, cupy\nfrom gpuws.kernels.registry import make_builtin, parse_workload\n"
          "ref = parse_workload(sys.argv[1])\nw = make_builtin(ref.target, ref.params)\n"
          "w.setup()\nfor _ in range(40): w.run()\ncupy.cuda.runtime.deviceSynchronize()\n")


def sample(run: Callable[[], None], *, batch: int = 1, pre: Callable[[], None] | None = None,
           isolated: bool = False, seconds: float = 1.0, cap: int = 400) -> list[float]:
    import cupy

    timer = CupyEventTimer()
    out: list[float] = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds and len(out) < cap:
        n = 1 if isolated else 16
        for _ in range(n):
            if isolated:
                cupy.cuda.runtime.deviceSynchronize()
                time.sleep(0.01)
            if pre is not None:
                pre()
            timer.start()
            for _ in range(batch):
                run()
            timer.stop()
        out.extend(ms * 1000.0 / batch for ms in timer.elapsed_ms())
    return out


def ncu_durations(ncu: str, workload: str, regex: str, cache: str) -> dict[str, Any]:
    argv = [ncu, "--csv", "--print-units", "base", "--metrics", "gpu__time_duration.sum",
            "--clock-control", "none", "--cache-control", cache, "-k", f"regex:{regex}",
            "--kernel-name-base", "demangled", "--launch-skip", "10", "--launch-count", "15",
            sys.executable, "-c", TARGET, workload]
    proc = subprocess.run(argv, capture_output=True, text=True)
    values = []
    text = proc.stdout[proc.stdout.find('"ID"'):] if '"ID"' in proc.stdout else ""
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("Metric Name") == "gpu__time_duration.sum":
            unit = row.get("Metric Unit", "ns")
            scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0,
                     "msecond": 1e3, "ms": 1e3}.get(unit, 1e-3)
            values.append(float(row["Metric Value"].replace(",", "")) * scale)
    return {"cache_control": cache, "rc": proc.returncode, "n": len(values),
            "median_us": statistics.median(values) if values else None,
            "min_us": min(values) if values else None, "max_us": max(values) if values else None,
            "stderr_tail": proc.stderr[-400:] if not values else ""}


def main() -> int:
    import cupy

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    args = ap.parse_args()
    hold = make_hold()
    read = make_l2_flush()
    clean_flush = read.fn
    # Tier 1's old cold flush: a memset of a buffer the same size.
    dirty_flush = memset_flush(cupy.empty(read.nbytes, dtype=cupy.uint8), read.nbytes)
    cases = []
    for text in args.workloads.split(","):
        ref = parse_workload(text)
        w = make_builtin(ref.target, ref.params)
        w.setup()
        for _ in range(10):
            w.run()
        cupy.cuda.runtime.deviceSynchronize()
        modes: dict[str, list[float]] = {
            "hot": sample(w.run),
            "hot_b16": sample(w.run, batch=16),
            "memset_flush": sample(w.run, pre=dirty_flush),
            "clean_flush": sample(w.run, pre=clean_flush),
            "idle": sample(w.run, pre=lambda: hold(1.0)),
            "clean_flush_idle": sample(w.run, pre=lambda: (clean_flush(), hold(COLD_GAP_MS))),
            "isolated": sample(w.run, isolated=True, cap=60),
            "isolated_clean": sample(w.run, pre=clean_flush, isolated=True, cap=60),
        }
        row: dict[str, Any] = {"workload": text, "modes": {}}
        for name, values in modes.items():
            values.sort()
            row["modes"][name] = {"median_us": statistics.median(values), "n": len(values),
                                  "p5": values[len(values) // 20],
                                  "p95": values[len(values) * 19 // 20]}
        del w
        cupy.get_default_memory_pool().free_all_blocks()
        row["ncu"] = [ncu_durations(args.ncu, text, make_builtin(ref.target, ref.params)
                                    .kernel_regex or ".", c) for c in ("all", "none")]
        cases.append(row)
        line = " ".join(f"{k}={v['median_us']:.2f}" for k, v in row["modes"].items())
        nc = " ".join(f"ncu[{n['cache_control']}]={n['median_us']}" for n in row["ncu"])
        print(f"{text}: {line} {nc}", flush=True)
    with open(args.out, "w") as fh:
        json.dump(cases, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
