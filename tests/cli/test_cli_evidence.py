"""NVML GPM beside Tier 1 and Tier 3's estimate, in every face: printer, panes, export.

The runs are the realistic streams of ``tests/sessions/recorded.py`` (the real H200
fixtures) with what this round's agent adds: ``TierFinished.gpm`` on Tier 1 (the figures
issue 21 read on the H100 during a device-to-device copy: SM 98%, DRAM bandwidth 89%) or
the one line a GPU without GPM gives, and ``TierStarted.estimate`` on Tier 3 (what
``remote_agent/measure/tier3_cost.py`` says for this run's recorded Tier-2 table).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import pytest
from rich.console import Console
from rich.table import Table
from textual.app import App, ComposeResult

from gpuws import protocol
from gpuws.commands import doctor
from gpuws.commands.run import Printer
from gpuws.live.feed import Batch
from gpuws.live.model import RunModel
from gpuws.remote_agent.measure import tier3_cost
from gpuws.remote_agent.profilers.ncu_cmd import DEFAULT_SECTIONS
from gpuws.sessions.export import export_session
from gpuws.sessions.store import Store
from gpuws.tui.widgets.run.tier_strip import TierStrip
from gpuws.tui.widgets.run.timing import TimingPane


def _load_recorded() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gpuws_evidence_recorded", Path(__file__).parents[1] / "sessions" / "recorded.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECORDED = _load_recorded()
#: Issue 21's reading on the H100 during a device-to-device copy.
COPY_GPM = {"window_s": 2.05, "sm_active_pct": 98.0, "sm_occupancy_pct": 47.0,
            "tensor_active_pct": 0.0, "dram_bw_pct": 89.0, "fp32_pct": 0.0, "reason": "",
            "source": "NVML GPM"}
NO_GPM = {"reason": "NVML GPM is not supported on GPU 0 (Hopper or newer is needed)",
          "source": "NVML GPM"}
RATE = 3.99  # the H200 session's $/hour in tests/cli/test_cli_gpus_clocks.py


def with_evidence(lines: list[bytes], gpm: dict[str, Any], budget: float | None = None
                  ) -> tuple[list[bytes], dict[str, Any]]:
    """The run's lines with GPM on Tier 1's end and the estimate on Tier 3's start."""
    out: list[bytes] = []
    est: dict[str, Any] = {}
    table: list[dict[str, Any]] = []
    for line in lines:
        event = json.loads(line)
        if event["type"] == "kernel_table":
            table = event["kernels"]
        if event["type"] == "tier_finished" and event["tier"] == 1:
            event["gpm"] = gpm
        if event["type"] == "tier_started" and event["tier"] == 3:
            spec = {"max_tier3_s": budget}
            est = tier3_cost.estimate(spec, table, "saxpy", default_sections=DEFAULT_SECTIONS,
                                      setup_s=0.9, setup_basis="the Tier-1 child's start and "
                                                               "setup")
            event["estimate"] = est
        out.append(json.dumps(event).encode())
    return out, est


def events(lines: list[bytes]) -> list[protocol.Events]:
    evs = [protocol.decode_event(line) for line in lines]
    assert not any(isinstance(e, protocol.BadLine) for e in evs)
    return evs  # type: ignore[return-value]


def test_the_printer_shows_gpm_beside_tier1_and_the_estimate_in_dollars(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "240")
    lines, est = with_evidence(RECORDED.saxpy_run("20261124-120000-aaaaaa"), COPY_GPM)
    evs = events(lines)
    printer = Printer(as_json=False)
    printer.rate = RATE
    printer.batch(Batch(evs, [0.0] * len(evs), len(evs)))
    out = capsys.readouterr().out
    assert ("NVML GPM over 2.05 s (Tier 1's timed rounds): SM active 98%, SM occupancy 47%, "
            "tensor active 0%, DRAM bandwidth 89%, FP32 pipe 0%") in out
    # Beside Tier 1: after its end, before Tier 2 starts.
    assert out.index("■ tier 1") < out.index("NVML GPM over") < out.index("▶ tier 2")
    usd = est["seconds"] * RATE / 3600
    assert f"Tier 3 estimate: about {est['seconds']:.2f} s (${usd:.4f} at $3.99/h)" in out
    assert "1 launch(es) × 27 passes" in out
    assert "passes: gpuws's default sections: 27 passes" in out
    assert out.index("Tier 3 estimate") < out.index("ncu saxpy: 100%")  # before ncu's work
    fin3 = next(e for e in evs if isinstance(e, protocol.TierFinished) and e.tier == 3)
    error = (est["seconds"] - fin3.wall_s) / fin3.wall_s * 100
    assert f"(estimated {est['seconds']:.2f} s, {error:+.0f}%)" in out


def test_a_gpu_without_gpm_says_why_in_one_line(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "240")
    lines, _est = with_evidence(RECORDED.saxpy_run("20261124-120000-bbbbbb"), NO_GPM)
    evs = events(lines)
    Printer(as_json=False).batch(Batch(evs, [0.0] * len(evs), len(evs)))
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if "NVML GPM" in x]
    assert line.strip() == ("NVML GPM (Tier 1's timed rounds): not measured — NVML GPM is "
                            "not supported on GPU 0 (Hopper or newer is needed)")
    assert "no rate: pass --rate for dollars" in out


def test_the_panes_model_keeps_gpm_and_the_estimate() -> None:
    lines, est = with_evidence(RECORDED.saxpy_run("20261124-120000-cccccc"), COPY_GPM)
    model = RunModel("20261124-120000-cccccc")
    changed, _ = model.apply(events(lines))
    assert "tiers" in changed
    gpm = model.tiers[1].gpm
    assert gpm is not None and (gpm.sm_active_pct, gpm.dram_bw_pct) == (98.0, 89.0)
    estimate = model.tiers[3].estimate
    assert estimate is not None and estimate.seconds == pytest.approx(est["seconds"])


def test_the_export_carries_gpm_and_the_estimate_against_what_tier3_took() -> None:
    run_id = "20261124-120000-dddddd"
    lines, est = with_evidence(RECORDED.saxpy_run(run_id), COPY_GPM)
    with Store() as store:
        sid = store.open_session("h200", "ssh+sftp", msgspec.convert(RECORDED.probe(),
                                                                     protocol.Probe),
                                 RATE, started=RECORDED.T0 - 10)
        store.ingest_many(sid, lines)
        md = export_session(store, sid, now=RECORDED.T0 + 100)
    assert "### Device activity (NVML GPM)" in md
    assert "Device-wide averages over Tier 1's timed rounds (2.0 s), source: NVML GPM" in md
    assert "| DRAM bandwidth | 89% | NVML GPM |" in md
    assert "| FP64 pipe | — | NVML GPM |" in md  # not given: a dash, never a number
    assert "### Tier 3 estimate (before ncu started)" in md
    assert f"Tier 3 estimate: about {est['seconds']:.2f} s" in md
    fin3 = next(e for e in events(lines) if isinstance(e, protocol.TierFinished) and e.tier == 3)
    error = (est["seconds"] - fin3.wall_s) / fin3.wall_s * 100
    assert f"Tier 3 took {fin3.wall_s:.1f} s (estimated {est['seconds']:.2f} s, {error:+.0f}%)." \
        in md


def test_the_run_panes_show_gpm_and_a_running_tier3s_estimate() -> None:
    """The tier strip and the timing pane, mounted in a real Textual app."""
    lines, est = with_evidence(RECORDED.saxpy_run("20261124-120000-eeeeee"), COPY_GPM)
    evs = events(lines)
    # Up to Tier 3's start: ncu is still running, its estimate in the strip.
    upto = next(i for i, e in enumerate(evs)
                if isinstance(e, protocol.TierStarted) and e.tier == 3) + 1
    model = RunModel("20261124-120000-eeeeee", rate_usd_per_hour=RATE)
    model.apply(evs[:upto])

    class Panes(App[None]):
        def compose(self) -> ComposeResult:
            yield TierStrip(id="tiers")
            yield TimingPane(id="timing")

    def text(renderable: Any) -> str:
        console = Console(width=240, record=True)
        console.print(renderable)
        return console.export_text()

    async def go() -> tuple[str, str]:
        app = Panes()
        async with app.run_test(size=(240, 40)) as pilot:
            app.query_one(TierStrip).show(model, now=model.last_ts)
            app.query_one(TimingPane).show(model)
            await pilot.pause()
            strip = app.query_one(TierStrip).content
            gpm = app.query_one("#t1-gpm").content
            assert isinstance(strip, Table)
            return text(strip), text(gpm)

    strip, gpm = asyncio.run(go())
    assert "GPM SM 98% · tensor 0% · DRAM 89% · occ 47%" in strip
    usd = est["seconds"] * RATE / 3600
    assert f"running · est. {est['seconds']:.2f} s (${usd:.4f})" in strip
    assert gpm.strip() == ("NVML GPM over 2.05 s (Tier 1's timed rounds): SM active 98%, SM "
                           "occupancy 47%, tensor active 0%, DRAM bandwidth 89%, FP32 pipe 0%")


def test_doctor_and_the_export_say_whether_gpm_answered() -> None:
    """What the probe learnt by asking each GPU (one answered, one refused, one not asked)."""
    probe = RECORDED.probe()
    first = dict(probe["gpus"][0], gpm_supported=True, gpm_reason="")
    second = dict(probe["gpus"][0], index=1, gpm_supported=False,
                  gpm_reason="NVML refused GPM to this user (nvmlGpmSampleGet: no permission)")
    third = dict(probe["gpus"][0], index=2)
    probe["gpus"] = [first, second, third]
    gpus_ = msgspec.convert(probe["gpus"], list[protocol.Gpu])
    table = Console(width=240, record=True)
    table.print(doctor.gpu_table(gpus_))
    text = table.export_text()
    assert text.count("NVML GPM answers") == 1
    assert "NVML GPM: no — NVML refused GPM to this user (nvmlGpmSampleGet: no permission)" \
        in text
    with Store() as store:
        sid = store.open_session("h200", "ssh+sftp", msgspec.convert(probe, protocol.Probe),
                                 RATE, started=RECORDED.T0 - 10)
        md = export_session(store, sid, now=RECORDED.T0)
    assert "| GPU 0 NVML GPM | answers |" in md
    assert "| GPU 1 NVML GPM | does not answer: NVML refused GPM to this user" in md
    assert "GPU 2 NVML GPM" not in md  # not asked: nothing claimed


def test_a_cold_tier1s_gpm_names_what_its_window_held(capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "260")
    lines, _est = with_evidence(RECORDED.saxpy_run("20261124-120000-ffffff", mode="cold"),
                                dict(COPY_GPM, timed_share_pct=19.0))
    evs = events(lines)
    Printer(as_json=False).batch(Batch(evs, [0.0] * len(evs), len(evs)))
    out = capsys.readouterr().out
    assert ("NVML GPM over 2.05 s (Tier 1's timed rounds, with the L2 flush and 1 ms idle "
            "before each cold sample): SM active 98%") in out
    assert "(the timed calls took 19% of it)" in out
