"""What each ncu section costs in replay passes and time (run on a GPU).

Tier 3's default profile is a focused section list; this sweep profiles one launch of a
kernel with each candidate list and reports ncu's pass count, the wall time of the whole
ncu process, and the profiling span (first ``==PROF== Profiling`` line to the line that
prints the pass count), so the default can be chosen from measurements::

    PYTHONPATH=src python3 bench/tier3_sections.py --out sections.json
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from typing import Any

from gpuws.kernels.registry import make_builtin, parse_workload
from gpuws.remote_agent.ncu_cmd import DEFAULT_SECTIONS

TARGET = ("import sys, cupy\nfrom gpuws.kernels.registry import make_builtin, parse_workload\n"
          "ref = parse_workload(sys.argv[1])\nw = make_builtin(ref.target, ref.params)\n"
          "w.setup(); cupy.cuda.runtime.deviceSynchronize()\n"
          "cupy.cuda.runtime.profilerStart()\nfor _ in range(3): w.run()\n"
          "cupy.cuda.runtime.deviceSynchronize(); cupy.cuda.runtime.profilerStop()\n")
BASE = ["SpeedOfLight", "Occupancy", "LaunchStats", "ComputeWorkloadAnalysis",
        "MemoryWorkloadAnalysis", "WarpStateStats"]
FLOP_METRICS = [f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum"
                for op in ("fadd", "fmul", "ffma", "dadd", "dmul", "dfma", "hadd", "hmul", "hfma")]
TENSOR_METRICS = [f"sm__ops_path_tensor_src_{t}.sum"
                  for t in ("fp16", "bf16", "tf32", "fp8", "fp64")]
CONFIGS: dict[str, dict[str, Any]] = {
    "current default": {"sections": list(DEFAULT_SECTIONS)},
    "base6": {"sections": BASE},
    **{f"only {s}": {"sections": [s]} for s in BASE},
    "only SpeedOfLight_RooflineChart": {"sections": ["SpeedOfLight_RooflineChart"]},
    "only HierarchicalTensorRoofline": {
        "sections": ["SpeedOfLight_HierarchicalTensorRooflineChart"]},
    "base6 + flop metrics": {"sections": BASE, "metrics": FLOP_METRICS},
    "base6 + flop + tensor metrics": {
        "sections": BASE, "metrics": [*FLOP_METRICS, *TENSOR_METRICS]},
    "set basic": {"set": "basic"},
    "set full": {"set": "full"},
    "launch only": {"metrics": ["gpu__time_duration.sum"]},
}
_PASSES = re.compile(r"- (\d+) pass(?:es)?\s*$")


def profile(ncu: str, workload: str, regex: str, cfg: dict[str, Any]) -> dict[str, Any]:
    argv = [ncu, "--profile-from-start", "off", "--clock-control", "none", "--cache-control",
            "all", "-k", f"regex:{regex}", "--kernel-name-base", "demangled",
            "--launch-count", "1"]
    if cfg.get("set"):
        argv += ["--set", cfg["set"]]
    for s in cfg.get("sections", []):
        argv += ["--section", s]
    if cfg.get("metrics"):
        argv += ["--metrics", ",".join(cfg["metrics"])]
    argv += [sys.executable, "-c", TARGET, workload]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    assert proc.stdout is not None
    first: float | None = None
    last: float | None = None
    passes: int | None = None
    lines = []
    for line in proc.stdout:
        now = time.perf_counter() - t0
        lines.append(line.rstrip("\n"))
        if line.startswith("==PROF== Profiling") and first is None:
            first = now
        m = _PASSES.search(line)
        if m:
            passes, last = int(m.group(1)), now
    rc = proc.wait()
    wall = time.perf_counter() - t0
    return {"rc": rc, "passes": passes, "wall_s": wall,
            "span_s": (last - first) if first is not None and last is not None else None,
            "prof_lines": [x for x in lines if x.startswith("==")][-6:]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--workloads", default="builtin:saxpy,builtin:tiled_matmul")
    args = ap.parse_args()
    rows = []
    for wl in args.workloads.split(","):
        ref = parse_workload(wl)
        regex = make_builtin(ref.target, ref.params).kernel_regex or "."
        for name, cfg in CONFIGS.items():
            r = profile(args.ncu, wl, regex, cfg)
            r.update(workload=wl, config=name)
            rows.append(r)
            print(f"{wl:28} {name:36} passes={r['passes']} wall={r['wall_s']:.2f} "
                  f"span={r['span_s']}", flush=True)
    with open(args.out, "w") as fh:
        json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
