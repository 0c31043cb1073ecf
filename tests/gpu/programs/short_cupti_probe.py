"""Tier 1 on the ~5 µs kernel of short_kernel.py through the product's own code (auto,
cold, hot), with the last CUPTI session's Chrome trace kept, for the CPU tests' fixture.

    PYTHONPATH=src python tests/gpu/programs/short_cupti_probe.py OUT_DIR
Prints one JSON line per mode: the source, the reported median and the event median.
"""

from __future__ import annotations

import json
import os
import sys

import cupy

from gpuws.kernels.workload import load_file_workload
from gpuws.remote_agent.measure.device_time import TorchCuptiTimer
from gpuws.remote_agent.measure.tier1 import run_tier1

HERE = os.path.dirname(os.path.abspath(__file__))


def main(out: str) -> None:
    w = load_file_workload(os.path.join(HERE, "short_kernel.py"))
    w.setup()
    cupy.cuda.runtime.deviceSynchronize()
    for mode in ("auto", "cold", "hot"):
        events: list = []
        device = TorchCuptiTimer(trace_path=os.path.join(out, f"trace-{mode}.json"))
        res = run_tier1(w, emit=events.append, mode=mode, device=device)
        logs = [e for e in events if e["type"] == "log"]
        print(json.dumps({"mode": mode, "ran": res["mode"], "source": res["timing_source"],
                          "median_us": res["stats"]["median_ms"] * 1000,
                          "n": res["stats"]["n"], "ci_rel": res["stats"]["ci_rel_halfwidth"],
                          "events_median_us": (res["events_median_ms"] or 0) * 1000,
                          "timer_us": res["timer_ms"] * 1000, "caution": res["caution"],
                          "logs": [e["message"] for e in logs]}))
        sys.stdout.flush()
    res = run_tier1(w, emit=lambda e: None)
    print(json.dumps({"mode": "auto-default", "source": res["timing_source"],
                      "median_us": res["stats"]["median_ms"] * 1000,
                      "events_median_us": (res["events_median_ms"] or 0) * 1000,
                      "caution": res["caution"]}))


if __name__ == "__main__":
    main(sys.argv[1])
