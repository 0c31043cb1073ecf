#!/usr/bin/env bash
# The whole GPU check in one call: install carried wheels, show the machine, run the GPU
# end-to-end tests (real SSH server on loopback), the timing and Tier-3 benchmarks, and
# print a short table last. Logs and figures go to $OUT (8 files at most come back).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpuws-gpu-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >/dev/null 2>&1 || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests:$PWD/tests/gpu PYTHONUNBUFFERED=1
export GPUWS_GPU_OUT=$OUT PATH=$PATH:/opt/nvidia/nsight-compute/2025.3.1
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  ncu --version | tail -1; python3 -V
  python3 -c 'import cupy, torch, triton; print("cupy", cupy.__version__, "torch", torch.__version__, "triton", triton.__version__)'
} 2>&1 | tee "$OUT/bench.log"
timeout 300 python3 -m pytest -p no:cacheprovider tests/gpu -q -s -o addopts="" \
  -W ignore::RuntimeWarning --timeout 280 2>&1 | tail -40 | tee "$OUT/gpu_e2e.log"
timeout 150 python3 bench/timing.py --out "$OUT/timing.json" --max-seconds 4 2>&1 \
  | tee -a "$OUT/bench.log" | tail -3
timeout 120 python3 bench/tier1_vs_ncu.py --out "$OUT/gap.json" 2>&1 | tee -a "$OUT/bench.log" \
  | grep -v Warning
timeout 200 python3 bench/tier3.py --out "$OUT/tier3.json" 2>&1 | tee -a "$OUT/bench.log" | tail -8
python3 tests/gpu/summary.py "$OUT"
# At most 8 files come back from the device: keep the e2e run's recording in one archive.
tar -czf "$OUT/saxpy_run.tar.gz" -C "$OUT" saxpy_events.ndjson saxpy_session.md saxpy.ncu-rep \
  2>/dev/null && rm -f "$OUT"/saxpy_events.ndjson "$OUT"/saxpy_session.md "$OUT"/saxpy.ncu-rep
