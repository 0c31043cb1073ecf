"""Issue 32 point 5 on a machine with two GPUs: the second GPU through every tier, both GPUs
on the dashboard, and Tier 3 of a two-rank ``torchrun`` profiling the one rank asked for.

(a) ``builtin:saxpy`` pinned with ``gpu="1"`` through tiers 1, 2 and 3 on the machine's own
    agent: RunStarted names GPU 1; ncu ran with ``--devices 0``, the one GPU the pinned
    process sees, and its report's device is GPU 1 by PCI id; Tier 1's clocks are GPU 1's.
(b) The TUI's dashboard (``connect local``) draws a row per GPU, each with its own
    readings from the pod's telemetry (SM clock, memory, power, temperature).
(c) ``gpuws run local -w cmd:"torchrun --nproc-per-node 2 ddp_step.py" --tiers 2,3 --rank 1``
    (NCCL, a GPU per rank): Tier 2 gives a table per rank; ncu ran with the rank-1 NVTX
    filter, profiled kernels of one process only, on GPU 1 (rank 1's device), and never
    an NCCL collective unasked.

Figures go to ``$GPUWS_GPU_OUT/two_gpus.json`` (and the dashboard's picture to
``dashboard_two_gpus.svg``). Skipped without two NVIDIA GPUs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuws import protocol

pytestmark = pytest.mark.gpu
if shutil.which("nvidia-smi") is None:
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)
_LISTED = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
if sum(1 for line in _LISTED.splitlines() if line.startswith("GPU ")) < 2:
    pytest.skip("fewer than two NVIDIA GPUs here", allow_module_level=True)

from gpu import test_gpu_pinning as pin  # noqa: E402
from gpuws.cli import main  # noqa: E402
from gpuws.remote_agent.pod import gpuinfo  # noqa: E402

OUT = Path(os.environ["GPUWS_GPU_OUT"]) if os.environ.get("GPUWS_GPU_OUT") else None
PROGRAMS = Path(__file__).parent / "programs"
FIGURES: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def _write_figures() -> Any:
    yield
    print("two GPUs:", json.dumps(FIGURES, indent=1, default=str)[:6000])
    if OUT:
        (OUT / "two_gpus.json").write_text(json.dumps(FIGURES, indent=2, default=str))


@pytest.fixture(scope="module")
def gpus() -> list[dict[str, Any]]:
    found = gpuinfo.list_gpus()
    assert len(found.gpus) >= 2, found.error
    return found.gpus


def pci_of(device: dict[str, str]) -> tuple[int, int, int]:
    return (int(device["device__attribute_pci_domain_id"]),
            int(device["device__attribute_pci_bus_id"]),
            int(device["device__attribute_pci_device_id"]))


# ----------------------------------------------------------------------------------- (a)
def test_saxpy_on_gpu_1_through_every_tier(gpus: list[dict[str, Any]]) -> None:
    events = pin.run(protocol.RunSpec(workload="builtin:saxpy", tiers=[1, 2, 3], gpu="1",
                                      max_seconds=3.0, profile_iters=3))
    fin = events[-1]
    assert isinstance(fin, protocol.RunFinished) and fin.status == "ok", \
        [e for e in events if isinstance(e, (protocol.Diagnosis, protocol.RunFinished))]
    started = pin.of(events, protocol.RunStarted)[0]
    assert started.gpu is not None
    assert (started.gpu.index, started.gpu.uuid) == (1, gpus[1]["uuid"])
    assert started.gpu.sm_count, started.gpu
    tier2 = [e for e in pin.of(events, protocol.TierFinished) if e.tier == 2]
    # "fallback": torch.profiler where the pod has no nsys (the GPU machine has none).
    assert tier2 and tier2[-1].status in ("ok", "fallback") and tier2[-1].source, tier2
    argv = [e for e in pin.of(events, protocol.TierStarted) if e.tier == 3 and e.argv][-1].argv
    assert argv[argv.index("--devices") + 1] == "0"  # inside the pinned process: its only GPU
    reps = [a for a in pin.of(events, protocol.Artifact) if a.name.endswith(".ncu-rep")]
    assert reps, pin.of(events, protocol.TierFinished)
    devices = pin.ncu_devices(argv[0], reps[0].path)
    assert devices and {pci_of(d) for d in devices} == {pin.pci_tuple(gpus[1]["pci_bus_id"])}
    assert pin.pci_tuple(gpus[0]["pci_bus_id"]) != pin.pci_tuple(gpus[1]["pci_bus_id"])
    (t1,) = pin.of(events, protocol.Tier1Result)
    c = t1.clocks
    assert c is not None and c.source == "nvml" and c.samples >= 2
    ceiling = gpuinfo.nvml_session().max_sm_clock_mhz(1)  # type: ignore[union-attr]
    assert c.sm_mhz_ceiling == ceiling
    FIGURES["saxpy_gpu1"] = {
        "run_started_gpu": protocol.to_builtins(started.gpu), "ncu_argv": argv,
        "ncu_report_devices": devices, "tier1_median_ms": t1.stats.median_ms,
        "clocks": protocol.to_builtins(c)}


# ----------------------------------------------------------------------------------- (b)
async def test_dashboard_draws_every_gpu_with_its_readings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from textual.widgets import Label

    from gpuws.live.link import Target
    from gpuws.tui.app import GpuwsApp, StartConnect
    from gpuws.tui.screens.dashboard import DashboardScreen
    from gpuws.tui.widgets.pod.gpu_row import GpuRow

    monkeypatch.setenv("GPUWS_HOME", str(tmp_path / "home"))
    n = len(gpuinfo.list_gpus().gpus)
    app = GpuwsApp(StartConnect(Target("local")))

    def read(row: GpuRow) -> str:
        return str(row.query_one(".gpu-detail", Label).content)

    def ready() -> bool:
        rows = list(app.screen.query(GpuRow)) if isinstance(app.screen, DashboardScreen) else []
        return len(rows) == n and all("MHz" in read(r) and " W" in read(r) for r in rows)

    async with app.run_test(size=(160, 45)) as pilot:
        deadline = time.monotonic() + 120
        while not ready():
            assert time.monotonic() < deadline, repr(app.screen)
            await pilot.pause(0.2)
        rows = sorted(app.screen.query(GpuRow), key=lambda r: r.gpu.index)
        samples = {i: protocol.to_builtins(s) for i, s in app.telemetry.latest.items()}
        FIGURES["dashboard"] = {"rows": {r.gpu.index: read(r) for r in rows},
                                "samples": samples}
        if OUT:
            app.save_screenshot("dashboard_two_gpus.svg", str(OUT))
        assert [r.gpu.index for r in rows] == list(range(n))
        assert set(samples) == set(range(n))
        for s in samples.values():
            assert s["sm_clock_mhz"] and s["power_w"] and s["temp_c"] is not None, s
        await app.shutdown()


# ----------------------------------------------------------------------------------- (c)
def test_torchrun_tier3_profiles_rank_1_alone(gpus: list[dict[str, Any]],
                                             capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "200")
    command = (f"{sys.executable} -m torch.distributed.run --standalone --nproc-per-node 2 "
               f"{PROGRAMS / 'ddp_step.py'}")
    code = main(["run", "local", "-w", f"cmd:{command}", "--tiers", "2,3", "--rank", "1",
                 "--json", "--no-pull"])
    out = capsys.readouterr().out
    if OUT:
        (OUT / "ddp_rank1.ndjson").write_text(out)
    events = [json.loads(x) for x in out.splitlines() if x.startswith("{")]

    def of(t: str) -> list[dict[str, Any]]:
        return [e for e in events if e["type"] == t]

    assert code == 0, [e for e in events if e["type"] in ("diagnosis", "run_finished", "log")]
    (table,) = of("kernel_table")
    ranks = sorted((r.get("rank") or 0) for r in table.get("ranks") or [])
    assert ranks == [0, 1], table.get("ranks")
    argv = [e for e in of("tier_started") if e["tier"] == 3 and e.get("argv")][-1]["argv"]
    assert argv[argv.index("--nvtx-include") + 1].startswith("gpuws_rank1"), argv
    metrics = of("kernel_metrics")
    assert metrics, [e for e in events if e["type"] in ("tier_finished", "diagnosis", "log")]
    assert not any(m["kernel"].lower().startswith("nccl") for m in metrics)
    reps = [a for a in of("artifact") if a["name"].endswith(".ncu-rep")]
    assert reps
    devices = pin.ncu_devices(argv[0], reps[0]["path"])
    assert devices and {pci_of(d) for d in devices} == {pin.pci_tuple(gpus[1]["pci_bus_id"])}
    FIGURES["ddp_rank1"] = {
        "ncu_argv": argv, "ncu_report_devices": devices,
        "kernels_profiled": [m["kernel"] for m in metrics],
        "tier2_top": [(k["name"][:80], k.get("share_pct")) for k in table["kernels"][:5]],
        "comm": table.get("comm"), "logs": [e["message"] for e in of("log")][-10:]}
