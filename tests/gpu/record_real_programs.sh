#!/usr/bin/env bash
# Issue 32's recordings, on the GPU machine (no gpuws needed): the names each tool gives
# the same kernels, torch.profiler traces with host activity and stacks of an HF generate
# and a two-rank torchrun step, and a ~5 µs kernel timed by CUDA events, CUPTI and ncu.
# Everything lands in $OUT/rec.tar.gz; a short table last.
set -uo pipefail
cd "$(dirname "$0")/programs"
OUT=${OUT:-/tmp/rec-out}; R=$OUT/rec; mkdir -p "$R"
export PATH=$PATH:/opt/nvidia/nsight-compute/2025.3.1 PYTHONUNBUFFERED=1 REC_DIR=$R
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=python3
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; ncu --version | tail -1
  $PY -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'; } > "$R/machine.txt" 2>&1
s() { local name=$1; shift; local t0=$SECONDS
  if [ $SECONDS -gt 470 ]; then echo "$name skipped (time)"; return; fi
  timeout 200 "$@" > "$R/$name.log" 2>&1; echo "$name rc=$? $((SECONDS-t0))s"; }
# In order of need, so a slow machine still brings back the most important ones.
# the HF generate: profile (host + stacks), ncu's names, and the failing regex of the report
# 2 layers and 8 new tokens: with host activity and Python stacks the full program's
# trace was 2.3 GB (8 layers, 24 tokens, the warm-up call and the counted one).
REC_TAG=hf s hf_torch $PY record_profile.py hf_generate.py --layers 2 --new-tokens 8
s hf_ncu_demangled ncu --metrics gpu__time_duration.sum --csv --print-kernel-base demangled -c 400 $PY hf_generate.py --layers 2 --new-tokens 4
s hf_ncu_miss ncu --kernel-name-base demangled -k 'regex:void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast' -c 1 $PY hf_generate.py --layers 2 --new-tokens 4
# every family: torch.profiler vs ncu's kernel bases
REC_TAG=families s fam_torch $PY record_profile.py families.py
s fam_ncu_demangled ncu --metrics gpu__time_duration.sum --csv --print-kernel-base demangled -c 120 $PY families.py
s fam_ncu_mangled ncu --metrics gpu__time_duration.sum --csv --print-kernel-base mangled -c 120 $PY families.py
# the 5 µs kernel
s short_timing $PY short_timing.py
s short_ncu ncu --metrics gpu__time_duration.sum --csv --kernel-name-base demangled -k regex:CUDAFunctor_add --cache-control all --clock-control none $PY short_ncu.py
# two ranks (one GPU here: gloo)
[ -n "${SKIP_DDP:-}" ] || REC_TAG=ddp s ddp_torch $PY -m torch.distributed.run --standalone --nproc-per-node 2 record_profile.py ddp_step.py --steps 40
s hf_ncu_mangled ncu --metrics gpu__time_duration.sum --csv --print-kernel-base mangled -c 400 $PY hf_generate.py --layers 2 --new-tokens 4
s fam_ncu_function ncu --metrics gpu__time_duration.sum --csv --print-kernel-base function -c 120 $PY families.py
s short_ncu_base ncu --metrics gpu__time_duration.sum --csv --kernel-name-base demangled -k regex:CUDAFunctor_add --cache-control all --clock-control base $PY short_ncu.py
ls -la "$R" > "$OUT/ls.txt"
echo "== short kernel"; tail -1 "$R/short_timing.log"; grep -c CUDAFunctor_add "$R/short_ncu.log"
for f in "$R"/*.trace.json; do gzip -9 "$f"; done
# Few files come back from the device: the big trace alone, the rest in one archive.
mv "$R"/hf-rank0.trace.json.gz "$OUT/" 2>/dev/null
tar -czf "$OUT/rec.tar.gz" -C "$OUT" rec && rm -rf "$R"

echo "== sizes"; du -sh "$OUT/rec.tar.gz"; cat "$OUT/ls.txt" | awk '{print $5, $9}'
