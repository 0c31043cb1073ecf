"""What each ncu section costs in replay passes and time (run on a GPU).

Tier 3's default profile is a focused section list; this sweep profiles one launch of a
kernel with each candidate list (the same ncu command as ``bench/tier3.py``) and reports
ncu's pass count and the wall time of the whole ncu process, so the default can be chosen
from measurements::

    PYTHONPATH=src python3 bench/tier3_sections.py --out sections.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from typing import Any

from tier3 import ONE_PASS, profile

from gpuws.kernels.registry import make_builtin, parse_workload
from gpuws.remote_agent.profilers.ncu_cmd import DEFAULT_SECTIONS

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
    "set basic": {"ncu_set": "basic"},
    "set full": {"ncu_set": "full"},
    "launch only": {"metrics": ONE_PASS},
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--workloads", default="builtin:saxpy,builtin:tiled_matmul")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for wl in args.workloads.split(","):
            ref = parse_workload(wl)
            regex = make_builtin(ref.target, ref.params).kernel_regex or "."
            for name, cfg in CONFIGS.items():
                r = profile(args.ncu, wl, regex, tmp, label=name, **cfg)
                r.update(workload=wl, config=name)
                rows.append(r)
                print(f"{wl:28} {name:36} rc={r['rc']} passes={r['passes']} "
                      f"wall={r['wall_s']:.2f}", flush=True)
    with open(args.out, "w") as fh:
        json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
