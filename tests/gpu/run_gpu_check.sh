#!/usr/bin/env bash
# The whole GPU check in one call: install carried wheels, show the machine, run the GPU
# end-to-end tests (real SSH server on loopback), the timing and Tier-3 benchmarks, and
# print a short table last. Logs and figures go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpuws-gpu-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >/dev/null 2>&1 || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests:$PWD/tests/gpu PYTHONUNBUFFERED=1
export GPUWS_GPU_OUT=$OUT PATH=$PATH:/opt/nvidia/nsight-compute/2025.3.1
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  ncu --version | tail -1; python3 -V; python3 -c 'import cupy, torch; print("cupy", cupy.__version__, "torch", torch.__version__)'
} 2>&1 | tee "$OUT/machine.txt"
timeout 330 python3 -m pytest -p no:cacheprovider tests/gpu -q -s -o addopts="" \
  --timeout 300 2>&1 | tail -60 | tee "$OUT/gpu_e2e.log"
timeout 150 python3 bench/timing.py --out "$OUT/timing.json" --max-seconds 4 2>&1 | tail -15 \
  | tee "$OUT/bench.log"
timeout 100 python3 bench/tier3.py --out "$OUT/tier3.json" 2>&1 | tail -8 | tee -a "$OUT/bench.log"
python3 - <<'PY'
import json, os
out = os.environ["GPUWS_GPU_OUT"]
try:
    f = json.load(open(f"{out}/figures.json"))
    s = f["saxpy"]; t = s["tier1"]; st = t["stats"]
    print(f"saxpy tier1 median {st['median_ms']*1e3:.1f} us (n={st['n']}, CI ±{st['ci_rel_halfwidth']*100:.2f}%)"
          f" | ncu {s['ncu_duration_ns']/1e3:.1f} us | diff {abs(st['median_ms']*1e6-s['ncu_duration_ns'])/s['ncu_duration_ns']*100:.2f}%")
    print(f"saxpy {t['gbps']:.0f} GB/s = {t['pct_peak_bw']:.1f}% of measured copy {t['peak_gbps']:.0f} GB/s; DRAM {s['metrics']['dram_throughput_pct']:.1f}%")
    m = f["matmul"]
    print("matmul n=2048 naive {:.3f} ms tiled {:.3f} ms".format(m["naive_matmul"]["median_ms"], m["tiled_matmul"]["median_ms"]))
except Exception as e:
    print("no figures:", e)
PY
