#!/usr/bin/env bash
# The whole GPU check: install the carried wheels, show the machine, then
#   tests  (default part): every test under tests/gpu, each file with its own time limit,
#          through a real OpenSSH sshd when one is carried (.carry/sshd, made here by
#          tests/gpu/make_carry.sh; root's python3 over it lacks torch and CuPy, so the
#          agent must find the torch interpreter by itself); last, with the real nsys
#          carried in .carry/nsys (tests/gpu/make_nsys_carry.sh) unpacked, test_gpu_nsys;
#   bench: bench/answer.py (time to an answer: each tier and the whole run beside the same
#          steps typed by hand) and bench/timing.py (Tier 1 beside do_bench);
# and print short tables last. Logs and figures go to $OUT; everything but the summary is
# packed into one archive (few files come back from the device).
# Usage: bash tests/gpu/run_gpu_check.sh [tests|bench|all]
set -uo pipefail
cd "$(dirname "$0")/../.."
PART=${1:-tests}
OUT=${OUT:-/tmp/gpuws-gpu-out}; mkdir -p "$OUT/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >/dev/null 2>&1 || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests:$PWD/tests/gpu PYTHONUNBUFFERED=1
# The device shell sets PYTHONDONTWRITEBYTECODE: every gpuws process (and the agent) would
# compile asyncssh and gpuws from source each start (0.76 s against 0.28 s for `import
# asyncssh` there), which no installed laptop or pod does.
unset PYTHONDONTWRITEBYTECODE
export GPUWS_GPU_OUT=$OUT/logs PATH=$PATH:/opt/nvidia/nsight-compute/2025.3.1
# The sshd folder travels packed (tar -C .carry -cJf .carry/sshd.tar.xz sshd): with the
# wheels and the nsys it must fit the 64 MiB a call carries.
[ ! -d .carry/sshd ] && [ -f .carry/sshd.tar.xz ] && tar -C .carry -xJf .carry/sshd.tar.xz
[ -d .carry/sshd ] && export GPUWS_CARRIED_SSHD=$PWD/.carry/sshd
# The GPU machine has no ssh client: the carried one (with the carried libraries, for it
# alone) serves the benches' by-hand path (scp + ssh), as a laptop's would.
if [ -x .carry/sshd/bin/ssh ]; then
  mkdir -p .carry/sshd/client
  C=$GPUWS_CARRIED_SSHD
  # (scp runs /usr/bin/ssh unless -S names another)
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib exec %s/bin/ssh "$@"\n' "$C" "$C" > .carry/sshd/client/ssh
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib exec %s/bin/scp -S %s/client/ssh "$@"\n' \
    "$C" "$C" "$C" > .carry/sshd/client/scp
  chmod 755 .carry/sshd/client/ssh .carry/sshd/client/scp
  export PATH=$PWD/.carry/sshd/client:$PATH
fi
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  ncu --version | tail -1; python3 -V; echo "carried sshd: ${GPUWS_CARRIED_SSHD:-none}"
  python3 -c 'import cupy, torch; print("cupy", cupy.__version__, "torch", torch.__version__)'
} 2>&1 | tee "$OUT/logs/machine.log"

declare -A RESULT
run_tests() {
  local name limit
  for spec in ${GPU_TESTS:-e2e:240 pinning:200 python:150 laptop_faces:120 fleet:120 gpm:150 verdicts:240 workspace:240 watch:300 nsys:300}; do
    name=${spec%%:*}; limit=${spec##*:}
    if [ "$name" = nsys ] && [ -f .carry/nsys/nsys-min.tar.xz ]; then
      # Last: the tests before it expect the machine as lent (no nsys, torch.profiler).
      mkdir -p /opt/nvidia/nsight-systems/2023.4.4
      tar -C /opt/nvidia/nsight-systems/2023.4.4 --strip-components=1 -xJf .carry/nsys/nsys-min.tar.xz
    fi
    local t0=$SECONDS
    timeout $((limit + 10)) python3 -m pytest -p no:cacheprovider "tests/gpu/test_gpu_$name.py" \
      -q -s -o addopts="" -W ignore::RuntimeWarning --timeout "$limit" \
      > "$OUT/logs/test_$name.log" 2>&1
    RESULT[$name]="rc=$? $((SECONDS - t0))s $(tail -1 "$OUT/logs/test_$name.log")"
    echo "tests/gpu/test_gpu_$name.py: ${RESULT[$name]}"
  done
}
run_bench() {
  timeout 420 python3 bench/answer.py --out "$OUT/logs/answer.json" --timeout 120 \
    --repeats "${ANSWER_REPEATS:-3}" \
    > "$OUT/logs/answer.log" 2>&1; echo "bench/answer.py rc=$?"
  tail -25 "$OUT/logs/answer.log"
  timeout 150 python3 bench/timing.py --out "$OUT/logs/timing.json" --max-seconds 4 \
    > "$OUT/logs/timing.log" 2>&1; echo "bench/timing.py rc=$?"
}
case $PART in
  tests) run_tests ;;
  bench) run_bench ;;
  all) run_tests; run_bench ;;
esac
python3 tests/gpu/summary.py "$OUT/logs" 2>&1 | tail -20
tar -czf "$OUT/gpu_check_$PART.tar.gz" -C "$OUT" logs && rm -rf "$OUT/logs"
echo "== summary ($PART)"
for name in "${!RESULT[@]}"; do echo "$name: ${RESULT[$name]}"; done
