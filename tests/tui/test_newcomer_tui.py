"""What a newcomer met in the TUI (issue 24, "The TUI"): a clock that stopped between
events, a destination box that looked focused while keys went to hotkeys, a replay that
did not leave, run ids cut on Sessions, a dashboard that moved under the reader, a
launcher that kept Tier 1 ticked for commands and forgot the kernel."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest
from textual.geometry import Region
from textual.pilot import Pilot
from textual.screen import Screen
from textual.widgets import Checkbox, DataTable, Input, Label, Select, Static

from gpuws import protocol
from gpuws.live.link import Target
from gpuws.live.storeio import StoreHandle
from gpuws.live.telemetry import TelemetryHistory
from gpuws.remote_agent.pod.gpuinfo import parse_query_csv, samples_from_query
from gpuws.remote_agent.profilers.ncu_select import select_ncu
from gpuws.remote_agent.profilers.nsys_provision import plan_nsys
from gpuws.sessions.cost import economics
from gpuws.sessions.store import Store
from gpuws.tui.app import GpuwsApp, StartConnect, StartHome, StartReplay
from gpuws.tui.hosts import last_workload
from gpuws.tui.messages import (
    EconomicsTick,
    NcuPlanReady,
    NsysPlanReady,
    RunEvents,
    TelemetryTick,
)
from gpuws.tui.screens.confirm import ConfirmScreen
from gpuws.tui.screens.dashboard import DashboardScreen
from gpuws.tui.screens.home import HomeScreen
from gpuws.tui.screens.launcher import LauncherScreen
from gpuws.tui.screens.run import RunScreen
from gpuws.tui.screens.sessions import SessionsScreen
from gpuws.tui.widgets.marked import MarkedRadioButton
from gpuws.tui.widgets.pod.cost_ticker import CostTicker
from tui.tuikit import (  # type: ignore[import-not-found]
    FIXTURES,
    RECORDING,
    fill_store,
    h200_probe,
    recorded_events,
    until,
)

NO_SSH_CONFIG = "/nonexistent/gpuws-test/ssh_config"


class Clock:
    """The app's wall clock, moved by the test (the run screen ages a live run by it)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def _send(pilot: Pilot[Any], screen: RunScreen, events: list[protocol.Events]) -> None:
    screen.post_message(RunEvents(screen.run_id, events, [0.0] * len(events)))
    await pilot.pause()


async def test_a_live_runs_clock_moves_between_events_and_stops_at_the_end() -> None:
    """The title read "running · 0.3 s" while the workload had run 8.5 s: it moved only
    when an event came. It follows the clock every second now, and stops at the end."""
    events = recorded_events()
    started = events[0].ts
    clock = Clock(started)
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG, now=clock)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = RunScreen(events[0].run_id or "", live=True, backfill=False)
        await app.push_screen(screen)
        await _send(pilot, screen, events[:2])  # started, Tier 1 started: then silence
        await until(pilot, lambda: "running · " in screen.sub_title)
        clock.now = started + 8.5  # 8.5 s later, no event since
        await until(pilot, lambda: "running · 8.5 s" in screen.sub_title)
        assert screen.clock_running
        await _send(pilot, screen, events[2:])  # the rest, to run_finished
        finished = events[-1]
        assert isinstance(finished, protocol.RunFinished)
        clock.now = started + 600  # the run's end, not the clock, decides what it reads
        await until(pilot, lambda: not screen.clock_running)
        assert f" {finished.wall_s:.1f} s" in screen.sub_title, screen.sub_title
        await app.shutdown()


async def test_esc_leaves_a_replay_while_it_plays() -> None:
    """The footer's "esc Leave replay" leaves mid-play too (a paced replay, not finished:
    tests/security/test_untrusted_replay.py covers the finished one), exit status 0."""
    app = GpuwsApp(StartReplay(str(RECORDING), speed=0.05), store=StoreHandle.throwaway())
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, RunScreen)
                    and bool(app.screen.query("RunPanes"))
                    and app.screen.panes.model.started is not None)
        screen = app.screen
        assert isinstance(screen, RunScreen) and screen.panes.model.finished is None
        # The footer offers it (the one of esc's three meanings that is true here).
        assert "Leave replay" in {b.binding.description for b in
                                  screen.active_bindings.values() if b.enabled}
        await pilot.press("escape")
        await until(pilot, lambda: app.return_code is not None)
    assert app.return_code == 0


async def test_esc_leaves_a_stored_runs_replay_back_to_sessions() -> None:
    """Opened from Sessions, esc goes back to Sessions (gpuws goes on)."""
    fill_store()
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, HomeScreen)
                    and any(t.row_count for t in app.screen.query("#hosts").results(DataTable)))
        app.open_sessions()
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen)
                    and any(t.row_count for t in app.screen.query("#runs").results(DataTable)))
        sessions = app.screen
        await pilot.press("tab", "enter")  # the runs table; Enter replays the run
        await until(pilot, lambda: isinstance(app.screen, RunScreen)
                    and bool(app.screen.query("RunPanes"))
                    and app.screen.panes.model.finished is not None)
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is sessions)
        assert app.return_code is None
        await app.shutdown()


async def test_home_types_a_host_name_into_the_box_and_no_hotkey_fires() -> None:
    """The "Connect to" box looked focused but was not: typing "server-1" opened Sessions
    at the "s". The box has the focus when Home opens, every letter goes into it, the footer
    offers no letter key then; ↓ leads to the hosts, where the letters are keys again."""
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, HomeScreen)
                    and any(t.row_count for t in app.screen.query("#hosts").results(DataTable)))
        home = app.screen
        box = home.query_one("#dest", Input)
        assert app.focused is box
        await pilot.press(*"server-1", "question_mark", "q", "c", "slash")
        await pilot.wait_for_scheduled_animations()
        assert app.screen is home and box.value == "server-1?qc/"
        offered = {b.binding.key for b in home.active_bindings.values() if b.enabled}
        assert "down" in offered and not offered & {"s", "q", "question_mark", "slash,c"}
        await pilot.press("down")
        await until(pilot, lambda: isinstance(app.focused, DataTable))
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen))
        await app.shutdown()


@pytest.mark.parametrize("width", [80, 160])
async def test_sessions_show_run_ids_whole(width: int) -> None:
    """Run ids were cut on Sessions even at 160 columns ("vs 20261121-130950-9ba1"); a
    recording's ids may be 64 characters long (the agent's RUN_ID_RE)."""
    sid, run_id = fill_store()
    longest = "r" + "0123456789abcdef" * 3 + "-longest-run-id"
    with Store() as store:
        store.ingest_many(sid, recorded_events(longest))
        store.set_baseline_of(longest, run_id)
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG)
    async with app.run_test(size=(width, 40)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, HomeScreen)
                    and any(t.row_count for t in app.screen.query("#hosts").results(DataTable)))
        app.open_sessions()
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen) and any(
            t.row_count == 2 for t in app.screen.query("#runs").results(DataTable)))
        runs = app.screen.query_one("#runs", DataTable)
        # What the table draws, scrolled right as far as it goes where it is wider.
        seen = set()
        for x in range(0, runs.virtual_size.width, max(1, runs.size.width // 2)):
            runs.scroll_to(x=x, animate=False)
            await pilot.pause()
            seen |= {runs.render_line(y).text for y in range(runs.size.height)}
        drawn = "\n".join(seen)
        assert run_id in drawn and longest in drawn
        assert f"vs {run_id}" in drawn
        await app.shutdown()


def _marks(screen: Screen[Any]) -> dict[str, str]:
    """What each workload kind's button draws (its mark and label), as text."""
    return {b.id or "": b.render().plain for b in screen.query(MarkedRadioButton)}


async def test_launcher_kinds_differ_by_shape_and_commands_untick_tier1() -> None:
    """A command always skips Tier 1: it is unticked and marked so (it stayed ticked), and
    the other kinds get back what it was. The chosen kind differs by its mark, not only by
    colour."""
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG)
    async with app.run_test(size=(100, 40)) as pilot:
        launcher = LauncherScreen([], probe=h200_probe())
        await app.push_screen(launcher)
        await until(pilot, lambda: bool(launcher.query("#params Input")))
        marks = _marks(launcher)
        assert "●" in marks["kind-builtin"] and "○" in marks["kind-cmd"], marks
        t1 = launcher.query_one("#t1", Checkbox)
        assert t1.value and not t1.disabled and "✓" in t1.render().plain
        launcher.query_one("#kind-cmd", MarkedRadioButton).value = True  # as a click does
        await until(pilot, lambda: launcher.kind == "cmd" and t1.disabled
                    and "○" in _marks(launcher)["kind-builtin"])
        marks = _marks(launcher)
        assert "○" in marks["kind-builtin"] and "●" in marks["kind-cmd"], marks
        assert not t1.value and "not for commands" in t1.render().plain
        launcher.query_one("#cmd", Input).value = "echo hi"
        assert launcher.options().tiers == "2,3"
        launcher.query_one("#kind-builtin", MarkedRadioButton).value = True
        await until(pilot, lambda: launcher.kind == "builtin" and not t1.disabled)
        assert t1.value and "not for commands" not in t1.render().plain
        await app.shutdown()


async def test_launcher_remembers_the_kernel_and_warns_before_a_gpu_run_without_a_gpu(
        ) -> None:
    """On the local pod (this machine: no GPU, as its real probe says): the launcher says
    so, asks before launching a bundled kernel (which would stop at once), and opens again
    on the kernel and parameters chosen before."""
    app = GpuwsApp(StartConnect(Target("local")))
    async with app.run_test(size=(100, 40)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
        link = app.link
        assert link is not None
        if link.probe.gpus:
            pytest.skip("this machine has a GPU: nothing to warn about")
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, LauncherScreen)
                    and bool(app.screen.query("#params Input")))
        launcher = app.screen
        assert isinstance(launcher, LauncherScreen)
        note = launcher.query_one("#no-gpu-note", Label)
        assert note.display and "This pod has no GPU" in note.render().plain
        launcher.query_one("#builtin", Select).value = "gemm"
        await until(pilot, lambda: bool(launcher.query("#param-m")))
        launcher.query_one("#param-m", Input).value = "1024"
        await pilot.press("ctrl+r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("escape")  # no: nothing starts
        await until(pilot, lambda: app.screen is launcher)
        assert not [w for w in app.workers if w.group == "run"]
        await pilot.press("escape")  # back to the dashboard; the choice is remembered
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, LauncherScreen)
                    and app.screen is not launcher and bool(app.screen.query("#param-m")))
        again = app.screen
        assert str(again.query_one("#builtin", Select).value) == "gemm"
        assert again.query_one("#param-m", Input).value == "1024"
        await app.shutdown()


def test_the_last_workload_run_on_a_pod_is_found_for_the_launcher() -> None:
    """Across sessions: the newest run on that pod (the h200 recording's saxpy), none for a
    pod never used."""
    fill_store()
    with Store() as store:
        assert last_workload(store, "h200") == "builtin:saxpy"
        assert last_workload(store, "never-used") is None


def h200_samples() -> list[Any]:
    """The H200's captured ``nvidia-smi --query-gpu`` reading, as the agent parses it."""
    text = (FIXTURES / "ncu-2025.3.1-h200" / "nvidia_smi_query.csv").read_text()
    query = ("index,name,uuid,driver_version,memory.total,memory.used,utilization.gpu,"
             "temperature.gpu,power.draw,clocks.sm,clocks.max.sm,compute_cap").split(",")
    return samples_from_query(parse_query_csv(text, query))


def ncu_plan_for(probe: protocol.Probe) -> protocol.NcuPlan:
    """What the agent's selector says about this probe's ncu installs."""
    plan = select_ncu([msgspec.to_builtins(t) for t in probe.ncu], probe.driver,
                      probe.gpus[0].compute_capability, cuda_driver=probe.cuda_driver,
                      os_release='ID=ubuntu\nVERSION_ID="22.04"\n', is_root=True,
                      home=probe.home)
    return msgspec.convert(plan, protocol.NcuPlan)


def nsys_plan_with_nsys() -> protocol.NsysPlan:
    """The agent's nsys choice where a working nsys is installed."""
    plan = plan_nsys([{"path": "/opt/nvidia/nsight-systems/2025.1.3/bin/nsys",
                       "version": "2025.1.3", "error": None}], "13.0",
                     'ID=ubuntu\nVERSION_ID="24.04"\n', True, "x86_64")
    return msgspec.convert(dict(plan, ts=time.time()), protocol.NsysPlan)


def _places(screen: Screen[Any]) -> dict[str, Region]:
    """Where the dashboard's parts are drawn (screen coordinates)."""
    parts = {"telemetry": "#telemetry-title", "gauges": "#gauges", "cost": "#cost",
             "agent": "#agent-log", "pod": "#pod", "counters": "#counters", "ncu": "#ncu-text",
             "nsys": "NsysPanel .title"}
    return {name: screen.query_one(selector).region for name, selector in parts.items()}


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_the_dashboard_does_not_move_when_its_data_arrives(size: tuple[int, int]) -> None:
    """It visibly reflowed a second after it appeared: the first sample showed the gauges,
    the cost grew from one line to three, the ncu and nsys answers pushed what was below.
    Everything has its place at mount now; the H200's real answers fill it in."""
    probe = h200_probe()
    history = TelemetryHistory()
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG)
    async with app.run_test(size=size) as pilot:
        screen = DashboardScreen("h200", probe, "ssh+sftp", history)
        await app.push_screen(screen)
        # Laid out (the Agent block, once the last thing to get a height, waits hidden for
        # the agent's first message now).
        await until(pilot, lambda: screen.query_one(CostTicker).region.height > 0)
        before = _places(screen)
        for _ in range(3):
            history.add(msgspec.convert({"type": "telemetry", "gpus": h200_samples()},
                                        protocol.Telemetry))
        screen.post_message(TelemetryTick())
        screen.post_message(NcuPlanReady(ncu_plan_for(probe)))
        screen.post_message(NsysPlanReady(nsys_plan_with_nsys()))
        fill_store()
        with Store() as s:
            econ = economics(s, s.sessions()[0].id)
        screen.post_message(EconomicsTick(econ))
        await until(pilot, lambda: "waiting" not in
                    screen.query_one("#telemetry-title", Label).render().plain
                    and "$" in screen.query_one(CostTicker).render().plain
                    and "✓ nsys" in screen.query_one("#nsys-text", Static).render().plain
                    and "✓ ncu" in screen.query_one("#ncu-text", Static).render().plain)
        assert _places(screen) == before
        await app.shutdown()
