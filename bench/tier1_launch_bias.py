"""Does the host's launch latency leak into Tier 1's event interval? (run on a GPU)

A Triton kernel launched from Python read +1.33% against ncu's ``gpu__time_duration``
on an H100 where CuPy and torch kernels of the same size read within ±0.75%. This bench
times the same vector add (``bench/workloads/{cupy,torch,triton}_add.py``, ~90 µs) in one
process several ways and asks ncu for each kernel's duration::

    PYTHONPATH=src python3 bench/tier1_launch_bias.py --out bias.json

Ways (median per-call µs, cold: L2 flushed clean before each sample):

* ``tier1``     Tier 1's product path (:func:`run_tier1`, ``mode="cold"``): the gate, and the
                timer's own cost (an event pair around nothing) taken out of every sample.
* ``tier1_gate`` the same with this bench's gate passed in.
* ``hold``      flush, 1 ms timed hold kernel, events around one call (Tier 1's cold loop
                before the gate), nothing taken out; the ways below take nothing out either.
* ``nohold``    flush, events around one call: nothing hides the host's launch.
* ``empty``     flush, gate, an event pair around nothing: the timer's own cost.
* ``gate``      flush, a gate kernel that waits 1 ms *and* until the host has enqueued
                the start event, the call and the stop event (nvbench's blocking kernel),
                then events around one call.

``enqueue_us`` is the host time one ``run()`` takes to return (the launch cost).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from gpuws.kernels.workload import load_file_workload
from gpuws.remote_agent.measure.tier1 import (
    COLD_GAP_MS,
    CupyEventTimer,
    Timer,
    make_gate,
    make_hold,
    make_l2_flush,
    run_tier1,
)

SPAN_SRC = r"""
extern "C" __global__ void gpuws_span(unsigned long long ns, unsigned long long* out) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
    out[0] = start;
    out[1] = now;
}
"""


def measure_event_overhead(timer: Timer, *, flush: Callable[[], None] | None,
                           wait: Callable[[float], None] | None,
                           done: Callable[[], None] | None = None, samples: int = 48,
                           span_us: float = 20.0) -> tuple[float, float]:
    """What an event pair adds around one kernel, beyond the kernel's own span (ms).

    A one-thread kernel reads the GPU's global timer at its first and last instruction;
    the events around it, taken as the samples are (``flush``, ``wait``), read longer by
    what the timer itself costs: the start event, the launch's front end, the stop
    event's wait for idle. That difference is what separates an event interval from
    ncu's ``gpu__time_duration``, which starts and ends with the kernel.

    Returns:
        The median difference and the median in-kernel span, both in ms.
    """
    import cupy
    import numpy

    kernel = cupy.RawKernel(SPAN_SRC, "gpuws_span")
    out = cupy.zeros(2 * samples, dtype=cupy.uint64)
    ns = numpy.uint64(int(span_us * 1000))
    for i in range(samples):
        if flush is not None:
            flush()
        if wait is not None:
            wait(COLD_GAP_MS)
        timer.start()
        kernel((1,), (1,), (ns, out[2 * i:]))
        timer.stop()
        if done is not None:
            done()
    events = timer.elapsed_ms()
    stamps = out.get().astype(numpy.int64)
    spans = [float(stamps[2 * i + 1] - stamps[2 * i]) / 1e6 for i in range(samples)]
    diffs = sorted(e - s for e, s in zip(events, spans, strict=True))
    return diffs[len(diffs) // 2], sorted(spans)[len(spans) // 2]


HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = ("cupy_add.py", "torch_add.py", "triton_add.py")
WAYS = ("tier1", "tier1_gate", "hold", "nohold", "gate")
TARGET = ("import sys, cupy\nfrom gpuws.kernels.workload import load_file_workload\n"
          "w = load_file_workload(sys.argv[1])\nw.setup()\n"
          "for _ in range(40): w.run()\ncupy.cuda.runtime.deviceSynchronize()\n")


def loop(run: Callable[[], None], flush: Callable[[], None], *, seconds: float,
         hold: Callable[[float], None] | None = None, gate: Any = None) -> list[float]:
    timer = CupyEventTimer()
    out: list[float] = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(32):
            flush()
            if hold is not None:
                hold(COLD_GAP_MS)
            if gate is not None:
                gate.close(COLD_GAP_MS)
            timer.start()
            run()
            timer.stop()
            if gate is not None:
                gate.open()
        out.extend(ms * 1000.0 for ms in timer.elapsed_ms())
    return out


def enqueue_us(run: Callable[[], None], calls: int = 200) -> float:
    import cupy

    cupy.cuda.runtime.deviceSynchronize()
    t = time.perf_counter()
    for _ in range(calls):
        run()
    dt = (time.perf_counter() - t) * 1e6 / calls
    cupy.cuda.runtime.deviceSynchronize()
    return dt


def ncu_us(ncu: str, path: str, regex: str) -> float | None:
    argv = [ncu, "--csv", "--print-units", "base", "--metrics", "gpu__time_duration.sum",
            "--clock-control", "none", "--cache-control", "all", "-k", f"regex:{regex}",
            "--launch-skip", "10", "--launch-count", "20", sys.executable, "-c", TARGET, path]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    vals = []
    text = res.stdout[res.stdout.find('"ID"'):] if '"ID"' in res.stdout else ""
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("Metric Name") == "gpu__time_duration.sum":
            vals.append(float(row["Metric Value"].replace(",", "")) / 1000.0)  # ns -> µs
    return statistics.median(vals) if vals else None


SPAN_TARGET = ("import cupy, numpy\n"
               f"k = cupy.RawKernel({SPAN_SRC!r}, 'gpuws_span')\n"
               "out = cupy.zeros(2 * 40, dtype=cupy.uint64)\n"
               "for i in range(40): k((1,), (1,), (numpy.uint64(20000), out[2 * i:]))\n"
               "s = out.get().astype(numpy.int64)\n"
               "spans = sorted(float(s[2*i+1] - s[2*i]) / 1e3 for i in range(10, 30))\n"
               "print('SPAN_US=%.4f' % spans[len(spans) // 2])\n")


def spin_check(ncu: str) -> dict[str, Any]:
    """ncu's gpu__time_duration of the span kernel beside its own in-kernel span."""
    argv = [ncu, "--csv", "--print-units", "base", "--metrics", "gpu__time_duration.sum",
            "--clock-control", "none", "--cache-control", "all", "-k", "regex:gpuws_span",
            "--launch-skip", "10", "--launch-count", "20", sys.executable, "-c", SPAN_TARGET]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    vals = []
    span = None
    for line in res.stdout.splitlines():
        if line.startswith("SPAN_US="):
            span = float(line.split("=", 1)[1])
    text = res.stdout[res.stdout.find('"ID"'):] if '"ID"' in res.stdout else ""
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("Metric Name") == "gpu__time_duration.sum":
            vals.append(float(row["Metric Value"].replace(",", "")) / 1000.0)
    return {"ncu_us": statistics.median(vals) if vals else None, "span_us": span,
            "stderr_tail": res.stderr[-400:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tier1_launch_bias.json")
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    args = ap.parse_args()
    rows = []
    for name in WORKLOADS:
        path = os.path.join(HERE, "workloads", name)
        w = load_file_workload(path)
        w.setup()
        for _ in range(20):
            w.run()
        flush = make_l2_flush().fn
        hold, gate = make_hold(), make_gate()
        ways: dict[str, list[float]] = {w: [] for w in WAYS}
        overheads: list[float] = []
        empties: list[float] = []
        for _ in range(args.rounds):  # interleaved: a drift hits every way alike
            res = run_tier1(w, emit=lambda e: None, mode="cold", max_seconds=args.seconds,
                            target_ci=0.0005, min_samples=50)
            ways["tier1"].append(float(res["stats"]["median_ms"]) * 1000.0)
            res = run_tier1(w, emit=lambda e: None, mode="cold", max_seconds=args.seconds,
                            target_ci=0.0005, min_samples=50, gate=gate)
            ways["tier1_gate"].append(float(res["stats"]["median_ms"]) * 1000.0)
            ways["hold"].append(statistics.median(loop(w.run, flush, seconds=args.seconds,
                                                       hold=hold)))
            ways["nohold"].append(statistics.median(loop(w.run, flush, seconds=args.seconds)))
            ways["gate"].append(statistics.median(loop(w.run, flush, seconds=args.seconds,
                                                       gate=gate)))
            over, span = measure_event_overhead(CupyEventTimer(), flush=flush, wait=gate.close,
                                                done=gate.open)
            overheads.append(over * 1000.0)
            empties.append(statistics.median(loop(lambda: None, flush, seconds=0.3,
                                                  gate=gate)))
        ref = ncu_us(args.ncu, path, str(w.kernel_regex))
        row: dict[str, Any] = {"workload": name, "ncu_us": ref,
                               "enqueue_us": enqueue_us(w.run)}
        for way, vals in ways.items():
            row[way + "_us"] = statistics.median(vals)
            row[way + "_rounds"] = vals
            row[way + "_vs_ncu"] = (row[way + "_us"] / ref - 1.0) if ref else None
        row["event_overhead_us"] = statistics.median(overheads)
        row["overheads"] = overheads
        row["span_us"] = span * 1000.0
        corrected = row["tier1_gate_us"] - row["event_overhead_us"]
        row["corrected_us"] = corrected
        row["corrected_vs_ncu"] = (corrected / ref - 1.0) if ref else None
        row["empty_us"] = statistics.median(empties)
        row["empty_rounds"] = empties
        minus_empty = row["tier1_gate_us"] - row["empty_us"]
        row["minus_empty_us"] = minus_empty
        row["minus_empty_vs_ncu"] = (minus_empty / ref - 1.0) if ref else None
        rows.append(row)
        print(json.dumps(row), flush=True)
    spin = spin_check(args.ncu)
    print("span kernel:", json.dumps(spin), flush=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"rows": rows, "spin": spin}, f, indent=1)
    print(f"{'workload':16} {'ncu µs':>8} {'launch µs':>9} " +
          " ".join(f"{w:>14}" for w in WAYS))
    for r in rows:
        cells = []
        for way in WAYS:
            d = r[way + "_vs_ncu"]
            cells.append(f"{r[way + '_us']:7.2f} {d * 100:+5.2f}%" if d is not None
                         else f"{r[way + '_us']:7.2f}   n/a")
        ncu = f"{r['ncu_us']:8.2f}" if r["ncu_us"] else "     n/a"
        d = r["minus_empty_vs_ncu"]
        cells.append(f"empty {r['empty_us']:5.2f} -> {r['minus_empty_us']:7.2f}"
                     + (f" {d * 100:+5.2f}%" if d is not None else ""))
        d = r["corrected_vs_ncu"]
        cells.append(f"overhead {r['event_overhead_us']:5.2f} -> {r['corrected_us']:7.2f}"
                     + (f" {d * 100:+5.2f}%" if d is not None else ""))
        print(f"{r['workload']:16} {ncu} {r['enqueue_us']:9.1f} " + " ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
