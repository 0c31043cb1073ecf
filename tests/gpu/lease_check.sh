#!/usr/bin/env bash
# Issue 22 on the GPU machine (docs/gpu-validation.md run 17; carry .whl and .carry with sshd.tar.xz): the agent's lease (and its cheap run check) through the
# carried OpenSSH sshd, then the GPU path end to end on the same agent. Short table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu22}; mkdir -p "$OUT/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >/dev/null 2>&1 || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests:$PWD/tests/gpu PYTHONUNBUFFERED=1
unset PYTHONDONTWRITEBYTECODE
export GPUWS_GPU_OUT=$OUT/logs PATH=$PATH:/opt/nvidia/nsight-compute/2025.3.1
tar -C .carry -xJf .carry/sshd.tar.xz && export GPUWS_CARRIED_SSHD=$PWD/.carry/sshd GPUWS_REQUIRE_SSHD=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -V; which python3; } 2>&1 | tee "$OUT/logs/machine.log"
declare -A R
t() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout $((limit + 10)) python3 -m pytest -p no:cacheprovider -q -o addopts="--import-mode=importlib" --timeout "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
  R[$name]="rc=$? $((SECONDS - t0))s $(tail -1 "$OUT/logs/$name.log")"; echo "$name: ${R[$name]}"; }
t lease 300 tests/lease
t tui_start 120 tests/tui/test_connect_start.py tests/tui/test_lease_on_dashboard.py
t e2e 220 -s -W ignore::RuntimeWarning tests/gpu/test_gpu_e2e.py
timeout 100 python3 bench/lease_cpu.py --seconds 30 --reps 1 > "$OUT/logs/lease_cpu.log" 2>&1; echo "lease_cpu rc=$?"
tail -12 "$OUT/logs/lease_cpu.log"
grep -h "Tier 1\|vs ncu\|passed\|failed" "$OUT/logs/e2e.log" | tail -6
tar -czf "$OUT/gpu22.tar.gz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "== summary"; for k in "${!R[@]}"; do echo "$k ${R[$k]}"; done
