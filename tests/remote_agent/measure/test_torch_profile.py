"""Tier 2 through torch.profiler: the injected sitecustomize, reading its results, the order.

torch is not installed here (and there is no GPU), so the end-to-end tests use a stand-in
``torch`` package that has the few calls the injected code makes: its
``key_averages().table()`` returns the real table captured on the H200
(tests/fixtures/ncu-2025.3.1-h200/torch_profiler_key_averages.txt) and its Chrome trace is
a small synthetic one, built here only for the interval arithmetic.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuws import protocol
from gpuws.remote_agent import wire
from gpuws.remote_agent.measure import tier2_parse as t2
from gpuws.remote_agent.measure import tiers
from gpuws.remote_agent.measure.torch_profile import (
    prepare,
    prepare_rank,
    ranks_seen,
    read_results,
)
from gpuws.remote_agent.worker import RunContext

FIXTURE = (Path(__file__).parents[2] / "fixtures" / "ncu-2025.3.1-h200"
           / "torch_profiler_key_averages.txt")


def synthetic_trace() -> dict[str, Any]:
    """Device 0: kernel A 0-100 us, memcpy 150-200 us, kernel B 200-300 us, A 300-400 us;
    device 1: kernel B 0-50 us. CPU events and flows are ignored."""
    def ev(cat: str, name: str, ts: float, dur: float, device: int) -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "pid": device, "tid": 7, "ts": ts,
                "dur": dur, "args": {"device": device, "stream": 7}}
    return {"traceEvents": [
        ev("kernel", "A", 1000.0, 100.0, 0), ev("gpu_memcpy", "Memcpy HtoD", 1150.0, 50.0, 0),
        ev("kernel", "B", 1200.0, 100.0, 0), ev("Kernel", "A", 1300.0, 100.0, 0),
        ev("kernel", "B", 5000.0, 50.0, 1),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 999.0, "dur": 2.0},
        {"ph": "f", "cat": "ac2g", "ts": 1000.0}, "garbage",
        {"ph": "X", "cat": "kernel", "name": "no times"},
    ], "baseTimeNanoseconds": 0}


def test_trace_intervals_give_kernels_idle_and_memcpy_share() -> None:
    got = t2.parse_torch_trace(synthetic_trace())
    rows = {r["name"]: (r["calls"], r["total_ns"]) for r in got["kernels"]}
    assert rows == {"A": (2, 200_000.0), "B": (2, 150_000.0)}
    # Spans: device 0 400 us, device 1 50 us. Busy: 100 + 50 + 100 + 100 + 50 = 400 us.
    assert got["span_ns"] == 450_000 and got["busy_ns"] == 400_000
    assert got["gpu_idle_pct"] == pytest.approx(100 * 50 / 450)
    assert got["memcpy_pct"] == pytest.approx(100 * 50 / 450)
    assert got["gap_count"] == 1 and got["largest_gap_ns"] == 50_000
    with pytest.raises(t2.Tier2ParseError):
        t2.parse_torch_trace({"not": "a trace"})


def test_read_results_prefers_full_names_and_skips_what_is_broken(tmp_path: Path) -> None:
    (tmp_path / "torch-keyavg-11.txt").write_text(FIXTURE.read_text())
    only_table = read_results(str(tmp_path))
    assert [r["name"] for r in only_table["kernels"]] == [
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wg..."]
    assert only_table["kernels"][0]["calls"] == 5 and only_table["gpu_idle_pct"] is None
    # The fixture's table cut the kernel's name: the trace's full names win.
    (tmp_path / "torch-trace-11.json").write_text(json.dumps(synthetic_trace()))
    (tmp_path / "torch-trace-12.json").write_text("{broken")
    os.mkfifo(tmp_path / "torch-trace-13.json")  # a workload's trap: skipped, not opened
    (tmp_path / "torch-inject-14.err").write_text("torch.profiler did not start: boom\n")
    got = read_results(str(tmp_path))
    assert [r["name"] for r in got["kernels"]] == ["A", "B"]
    assert got["kernels"][0]["share_pct"] == pytest.approx(100 * 200 / 350)
    assert got["gpu_idle_pct"] == pytest.approx(100 * 50 / 450)
    assert got["processes"] == 2
    problems = " | ".join(got["problems"])
    assert "torch-trace-12.json" in problems and "torch-trace-13.json" in problems
    assert "did not start: boom" in problems
    table = protocol.KernelTable(source="torch.profiler (injected)",
                                 kernels=[protocol.KernelRow(**r) for r in got["kernels"]],
                                 gpu_idle_pct=got["gpu_idle_pct"],
                                 memcpy_pct=got["memcpy_pct"])
    assert table.kernels[0].name == "A"


FAKE_TORCH = '''
"""Stand-in torch (no torch here): just what gpuws's injected profiler calls."""
import json, os
LOG = os.environ.get("FAKE_TORCH_LOG")

class cuda:
    @staticmethod
    def is_initialized():
        return False
    @staticmethod
    def synchronize():
        pass
    class nvtx:
        @staticmethod
        def range_start(msg):
            with open(os.environ["FAKE_NVTX_LOG"], "a") as f:
                f.write("%s %s\\n" % (os.environ.get("RANK"), msg))
            return 1

if os.environ.get("FAKE_TORCH_LAZY"):
    # CUDA initialised lazily, as torch does: torch.cuda._lazy_init on first use.
    _state = []
    def _lazy_init():
        _state.append(1)
    cuda._lazy_init = staticmethod(_lazy_init)
    cuda.is_initialized = staticmethod(lambda: bool(_state))
'''

FAKE_PROFILER = '''
import json, os
LOG = os.environ.get("FAKE_TORCH_LOG")
FIXTURE = os.environ["FAKE_TORCH_TABLE"]
TRACE = json.loads(os.environ["FAKE_TORCH_TRACE"])

class ProfilerActivity:
    CPU, CUDA = "cpu", "cuda"

class _Avg:
    def table(self, row_limit=-1, max_name_column_width=None):
        with open(FIXTURE) as f:
            return f.read()

class profile:
    def __init__(self, activities, with_stack=False, record_shapes=False):
        # Host activity and Python stacks: the evidence for host time and kernel code.
        assert activities == [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        assert with_stack == (os.environ.get("GPUWS_TORCH_STACK", "1") != "0")
        assert not record_shapes
        self.running = False
    def start(self):
        if LOG:
            with open(LOG, "a") as f:
                f.write("profiler started\\n")
        self.running = True
    def stop(self):
        assert self.running
        self.running = False
    def key_averages(self):
        return _Avg()
    def export_chrome_trace(self, path):
        with open(path, "w") as f:
            json.dump(TRACE, f)
'''


@pytest.fixture
def fake_torch(tmp_path: Path) -> dict[str, str]:
    pkg = tmp_path / "fake" / "torch"
    (pkg / "profiler").mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_TORCH)
    (pkg / "profiler" / "__init__.py").write_text(FAKE_PROFILER)
    shadowed = tmp_path / "shadowed"
    shadowed.mkdir()
    (shadowed / "sitecustomize.py").write_text(
        "import os\nopen(os.environ['CHAIN_MARK'], 'w').write('ran')\n")
    return {"PYTHONPATH": f"{tmp_path / 'fake'}{os.pathsep}{shadowed}",
            "FAKE_TORCH_TABLE": str(FIXTURE), "FAKE_TORCH_TRACE": json.dumps(synthetic_trace()),
            "CHAIN_MARK": str(tmp_path / "chained")}


def test_injected_sitecustomize_profiles_a_python_that_imports_torch(
        tmp_path: Path, fake_torch: dict[str, str]) -> None:
    env = {**os.environ, **fake_torch}
    out = prepare(str(tmp_path / "run"), env, inject=True)
    assert env["PYTHONPATH"].split(os.pathsep)[0].endswith("site")
    subprocess.run([sys.executable, "-c", "import torch; print('workload ran')"], env=env,
                   check=True, capture_output=True, timeout=60)
    names = sorted(os.listdir(out))
    assert names[0].startswith("torch-keyavg-") and names[1].startswith("torch-trace-")
    got = read_results(out)
    assert [r["name"] for r in got["kernels"]] == ["A", "B"] and got["processes"] == 1
    assert (tmp_path / "chained").read_text() == "ran"  # the shadowed one still ran


def test_the_profiler_starts_when_cuda_does_not_at_torch_s_import(
        tmp_path: Path, fake_torch: dict[str, str]) -> None:
    """A whole-program trace with Python stacks was 2.3 GB for an HF generate (the
    imports after torch's); nothing runs on the GPU before CUDA starts, so neither does
    the profiler. A process that never starts CUDA (torchrun's launcher) writes nothing."""
    log = tmp_path / "log"
    env = {**os.environ, **fake_torch, "FAKE_TORCH_LAZY": "1", "FAKE_TORCH_LOG": str(log)}
    out = prepare(str(tmp_path / "run"), env, inject=True)
    script = ("import torch\n"
              f"open({str(log)!r}, 'a').write('imported, building the model\\n')\n"
              "torch.cuda._lazy_init(); torch.cuda._lazy_init()\n"
              f"open({str(log)!r}, 'a').write('on the GPU\\n')\n")
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)
    assert log.read_text().splitlines() == [
        "imported, building the model", "profiler started", "on the GPU"]
    assert len(os.listdir(out)) == 2
    for name in os.listdir(out):
        os.unlink(os.path.join(out, name))
    subprocess.run([sys.executable, "-c", "import torch"], env=env, check=True, timeout=60)
    assert os.listdir(out) == []


def test_injection_costs_nothing_without_torch(tmp_path: Path,
                                               fake_torch: dict[str, str]) -> None:
    env = {**os.environ, **fake_torch}
    out = prepare(str(tmp_path / "run"), env, inject=True)
    res = subprocess.run([sys.executable, "-c", "import json; print('no torch here')"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout == "no torch here\n" and res.stderr == ""
    assert os.listdir(out) == []
    assert read_results(out)["processes"] == 0


def test_each_rank_s_profile_is_named_by_its_rank(tmp_path: Path,
                                                  fake_torch: dict[str, str]) -> None:
    env = {**os.environ, **fake_torch}
    out = prepare(str(tmp_path / "run"), env, inject=True)
    for rank in ("0", "1"):
        subprocess.run([sys.executable, "-c", "import torch"], env={**env, "RANK": rank},
                       check=True, capture_output=True, timeout=60)
    assert sorted(n.split("-r")[-1] for n in os.listdir(out)) == [
        "0.json", "0.txt", "1.json", "1.txt"]
    assert ranks_seen(out) == [0, 1]
    got = read_results(out)
    assert got["processes"] == 2 and [r["rank"] for r in got["ranks"]] == [0, 1]


def test_tier3_of_one_rank_marks_only_that_rank_s_process(tmp_path: Path,
                                                         fake_torch: dict[str, str]) -> None:
    env = {**os.environ, **fake_torch, "GPUWS_TORCH_TRACE_DIR": "/should/go",
           "FAKE_NVTX_LOG": str(tmp_path / "nvtx.log")}
    extra = prepare_rank(str(tmp_path / "run"), env, 1)
    # ncu profiles inside the start/end range only (no trailing "/": not push/pop).
    assert extra == ["--nvtx", "--nvtx-include", "gpuws_rank1"]
    assert "GPUWS_TORCH_TRACE_DIR" not in env  # marking, not profiling
    for rank in ("0", "1", "2"):
        subprocess.run([sys.executable, "-c", "import torch"], env={**env, "RANK": rank},
                       check=True, capture_output=True, timeout=60)
    assert (tmp_path / "nvtx.log").read_text() == "1 gpuws_rank1\n"
    assert not (tmp_path / "run" / "torchprof" / "out").exists() or not os.listdir(
        tmp_path / "run" / "torchprof" / "out")


class NoToolsPod:
    """A pod with a GPU but neither nsys nor a compatible ncu (the fallback order)."""

    has_gpu = True

    def __init__(self) -> None:
        self.counters: dict[str, Any] = {}
        self.facts: dict[str, Any] = {}

    def nsys(self, workload: str | None = None) -> None:
        return None

    def nsys_passed_over(self, workload: str | None = None) -> str | None:
        return None

    def select_ncu(self, exclude: list[str]) -> dict[str, Any]:
        return {"selected": None, "reason": "no ncu here"}


def test_tier2_order_for_a_python_command(tmp_path: Path, fake_torch: dict[str, str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWS_POD_CACHE", str(tmp_path / "cache"))
    run_id = "20250101-000000-aaaaaa"
    got: list[dict[str, Any]] = []
    ctx = RunContext(run_id, {"workload": "cmd:python3 x.py", "tiers": [2]}, got.append)
    os.makedirs(ctx.artifact_dir)
    ctx.env.update(fake_torch)
    target = [sys.executable, "-c", "import torch"]
    rows = tiers.tier2(ctx, NoToolsPod(), target, python=False, inject=True)  # type: ignore[arg-type]
    assert rows is not None and rows[0]["name"] == "A"
    started = [e for e in got if e["type"] == "tier_started"]
    assert started[0]["argv"] == target  # the workload's own argv, no wrapper
    table = next(e for e in got if e["type"] == "kernel_table")
    assert table["source"] == "torch.profiler (injected)"
    assert table["gpu_idle_pct"] == pytest.approx(100 * 50 / 450)
    fin = next(e for e in got if e["type"] == "tier_finished")
    assert fin["status"] == "fallback" and "nsys: not installed" in fin["reason"]
    for event in got:
        assert not isinstance(protocol.decode_event(wire.dumps(event)), protocol.BadLine)
    # A command that does not start Python goes straight on to ncu (none here).
    got.clear()
    assert tiers.tier2(ctx, NoToolsPod(), ["./bench"], python=False,  # type: ignore[arg-type]
                       inject=False) is None
    assert [e["type"] for e in got] == ["tier_started", "diagnosis", "tier_finished"]
    assert "torch" not in got[1]["cause"]


def _command_run(tmp_path: Path, fake_torch: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                 script: str) -> tuple[list[dict[str, Any]], Path]:
    """A whole ``cmd:`` run of ``python3 job.py`` asking for Tier 2 only, on a pod with a
    GPU but neither nsys nor ncu (fake torch: there is no GPU here). ``job.py`` appends a
    line to ``ran.txt`` each time it starts."""
    monkeypatch.setenv("GPUWS_POD_CACHE", str(tmp_path / "cache"))
    ctx = RunContext("20250101-000000-bbbbbb",
                     {"workload": f"cmd:{sys.executable} job.py", "tiers": [2]}, [].append)
    got: list[dict[str, Any]] = []
    ctx.emit = got.append
    os.makedirs(ctx.artifact_dir)
    ran = tmp_path / "ran.txt"
    Path(ctx.run_dir, "job.py").write_text(
        f"with open({str(ran)!r}, 'a') as f:\n    f.write('ran\\n')\n{script}\n"
        "print('the output')\n")
    ctx.env.update(fake_torch)
    tiers.run_command(ctx, f"{sys.executable} job.py", NoToolsPod())  # type: ignore[arg-type]
    for event in got:
        assert not isinstance(protocol.decode_event(wire.dumps(event)), protocol.BadLine)
    return got, ran


def test_a_python_command_runs_once_for_its_output_and_tier_2(
        tmp_path: Path, fake_torch: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    got, ran = _command_run(tmp_path, fake_torch, monkeypatch, "import torch")
    assert ran.read_text() == "ran\n"  # once, where it used to run plain and then profiled
    started = [e for e in got if e["type"] == "tier_started"]
    assert [e["tier"] for e in started] == [0, 2]
    assert "torch.profiler" in started[0]["name"]  # the command's wall time had it on
    assert started[1].get("argv") is None  # Tier 2 ran no command of its own
    out = [e for e in got if e["type"] == "output"]
    assert [(e["tier"], e["text"]) for e in out] == [(0, "the output")]
    table = next(e for e in got if e["type"] == "kernel_table")
    assert table["source"] == "torch.profiler (injected)"
    assert [r["name"] for r in table["kernels"]] == ["A", "B"]
    finished = {e["tier"]: e for e in got if e["type"] == "tier_finished"}
    assert finished[0]["status"] == "ok" and finished[2]["status"] == "fallback"


def test_a_python_command_without_torch_still_gets_the_other_paths(
        tmp_path: Path, fake_torch: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    got, ran = _command_run(tmp_path, fake_torch, monkeypatch, "import json")
    assert ran.read_text() == "ran\n"
    diag = next(e for e in got if e["type"] == "diagnosis")
    assert diag["code"] == "no_timeline"
    assert "no Python process imported torch" in diag["cause"] and "ncu" in diag["cause"]
    assert not [e for e in got if e["type"] == "kernel_table"]


class NcuPod(NoToolsPod):
    """A pod with an ncu that fits (a stand-in script: there is no GPU here), counters
    allowed or blocked, and torch installed in the workloads' Python or not."""

    def __init__(self, ncu: str, verdict: str = "allowed", torch: bool = True) -> None:
        super().__init__()
        self.ncu = ncu
        self.torch = torch
        self.counters = {"verdict": verdict}

    def has_package(self, name: str) -> bool:
        return name == "torch" and self.torch

    def select_ncu(self, exclude: list[str]) -> dict[str, Any]:
        return {"selected": self.ncu, "reason": "test"}


def test_tier2_of_a_python_workload_takes_torch_profiler_then_the_ncu_pass(
        tmp_path: Path, fake_torch: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.profiler first (the table with the idle and memcpy shares), the ncu pass for
    what nothing else can time: here, a pod whose workloads' Python has no torch. The
    pass's ncu prints real ncu 2025.3.1 output, its CSV to ``--log-file`` and the
    workload's lines to stdout, which Tier 2 shows."""
    monkeypatch.setenv("GPUWS_POD_CACHE", str(tmp_path / "cache"))
    raw = Path(__file__).parents[2] / "fixtures" / "ncu-2025.3.1-h200" / "saxpy_raw.csv"
    ncu = tmp_path / "ncu"
    ncu.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'ncu-args'}\n"
                   'for a in "$@"; do [ "$prev" = --log-file ] && log="$a"; prev="$a"; done\n'
                   f'cat {raw} > "$log"\necho "the workload\'s own line"\n')
    ncu.chmod(0o755)
    got: list[dict[str, Any]] = []
    ctx = RunContext("20250101-000000-cccccc", {"workload": "builtin:saxpy", "tiers": [2]},
                     got.append)
    os.makedirs(ctx.artifact_dir)
    ctx.env.update(fake_torch)
    # What the torchprof child does around the workload: start the profiler, write at exit.
    src = str(Path(tiers.__file__).parents[3])
    ctx.env["PYTHONPATH"] += os.pathsep + src
    torchprof = [sys.executable, "-c", "import os, torch\n"
                 "from gpuws.remote_agent.measure.torch_inject import start_profiler\n"
                 "start_profiler(torch, os.environ['GPUWS_TORCH_TRACE_DIR'])\n"]
    rows = tiers.tier2(ctx, NcuPod(str(ncu)), ["workload"], python=True,  # type: ignore[arg-type]
                       torch_argv=torchprof)
    assert rows is not None and [r["name"] for r in rows] == ["A", "B"]
    table = next(e for e in got if e["type"] == "kernel_table")
    assert table["source"] == "torch.profiler" and table["gpu_idle_pct"] is not None
    assert not (tmp_path / "ncu-args").exists()  # the pass never ran
    # No torch for the workloads: the ncu pass.
    got.clear()
    rows = tiers.tier2(ctx, NcuPod(str(ncu), torch=False), ["workload"],  # type: ignore[arg-type]
                       python=True, torch_argv=torchprof)
    assert rows is not None and [r["name"] for r in rows] == ["saxpy"]
    assert rows[0]["total_ns"] == 246528.0
    started = [e for e in got if e["type"] == "tier_started"]
    assert len(started) == 1 and started[0]["argv"][0] == str(ncu)
    assert "--profile-from-start off" in (tmp_path / "ncu-args").read_text()
    assert [(e["tier"], e["text"]) for e in got if e["type"] == "output"] == [
        (2, "the workload's own line")]
    table = next(e for e in got if e["type"] == "kernel_table")
    assert table["source"] == "ncu gpu__time_duration" and table.get("gpu_idle_pct") is None
    fin = next(e for e in got if e["type"] == "tier_finished")
    assert "torch.profiler: torch is not installed" in fin["reason"]
