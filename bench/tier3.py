"""Tier 3's focused default profile beside ``--set full`` on the same kernel (run on a GPU).

For each workload: ncu with gpuws's default section list and ncu with ``--set full``,
both with ``--clock-control none --cache-control all`` on one launch of the main
kernel. Reports passes (parsed from ncu's own progress line), wall time of the whole
ncu process, the kernel duration ncu measured, and which kinds of data each profile
holds (SOL, occupancy, memory, compute, warp stalls). Prints a table, writes JSON::

    PYTHONPATH=src python3 bench/tier3.py --out tier3.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from gpuws.kernels.registry import make_builtin, parse_workload
from gpuws.remote_agent.ncu_cmd import DEFAULT_SECTIONS, build_ncu_argv
from gpuws.remote_agent.ncu_output import NcuConsoleParser
from gpuws.remote_agent.ncu_reader import read_ncu_rep

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


def profile(ncu: str, workload: str, regex: str, ncu_set: str | None, tmp: str) -> dict[str, Any]:
    report = os.path.join(tmp, f"{abs(hash((workload, ncu_set)))}")
    argv = build_ncu_argv(ncu, report_path=report,
                          target_argv=[sys.executable, "-c", TARGET, workload],
                          kernel_regex=regex, launch_skip=0, launch_count=1, ncu_set=ncu_set,
                          sections=None if ncu_set else list(DEFAULT_SECTIONS), replay_mode=None,
                          clock_control="none", cache_control="all")
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
    return {"set": ncu_set or "gpuws default", "rc": proc.returncode, "wall_s": wall,
            "passes": sum(int(p.get("passes") or 0) for p in parser.profiled),
            "duration_ns": m.get("duration_ns"), "present": present,
            "kernel": launches[0]["kernel"] if launches else None,
            "argv": argv, "errors": parser.errors[-3:]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ncu", help="ncu to use (default: the one gpuws selects for this pod)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    args = ap.parse_args()
    if not args.ncu:
        # The resolved install, not a toolkit launcher script: its extras/python is beside it.
        from gpuws.remote_agent.ncu_provision import current_plan

        args.ncu = current_plan()["selected"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for wl in args.workloads.split(","):
            ref = parse_workload(wl)
            regex = make_builtin(ref.target, ref.params).kernel_regex or ""
            default = profile(args.ncu, wl, regex, None, tmp)
            full = profile(args.ncu, wl, regex, "full", tmp)
            rows.append({"workload": wl, "default": default, "full": full,
                         "speedup_wall": full["wall_s"] / default["wall_s"]})
    print(f"{'workload':44} {'default passes/wall':>22} {'full passes/wall':>20} {'x':>6}")
    for r in rows:
        d, f = r["default"], r["full"]
        print(f"{r['workload']:44} {d['passes']:>8} {d['wall_s']:>10.2f} s "
              f"{f['passes']:>8} {f['wall_s']:>8.2f} s {r['speedup_wall']:>6.2f}")
    with open(args.out, "w") as fh:
        json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
