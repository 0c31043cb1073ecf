"""The ~5 µs kernel timed four ways in one process: CUDA events around one launch (with
and without an L2 flush before it), CUDA events around 200 back-to-back launches, and
CUPTI activity records through torch.profiler. Prints one JSON line; ncu's
gpu__time_duration of the same launches is measured beside it by the script that runs this.
"""

from __future__ import annotations

import json
import statistics
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import short_kernel as sk


def events(flush: bool, reps: int = 300) -> list:
    cache = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    times = []
    for _ in range(reps):
        if flush:
            cache.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        sk.run()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1000.0)
    return times


def batched(reps: int = 30, inner: int = 200) -> list:
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(inner):
            sk.run()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1000.0 / inner)
    return times


def cupti(flush: bool, reps: int = 200) -> list:
    from torch.profiler import ProfilerActivity, profile
    cache = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            if flush:
                cache.zero_()
            sk.run()
        torch.cuda.synchronize()
    return [e.time_range.elapsed_us() for e in prof.events()
            if e.device_type.name == "CUDA" and "add" in e.name.lower()
            and "fill" not in e.name.lower()]


def main() -> None:
    sk.setup()
    for _ in range(50):
        sk.run()
    torch.cuda.synchronize()
    out = {}
    for label, values in (("events_cold", events(True)), ("events_hot", events(False)),
                          ("events_batched", batched()), ("cupti_cold", cupti(True)),
                          ("cupti_hot", cupti(False))):
        out[label] = {"n": len(values), "median_us": statistics.median(values) if values else None,
                      "min_us": min(values) if values else None}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
