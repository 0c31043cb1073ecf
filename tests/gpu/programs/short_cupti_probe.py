"""The ~5 µs kernel of short_kernel.py timed by Tier 1's CUDA events and by the CUPTI
path (:mod:`gpuws.remote_agent.measure.device_time`) under the same cold conditions, with
the last CUPTI session's Chrome trace kept for the CPU tests' fixture.

    PYTHONPATH=src python tests/gpu/programs/short_cupti_probe.py OUT_DIR
Prints one JSON line per mode (cold, hot).
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import cupy

from gpuws.kernels.workload import Workload
from gpuws.remote_agent.measure.device_time import TorchCuptiTimer, device_loop
from gpuws.remote_agent.measure.tier1 import COLD_GAP_MS, make_gate, make_l2_flush, run_tier1

HERE = os.path.dirname(os.path.abspath(__file__))


def main(out: str) -> None:
    # short_kernel.py's run() takes no state (short_timing.py calls it so), which the
    # file: loader refuses beside a setup(): wrap the module's functions directly.
    sys.path.insert(0, HERE)
    import short_kernel as sk

    w = Workload()
    w.name = "short"
    w.run = sk.run  # type: ignore[method-assign]
    sk.setup()
    cupy.cuda.runtime.deviceSynchronize()
    flush, gate = make_l2_flush(), make_gate()
    for mode in ("cold", "hot"):
        ev = run_tier1(w, emit=lambda e: None, mode=mode)
        dev = TorchCuptiTimer(trace_path=os.path.join(out, f"trace-{mode}.json"))
        cold = mode == "cold"
        got = device_loop(w.run, device=dev, cold=cold, flush=flush.fn if cold else None,
                          gap=gate.close if cold else None, gap_ms=COLD_GAP_MS,
                          release=gate.open if cold else None)
        print(json.dumps({
            "mode": mode, "source": ev.get("timing_source"),
            "tier1_median_us": ev["stats"]["median_ms"] * 1000,
            "tier1_batch": ev["batch"], "timer_us": ev["timer_ms"] * 1000,
            "cupti_median_us": statistics.median(got.samples_ms) * 1000
            if got.samples_ms else None,
            "cupti_n": len(got.samples_ms), "cupti_stop": got.stop_reason,
            "outside": got.outside_count, "outside_names": got.outside}))
        sys.stdout.flush()
    gate.release()


if __name__ == "__main__":
    main(sys.argv[1])
