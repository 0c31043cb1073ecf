"""Tier-1 timing beside triton's ``do_bench`` and ``cupyx.profiler.benchmark`` (run on a GPU).

For each workload (saxpy, tiled_matmul, fp16 gemm 4096³, sdpa by default) it reports the
estimate (median per-call ms), the spread (IQR/median and stdev/median), the number of
samples and the wall time each tool needed to answer, prints a table and writes JSON::

    PYTHONPATH=src python3 bench/timing.py --out timing.json
    PYTHONPATH=src python3 bench/timing.py --out all.json --workloads all --max-seconds 3

gpuws runs in its default mode (``auto``: cold for calls ≥ 10 µs — L2 flushed clean and
1 ms of GPU idle before each sample, the conditions ncu measures in — and hot in batches
below) and hot (back to back). ``do_bench``
clears its own 256 MiB cache buffer before every repetition, so it sits near cold;
``cupyx.profiler.benchmark`` runs back to back with a sync per repetition (hot). Each
workload's ``check()`` (relative error against a float64/float32 reference) is recorded
too, so a fast wrong kernel cannot pass unnoticed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpuws.kernels.registry import BUILTINS, make_builtin, parse_workload
from gpuws.kernels.workload import Workload
from gpuws.remote_agent.measure.stats import percentile
from gpuws.remote_agent.measure.tier1 import measure_peaks, run_tier1

DEFAULT_WORKLOADS = (
    "builtin:saxpy",
    "builtin:tiled_matmul",
    "builtin:gemm?m=4096&n=4096&k=4096&dtype=fp16",
    "builtin:sdpa",
)


def spread(times_ms: Sequence[float]) -> dict[str, float]:
    """Median, IQR/median and stdev/median of per-call times."""
    values = sorted(times_ms)
    med = statistics.median(values)
    iqr = percentile(values, 75.0) - percentile(values, 25.0)
    stdev = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"median_ms": med, "iqr_rel": iqr / med if med else 0.0,
            "stdev_rel": stdev / med if med else 0.0, "n": float(len(values))}


def bench_gpuws(w: Workload, *, mode: str, target_ci: float, max_seconds: float,
                peaks: dict[str, Any]) -> dict[str, Any]:
    """Tier 1 as the agent runs it; the samples come from the emitted events."""
    samples: list[float] = []

    def emit(event: dict[str, Any]) -> None:
        if event["type"] == "samples":
            samples.extend(event["values_ms"])

    t0 = time.perf_counter()
    result = run_tier1(w, emit=emit, target_ci=target_ci, max_seconds=max_seconds,
                       min_samples=10, warmup=5, mode=mode, peaks=peaks)
    wall = time.perf_counter() - t0
    row: dict[str, Any] = dict(spread(samples))
    row.update(tool=f"gpuws {mode}", mode=result["mode"], wall_s=wall,
               batch=result["batch"], stop_reason=result["stop_reason"],
               ci_rel_halfwidth=result["stats"]["ci_rel_halfwidth"],
               gbps=result["gbps"], tflops=result["tflops"],
               pct_peak_bw=result["pct_peak_bw"], pct_peak_flops=result["pct_peak_flops"])
    return row


def bench_do_bench(w: Workload) -> dict[str, Any]:
    """``triton.testing.do_bench`` with its defaults (25 ms warm-up, 100 ms of repeats)."""
    from triton.testing import do_bench

    t0 = time.perf_counter()
    try:
        times = list(do_bench(w.run, return_mode="all"))
    except (TypeError, AssertionError, ValueError):
        # Older triton has no return_mode="all": ask for quantiles instead.
        q = do_bench(w.run, quantiles=[0.25, 0.5, 0.75])
        wall = time.perf_counter() - t0
        return {"tool": "triton do_bench", "median_ms": q[1], "iqr_rel": (q[2] - q[0]) / q[1],
                "stdev_rel": None, "n": None, "wall_s": wall}
    wall = time.perf_counter() - t0
    row: dict[str, Any] = dict(spread(times))
    row.update(tool="triton do_bench", wall_s=wall)
    return row


def bench_cupyx(w: Workload, max_seconds: float) -> dict[str, Any]:
    """``cupyx.profiler.benchmark``: CUDA events per repetition, no flush."""
    from cupyx.profiler import benchmark

    t0 = time.perf_counter()
    res = benchmark(w.run, n_repeat=10000, n_warmup=10, max_duration=max_seconds)
    wall = time.perf_counter() - t0
    times = [float(t) * 1000.0 for t in res.gpu_times[0]]
    row: dict[str, Any] = dict(spread(times))
    row.update(tool="cupyx benchmark", wall_s=wall)
    return row


def run_case(text: str, args: argparse.Namespace, peaks: dict[str, Any]) -> dict[str, Any]:
    """All tools on one workload string; a tool that fails is recorded, not fatal."""
    ref = parse_workload(text)
    w = make_builtin(ref.target, ref.params)
    w.setup()
    case: dict[str, Any] = {"workload": str(ref), "describe": w.describe(), "rows": []}
    try:
        err = w.check()
        case["check_rel_error"] = err
    except Exception as exc:
        case["check_error"] = f"{type(exc).__name__}: {exc}"
    kernels = []
    for sk in w.static_kernels():
        kernels.append({"name": sk.name, "block": sk.block_size, "regs": sk.kernel.num_regs,
                        "shared": sk.kernel.shared_size_bytes,
                        "local": sk.kernel.local_size_bytes})
    case["static_kernels"] = kernels
    tools: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("gpuws auto", lambda: bench_gpuws(w, mode="auto", target_ci=args.target_ci,
                                           max_seconds=args.max_seconds, peaks=peaks)),
        ("gpuws hot", lambda: bench_gpuws(w, mode="hot", target_ci=args.target_ci,
                                          max_seconds=args.max_seconds, peaks=peaks)),
    ]
    if not args.gpuws_only:
        tools += [("triton do_bench", lambda: bench_do_bench(w)),
                  ("cupyx benchmark", lambda: bench_cupyx(w, args.max_seconds))]
    for name, fn in tools:
        try:
            case["rows"].append(fn())
        except Exception as exc:
            case["rows"].append({"tool": name, "error": f"{type(exc).__name__}: {exc}"})
        print(_fmt_row(case["workload"], case["rows"][-1]), flush=True)
    return case


def _fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def _fmt_row(workload: str, row: dict[str, Any]) -> str:
    if "error" in row:
        return f"{workload[:44]:44} {row['tool']:16} ERROR {row['error']}"
    return (f"{workload[:44]:44} {row['tool']:16} {_fmt(row['median_ms'], '10.5f')} "
            f"{_fmt(row['iqr_rel'], '8.4f')} {_fmt(row['stdev_rel'], '8.4f')} "
            f"{_fmt(row['n'], '7.0f')} {_fmt(row['wall_s'], '7.2f')} "
            f"{_fmt(row.get('gbps'), '8.0f')} {_fmt(row.get('tflops'), '7.1f')} "
            f"{row.get('stop_reason', '')}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where to write the JSON results")
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                        help="comma-separated workload strings, or 'all' for every builtin "
                             "with its defaults (note: commas inside are not allowed)")
    parser.add_argument("--target-ci", type=float, default=0.01)
    parser.add_argument("--max-seconds", type=float, default=10.0)
    parser.add_argument("--gpuws-only", action="store_true", help="skip triton and cupyx")
    args = parser.parse_args(argv)
    texts = ([f"builtin:{name}" for name in BUILTINS] if args.workloads == "all"
             else [t for t in args.workloads.split(",") if t])
    peaks = measure_peaks()
    print(json.dumps(peaks, indent=1), flush=True)
    header = (f"{'workload':44} {'tool':16} {'median_ms':>10} {'iqr/med':>8} {'sd/med':>8} "
              f"{'n':>7} {'wall_s':>7} {'GB/s':>8} {'TFLOP/s':>7} stop")
    print(header, flush=True)
    cases = []
    for text in texts:
        try:
            cases.append(run_case(text, args, peaks))
        except Exception as exc:
            cases.append({"workload": text, "error": f"{type(exc).__name__}: {exc}"})
            print(f"{text}: ERROR {type(exc).__name__}: {exc}", flush=True)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump({"peaks": peaks, "cases": cases}, fh, indent=1)
    print("\n" + header)
    for case in cases:
        for row in case.get("rows", []):
            print(_fmt_row(case["workload"], row))
        print(f"{case['workload'][:44]:44} check rel error: {case.get('check_rel_error')} "
              f"{case.get('check_error', case.get('error', ''))} kernels: "
              f"{case.get('static_kernels', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
