"""The laptop's faces of issue 14 on a real GPU: ``--gpu``, every GPU, the clocks behind Tier 1.

Through the command line against the machine's own agent (``gpuws ... local``):

(a) ``gpuws doctor local --json`` lists every GPU nvidia-smi lists, each with its process
    list read (``processes`` not None) and its clocks; the table prints ``GPUs (N)``.
(b) ``gpuws run local --gpu 0 -w builtin:saxpy --tiers 1`` names the GPU on its first line
    and prints the clocks line under the Tier-1 table (``clocks: SM …``), with a caution
    exactly when :func:`gpuws.gpu.clocks.caution` gives one for the recorded clocks.
(c) ``--gpu N`` with N = the number of GPUs (one past the last) is refused in one line
    (exit 2) naming the pod's GPUs, before any run starts.
(d) ``gpuws compare`` of two such runs: the cycle-space ratio equals the time ratio times
    the ratio of their median SM clocks (both read from the real NVML samples).

Figures (the clocks lines, the cycle ratio) are printed and written to
``$GPUWS_GPU_OUT/laptop_faces.json`` when that is set. Skipped without a GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpuws.cli import main
from gpuws.gpu import clocks
from gpuws.sessions.store import Store

pytestmark = pytest.mark.gpu
if shutil.which("nvidia-smi") is None:
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)

OUT = Path(os.environ["GPUWS_GPU_OUT"]) if os.environ.get("GPUWS_GPU_OUT") else None
FIGURES: dict[str, Any] = {}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Any:
    yield tmp_path_factory.mktemp("gpuws-home")
    if OUT:
        (OUT / "laptop_faces.json").write_text(json.dumps(FIGURES, indent=2, default=str))
    print("laptop faces:", json.dumps(FIGURES, indent=1, default=str))


@pytest.fixture(autouse=True)
def _shared_home(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWS_HOME", str(home))
    monkeypatch.setenv("COLUMNS", "200")


def gpu_count() -> int:
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True)
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))


def test_doctor_lists_every_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "local", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["gpus"]) == gpu_count()
    for g in report["gpus"]:
        assert g["processes"] is not None, g  # who uses it was read (maybe nobody)
        assert g["sm_clock_max_mhz"], g
    FIGURES["doctor_gpus"] = [{k: g.get(k) for k in ("index", "name", "sm_clock_mhz",
                                                     "mem_clock_mhz", "power_w", "temp_c",
                                                     "clock_events", "processes")}
                              for g in report["gpus"]]
    assert main(["doctor", "local"]) == 0
    assert f"GPUs ({gpu_count()})" in capsys.readouterr().out


def _run(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    code = main(["run", "local", "-w", "builtin:saxpy", "--tiers", "1", "--max-seconds", "2",
                 *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_pinned_run_prints_its_gpu_and_clocks(capsys: pytest.CaptureFixture[str]) -> None:
    for label in ("a", "b"):
        code, out, err = _run(capsys, "--gpu", "0")
        assert code == 0, out + err
        first = out.splitlines()[0]
        assert "(GPU 0 (" in first, first
        line = next(ln.strip() for ln in out.splitlines() if ln.strip().startswith("clocks"))
        assert line.startswith("clocks: SM "), line
        caution = next((ln.strip() for ln in out.splitlines() if "! caution:" in ln), None)
        with Store() as store:
            run = store.runs(store.sessions()[0].id)[-1]
            t1 = store.tier1(run.run_id)
        assert t1 is not None and t1.clocks is not None
        assert (caution is not None) == (clocks.caution(t1.clocks) is not None)
        FIGURES[f"run_{label}"] = {"run_id": run.run_id, "clocks_line": line,
                                   "caution": caution, "median_ms": t1.stats.median_ms,
                                   "clocks": t1.clocks and {
                                       "sm_min": t1.clocks.sm_mhz_min,
                                       "sm_median": t1.clocks.sm_mhz_median,
                                       "sm_max": t1.clocks.sm_mhz_max,
                                       "events": t1.clocks.clock_events},
                                   "busy_warning": err.strip() or None}


def test_a_gpu_past_the_last_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    n = gpu_count()
    code, out, err = _run(capsys, "--gpu", str(n))
    assert code == 2, out + err
    (line,) = err.strip().splitlines()
    assert f"--gpu {n}: the pod has no such GPU" in line and "0 " in line
    FIGURES["refusal"] = line


def test_compare_gives_the_cycle_ratio_of_real_clocks(capsys: pytest.CaptureFixture[str]) -> None:
    a, b = FIGURES["run_a"]["run_id"], FIGURES["run_b"]["run_id"]
    assert main(["compare", a, b, "--json"]) == 0
    c = json.loads(capsys.readouterr().out)
    ratio = c["tier1"]["speedup"] * c["clocks_a"]["sm_mhz_median"] / c["clocks_b"]["sm_mhz_median"]
    assert c["cycle_ratio"] == pytest.approx(ratio)
    FIGURES["compare"] = {"speedup": c["tier1"]["speedup"], "cycle_ratio": c["cycle_ratio"],
                          "differences": c["differences"]}
