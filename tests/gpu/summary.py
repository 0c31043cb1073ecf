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
    gap = load(out / "gap.json")
    # ncu's duration of each kernel: the median of 15 launches (bench/tier1_vs_ncu.py,
    # cache control all) where measured, else Tier 3's single launch (bench/tier3.py).
    ncu_ns = {r["workload"]: r["default"]["duration_ns"] for r in tier3 or []}
    for case in gap or []:
        ncu_all = next((n for n in case["ncu"] if n["cache_control"] == "all"), None)
        if ncu_all and ncu_all["median_us"]:
            ncu_ns[case["workload"]] = ncu_all["median_us"] * 1e3
    if fig and "saxpy" in fig:
        s = fig["saxpy"]
        t = s["tier1"]
        st = t["stats"]
        diff = abs(st["median_ms"] * 1e6 - s["ncu_duration_ns"]) / s["ncu_duration_ns"] * 100
        print(f"e2e saxpy: tier1 {t.get('mode')} {st['median_ms'] * 1e3:.1f} us (n={st['n']}, CI "
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
                if "error" in r:
                    print(f"{wl[:45]:46}{r['tool']:17} ERROR {r['error'][:60]}")
                    continue
                ref = ncu_ns.get(wl)
                vs = f"{(r['median_ms'] * 1e6 / ref - 1) * 100:+.1f}%" if ref else "-"
                print(f"{wl[:45]:46}{r['tool']:17}{r['median_ms']:>11.5f}{r['iqr_rel']:>9.4f}"
                      f"{r['wall_s']:>8.2f}{vs:>8}")
            if ncu_ns.get(wl):
                print(f"{wl[:45]:46}{'ncu duration':17}{ncu_ns[wl] / 1e6:>11.5f}")
    for case in gap or []:
        modes = " ".join(f"{k}={v['median_us']:.1f}" for k, v in case["modes"].items())
        ncu = " ".join(f"ncu[{n['cache_control']}]={n['median_us']}" for n in case["ncu"])
        print(f"gap {case['workload'][:40]:41} {modes} {ncu}")
    for r in tier3 or []:
        d, f, o = r["default"], r["full"], r.get("one_pass", {})
        print(f"tier3 {r['workload'][:40]:41} 1-pass {o.get('wall_s', 0):.1f} s | default "
              f"{d['passes']} passes {d['wall_s']:.1f} s | full {f['passes']} passes "
              f"{f['wall_s']:.1f} s | {r['speedup_wall']:.2f}x wall, "
              f"{r.get('speedup_beyond_one_pass')} beyond 1 pass | FLOPs {d.get('flops')} "
              f"(declared {r.get('declared_flops')}) | "
              f"present {sorted(k for k, v in d['present'].items() if v)}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
