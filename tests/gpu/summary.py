"""Print the GPU check's short tables from the JSON files run_gpu_check.sh left in OUT."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"(no {path.name}: {exc})")
        return None


def main(out: Path) -> None:
    fig = load(out / "figures.json")
    timing = load(out / "timing.json")
    tier3 = load(out / "tier3.json")
    ncu_ns = {r["workload"]: r["default"]["duration_ns"] for r in tier3 or []}
    if fig and "saxpy" in fig:
        s = fig["saxpy"]
        t = s["tier1"]
        st = t["stats"]
        diff = abs(st["median_ms"] * 1e6 - s["ncu_duration_ns"]) / s["ncu_duration_ns"] * 100
        print(f"e2e saxpy: tier1 {st['median_ms'] * 1e3:.1f} us (n={st['n']}, CI "
              f"±{st['ci_rel_halfwidth'] * 100:.2f}%) vs ncu {s['ncu_duration_ns'] / 1e3:.1f} us: "
              f"{diff:.2f}% | {t['gbps']:.0f} GB/s = {t['pct_peak_bw']:.1f}% of measured copy "
              f"{t['peak_gbps']:.0f} GB/s | DRAM {s['metrics']['dram_throughput_pct']:.1f}% | "
              f"AI {s['metrics'].get('arithmetic_intensity')}")
    if fig and "matmul" in fig:
        m = fig["matmul"]
        print(f"e2e matmul n=2048: naive {m['naive_matmul']['median_ms']:.3f} ms, tiled "
              f"{m['tiled_matmul']['median_ms']:.3f} ms")
    if timing:
        print(f"{'workload':46}{'tool':17}{'median ms':>11}{'IQR/med':>9}"
              f"{'wall s':>8}{'vs ncu':>8}")
        for case in timing["cases"]:
            wl = case["workload"]
            for r in case["rows"]:
                ref = ncu_ns.get(wl)
                vs = f"{(r['median_ms'] * 1e6 / ref - 1) * 100:+.1f}%" if ref else "-"
                print(f"{wl[:45]:46}{r['tool']:17}{r['median_ms']:>11.5f}{r['iqr_rel']:>9.4f}"
                      f"{r['wall_s']:>8.2f}{vs:>8}")
            if ncu_ns.get(wl):
                print(f"{wl[:45]:46}{'ncu duration':17}{ncu_ns[wl] / 1e6:>11.5f}")
    for r in tier3 or []:
        d, f = r["default"], r["full"]
        print(f"tier3 {r['workload'][:40]:41} default {d['passes']} passes {d['wall_s']:.1f} s"
              f" | full {f['passes']} passes {f['wall_s']:.1f} s | {r['speedup_wall']:.2f}x | "
              f"present {sorted(k for k, v in d['present'].items() if v)}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
