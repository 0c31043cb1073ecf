#!/usr/bin/env bash
# Records the program/kernel characters the verdict tests have no real recording of, on
# the GPU machine, as fixtures: each workload through `gpuws run local` with Tiers 2 and
# 3, its events as NDJSON (--json) and the export of its session.
#   decode     launch-bound (an LLM decode loop in miniature, batch 1, .item() per step)
#   gemm       GPU-bound, one dominant GEMM (bf16 8192^3 through cuBLAS)
#   saxpy      memory-bound kernel (the builtin; DRAM-bound with counters)
#   tiny_grid  a kernel with 8 blocks of 256 threads (too small a grid for 132 SMs)
# (Passes with counters blocked: tests/gpu/test_gpu_verdicts.py, which sets
# GPUWS_COUNTERS=blocked for the agent and saves its streams the same way.)
# Output: $OUT/verdict/<name>.ndjson, <name>.md, <name>.log. Usage (from the repo root):
#   bash tests/gpu/record_verdict_characters.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpuws-gpu-out}; mkdir -p "$OUT/verdict"
export PYTHONPATH=${PYTHONPATH:-/tmp/site:$PWD/src} PYTHONUNBUFFERED=1
export GPUWS_HOME=$OUT/verdict/home PATH=$PATH:/opt/nvidia/nsight-compute/2025.3.1
W=$PWD/bench/workloads/verdict
# A command, not a shell function: `timeout` runs commands.
GPUWS=(python3 -c 'import sys; from gpuws.cli import main; sys.argv[0] = "gpuws"; sys.exit(main())')
gpuws() { "${GPUWS[@]}" "$@"; }
record() {  # name, then gpuws run arguments
  local name=$1; shift
  timeout 600 "${GPUWS[@]}" run local --tiers 2,3 --json "$@" \
    > "$OUT/verdict/$name.ndjson" 2> "$OUT/verdict/$name.log"
  echo "$name: rc=$? $(grep -c . "$OUT/verdict/$name.ndjson") events;" \
       "$(grep -o '"summary":"[^"]*"' "$OUT/verdict/$name.ndjson" | head -1)" \
       "$(grep -o '"sentence":"[^"]*"' "$OUT/verdict/$name.ndjson" | head -1)"
}
record decode -w "cmd:python3 $W/decode.py"
record gemm -w "cmd:python3 $W/gemm.py" --kernel-regex 'nvjet|gemm|sm90'
record saxpy -w builtin:saxpy
record tiny_grid -w "cmd:python3 $W/tiny_grid.py" --kernel-regex tiny_sum --launch-skip 10
gpuws sessions --json > "$OUT/verdict/sessions.json" 2>&1
for sid in $(python3 -c 'import json, sys; [print(s["id"]) for s in json.load(open(sys.argv[1]))]' \
             "$OUT/verdict/sessions.json"); do
  gpuws export "$sid" > "$OUT/verdict/export-$sid.md" 2>&1
done
