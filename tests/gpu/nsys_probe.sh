#!/usr/bin/env bash
# Does a real Nsight Systems trace the GPU machine's CUDA 13 processes? (issue 23)
# Unpacks the carried nsys (.carry/nsys/nsys-min.tar.xz, made from Debian's
# nsight-systems{,-target} 2023.4.4 by tests/gpu/make_nsys_carry.sh) where the agent looks
# (/opt/nvidia/nsight-systems/<ver>/bin/nsys), then profiles a CuPy and a torch program,
# runs nsys stats and export, and keeps every output as a fixture. Logs go to $OUT.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/nsys-probe}; L=$OUT/nsys; mkdir -p "$L"
PY=${PY:-/opt/torch/.venv/bin/python3}
ROOT=/opt/nvidia/nsight-systems/2023.4.4
mkdir -p "$ROOT" && tar -C "$ROOT" --strip-components=1 -xJf .carry/nsys/nsys-min.tar.xz
NSYS=$ROOT/bin/nsys
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$NSYS" --version; echo "version rc=$?"; } 2>&1 | tee "$L/version.txt"
"$NSYS" status -e > "$L/status.txt" 2>&1; echo "status rc=$?" >> "$L/status.txt"
IMP=$ROOT/host-linux-x64/QdstrmImporter
{ ldd "$IMP" | grep "not found"; "$IMP" --version; echo "importer rc=$?"; } 2>&1 | tee "$L/importer.txt"
cat > /tmp/nsys_cupy.py <<'PYEOF'
import cupy
x = cupy.arange(1 << 24, dtype=cupy.float32)
y = cupy.ones_like(x)
k = cupy.ElementwiseKernel("float32 a, float32 x, float32 y", "float32 z", "z = a * x + y", "saxpy")
for _ in range(50):
    z = k(2.0, x, y)
h = z.get()
cupy.cuda.runtime.deviceSynchronize()
print("cupy done", float(h[1]))
PYEOF
cat > /tmp/nsys_torch.py <<'PYEOF'
import torch
m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
x = torch.randn(64, 1024, device="cuda")
with torch.no_grad():
    for _ in range(20):
        y = m(x)
torch.cuda.synchronize()
print("torch done", y.shape)
PYEOF
for name in cupy torch; do
  t0=$(date +%s.%N)
  ( cd /tmp && timeout 240 "$NSYS" profile -t cuda --sample=none --cpuctxsw=none -f true \
      -o "/tmp/nsys_$name" "$PY" "/tmp/nsys_$name.py" ) > "$L/profile_$name.txt" 2>&1
  rc=$?; t1=$(date +%s.%N)
  echo "profile $name rc=$rc $(awk "BEGIN{print $t1 - $t0}") s; files: $(ls /tmp/nsys_$name.* 2>/dev/null | tr '\n' ' ')"
  if [ ! -f "/tmp/nsys_$name.nsys-rep" ] && [ -f "/tmp/nsys_$name.qdstrm" ]; then
    timeout 240 "$IMP" -i "/tmp/nsys_$name.qdstrm" > "$L/import_$name.txt" 2>&1
    echo "import $name rc=$? $(ls /tmp/nsys_$name.* | tr '\n' ' ')"
  fi
  if [ -f "/tmp/nsys_$name.nsys-rep" ]; then
    timeout 240 "$NSYS" stats -r cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_gpu_trace \
      -f csv -o "/tmp/stats_$name" "/tmp/nsys_$name.nsys-rep" > "$L/stats_$name.log" 2>&1
    echo "stats $name rc=$? $(ls /tmp/stats_$name* 2>/dev/null | tr '\n' ' ')"
    cp /tmp/stats_"$name"* "$L/" 2>/dev/null
    "$NSYS" stats -r gpukernsum -f csv "/tmp/nsys_$name.nsys-rep" > "$L/oldname_$name.csv" 2>&1
    echo "gpukernsum rc=$?"
    [ -f "/tmp/nsys_$name.sqlite" ] && "$PY" - "/tmp/nsys_$name.sqlite" > "$L/sqlite_$name.txt" 2>&1 <<'PYEOF'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
tables = [r[0] for r in c.execute("select name from sqlite_master where type='table' order by name")]
print("tables:", len(tables))
for t in tables:
    if t.startswith(("CUPTI", "StringIds", "TARGET_INFO", "META")):
        n = c.execute(f"select count(*) from {t}").fetchone()[0]
        cols = [r[1] for r in c.execute(f"pragma table_info({t})")]
        print(t, n, ",".join(cols))
PYEOF
  fi
done
ls -la /tmp/nsys_* > "$L/files.txt" 2>&1
cp /tmp/nsys_cupy.sqlite /tmp/nsys_torch.sqlite "$L/" 2>/dev/null
tar -czf "$OUT/nsys_probe.tar.gz" -C "$OUT" nsys && rm -rf "$L"
