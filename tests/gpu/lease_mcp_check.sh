#!/usr/bin/env bash
# Issues 31, 32 and 37 on the GPU machine (docs/gpu-validation.md run 19; carry .whl, with the
# mcp wheels, and .carry with sshd.tar.xz): the pod's lease through the carried OpenSSH sshd,
# the second GPU through every tier, an MCP client's agent loop on a Triton kernel, and the
# GPU path end to end. Each part with its own time limit; a short table last; logs packed
# under $OUT. PARTS picks the parts (default "lease two_gpus mcp"); E2E_S=SECONDS adds
# test_gpu_e2e, EXTRA="tests/gpu/…" any other GPU test files.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-lease-mcp}; mkdir -p "$OUT/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >/dev/null 2>&1 || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests:$PWD/tests/gpu PYTHONUNBUFFERED=1
unset PYTHONDONTWRITEBYTECODE
export GPUWS_GPU_OUT=$OUT/logs PATH=$PATH:/opt/nvidia/nsight-compute/2025.3.1
tar -C .carry -xJf .carry/sshd.tar.xz && export GPUWS_CARRIED_SSHD=$PWD/.carry/sshd GPUWS_REQUIRE_SSHD=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -V
  git log --oneline -1 2>/dev/null; } 2>&1 | tee "$OUT/logs/machine.log"
declare -A R
t() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout $((limit + 10)) python3 -m pytest -p no:cacheprovider -q -rs \
    -o addopts="--import-mode=importlib" --timeout "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
  R[$name]="rc=$? $((SECONDS - t0))s $(tail -1 "$OUT/logs/$name.log")"; echo "$name: ${R[$name]}"; }
PARTS=${PARTS:-lease two_gpus mcp}
[[ " $PARTS " == *" lease "* ]] && t lease ${LEASE_S:-420} tests/lease
[[ " $PARTS " == *" two_gpus "* ]] && t two_gpus 120 -s -W ignore::RuntimeWarning tests/gpu/test_gpu_two_gpus.py
if [[ " $PARTS " == *" mcp "* ]]; then
  t0=$SECONDS
  timeout ${MCP_S:-200} python3 tests/gpu/mcp_agent_loop.py --out "$OUT/logs/mcp" > "$OUT/logs/mcp.log" 2>&1
  R[mcp]="rc=$? $((SECONDS - t0))s"; echo "mcp: ${R[mcp]}"; tail -15 "$OUT/logs/mcp.log"
fi
[ -n "${E2E_S:-}" ] && t e2e "$E2E_S" -s -W ignore::RuntimeWarning tests/gpu/test_gpu_e2e.py
[ -n "${EXTRA:-}" ] && t extra ${EXTRA_S:-150} -s -W ignore::RuntimeWarning $EXTRA
cat "$OUT/logs/mcp/figures.md" 2>/dev/null | head -30
tar -czf "$OUT/lease_mcp.tar.gz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "== summary"; for k in "${!R[@]}"; do echo "$k ${R[$k]}"; done
