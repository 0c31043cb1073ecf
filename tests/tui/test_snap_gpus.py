"""Screenshots of every GPU and the clocks behind every figure, in the TUI.

The pods are real multi-GPU machines: the ``nvidia-smi -q -x`` captures in
``tests/fixtures/nvidia-smi/`` read by the agent's own parser (``tests/multigpu.py``): four
Tesla K80s, two of them busy with a python process at 99%, and two RTX A5000s with a
llama-server on each. The run is the real H200 recording, with what an agent of this round
adds to it: the GPU it was pinned to (busy with the A5000 capture's llama-server, pid and
memory as captured) and the clocks while Tier 1 sampled (the H200's real 345 MHz idle and
1,980 MHz boost SM clock and 3,201 MHz memory clock: a cold start, which is cautioned).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual.widgets import Select, TabbedContent

from gpuws import protocol
from gpuws.live.telemetry import TelemetryHistory
from gpuws.tui.messages import TelemetryTick
from gpuws.tui.screens.dashboard import DashboardScreen
from gpuws.tui.screens.launcher import LauncherScreen
from gpuws.tui.screens.run import RunScreen
from multigpu import A5000_X2, K80_X4, probe, telemetry  # type: ignore[import-not-found]
from tui.tuikit import (  # type: ignore[import-not-found]
    RECORDED,
    RECORDING,
    SnapCompare,
    replay_app,
    replayed,
)
from tui.tuikit import frozen_app as app_on  # type: ignore[import-not-found]

#: The H200's clocks while Tier 1 sampled a cold start (see the module docstring).
COLD_START = {"samples": 40, "sm_mhz_min": 345.0, "sm_mhz_median": 1980.0,
              "sm_mhz_max": 1980.0, "sm_mhz_ceiling": 1980.0, "mem_mhz_min": 3201.0,
              "mem_mhz_max": 3201.0, "clock_events": []}
LLAMA = {"pid": 100477, "name": "/root/src/llama.cpp/build/bin/llama-server",
         "used_mib": 22430.0}


def dashboard_of(p: protocol.Probe, history: TelemetryHistory
                 ) -> Callable[[Pilot[Any]], Awaitable[None]]:
    async def run_before(pilot: Pilot[Any]) -> None:
        screen = DashboardScreen("k80-pod", p, "ssh+sftp", history)
        await pilot.app.push_screen(screen)
        screen.post_message(TelemetryTick())
        await pilot.pause(0.3)

    return run_before


def test_dashboard_lists_and_samples_every_gpu(snap_compare: SnapCompare) -> None:
    """Four K80s at 120×40: each GPU's memory, clocks, power, heat and its users in the probe
    panel; a two-line telemetry row per GPU (the two at 99% show full sparklines)."""
    assert snap_compare(app_on(), terminal_size=(120, 40),
                        run_before=dashboard_of(probe(K80_X4), telemetry(K80_X4)))


def test_dashboard_of_eight_gpus_fits_a_laptop(snap_compare: SnapCompare) -> None:
    """Eight GPUs (the K80 capture twice, as indexes 0–7) at 80×24, stacked (narrow)."""
    k80 = probe(K80_X4)
    gpus = k80.gpus + [g.__class__(**{**{f: getattr(g, f) for f in g.__struct_fields__},
                                      "index": g.index + 4}) for g in k80.gpus]
    eight = protocol.Probe(**{**{f: getattr(k80, f) for f in k80.__struct_fields__},
                              "gpus": gpus})
    history = TelemetryHistory()
    for _ in range(30):
        for shift in (0, 4):
            sample = telemetry(K80_X4, ticks=1)
            history.add(protocol.Telemetry(gpus=[
                protocol.GpuSample(**{**{f: getattr(s, f) for f in s.__struct_fields__},
                                      "index": s.index + shift})
                for s in sample.latest.values()]))
    assert snap_compare(app_on(), terminal_size=(80, 24),
                        run_before=dashboard_of(eight, history))


def test_launcher_names_a_busy_gpu(snap_compare: SnapCompare) -> None:
    """The GPU field lists the pod's GPUs; the one picked has a user: named before the run."""

    async def run_before(pilot: Pilot[Any]) -> None:
        await pilot.app.push_screen(LauncherScreen([], probe(A5000_X2)))
        await pilot.pause(0.2)
        pilot.app.screen.query_one("#gpu", Select).value = "1"
        await pilot.pause(0.3)

    assert snap_compare(app_on(), terminal_size=(100, 24), run_before=run_before)


async def test_launcher_sends_the_chosen_gpu() -> None:
    app = app_on()
    async with app.run_test(size=(100, 40)) as pilot:
        screen = LauncherScreen([], probe(K80_X4))
        await app.push_screen(screen)
        await pilot.pause(0.2)
        assert screen.options().gpu is None  # auto: CUDA's first
        screen.query_one("#gpu", Select).value = "3"
        await pilot.pause(0.1)
        assert screen.options().gpu == "3"
        assert not screen.query_one("#gpu-note").display  # GPU 3 is idle
        screen.query_one("#gpu", Select).value = "0"
        await pilot.pause(0.1)
        assert screen.query_one("#gpu-note").display


def _pinned_recording(tmp_path: Path) -> Path:
    """The H200 recording, pinned to a busy GPU 0, its Tier-1 result with clocks."""
    out = []
    for line in RECORDING.read_bytes().splitlines():
        event = json.loads(line)
        if event["type"] == "run_started":
            event["gpu"] = {"index": 0, "uuid": "GPU-2a311d9d-4e63-03d1-940a-9fa658b398ad",
                            "name": "NVIDIA H200", "busy": [LLAMA]}
        if event["type"] == "tier1_result":
            event["clocks"] = COLD_START
        out.append(json.dumps(event).encode())
    path = tmp_path / "pinned.ndjson"
    path.write_bytes(b"\n".join(out) + b"\n")
    return path


def test_run_names_a_busy_gpu_and_cautions_its_clocks(snap_compare: SnapCompare,
                                                      tmp_path: Path) -> None:
    """The busy-GPU banner above the tabs; the clocks and their caution under the figure."""
    app = replay_app(_pinned_recording(tmp_path))
    assert snap_compare(app, terminal_size=(100, 34), run_before=replayed())
    app.store.close_blocking()


def test_a_failed_runs_metrics_say_why(snap_compare: SnapCompare, tmp_path: Path) -> None:
    """Counters blocked: the Metrics tab says Tier 3 failed and why, not "… yet"."""
    source = tmp_path / "blocked.ndjson"
    source.write_bytes(b"".join(RECORDED.blocked_run("20251121-101010-blocked")))
    app = replay_app(source)
    assert snap_compare(app, terminal_size=(100, 32), run_before=replayed("3"))
    app.store.close_blocking()


async def test_a_cancelled_run_says_so_on_every_empty_pane(tmp_path: Path) -> None:
    source = tmp_path / "cancelled.ndjson"
    source.write_bytes(b"".join(RECORDED.cancelled_run("20251121-101010-cancel")))
    app = replay_app(source)
    async with app.run_test(size=(100, 32)) as pilot:
        await replayed()(pilot)
        screen = app.screen
        assert isinstance(screen, RunScreen)
        panes = screen.panes
        caption = str(panes.query_one("#kernels-caption").render())
        assert caption.startswith("no kernel table: the run cancelled before Tier 2"), caption
        screen.query_one(TabbedContent).active = "tab-findings"
        await pilot.pause(0.2)
        assert "no rule findings: Tier 3 was not asked for (tiers 1, 2)" in str(
            panes.query_one("#rules").render())
    app.store.close_blocking()


async def test_one_busy_banner_whichever_warning_comes_first() -> None:
    """RunStarted.gpu.busy and the agent's own gpu_busy diagnosis name the same thing: the
    panes show one banner, in either arrival order."""
    from textual.app import App, ComposeResult

    from gpuws.tui.widgets.run.banner import DiagnosisBanner
    from gpuws.tui.widgets.run.run_panes import RunPanes

    run_id = "20261121-130950-9ba123"
    started = protocol.RunStarted(
        run_id=run_id, seq=0, ts=1.0, spec=protocol.RunSpec(workload="builtin:saxpy"),
        run_dir="/r", pid=1, gpu=protocol.GpuTarget(
            index=0, name="NVIDIA H200", busy=[protocol.GpuProcess(**LLAMA)]))  # type: ignore[arg-type]
    agents = protocol.Diagnosis(run_id=run_id, seq=1, ts=1.1, code="gpu_busy",
                                severity="warning", title="GPU 0 is in use by other processes",
                                cause="pid 100477 (llama-server, 21.9 GiB)")

    class Host(App[None]):
        def compose(self) -> ComposeResult:
            yield RunPanes(run_id)

    for batches in ([[started], [agents]], [[started, agents]]):
        app = Host()
        async with app.run_test(size=(100, 30)) as pilot:
            panes = app.query_one(RunPanes)
            for batch in batches:
                panes.apply(list(batch))
                await pilot.pause(0.05)
            banners = app.query(DiagnosisBanner)
            assert len([b for b in banners if b.diagnosis.code == "gpu_busy"]) == 1, batches
            assert panes.gpu is not None and panes.gpu.index == 0
