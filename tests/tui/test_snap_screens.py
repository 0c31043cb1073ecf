"""Screenshots of Home, Connecting, the dashboard, the launcher, sessions and help.

Fed by real data: the session store holds the recorded H200 run, the dashboard shows the
H200 probe (tests/sessions/recorded.py, from the fixtures), the ncu plan the agent's own
selector makes for it, and telemetry parsed from the captured ``nvidia-smi --query-gpu``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from textual.command import CommandList, CommandPalette
from textual.pilot import Pilot
from textual.widgets import DataTable, Input

from gpuws import protocol
from gpuws.live.link import Target
from gpuws.live.telemetry import TelemetryHistory
from gpuws.remote_agent.pod.gpuinfo import TELEMETRY_FIELDS, parse_query_csv, samples_from_query
from gpuws.remote_agent.profilers.ncu_select import select_ncu
from gpuws.sessions.cost import economics
from gpuws.sessions.store import Store
from gpuws.tui.app import GpuwsApp, StartConnect
from gpuws.tui.messages import EconomicsTick, NcuPlanReady, TelemetryTick
from gpuws.tui.screens.connecting import ConnectingScreen
from gpuws.tui.screens.dashboard import DashboardScreen
from gpuws.tui.screens.help import HelpScreen
from gpuws.tui.screens.launcher import LauncherScreen
from gpuws.tui.screens.sessions import SessionsScreen
from tui.tuikit import (  # type: ignore[import-not-found]
    FIXTURES,
    SnapCompare,
    fill_store,
    h200_probe,
)
from tui.tuikit import frozen_app as app_on  # type: ignore[import-not-found]
from tui.tuikit import settle as until  # type: ignore[import-not-found]

UBUNTU = 'ID=ubuntu\nVERSION_ID="22.04"\n'


def h200_telemetry() -> TelemetryHistory:
    """The captured nvidia-smi reading as the agent's Telemetry events, 30 ticks of it."""
    text = (FIXTURES / "ncu-2025.3.1-h200" / "nvidia_smi_query.csv").read_text()
    query = ("index,name,uuid,driver_version,memory.total,memory.used,utilization.gpu,"
             "temperature.gpu,power.draw,clocks.sm,clocks.max.sm,compute_cap").split(",")
    sample = samples_from_query(parse_query_csv(text, query))
    # The capture holds every field the dashboard's gauges show (telemetry reads more
    # now: the memory clock and the clock-event reasons, which this capture predates).
    assert sample and set(TELEMETRY_FIELDS[:6]) <= set(query)
    history = TelemetryHistory()
    for _ in range(30):
        history.add(msgspec.convert({"type": "telemetry", "gpus": sample}, protocol.Telemetry))
    return history


def plan_for(probe: protocol.Probe, os_release: str = UBUNTU, root: bool = True
             ) -> protocol.NcuPlan:
    """What the agent's selector says about this probe's ncu installs."""
    plan = select_ncu([msgspec.to_builtins(t) for t in probe.ncu], probe.driver,
                      probe.gpus[0].compute_capability if probe.gpus else None,
                      cuda_driver=probe.cuda_driver, os_release=os_release, is_root=root,
                      home=probe.home)
    return msgspec.convert(plan, protocol.NcuPlan)


def dashboard(probe: protocol.Probe, plan: protocol.NcuPlan
              ) -> Callable[[Pilot[Any]], Awaitable[None]]:
    sid, _ = fill_store()  # before the app opens the store

    async def run_before(pilot: Pilot[Any]) -> None:
        app = pilot.app
        assert isinstance(app, GpuwsApp)
        with Store() as s:
            econ = economics(s, sid)
        screen = DashboardScreen("h200", probe, "ssh+sftp", h200_telemetry())
        await app.push_screen(screen)
        screen.post_message(TelemetryTick())
        screen.post_message(NcuPlanReady(plan))
        screen.post_message(EconomicsTick(econ))
        await pilot.pause(0.3)

    return run_before


def test_home(snap_compare: SnapCompare, snapshot_home: Path) -> None:
    """Hosts from the ssh config (no wildcards) and from the store; recent sessions."""
    fill_store()
    config = snapshot_home.parent / "ssh_config"
    config.write_text("Host *\n  ServerAliveInterval 30\n"
                      "Host runpod-h100 lambda-a100\n  User root\n  Port 22022\n"
                      "Host runpod-h100\n  HostName 203.0.113.7\n"
                      "Host lambda-a100\n  HostName 198.51.100.20\n  User ubuntu\n"
                      "Host !bastion *.internal\n  User ops\n")
    app = app_on(ssh_config=str(config))

    async def run_before(pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: pilot.app.screen.query_one("#hosts", DataTable).row_count > 0)

    assert snap_compare(app, terminal_size=(100, 28), run_before=run_before)


def test_connecting_failure_shows_cause_and_remedy(snap_compare: SnapCompare) -> None:
    """A pod without the python it was told to use: deploy fails, Retry / Back offered."""
    app = app_on(StartConnect(Target("local", python="/nonexistent/python3")))

    async def run_before(pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: isinstance(pilot.app.screen, ConnectingScreen)
                    and pilot.app.screen.state == "failed")

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_connecting_offers_to_start_a_stopped_host(
        snap_compare: SnapCompare, snapshot_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host that refuses connections and has a `start` command: Start pod offered.

    Port 1 on loopback is closed (nothing listens on tcpmux), so the failure is always
    the same refused connection; the start command is never run here.
    """
    snapshot_home.mkdir(parents=True)
    ssh_config = snapshot_home.parent / "ssh_config"
    ssh_config.write_text("Host pod\n  HostName 127.0.0.1\n  Port 1\n  User gpuws\n")
    config = snapshot_home.parent / "config.toml"
    config.write_text('[hosts.pod]\nstart = ["podctl", "start", "--pod", "abc 123"]\n')
    monkeypatch.setenv("GPUWS_CONFIG", str(config))
    app = app_on(StartConnect(Target("pod", ssh_config=str(ssh_config))))

    async def run_before(pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: isinstance(pilot.app.screen, ConnectingScreen)
                    and pilot.app.screen.state == "failed")

    assert snap_compare(app, terminal_size=(80, 28), run_before=run_before)


def test_dashboard_h200(snap_compare: SnapCompare, snapshot_home: Path) -> None:
    """The H200 pod at 80×24: ncu 2025.3.1 fits, counters allowed, telemetry, cost."""
    probe = h200_probe()
    assert snap_compare(app_on(), terminal_size=(80, 24),
                        run_before=dashboard(probe, plan_for(probe)))


def test_dashboard_blocked_and_no_ncu(snap_compare: SnapCompare, snapshot_home: Path) -> None:
    """An L4 with driver 570, no ncu and counters blocked: remedies, install plan, button."""
    probe = msgspec.structs.replace(
        h200_probe(), driver="570.172.08", cuda_driver="12.8", ncu=[], uid=1000, user="user",
        home="/home/user",
        gpus=[protocol.Gpu(index=0, name="NVIDIA L4", memory_total_mib=23034.0,
                           compute_capability="8.9", sm_count=58)],
        counters=protocol.Counters(rm_profiling_admin_only=True, cap_sys_admin=False,
                                   cap_perfmon=False, uid=1000, verdict="blocked",
                                   reason="RmProfilingAdminOnly is 1 and this process has "
                                          "neither CAP_SYS_ADMIN nor CAP_PERFMON"))
    plan = plan_for(probe, root=False)
    assert plan.install_plan and plan.selected is None
    assert snap_compare(app_on(), terminal_size=(130, 46), run_before=dashboard(probe, plan))


def test_launcher(snap_compare: SnapCompare) -> None:
    """Bundled kernels with their parameters, tiers, Tier 1 and Tier 3 options."""

    async def run_before(pilot: Pilot[Any]) -> None:
        await pilot.app.push_screen(LauncherScreen([("20261121-130950-9ba123 · builtin:saxpy",
                                                     "20261121-130950-9ba123")]))
        await pilot.pause(0.2)

    assert snap_compare(app_on(), terminal_size=(100, 40), run_before=run_before)


def test_sessions(snap_compare: SnapCompare, snapshot_home: Path) -> None:
    """Sessions with host, GPU, duration and cost; the selected one's runs."""
    fill_store()

    async def run_before(pilot: Pilot[Any]) -> None:
        await pilot.app.push_screen(SessionsScreen())
        await until(pilot, lambda: pilot.app.screen.query_one("#runs", DataTable).row_count > 0)

    assert snap_compare(app_on(), terminal_size=(100, 24), run_before=run_before)


def test_help(snap_compare: SnapCompare) -> None:
    """The help screen lists the keys of the screen it was opened from."""

    async def run_before(pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: pilot.app.screen.query("#hosts"))
        # Home opens typing into its destination box, where ? is a character: the hosts
        # list first, where it is the key.
        await pilot.press("down", "question_mark")
        await until(pilot, lambda: isinstance(pilot.app.screen, HelpScreen))

    assert snap_compare(app_on(), terminal_size=(80, 24), run_before=run_before)


def test_launcher_refuses_a_bad_parameter(snap_compare: SnapCompare) -> None:
    """A builtin parameter of the wrong type: refused in the form, with what is valid."""

    async def run_before(pilot: Pilot[Any]) -> None:
        await pilot.app.push_screen(LauncherScreen([]))
        await pilot.pause(0.2)
        pilot.app.screen.query_one("#param-n", Input).value = "abc"
        pilot.app.screen.query_one("#target-ci", Input).value = "2"
        await pilot.press("ctrl+r")
        # The refusal scrolls into view (animated): wait for it, then let it settle.
        await until(pilot, lambda: str(pilot.app.screen.query_one("#error").render()).strip())
        await pilot.pause(0.3)

    # Tall enough for the whole form: the scrollbar's fractional thumb made the picture
    # depend on timing.
    assert snap_compare(app_on(), terminal_size=(100, 60), run_before=run_before)


async def _palette(pilot: Pilot[Any], query: str) -> list[str]:
    """Open Ctrl+P on Home, type ``query``; the names of the commands it offers."""
    await until(pilot, lambda: pilot.app.screen.query("#hosts"))
    await pilot.press("ctrl+p")
    await until(pilot, lambda: isinstance(pilot.app.screen, CommandPalette))
    await pilot.press(*query)
    await pilot.pause(0.5)
    options = pilot.app.screen.query_one(CommandList)
    return [str(options.get_option_at_index(i).prompt).split("\n")[0]
            for i in range(options.option_count)]


def test_palette_finds_replay(snap_compare: SnapCompare) -> None:
    """Typing "replay" in the palette finds gpuws's replay commands, not Textual's."""

    async def run_before(pilot: Pilot[Any]) -> None:
        await _palette(pilot, "replay")

    assert snap_compare(app_on(), terminal_size=(80, 24), run_before=run_before)


@pytest.mark.parametrize("query,command", [
    ("connect", "Connect to a pod"), ("new run", "New run"),
    ("replay", "Replay a recorded run"), ("export", "Export the session as markdown"),
    ("sessions", "Sessions"), ("compare", "Compare with the baseline"),
    ("attach", "Attach to a run on the pod"), ("cancel", "Cancel the run"),
])
async def test_palette_offers_gpuws_actions_by_name(query: str, command: str) -> None:
    app = app_on()
    async with app.run_test(size=(100, 30)) as pilot:
        names = await _palette(pilot, query)
        assert names and names[0] == command, names


async def test_palette_commands_say_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chosen without a pod, a pod's command runs and says what it needs."""
    app = app_on()
    notes: list[str] = []
    monkeypatch.setattr(app, "notify", lambda message, **_: notes.append(message))
    async with app.run_test(size=(100, 30)) as pilot:
        await _palette(pilot, "new run")
        await pilot.press("enter")
        await pilot.pause(0.3)
    assert notes == ["connect to a pod first"]
