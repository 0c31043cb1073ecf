"""Tier 3's focused default profile beside ``--set full`` on the same kernel (run on a GPU).

For each workload: ncu with gpuws's default section list and ncu with ``--set full``,
both with ``--clock-control none --cache-control all`` on one launch of the main
kernel, and a one-pass profile (``gpu__time_duration`` only) as the floor every ncu run
pays: process and CUDA start-up, ncu's attach, the workload's set-up. Each profile runs
``--repeats`` times; medians are reported. Reports passes (parsed from ncu's own
progress line), wall time of the whole ncu process, that wall time less the one-pass
floor (what the sections themselves cost), the kernel duration ncu measured, the
FLOPs it counted beside the workload's declared FLOPs, and which kinds of data each
profile holds (SOL, occupancy, memory, compute, warp stalls). Prints a table, writes
JSON (with ncu's console text of the last repeat)::

    PYTHONPATH=src python3 bench/tier3.py --out tier3.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from gpuws.kernels.registry import make_builtin, parse_workload
from gpuws.remote_agent.profilers.ncu_cmd import build_ncu_argv
from gpuws.remote_agent.profilers.ncu_output import NcuConsoleParser
from gpuws.remote_agent.profilers.ncu_reader import read_ncu_rep

WORKLOADS = ("builtin:saxpy", "builtin:tiled_matmul",
             "builtin:gemm?m=4096&n=4096&k=4096&dtype=fp16")
TARGET = ("import sys, cupy\nfrom gpuws.kernels.registry import make_builtin, parse_workload\n"
          "ref = parse_workload(sys.argv[1])\nw = make_builtin(ref.target, ref.params)\n"
          "w.setup(); cupy.cuda.runtime.deviceSynchronize()\n"
          "cupy.cuda.runtime.profilerStart()\nfor _ in range(3): w.run()\n"
          "cupy.cuda.runtime.deviceSynchronize(); cupy.cuda.runtime.profilerStop()\n")
KINDS = {
    "speed of light": ("sm_throughput_pct", "memory_throughput_pct"),
    "occupancy": ("achieved_occupancy_pct", "theoretical_occupancy_pct"),
    "memory": ("dram_throughput_pct", "l2_hit_pct"),
    "compute": ("sm_throughput_pct",),
}


#: The one-pass floor: only the kernel's duration.
ONE_PASS = ["gpu__time_duration.sum"]


def profile(ncu: str, workload: str, regex: str, tmp: str, *, ncu_set: str | None = None,
            sections: list[str] | None = None, metrics: list[str] | None = None,
            label: str | None = None) -> dict[str, Any]:
    """One ncu process on one launch; without a set, sections or metrics, gpuws's default."""
    report = os.path.join(tmp, f"{abs(hash((workload, ncu_set, str(sections), str(metrics))))}")
    argv = build_ncu_argv(ncu, report_path=report,
                          target_argv=[sys.executable, "-c", TARGET, workload],
                          kernel_regex=regex, launch_skip=0, launch_count=1, ncu_set=ncu_set,
                          sections=sections, replay_mode=None, clock_control="none",
                          cache_control="all", metrics=metrics)
    argv[1:1] = ["--profile-from-start", "off"]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    parser = NcuConsoleParser(regex)
    parser.feed(proc.stdout, "stdout")
    parser.feed(proc.stderr, "stderr")
    parser.close()
    launches = read_ncu_rep(report + ".ncu-rep", ncu_path=ncu) if proc.returncode == 0 else []
    m = launches[0]["metrics"] if launches else {}
    stalls = launches[0]["stalls"] if launches else []
    present = {k: all(m.get(x) is not None for x in keys) for k, keys in KINDS.items()}
    present["warp stalls"] = bool(stalls)
    return {"set": label or ncu_set or "gpuws default", "rc": proc.returncode,
            "wall_s": wall, "passes": sum(int(p.get("passes") or 0) for p in parser.profiled),
            "duration_ns": m.get("duration_ns"), "flops": m.get("flops"),
            "dram_bytes": m.get("dram_bytes"), "present": present,
            "kernel": launches[0]["kernel"] if launches else None,
            "argv": argv, "errors": parser.errors[-3:],
            "console": {"stdout": proc.stdout[-4000:], "stderr": proc.stderr[-4000:]}}


def repeated(n: int, *args: Any, **kw: Any) -> dict[str, Any]:
    """:func:`profile` n times: the last result, with the median and every wall time."""
    runs = [profile(*args, **kw) for _ in range(n)]
    out = dict(runs[-1])
    out["walls_s"] = [r["wall_s"] for r in runs]
    out["wall_s"] = statistics.median(out["walls_s"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ncu", help="ncu to use (default: the one gpuws selects for this pod)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if not args.ncu:
        # The resolved install, not a toolkit launcher script: its extras/python is beside it.
        from gpuws.remote_agent.profilers.ncu_provision import current_plan

        args.ncu = current_plan()["selected"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for wl in args.workloads.split(","):
            ref = parse_workload(wl)
            w = make_builtin(ref.target, ref.params)
            regex = w.kernel_regex or ""
            n = args.repeats
            floor = repeated(n, args.ncu, wl, regex, tmp, metrics=ONE_PASS, label="one pass")
            default = repeated(n, args.ncu, wl, regex, tmp)
            full = repeated(n, args.ncu, wl, regex, tmp, ncu_set="full")
            beyond_d = default["wall_s"] - floor["wall_s"]
            beyond_f = full["wall_s"] - floor["wall_s"]
            rows.append({"workload": wl, "declared_flops": w.flops, "one_pass": floor,
                         "default": default, "full": full,
                         "speedup_wall": full["wall_s"] / default["wall_s"],
                         "speedup_beyond_one_pass": beyond_f / beyond_d if beyond_d > 0 else None,
                         "speedup_passes": (full["passes"] / default["passes"]
                                            if default["passes"] else None)})
    print(f"{'workload':44} {'1-pass wall':>11} {'default passes/wall':>20} "
          f"{'full passes/wall':>18} {'x wall':>7} {'x beyond':>8} {'x passes':>8}")
    for r in rows:
        d, f, o = r["default"], r["full"], r["one_pass"]
        beyond, by_passes = r["speedup_beyond_one_pass"], r["speedup_passes"]
        print(f"{r['workload']:44} {o['wall_s']:>9.2f} s {d['passes']:>6} {d['wall_s']:>9.2f} s "
              f"{f['passes']:>6} {f['wall_s']:>8.2f} s {r['speedup_wall']:>7.2f} "
              f"{beyond if beyond is None else round(beyond, 2)!s:>8} "
              f"{by_passes if by_passes is None else round(by_passes, 2)!s:>8}")
        print(f"{'':44} FLOPs counted {d['flops']} (declared {r['declared_flops']}), "
              f"DRAM {d['dram_bytes']} B")
    with open(args.out, "w") as fh:
        json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
