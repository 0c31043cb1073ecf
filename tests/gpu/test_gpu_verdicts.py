"""The verdicts of issue 21 on a real GPU (brief verdict2): the SM count, the launch-bound
decode, the tiny grid, and the counters-blocked verdicts from Tier 1 and NVML GPM.

(a) The probe's SM count (the CUDA driver's ``cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)``
    in a child, matched by PCI bus id) against torch's ``multi_processor_count`` for the
    same GPU, and the probe's time with it.
(b) With counters (Tiers 2 and 3, as tests/gpu/record_verdict_characters.sh): the decode
    loop (bench/workloads/verdict/decode.py) must read launch-bound first, with CUDA graphs
    among the remedies; the tiny grid (8 blocks) must be "Too small a grid: 8 block(s) for
    N SMs" with N the GPU's count; the laptop's logic over the same events (a replay) must
    agree with the pod's.
(c) Counters treated as blocked (``GPUWS_COUNTERS=blocked`` in the agent's environment, as
    on a pod with ``RmProfilingAdminOnly=1``): builtin:saxpy and builtin:gemm bf16 through
    Tiers 1 and 3 get a kernel verdict without counters: saxpy DRAM-bound, the GEMM
    compute-bound (on the tensor cores where GPM answered), each naming its sources
    (CUDA events, NVML GPM where supported, static analysis).

Every stream is saved under ``$GPUWS_GPU_OUT/verdict/`` (``<name>.ndjson``) to be kept as
fixtures (tests/fixtures/verdict-h100 holds the earlier ones); figures go through
tests/faults/figures.py ``record``. About 60 s of GPU time. Skipped without a GPU.
Run alone: ``GPU_TESTS=verdicts:240 bash tests/gpu/run_gpu_check.sh``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from faults.figures import record  # type: ignore[import-not-found]
from gpuws import protocol
from gpuws.cli import main
from gpuws.live import verdicts
from gpuws.remote_agent.pod import gpuinfo, probe

pytestmark = pytest.mark.gpu
if shutil.which("nvidia-smi") is None:
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)

OUT = Path(os.environ["GPUWS_GPU_OUT"]) / "verdict" if os.environ.get("GPUWS_GPU_OUT") \
    else None
W = Path(__file__).parents[2] / "bench" / "workloads" / "verdict"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gpuws-home")


@pytest.fixture(autouse=True)
def _shared_home(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWS_HOME", str(home))
    monkeypatch.setenv("COLUMNS", "200")


def run(capsys: pytest.CaptureFixture[str], name: str, *args: str
        ) -> list[dict[str, Any]]:
    code = main(["run", "local", *args, "--json", "--no-pull"])
    out = capsys.readouterr().out
    if OUT is not None:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{name}.ndjson").write_text(out)
    events = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert code == 0, [e for e in events if e["type"] in ("diagnosis", "run_finished")]
    return events


def of(events: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == type_]


def laptop(events: list[dict[str, Any]]) -> verdicts.Verdicts:
    """The laptop's verdicts over the same events (a replay, an export)."""
    decoded = [protocol.decode_event(json.dumps(e).encode()) for e in events]
    return verdicts.derive(verdicts.inputs_from_events(
        [e for e in decoded if not isinstance(e, protocol.BadLine)]))


def torch_sms() -> int | None:
    """torch's SM count of the GPU NVML calls 0 (PCI order, as NVML counts)."""
    res = subprocess.run(["python3", "-c", "import torch; print(torch.cuda."
                          "get_device_properties(0).multi_processor_count)"],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID"))
    return int(res.stdout.strip()) if res.returncode == 0 else None


def test_the_probe_carries_the_sm_count() -> None:
    t0 = time.monotonic()
    counts = gpuinfo.sm_counts()
    child_s = time.monotonic() - t0
    facts = probe.probe()
    gpu0 = next(g for g in facts["gpus"] if g["index"] == 0)
    expected = torch_sms()
    record("verdict_sm_count", probe_sm_count=gpu0.get("sm_count"), torch_sm_count=expected,
           sm_count_child_s=round(child_s, 3), probe_s=facts["probe_s"],
           gpu=gpu0["name"], buses=len(counts))
    assert gpu0.get("sm_count") is not None, (counts, gpu0.get("pci_bus_id"))
    if expected is not None:
        assert gpu0["sm_count"] == expected
    msgspec.convert(facts, protocol.Probe, strict=True)


def test_with_counters_decode_is_launch_bound_and_the_tiny_grid_too_small(
        capsys: pytest.CaptureFixture[str]) -> None:
    decode = run(capsys, "decode", "-w", f"cmd:python3 {W / 'decode.py'}", "--tiers", "2")
    program = of(decode, "program_verdict")[-1]
    first = program["findings"][0]
    record("verdict_decode", bound=program["bound"], summary=program["summary"],
           detail=first["detail"])
    assert program["bound"] == "launch" and first["code"] == "launch_bound", program
    assert any("CUDA graph" in r for r in first["remedies"])
    again = laptop(decode).program
    assert again is not None and (again.bound, again.summary) == (program["bound"],
                                                                  program["summary"])

    tiny = run(capsys, "tiny_grid", "-w", f"cmd:python3 {W / 'tiny_grid.py'}",
               "--tiers", "3", "--kernel-regex", "tiny_sum", "--launch-skip", "10")
    kv = of(tiny, "kernel_verdict")[-1]
    sms = next(e["value"] for e in kv["evidence"] if e["name"] == "SMs on the GPU")
    record("verdict_tiny_grid", bound=kv["bound"], sentence=kv["sentence"], sms=sms)
    assert kv["bound"] == "small_grid", kv["sentence"]
    assert kv["sentence"].startswith(f"Too small a grid: 8 block(s) for {int(sms)} SMs")
    assert [k.bound for k in laptop(tiny).kernels] == ["small_grid"]


@pytest.mark.parametrize(("name", "workload", "bounds"), [
    ("saxpy_blocked", "builtin:saxpy", ("dram",)),
    ("gemm_bf16_blocked", "builtin:gemm?dtype=bf16", ("compute_tensor", "compute_sm")),
])
def test_counters_treated_as_blocked_still_give_kernel_verdicts(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, name: str,
        workload: str, bounds: tuple[str, ...]) -> None:
    monkeypatch.setenv("GPUWS_COUNTERS", "blocked")
    events = run(capsys, name, "-w", workload, "--tiers", "1,3")
    diag = [d for d in of(events, "diagnosis") if d["code"] == "counters_blocked"]
    assert diag and "GPUWS_COUNTERS=blocked" in diag[0]["cause"]
    fin3 = next(e for e in of(events, "tier_finished") if e["tier"] == 3)
    assert fin3["status"] == "fallback"
    assert not of(events, "kernel_metrics")  # ncu never ran
    kv = of(events, "kernel_verdict")[-1]
    gpm = next(e for e in of(events, "tier_finished") if e["tier"] == 1).get("gpm") or {}
    record(f"verdict_{name}", bound=kv["bound"], sentence=kv["sentence"],
           sources=",".join(kv["sources"]), gpm_dram=gpm.get("dram_bw_pct"),
           gpm_tensor=gpm.get("tensor_active_pct"),
           gpm_timed_share=gpm.get("timed_share_pct"), gpm_reason=repr(gpm.get("reason")))
    assert kv["counters"] is False and kv["bound"] in bounds, kv["sentence"]
    assert kv["sentence"].endswith("without hardware counters)")
    assert kv["sources"][0] == "CUDA events"  # static analysis too where cuobjdump ran
    if gpm.get("window_s"):
        # GPM answered: it is read, named, and for the GEMM it tells the tensor cores.
        assert "NVML GPM" in kv["sources"] and "NVML GPM" in kv["sentence"]
        if name.startswith("gemm"):
            assert kv["bound"] == "compute_tensor", kv["sentence"]
    # The laptop, over the same events, keeps the pod's verdict (and would say the same).
    assert [k.sentence for k in laptop(events).kernels] == [kv["sentence"]]
    without_pods = [e for e in events if e["type"] != "kernel_verdict"]
    assert [k.sentence for k in laptop(without_pods).kernels] == [kv["sentence"]]
