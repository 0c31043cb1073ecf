"""A run pinned with ``--gpu`` reaches every tier pinned: env for every process, ncu's
``--devices``; and the clocks behind Tier 1.

This machine has no GPU, so the GPU list is the real 4 × K80 capture
(tests/fixtures/nvidia-smi/) put where ``list_gpus`` would have read it, and the tools
are stand-in scripts that write down the argv and environment they were started with.
Everything between — the worker's GPU choice, the tiers, the processes they start, the
durable event log — is the real code. The NVML clock readings in the Tier-1 tests are a
stand-in too (no NVML here); tests/gpu/test_gpu_pinning.py reads the real ones.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuws import protocol
from gpuws.remote_agent import runs, worker
from gpuws.remote_agent.measure import tiers
from gpuws.remote_agent.pod import clocks, gpuinfo
from gpuws.remote_agent.worker import RunContext

SMI_DIR = Path(__file__).parents[2] / "fixtures" / "nvidia-smi"
K80_XML = SMI_DIR / "pai_tesla_k80_x4_430.26.xml"
K80 = gpuinfo.parse_nvidia_smi_xml(K80_XML.read_text())["gpus"]
GPU2 = "GPU-30bc2701-3bc2-5f35-0ebd-9867a077e138"

RECORDER = """#!/bin/sh
# Writes down how it was started, as the tool it stands in for would have been.
{{
  for a in "$@"; do printf 'ARG %s\\n' "$a"; done
  printf 'CVD %s\\n' "${{CUDA_VISIBLE_DEVICES-<unset>}}"
  printf 'ORDER %s\\n' "${{CUDA_DEVICE_ORDER-<unset>}}"
}} >> {log}
exit {code}
"""


def recorder(path: Path, code: int = 1) -> tuple[str, Path]:
    log = path.with_suffix(".log")
    path.write_text(RECORDER.format(log=log, code=code))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path), log


def recorded(log: Path) -> tuple[list[str], str, str]:
    """(argv, CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER) of the first start in ``log``."""
    lines = log.read_text().splitlines()
    argv = [line[4:] for line in lines if line.startswith("ARG ")]
    cvd = next(line[4:] for line in lines if line.startswith("CVD "))
    order = next(line[6:] for line in lines if line.startswith("ORDER "))
    return argv, cvd, order


class FakePod:
    """The probe's facts for the K80 box (stand-in: this machine has no GPU)."""

    def __init__(self, ncu: str | None = None, nsys: str | None = None) -> None:
        self.ncu, self._nsys = ncu, nsys
        self.has_gpu = True
        self.counters = {"verdict": "allowed", "reason": "test"}
        self.facts: dict[str, Any] = {"gpus": K80}

    def select_ncu(self, exclude: list[str]) -> dict[str, Any]:
        left = [n for n in [self.ncu] if n and n not in exclude]
        return {"selected": left[0] if left else None, "selected_version": "2025.3.1",
                "reason": "test", "install_plan": None}

    def nsys(self) -> str | None:
        return self._nsys

    def nsys_passed_over(self) -> str | None:
        return None

    def nsys_version(self, path: str) -> str | None:
        return None

    def program_cuda(self) -> str | None:
        return None

    def has_package(self, name: str) -> bool:
        return False


def make_ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: dict[str, Any],
             env: dict[str, str] | None = None) -> RunContext:
    monkeypatch.setenv("GPUWS_POD_CACHE", str(tmp_path / "pod"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    runs.ensure_private_dir(runs.cache_root())
    runs.ensure_private_dir(runs.runs_root())
    rdir = Path(runs.run_dir("r-pin"))
    (rdir / "artifacts").mkdir(parents=True)
    (rdir / "spec.json").write_text(json.dumps(spec))
    log = runs.EventLog("r-pin", str(rdir / "events.ndjson"))
    ctx = RunContext("r-pin", spec, log.append)
    monkeypatch.setattr(gpuinfo, "list_gpus",
                        lambda *a, **k: gpuinfo.GpuList(K80, "430.26", None, "nvidia-smi", None))
    worker.choose_gpu(ctx)
    return ctx


def events(ctx: RunContext) -> list[protocol.Events]:
    lines = (Path(ctx.run_dir) / "events.ndjson").read_bytes().splitlines()
    out = [protocol.decode_event(line) for line in lines]
    assert not [e for e in out if isinstance(e, protocol.BadLine)], out
    return out  # type: ignore[return-value]


def test_choice_pins_the_environment_every_tier_inherits(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    ctx = make_ctx(tmp_path, monkeypatch, {"workload": "cmd:true", "gpu": "2"},
                   env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert ctx.gpu.pinned and ctx.gpu.gpu is not None and ctx.gpu.gpu["index"] == 2
    assert ctx.env["CUDA_VISIBLE_DEVICES"] == GPU2
    assert ctx.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_cmd_workload_runs_pinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = make_ctx(tmp_path, monkeypatch, {"workload": "cmd:env", "tiers": [1], "gpu": "2"})
    tiers.run_command(ctx, "env", FakePod())  # type: ignore[arg-type]
    texts = [e.text for e in events(ctx) if isinstance(e, protocol.Output) and e.tier == 0]
    assert f"CUDA_VISIBLE_DEVICES={GPU2}" in texts
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in texts


def test_tier1_child_is_pinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = make_ctx(tmp_path, monkeypatch, {"workload": "builtin:saxpy", "gpu": "GPU-30bc"})
    script, log = recorder(tmp_path / "child", code=0)
    monkeypatch.setattr(tiers, "child_argv", lambda ctx, mode, *args: [script, mode, *args])
    monkeypatch.setattr(clocks, "sampler_for", lambda index: None)
    tiers.tier1(ctx)
    argv, cvd, order = recorded(log)
    assert argv == ["tier1"] and (cvd, order) == (GPU2, "PCI_BUS_ID")


def test_tier2_nsys_and_ncu_pass_are_pinned(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = make_ctx(tmp_path, monkeypatch, {"workload": "builtin:saxpy", "gpu": "2"})
    nsys, nsys_log = recorder(tmp_path / "nsys")
    ncu, ncu_log = recorder(tmp_path / "ncu")
    target = ["/usr/bin/python3", "agent.pyz", "child", "exec", "r-pin", "10"]
    assert tiers.tier2(ctx, FakePod(ncu=ncu, nsys=nsys), target,  # type: ignore[arg-type]
                       python=True, torch_argv=None) is None  # the stand-ins measure nothing
    argv, cvd, order = recorded(nsys_log)
    assert argv[0] == "profile" and argv[-len(target):] == target
    assert (cvd, order) == (GPU2, "PCI_BUS_ID")
    argv, cvd, order = recorded(ncu_log)
    assert argv[argv.index("--devices") + 1] == "0"
    assert argv.index("--devices") < argv.index(target[0])
    assert (cvd, order) == (GPU2, "PCI_BUS_ID")


def test_tier2_torch_profiler_is_pinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = make_ctx(tmp_path, monkeypatch, {"workload": "builtin:saxpy", "gpu": "2"})
    script, log = recorder(tmp_path / "torchprof", code=0)
    tried: list[str] = []
    assert tiers.tier2_torch(ctx, [script, "torchprof", "10"], False, tried) is None
    _argv, cvd, order = recorded(log)
    assert (cvd, order) == (GPU2, "PCI_BUS_ID")


def test_tier3_ncu_is_pinned_to_device_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = make_ctx(tmp_path, monkeypatch, {"workload": "builtin:saxpy", "gpu": "2"})
    ncu, log = recorder(tmp_path / "ncu")
    target = ["/usr/bin/python3", "agent.pyz", "child", "exec", "r-pin", "10"]
    tiers.tier3(ctx, FakePod(ncu=ncu), target, None, "saxpy",  # type: ignore[arg-type]
                python=True)
    argv, cvd, order = recorded(log)
    # Under CUDA_VISIBLE_DEVICES=<uuid> the pinned GPU (nvidia-smi's 2) is CUDA device 0.
    assert argv[argv.index("--devices") + 1] == "0"
    assert argv.index("--devices") < argv.index(target[0])
    assert argv[-len(target):] == target
    assert (cvd, order) == (GPU2, "PCI_BUS_ID")
    started = [e for e in events(ctx) if isinstance(e, protocol.TierStarted) and e.tier == 3]
    assert started[-1].argv is not None and "--devices" in started[-1].argv


def test_unpinned_run_adds_no_device_filter(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = make_ctx(tmp_path, monkeypatch, {"workload": "builtin:saxpy"})
    assert not ctx.gpu.pinned and ctx.gpu.gpu is not None and ctx.gpu.gpu["index"] == 0
    ncu, log = recorder(tmp_path / "ncu")
    tiers.tier3(ctx, FakePod(ncu=ncu), ["/bin/true"], None, "x",  # type: ignore[arg-type]
                python=False)
    argv, cvd, order = recorded(log)
    assert "--devices" not in argv and (cvd, order) == ("<unset>", "PCI_BUS_ID")


# ----------------------------------------------------------------------------- clocks
FAKE_TIER1 = r"""
import json, os, sys, time
fd = int(os.environ["GPUWS_EVENT_FD"])
def emit(e):
    os.write(fd, (json.dumps(e) + "\n").encode())
stats = {"n": 2, "median_ms": 0.25, "mean_ms": 0.25, "stdev_ms": 0.0, "min_ms": 0.25,
         "max_ms": 0.25, "p5_ms": 0.25, "p95_ms": 0.25, "ci_low_ms": 0.25,
         "ci_high_ms": 0.25, "ci_rel_halfwidth": 0.0}
time.sleep(0.15)  # warm-up: outside the window, never read
emit({"type": "gpuws_clock_window", "edge": "start"})
emit({"type": "samples", "values_ms": [0.25, 0.25], "batch": 1})
time.sleep(0.45)
emit({"type": "gpuws_clock_window", "edge": "end"})
# A workload may write anything here; made-up clocks must not survive.
emit({"type": "tier1_result", "stats": stats, "mode": "cold", "batch": 1, "warmup": 5,
      "stop_reason": "ci_reached", "clocks": {"samples": 999, "sm_mhz_max": 9999.0}})
"""


class ColdStart:
    """Stand-in NVML readings: the H200's idle 345 MHz, then its 1,980 MHz boost."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self) -> dict[str, Any]:
        self.times.append(time.monotonic())
        first = len(self.times) == 1
        return {"sm_clock_mhz": 345.0 if first else 1980.0, "mem_clock_mhz": 3201.0,
                "power_w": 90.0 if first else 410.5, "temp_c": 36.0 if first else 44.0,
                "clock_events": ["gpu_idle"] if first else ["sw_power_cap"]}


def run_fake_tier1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                   sampler: clocks.ClockSampler | None) -> RunContext:
    ctx = make_ctx(tmp_path, monkeypatch, {"workload": "builtin:saxpy", "gpu": "2"})
    child = tmp_path / "tier1_child.py"
    child.write_text(FAKE_TIER1)
    monkeypatch.setattr(tiers, "child_argv",
                        lambda ctx, mode, *args: [sys.executable, str(child)])
    asked: list[int | None] = []

    def sampler_for(index: int | None) -> clocks.ClockSampler | None:
        asked.append(index)
        return sampler

    monkeypatch.setattr(clocks, "sampler_for", sampler_for)
    tiers.tier1(ctx)
    assert asked == [2]  # the pinned GPU's clocks, by its NVML index
    return ctx


def test_tier1_result_carries_the_clocks_read_in_its_window(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    read = ColdStart()
    sampler = clocks.ClockSampler(read, ceiling_mhz=1980.0, power_limit_w=700.0,
                                  period_s=0.1)
    ctx = run_fake_tier1(tmp_path, monkeypatch, sampler)
    got = events(ctx)
    assert not any(getattr(e, "type", "") == clocks.WINDOW_EVENT for e in got)
    raw = (Path(ctx.run_dir) / "events.ndjson").read_text()
    assert clocks.WINDOW_EVENT not in raw
    (result,) = [e for e in got if isinstance(e, protocol.Tier1Result)]
    c = result.clocks
    assert c is not None and c.source == "nvml"
    # Both edges plus the 10 Hz readings of a ~0.45 s window; none in the warm-up.
    assert 3 <= c.samples <= 8 and c.samples == len(read.times)
    assert (c.sm_mhz_min, c.sm_mhz_max, c.sm_mhz_median) == (345.0, 1980.0, 1980.0)
    assert (c.sm_mhz_ceiling, c.power_limit_w) == (1980.0, 700.0)
    assert (c.mem_mhz_min, c.mem_mhz_max, c.power_w_max, c.temp_c_max) == (
        3201.0, 3201.0, 410.5, 44.0)
    assert c.clock_events == ["sw_power_cap"]  # gpu_idle left out
    assert read.times[-1] - read.times[0] >= 0.4


def test_without_nvml_the_result_has_no_clocks(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = run_fake_tier1(tmp_path, monkeypatch, None)
    (result,) = [e for e in events(ctx) if isinstance(e, protocol.Tier1Result)]
    assert result.clocks is None  # the workload's made-up clocks were dropped


def test_sampler_reads_only_inside_the_window() -> None:
    read = ColdStart()
    sampler = clocks.ClockSampler(read, period_s=0.02).start()
    try:
        time.sleep(0.1)
        assert read.times == []
        sampler.mark("start")
        time.sleep(0.12)
        sampler.mark("end")
        inside = len(read.times)
        time.sleep(0.1)
        assert len(read.times) == inside >= 4
        sampler.mark("bogus")  # an unknown edge from a workload changes nothing
        assert len(read.times) == inside
    finally:
        sampler.stop()


def test_summary_is_none_when_no_sm_clock_was_read() -> None:
    assert clocks.summarize([]) is None
    assert clocks.summarize([{"sm_clock_mhz": None, "mem_clock_mhz": 1.0}]) is None
    one = clocks.summarize([{"sm_clock_mhz": 1410.0, "mem_clock_mhz": None, "power_w": None,
                             "temp_c": None, "clock_events": None}])
    assert one is not None and one["samples"] == 1 and one["mem_mhz_min"] is None
    assert protocol.ClockRange(**one).sm_mhz_median == 1410.0


def test_sampler_for_needs_nvml_and_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    assert clocks.sampler_for(None) is None
    monkeypatch.setattr(gpuinfo, "nvml_session", lambda *a: None)
    assert clocks.sampler_for(0) is None


# ----------------------------------------------------------------------------- worker
FAKE_SMI = """#!{python}
# A stand-in for nvidia-smi (this machine has no GPU) answering with the real K80 capture.
import sys
if sys.argv[1:] == ["-q", "-x"]:
    sys.stdout.write(open({xml!r}).read())
    sys.exit(0)
print('Field "compute_cap" is not a valid field to query.')
sys.exit(2)
"""


def nvml_loads() -> bool:
    try:
        ctypes.CDLL(gpuinfo.NVML_LIB)
    except OSError:
        return False
    return True


def run_agent(tmp_path: Path, spec: protocol.RunSpec) -> list[Any]:
    """Start a real agent here with the stand-in nvidia-smi first on PATH; its events."""
    from gpuws.client import AgentClient
    from gpuws.transport.local import LocalTransport

    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    smi = bindir / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable, xml=str(K80_XML)))
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    import os

    env = {"PATH": f"{bindir}:{os.environ['PATH']}"}

    async def go() -> list[Any]:
        client = await AgentClient.connect(LocalTransport(env))
        got: list[Any] = []
        client.add_listener(got.append)
        await client.start_run(spec)
        for _ in range(600):
            if any(isinstance(e, protocol.RunFinished) for e in got):
                break
            await asyncio.sleep(0.05)
        await client.close()
        assert client.bad_lines == []  # every line decoded strictly
        return got

    return asyncio.run(go())


needs_no_nvml = pytest.mark.skipif(nvml_loads(), reason="a real NVML answers here: the "
                                   "stand-in nvidia-smi would not be asked")


@needs_no_nvml
def test_worker_pins_warns_when_busy_and_says_which_gpu(tmp_path: Path) -> None:
    got = run_agent(tmp_path, protocol.RunSpec(workload="cmd:env", tiers=[1], gpu="1"))
    started = next(e for e in got if isinstance(e, protocol.RunStarted))
    assert started.gpu is not None
    assert (started.gpu.index, started.gpu.uuid) == (1, "GPU-b01b80eb-0f18-1df0-cf88-0725bd90f1e1")
    assert [(p.pid, p.used_mib) for p in started.gpu.busy] == [(58642, 576.0)]
    kinds = [type(e).__name__ for e in got]
    busy = next(e for e in got if isinstance(e, protocol.Diagnosis) and e.code == "gpu_busy")
    assert "pid 58642" in busy.cause and "576 MiB" in busy.cause
    assert kinds.index("Diagnosis") < kinds.index("TierStarted")  # before any tier
    out = [e.text for e in got if isinstance(e, protocol.Output)]
    assert "CUDA_VISIBLE_DEVICES=GPU-b01b80eb-0f18-1df0-cf88-0725bd90f1e1" in out
    assert got[-1].status == "ok"


@needs_no_nvml
def test_worker_refuses_a_gpu_that_is_not_there(tmp_path: Path) -> None:
    got = run_agent(tmp_path, protocol.RunSpec(workload="cmd:true", gpu="7"))
    fin = got[-1]
    assert isinstance(fin, protocol.RunFinished) and fin.status == "failed"
    assert fin.error is not None and "\n" not in fin.error
    assert fin.error.startswith("there is no GPU '7' on this pod; its GPUs: 0 = Tesla K80")
    assert "--gpu INDEX" in fin.error
    assert not any(isinstance(e, protocol.TierStarted) for e in got)
    diag = next(e for e in got if isinstance(e, protocol.Diagnosis))
    assert diag.code == "no_such_gpu" and diag.remedies
    started = next(e for e in got if isinstance(e, protocol.RunStarted))
    assert started.gpu is None


@needs_no_nvml
def test_worker_names_the_default_gpu_without_pinning(tmp_path: Path) -> None:
    got = run_agent(tmp_path, protocol.RunSpec(workload="cmd:env", tiers=[1]))
    started = next(e for e in got if isinstance(e, protocol.RunStarted))
    assert started.gpu is not None and started.gpu.index == 0
    out = [e.text for e in got if isinstance(e, protocol.Output)]
    assert not any(t.startswith("CUDA_VISIBLE_DEVICES=") for t in out)
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in out
