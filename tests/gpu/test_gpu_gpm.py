"""NVML GPM and Tier 3's estimate on a real GPU (issue 21, points 3 and 5).

(a) Does GPM answer for this user? ``gpm.probe`` on GPU 0 (support, then one real sample),
    with the host's ``RmProfilingAdminOnly`` and the user beside it. On a Hopper-or-newer
    GPU outside MIG it must answer; elsewhere the reason is recorded and (b) is skipped
    with it.
(b) GPM beside ncu for the same kernels: a device-to-device streaming loop (``b = 2·a`` on
    1 GiB float32 tensors: one elementwise kernel, so ncu sees what GPM saw; a cudaMemcpy
    is a copy-engine transfer ncu does not profile) and a bf16 GEMM loop (8192³, cuBLAS),
    each ~2 s back to back between two GPM samples taken by ``gpm.GpmWindow`` in this
    process; then ncu on one launch of each kernel with
    ``gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed`` (what the reader maps to
    ``dram_throughput_pct``; ``dram__throughput`` is its older name) and
    ``sm__pipe_tensor_cycles_active`` / ``sm__pipe_tensor_op_hmma_cycles_active``
    ``.avg.pct_of_peak_sustained_elapsed`` (names from the H200 fixture
    tests/fixtures/ncu-2025.3.1-h200/gemm_raw.csv). One agreement table is printed. GPM is
    device-wide over the window (the loop's gaps count), ncu is one launch: they should be
    close for back-to-back loops, not equal. Expect DRAM high on the copy, tensor high on
    the GEMM.
(c) The estimate against the measured Tier 3, for three workloads through ``gpuws run
    local`` (builtin:saxpy, builtin:gemm bf16, a CuPy ``cmd:``): estimate, measured, error
    %; and the Tier-1 (or Tier-0) GPM those runs carried.

Figures go through tests/faults/figures.py ``record`` (``FIGURES gpm_…`` lines) and to
``$GPUWS_GPU_OUT/gpm.json``. About 60 s of GPU time. Skipped without a GPU.
Run alone: ``GPU_TESTS=gpm:150 bash tests/gpu/run_gpu_check.sh``.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from faults.figures import record  # type: ignore[import-not-found]
from gpuws.cli import main
from gpuws.remote_agent.pod import gpm, gpuinfo

pytestmark = pytest.mark.gpu
if shutil.which("nvidia-smi") is None:
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)

OUT = Path(os.environ["GPUWS_GPU_OUT"]) if os.environ.get("GPUWS_GPU_OUT") else None
FIGURES: dict[str, Any] = {}
NCU = shutil.which("ncu") or "/opt/nvidia/nsight-compute/2025.3.1/ncu"
METRICS = ("gpu__time_duration.sum",
           "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
           "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
           "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
           "sm__throughput.avg.pct_of_peak_sustained_elapsed")
#: The kernels of each loop, as ncu's demangled names show them.
REGEX = {"copy": "vectorized_elementwise|unrolled_elementwise",  # not torch.rand's kernel
         "gemm": "nvjet|gemm|sm90|xmma|cutlass"}
LOOP_S = 2.0

#: The child: sets up, warms up, then either loops ~LOOP_S s between "start" and "end"
#: lines (for GPM) or launches the kernel 5 times (for ncu: skip 3, profile 1).
CHILD = r"""
import sys, time, torch
mode, how, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
if mode == "copy":
    a = torch.rand(1 << 28, device="cuda")
    b = torch.empty_like(a)
    step = lambda: torch.mul(a, 2.0, out=b)
else:
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    z = torch.empty_like(x)
    step = lambda: torch.matmul(x, y, out=z)
for _ in range(3):
    step()
torch.cuda.synchronize()
if how == "ncu":
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    sys.exit(0)
print("start", flush=True)
t0 = time.monotonic()
n = 0
while time.monotonic() - t0 < seconds:
    for _ in range(20):
        step()
    n += 20
    torch.cuda.synchronize()
print("end %d %.3f" % (n, time.monotonic() - t0), flush=True)
"""


def torch_python() -> str | None:
    """An interpreter with torch (the GPU machine's, or this one)."""
    for python in (os.environ.get("GPUWS_EXPECT_PYTHON"), "/opt/torch/.venv/bin/python3",
                   sys.executable, shutil.which("python3")):
        if python and os.path.exists(python) and subprocess.run(
                [python, "-c", "import torch; assert torch.cuda.is_available()"],
                capture_output=True, timeout=120).returncode == 0:
            return python
    return None


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Any:
    yield tmp_path_factory.mktemp("gpuws-home")
    if OUT:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "gpm.json").write_text(json.dumps(FIGURES, indent=2, default=str))
    print("\ngpm figures:", json.dumps(FIGURES, indent=1, default=str))


@pytest.fixture(autouse=True)
def _shared_home(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWS_HOME", str(home))
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture(scope="module")
def nvml() -> gpuinfo.Nvml:
    session = gpuinfo.nvml_session()
    if session is None:
        FIGURES["gpm_probe"] = {"answered": False, "reason": gpuinfo.nvml_error()}
        pytest.skip(f"NVML cannot be opened here: {gpuinfo.nvml_error()}")
    return session


def _admin_only() -> str:
    try:
        for line in Path("/proc/driver/nvidia/params").read_text().splitlines():
            if line.startswith("RmProfilingAdminOnly"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def test_gpm_answers_for_this_user(nvml: gpuinfo.Nvml) -> None:
    gpu = nvml.gpu(0)
    ok, why = gpm.probe(nvml, 0)
    FIGURES["gpm_probe"] = {"gpu": gpu["name"], "cc": gpu["compute_capability"],
                            "answered": ok, "reason": why, "uid": os.geteuid(),
                            "RmProfilingAdminOnly": _admin_only(),
                            "probe_fields": (gpu.get("gpm_supported"), gpu.get("gpm_reason"))}
    record("gpm_probe", gpu=str(gpu["name"]).replace(" ", "_"), answered=int(ok),
           admin_only=_admin_only(), uid=os.geteuid(), reason=repr(why))
    assert gpu.get("gpm_supported") == ok  # the probe event says what gpm.probe found
    major = int(str(gpu["compute_capability"] or "0").split(".")[0])
    if major < 9 or "MIG" in why:
        pytest.skip(f"GPM is not expected here ({gpu['compute_capability']}): {why}")
    assert ok, why


def _gpm_loop(python: str, mode: str) -> dict[str, Any]:
    """GPM over the child's loop: the window opens at its "start" line, closes at "end"."""
    window = gpm.window_for(0)
    # NVML numbers GPUs in PCI order; so does CUDA with this, so both mean the same GPU 0.
    env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    child = subprocess.Popen([python, "-c", CHILD, mode, "gpm", str(LOOP_S)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None
    tail = ""
    for line in child.stdout:
        if line.startswith("start"):
            window.open()
        elif line.startswith("end"):
            window.close()
            tail = line.strip()
    child.wait(timeout=120)
    assert child.returncode == 0, child.stderr.read() if child.stderr else ""
    return dict(window.close(), loop=tail)  # closed at "end"; the same result again


def _ncu(python: str, mode: str) -> dict[str, Any]:
    """ncu's figures for one launch of the loop's kernel, or why there are none."""
    if not os.path.exists(NCU):
        return {"error": f"no ncu at {NCU}"}
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "ncu.csv")
        argv = [NCU, "--target-processes", "all", "--kernel-name-base", "demangled",
                "-k", "regex:" + REGEX[mode], "--launch-skip", "3", "--launch-count", "1",
                "--metrics", ",".join(METRICS), "--csv", "--page", "raw", "--log-file", log,
                python, "-c", CHILD, mode, "ncu", "0"]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                             env=dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID"))
        text = Path(log).read_text(errors="replace") if os.path.exists(log) else ""
    if "ERR_NVGPUCTRPERM" in text + res.stdout + res.stderr:
        return {"error": "ncu: ERR_NVGPUCTRPERM (counters blocked for this user)"}
    rows = list(csv.reader(ln for ln in text.splitlines() if ln and not ln.startswith("==")))
    if len(rows) < 3:
        return {"error": f"ncu gave no rows (exit {res.returncode}): "
                         f"{(res.stderr or text)[-300:]}"}
    header, data = rows[0], rows[-1]  # rows[1] holds the units

    def value(name: str) -> float | None:
        try:
            return float(data[header.index(name)].replace(",", ""))
        except (ValueError, IndexError):
            return None

    return {"kernel": data[header.index("Kernel Name")][:120] if "Kernel Name" in header
            else "?", **{m: value(m) for m in METRICS}}


def test_gpm_beside_ncu_on_a_copy_and_a_bf16_gemm(nvml: gpuinfo.Nvml) -> None:
    ok, why = gpm.probe(nvml, 0)
    if not ok:
        pytest.skip(f"GPM does not answer here: {why}")
    python = torch_python()
    if python is None:
        pytest.skip("no interpreter with torch and CUDA here")
    rows = []
    for mode in ("copy", "gemm"):
        g = _gpm_loop(python, mode)
        n = _ncu(python, mode)
        FIGURES[f"gpm_{mode}"] = {"gpm": g, "ncu": n}
        rows.append((mode, g, n))
        record(f"gpm_vs_ncu_{mode}", gpm_window_s=g.get("window_s"),
               gpm_sm_active=g.get("sm_active_pct"), gpm_dram=g.get("dram_bw_pct"),
               gpm_tensor=g.get("tensor_active_pct"), gpm_hmma=g.get("hmma_active_pct"),
               ncu_dram=n.get(METRICS[1]), ncu_tensor=n.get(METRICS[2]),
               ncu_hmma=n.get(METRICS[3]), ncu_sm=n.get(METRICS[4]),
               ncu_error=repr(n.get("error", "")))

    def pct(v: Any) -> str:
        return "—" if v is None else f"{v:5.1f}%"

    print("\nGPM (device-wide, ~2 s loop) beside ncu (one launch), same kernels:")
    print(f"{'loop':6} | {'GPM DRAM':>9} | {'ncu DRAM':>9} | {'GPM tensor':>10} | "
          f"{'ncu tensor':>10} | {'GPM HMMA':>9} | {'ncu HMMA':>9} | {'GPM SM':>7} | ncu")
    for mode, g, n in rows:
        print(f"{mode:6} | {pct(g.get('dram_bw_pct')):>9} | {pct(n.get(METRICS[1])):>9} | "
              f"{pct(g.get('tensor_active_pct')):>10} | {pct(n.get(METRICS[2])):>10} | "
              f"{pct(g.get('hmma_active_pct')):>9} | {pct(n.get(METRICS[3])):>9} | "
              f"{pct(g.get('sm_active_pct')):>7} | {n.get('error') or n.get('kernel')}")
    copy, gemm = rows[0][1], rows[1][1]
    assert copy.get("window_s") and gemm.get("window_s"), (copy, gemm)
    assert (copy.get("dram_bw_pct") or 0) > 50, copy  # a streaming loop: DRAM-bound
    assert (gemm.get("tensor_active_pct") or 0) > 50, gemm  # a bf16 GEMM: tensor-bound
    assert (copy.get("tensor_active_pct") or 0) < 5, copy


WORKLOADS = (
    ("saxpy", ["-w", "builtin:saxpy"]),
    ("gemm bf16", ["-w", "builtin:gemm?dtype=bf16"]),
    ("cmd: cupy", ["-w", "cmd:python3 -c \"import cupy; x = cupy.arange(1 << 22, "
                         "dtype=cupy.float32); [cupy.sqrt(x) for _ in range(5)]; "
                         "cupy.cuda.runtime.deviceSynchronize(); print('cmd-done')\"",
                   "--tiers", "2,3"]),
)


def test_tier3_estimate_against_measured_and_the_runs_gpm(
        capsys: pytest.CaptureFixture[str]) -> None:
    rows = []
    for name, args in WORKLOADS:
        t0 = time.monotonic()
        code = main(["run", "local", *args, "--json", "--no-pull", "--rate", "3.5"])
        events = [json.loads(x) for x in capsys.readouterr().out.splitlines()
                  if x.startswith("{")]
        wall = time.monotonic() - t0
        assert code == 0, [e for e in events if e["type"] in ("diagnosis", "run_finished")]
        est = next((e["estimate"] for e in events if e["type"] == "tier_started"
                    and e["tier"] == 3 and e.get("estimate")), None)
        fin3 = next(e for e in events if e["type"] == "tier_finished" and e["tier"] == 3)
        window = next((e.get("gpm") for e in events if e["type"] == "tier_finished"
                       and e["tier"] in (0, 1) and e.get("gpm") is not None), None)
        assert est is not None, "Tier 3 started without an estimate"
        error = (est["seconds"] - fin3["wall_s"]) / fin3["wall_s"] * 100
        rows.append((name, est, fin3["wall_s"], error, window))
        FIGURES[f"estimate_{name}"] = {"estimate": est, "measured_s": fin3["wall_s"],
                                       "error_pct": error, "gpm": window, "run_wall_s": wall}
        record(f"tier3_estimate_{name.replace(' ', '_').replace(':', '')}",
               estimate_s=round(est["seconds"], 2), measured_s=round(fin3["wall_s"], 2),
               error_pct=round(error, 1), passes=est["passes"], launches=est["launches"],
               start_s=round(est["start_s"], 2),
               gpm_dram=(window or {}).get("dram_bw_pct"),
               gpm_timed_share=(window or {}).get("timed_share_pct"),
               gpm_tensor=(window or {}).get("tensor_active_pct"),
               gpm_reason=repr((window or {}).get("reason", "")))
    print("\nTier 3: estimated before ncu started vs measured")
    print(f"{'workload':10} | {'estimate':>9} | {'measured':>9} | {'error':>7} | GPM of the run")
    for name, est, measured, error, window in rows:
        g = window or {}
        said = (f"DRAM {g.get('dram_bw_pct')}, tensor {g.get('tensor_active_pct')}, SM "
                f"{g.get('sm_active_pct')} over {g.get('window_s')} s"
                if g.get("window_s") else g.get("reason", "not sampled"))
        print(f"{name:10} | {est['seconds']:8.2f}s | {measured:8.2f}s | {error:+6.0f}% | {said}")
    for name, _est, _m, _e, window in rows:
        assert window is not None, f"{name}: no GPM (nor a reason) on Tier 1/Tier 0"
