"""What a newcomer met in the TUI, third round (issue 34, the TUI findings left: 8, 10, 12,
13a, 17, 18, 19's toast, 22, 23's watch keys, 28). Each test failed before its fix."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import msgspec
import pytest
from rich.console import Console
from rich.text import Text
from textual.content import Content
from textual.message import Message
from textual.notifications import Notify
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets import DataTable, Input, Label, Static

from gpuws import protocol
from gpuws.live.link import Target
from gpuws.live.telemetry import TelemetryHistory
from gpuws.live.watchloop import Iteration, WatchStatus
from gpuws.sessions.store import Store
from gpuws.tui.app import GpuwsApp, StartConnect, StartHome, run_end_line
from gpuws.tui.messages import NcuPlanReady, NsysPlanReady
from gpuws.tui.screens.confirm import ConfirmScreen
from gpuws.tui.screens.dashboard import DashboardScreen
from gpuws.tui.screens.help import HelpScreen
from gpuws.tui.screens.home import HomeScreen
from gpuws.tui.screens.launcher import LauncherScreen
from gpuws.tui.screens.pick_run import PickRunScreen
from gpuws.tui.screens.results import ResultsScreen
from gpuws.tui.screens.run import RunScreen
from gpuws.tui.screens.sessions import SessionsScreen
from gpuws.tui.screens.watch import WatchScreen
from gpuws.tui.widgets.marked import MarkedRadioButton
from gpuws.tui.widgets.run.output_log import WRAP_MARK
from gpuws.tui.widgets.run.roofline import Roofline
from gpuws.tui.widgets.run.rules import SPEEDUP_NOTE, RuleList
from gpuws.tui.widgets.run.run_panes import render_static
from tui.test_newcomer_tui import (  # type: ignore[import-not-found]
    ncu_plan_for,
    nsys_plan_with_nsys,
)
from tui.tuikit import (  # type: ignore[import-not-found]
    RECORDING,
    fill_store,
    h200_probe,
    launch_command,
    recorded_events,
    replay_app,
    until,
)

NO_SSH_CONFIG = "/nonexistent/gpuws-test/ssh_config"


def _toasts(messages: list[Message]) -> list[str]:
    return [m.notification.message for m in messages if isinstance(m, Notify)]


# ---------------------------------------------------------------- 19: the toast's words
async def test_a_cancelled_runs_toast_says_cancelled_once_not_finished() -> None:
    """A cancel showed two toasts, "run … finished" and "run …: cancelled"; one now, saying
    how the run ended. On the local pod (the agent here; a command needs no GPU)."""
    messages: list[Message] = []
    app = GpuwsApp(StartConnect(Target("local")))
    async with app.run_test(size=(100, 30), message_hook=messages.append) as pilot:
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
        screen = await launch_command(pilot, "echo started; sleep 60")
        await until(pilot, lambda: screen.panes.model.tiers.get(0) is not None
                    and screen.run_id in app.runs_going)
        await pilot.press("c")
        await until(pilot, lambda: screen.panes.model.finished is not None
                    and any(screen.run_id in t for t in _toasts(messages)))
        # Whatever the cancel worker would have said has been said by now.
        await until(pilot, lambda: not [w for w in app.workers if w.group == "run"
                                        and w.is_running])
        about = [t for t in _toasts(messages) if screen.run_id in t]
        assert about == [f"run {screen.run_id} cancelled after "
                         f"{about[0].rsplit('after ', 1)[-1]}"], about
        assert not any("finished" in t for t in about)
        await app.shutdown()


def test_a_runs_end_toast_names_ok_failed_and_why() -> None:
    """Not "finished" for all three ends."""
    ok = protocol.RunFinished(run_id="r1", seq=9, ts=1.0, status="ok", wall_s=2.5)
    assert run_end_line("r1", ok) == "run r1 ok in 2.50 s"
    failed = protocol.RunFinished(run_id="r1", seq=9, ts=1.0, status="failed", wall_s=0.4,
                                  exit_code=3)
    assert run_end_line("r1", failed) == "run r1 failed: exit code 3"
    # The pod's words: an escape sequence is shown, never obeyed; a long reason is cut.
    hostile = protocol.RunFinished(run_id="r1", seq=9, ts=1.0, status="failed", wall_s=0.4,
                                   error="\x1b]0;pwned\x07" + "x" * 5000)
    line = run_end_line("r1", hostile)
    assert "\x1b" not in line and "\x07" not in line and len(line) < 260




# ---------------------------------------------------------------- the new-run form
def _no_gpu_probe() -> protocol.Probe:
    """The H200 pod's probe with no GPU, as the agent reports a machine without a driver."""
    return msgspec.structs.replace(h200_probe(), gpus=[], gpu_error=(
        "no NVIDIA driver: libnvidia-ml.so.1 not found and nvidia-smi not on PATH"))


def _drawn(widget: Widget) -> str:
    """What a widget shows, as plain text with its whitespace collapsed (a wrapped
    sentence reads whole); a rich renderable (the help's table) printed wide."""
    shown = widget.content if isinstance(widget, Static) else widget.render()
    if isinstance(shown, str):
        return " ".join(shown.split())
    if isinstance(shown, (Text, Content)):
        return " ".join(shown.plain.split())
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(shown)
    return " ".join(console.export_text().split())


async def _form(pilot: Pilot[Any], probe: protocol.Probe | None = None,
                workload: str | None = None) -> LauncherScreen:
    launcher = LauncherScreen([], probe=probe or h200_probe(), workload=workload)
    await pilot.app.push_screen(launcher)
    await until(pilot, lambda: bool(launcher.query("#params Input")))
    return launcher


@pytest.mark.parametrize(("workload", "field"), [(None, "builtin"), ("cmd:echo hi", "cmd"),
                                                  ("file:bench.py", "file")])
async def test_the_form_opens_with_the_focus_in_the_chosen_kinds_field(
        workload: str | None, field: str) -> None:
    """Finding 22: an empty form had the focus on the kind buttons, a remembered command
    in its box. Now always the chosen kind's field, so typing goes where it is meant."""
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG)
    async with app.run_test(size=(80, 24)) as pilot:
        launcher = await _form(pilot, workload=workload)
        await until(pilot, lambda: getattr(app.focused, "id", None) == field)
        if field == "cmd":
            await pilot.press("end", *" --x")
            await until(pilot, lambda: launcher.query_one("#cmd", Input).value == "echo hi --x")
        await app.shutdown()


def _watch_offered(launcher: LauncherScreen) -> bool:
    return any(b.enabled for b in launcher.active_bindings.values()
               if b.binding.action == "watch")


def _error(launcher: LauncherScreen) -> str:
    return _drawn(launcher.query_one("#error", Static))


async def test_watch_is_offered_only_with_something_to_watch_and_says_so_in_the_forms_words(
        tmp_path: Path) -> None:
    """Finding 10: the footer offered ^t Watch for every kind, and its refusal spoke the
    CLI's flags ("give -W DIR (the project), or -w file:PATH"). The key is dimmed until
    there is something to watch; what it refuses names the form's fields."""
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG)
    async with app.run_test(size=(100, 40)) as pilot:
        launcher = await _form(pilot)
        assert not _watch_offered(launcher)  # a bundled kernel, no project dir
        await pilot.press("ctrl+t")
        await pilot.wait_for_scheduled_animations()
        assert app.watch_loop is None and "-W" not in _error(launcher)
        launcher.query_one("#kind-file", MarkedRadioButton).value = True
        await until(pilot, lambda: launcher.kind == "file" and _watch_offered(launcher))
        launcher.query_one("#file", Input).value = "no-such-bench.py"
        await pilot.press("ctrl+t")
        await until(pilot, lambda: "no such file" in _error(launcher))
        said = _error(launcher)
        assert "Python file 'no-such-bench.py'" in said and "-w" not in said, said
        launcher.query_one("#workspace", Input).value = str(tmp_path / "not-there")
        await pilot.press("ctrl+t")
        await until(pilot, lambda: "project dir" in _error(launcher))
        assert "Workspace" in _error(launcher) and "-W" not in _error(launcher)
        assert app.watch_loop is None
        await app.shutdown()


async def test_watch_refuses_a_gpu_workload_on_a_pod_without_a_gpu(tmp_path: Path) -> None:
    """Finding 8: Launch asked first, Watch started and failed the same way on every save.
    A Python file on a pod with no GPU is refused before the loop starts, cause and remedy
    in one line."""
    bench = tmp_path / "bench.py"
    bench.write_text("def run():\n    pass\n")
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG)
    async with app.run_test(size=(100, 40)) as pilot:
        launcher = await _form(pilot, probe=_no_gpu_probe(), workload=f"file:{bench}")
        await until(pilot, lambda: launcher.kind == "file" and _watch_offered(launcher))
        await pilot.press("ctrl+t")
        await until(pilot, lambda: "This pod has no GPU" in _error(launcher))
        said = _error(launcher)
        assert "every save" in said and "connect to a pod with a GPU" in said, said
        assert app.watch_loop is None and app.screen is launcher
        await app.shutdown()


async def test_watch_of_a_command_asks_first_and_no_means_nothing_starts(
        tmp_path: Path) -> None:
    """Finding 8: a command has no Tier 1, so each save added a row with no median. Watch
    asks once, saying so; Esc (or Enter, on Cancel) starts nothing."""
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG)
    async with app.run_test(size=(100, 40)) as pilot:
        launcher = await _form(pilot, workload="cmd:make test")
        launcher.query_one("#workspace", Input).value = str(tmp_path)
        await until(pilot, lambda: launcher.kind == "cmd" and _watch_offered(launcher))
        await pilot.press("ctrl+t")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert "no Tier 1" in app.screen.question
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is launcher)
        assert app.watch_loop is None and not [w for w in app.workers if w.group == "watch"]
        await app.shutdown()


async def test_the_forms_notes_wrap_at_80_columns() -> None:
    """Finding 17: the no-GPU note ended at "(no NVIDIA driver: libnvidia-ml.so.1" at
    80x24 (its remedy was never seen, even at 160), the project dir's explanation was a
    placeholder cut at "synced to the pod; the run". Both read whole now."""
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG)
    async with app.run_test(size=(80, 24)) as pilot:
        launcher = await _form(pilot, probe=_no_gpu_probe())
        note = launcher.query_one("#no-gpu-note", Label)
        # Its ~190 characters on lines of at most 80 - 18 (the labels' column): 4 lines.
        await until(pilot, lambda: note.size.height >= 3)
        assert "a command runs, without Tiers 2 and 3." in _drawn(note), _drawn(note)
        assert note.region.right <= 80
        helps = [h for h in launcher.query(".help").results(Label) if h.display]
        for h in helps:  # none runs off the screen's right edge
            assert h.region.right <= 80 and h.size.height * h.content_size.width >= len(
                _drawn(h)), (_drawn(h), h.region)
        said = [_drawn(h) for h in helps]
        assert any("which executes in it" in h and "every save in it" in h for h in said)
        assert any(h.endswith("(memcpy/kernel)") for h in said if "float4" in h), said
        await app.shutdown()


# ---------------------------------------------------------------- 12: a replayed file
def _offered(screen: Any, action: str) -> bool:
    return any(b.enabled for b in screen.active_bindings.values() if b.binding.action == action)


async def test_a_replayed_file_offers_no_baseline_and_its_export_lasts(
        tmp_path: Path) -> None:
    """Finding 12: in a replay of a recording, b said "… is now the baseline" and e wrote
    gpuws-session-ID.md, both of a throwaway session gone on leaving. b is not offered (a
    recording never enters the person's store: it is untrusted); e writes a report named
    after the recording, which is what lasts, and says the replay is not kept."""
    messages: list[Message] = []
    app = replay_app(RECORDING)
    app.export_dir = tmp_path
    async with app.run_test(size=(100, 30), message_hook=messages.append) as pilot:
        await until(pilot, lambda: isinstance(app.screen, RunScreen)
                    and bool(app.screen.query("RunPanes"))
                    and app.screen.panes.model.finished is not None)
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ResultsScreen)
                    and app.screen.results is not None)
        results = app.screen
        assert not _offered(results, "baseline")
        await pilot.press("b")
        await pilot.press("e")
        report = tmp_path / "gpuws-replay-saxpy_h200.md"
        await until(pilot, lambda: report.is_file()
                    and any("not kept" in t for t in _toasts(messages)))
        assert "saxpy" in report.read_text()
        assert not any("baseline" in t for t in _toasts(messages)), _toasts(messages)
        assert [p.name for p in tmp_path.iterdir()] == [report.name]
        await app.shutdown()


async def test_a_replays_artifacts_name_the_report_beside_the_recording() -> None:
    """Finding 12's last part: the artifacts screen of a replayed recording said "connect
    to the pod to pull them" (no pod is connected, and the recording's is gone) while the
    same report ships beside the recording. It says where they are and names that file."""
    from gpuws.tui.screens.artifacts import ArtifactsScreen

    app = replay_app(RECORDING)
    async with app.run_test(size=(160, 30)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, RunScreen)
                    and bool(app.screen.query("RunPanes"))
                    and app.screen.panes.model.finished is not None)
        await pilot.press("f")
        await until(pilot, lambda: isinstance(app.screen, ArtifactsScreen)
                    and "artifact" in _drawn(app.screen.query_one("#art-status")))
        status = _drawn(app.screen.query_one("#art-status"))
        assert "connect to the pod" not in status, status
        assert "a replay: they stay on the pod that recorded it" in status, status
        assert "gpuws report " in status and "saxpy_h200.ncu-rep" in status, status
        await app.shutdown()


# ---------------------------------------------------------------- 23: the watch screen's keys
async def test_the_watch_screens_help_lists_b_and_enter_before_any_median() -> None:
    """Finding 23: b became a key only once an iteration had samples, and Enter (results)
    was the table's: on a pod where every iteration failed, the help named neither. Both
    are listed now, b dimmed in the footer until it can act."""
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = WatchScreen("file:bench.py", [Path("/home/me/proj")])
        await app.push_screen(screen)
        await until(pilot, lambda: screen.is_mounted)
        screen.show_iteration(Iteration(1, [], run_id="20261128-093122-4a5c3f33",
                                        status="failed", error="no NVIDIA GPU on this pod"),
                              None, None)
        screen.show_status(WatchStatus("waiting", 1, 3))
        await until(pilot, lambda: screen.query_one("#iterations").row_count == 1)
        shown = {b.binding.key: b.enabled for b in screen.active_bindings.values()}
        assert shown.get("b") is False  # listed, dimmed: nothing to mark yet
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        table = _drawn(app.screen.query_one("Static"))
        assert "Baseline = selected (not available now)" in table, table
        assert "the selected iteration's results" in table, table
        await app.shutdown()


# ---------------------------------------------------------------- 13a: Home
def _home_ready(app: GpuwsApp) -> bool:
    return isinstance(app.screen, HomeScreen) and any(
        t.row_count for t in app.screen.query("#hosts").results(DataTable))


async def test_home_marks_a_host_used_through_another_ssh_config() -> None:
    """Finding 13a: "pod", reached before with -F, was listed like any host with an empty
    "where"; Enter said "cannot resolve host 'pod'". It is marked, and highlighting it
    says how to reach it."""
    with Store() as store:
        sid = store.open_session("pod", "ssh+sftp", h200_probe(), None, None)
        store.end_session(sid)
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: _home_ready(app))
        home = app.screen
        hosts = home.query_one("#hosts", DataTable)
        row = [str(c) for c in hosts.get_row("pod")]
        assert row[0].startswith("? ") and "not in ssh config" in row[1], row
        local = [str(c) for c in hosts.get_row("local")]
        assert not local[0].startswith("?") and local[1] == "this machine"
        await pilot.press("down")
        await until(pilot, lambda: app.focused is hosts)
        hosts.move_cursor(row=hosts.get_row_index("pod"))
        hint = home.query_one("#dest-error", Label)
        await until(pilot, lambda: hint.display and "-F FILE connect pod" in _drawn(hint))
        await app.shutdown()


@pytest.mark.parametrize("typed", ["clear; .venv/bin/gpuws connect local", "pod $(id)",
                                   "a|b", "host name"])
async def test_home_refuses_a_pasted_command_line_before_connecting(typed: str) -> None:
    """Finding 13a: a command pasted into "Connect to" was sent to ssh as a host name and
    came back as a configuration error. It is refused under the box; nothing connects."""
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: _home_ready(app))
        home = app.screen
        home.query_one("#dest", Input).value = typed
        await pilot.press("enter")
        error = home.query_one("#dest-error", Label)
        await until(pilot, lambda: error.display and "not a host name" in _drawn(error))
        assert app.screen is home and not [w for w in app.workers if w.group == "connect"]
        assert "user@host[:port]" in _drawn(error)
        await app.shutdown()


# ---------------------------------------------------------------- 18: the dashboard at 80x24
async def test_the_dashboard_at_80x24_shows_counters_ncu_nsys_and_the_whole_pod_panel(
        ) -> None:
    """Finding 18: at 80x24 the Pod panel had 7 rows; ncu, nsys and the counters were below
    the fold of an inner scroll area, and the first paint had two columns that became one.
    Their verdicts have a line of their own now, the Pod panel shows whole, and the
    narrow layout is there from the first paint."""
    probe = h200_probe()
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = DashboardScreen("h200", probe, "ssh+sftp", TelemetryHistory())
        await app.push_screen(screen)
        assert screen.has_class("-narrow")  # before any resize reached it
        screen.post_message(NcuPlanReady(ncu_plan_for(probe)))
        screen.post_message(NsysPlanReady(nsys_plan_with_nsys()))
        line = screen.query_one("#tools-line", Static)
        await until(pilot, lambda: "nsys 2025.1.3" in _drawn(line))
        drawn = _drawn(line)
        assert "✓ counters allowed" in drawn and "✓ ncu 2025.3.1" in drawn, drawn
        assert line.region.height == 1 and line.region.bottom <= 23
        pod, left = screen.query_one("#pod").region, screen.query_one("#left").region
        assert pod.height >= 7 and pod.bottom <= left.bottom, (pod, left)
        cost = screen.query_one("#cost").region
        assert cost.height == 3 and cost.bottom <= 23  # above the footer
        await app.shutdown()


# ---------------------------------------------------------------- 17: tables that fit
def _fits(table: DataTable[Any]) -> list[str]:
    """The table's column labels, after checking they all fit its width (no horizontal
    scroll: nothing off the right edge)."""
    assert table.virtual_size.width <= table.scrollable_content_region.width, (
        table.virtual_size, table.scrollable_content_region)
    return [str(c.label) for c in table.columns.values()]


def _column(table: DataTable[Any], label: str) -> Any:
    return next(c for c in table.columns.values() if str(c.label) == label)


async def test_home_and_sessions_tables_fit_80_columns_and_keep_their_units() -> None:
    """Finding 17: at 80x24 Home showed "durati", "575.8" for 575.8 ms and "last co", and
    Sessions "duratio" with runs and cost off-screen. The GPU column goes on a narrow
    terminal instead; every value is whole. At 120 columns the GPU is back."""
    fill_store()
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: _home_ready(app) and app.screen.query_one(
            "#recent", DataTable).row_count == 1)
        home = app.screen
        recent = home.query_one("#recent", DataTable)
        assert _fits(recent) == ["session", "host", "started", "duration", "runs", "cost"]
        assert _fits(home.query_one("#hosts", DataTable)) == [
            "host", "where", "last cost", "last used"]
        duration = str(recent.get_row_at(0)[3])
        assert duration.endswith((" ms", " s", " min")), duration
        app.open_sessions()
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen) and any(
            t.row_count == 1 for t in app.screen.query("#sessions").results(DataTable)))
        sessions = app.screen.query_one("#sessions", DataTable)
        assert _fits(sessions)[-2:] == ["runs", "cost"]
        await pilot.resize_terminal(120, 30)
        await until(pilot, lambda: "GPU" in [str(c.label) for c in sessions.columns.values()])
        assert _fits(sessions)[2] == "GPU" and sessions.row_count == 1
        await app.shutdown()


async def test_the_sessions_runs_table_shows_a_long_command_whole_at_160() -> None:
    """Finding 17: the runs' workload column was cut at 30 characters even at 160
    (`cmd:python3 -c "import time; [`)."""
    sid, _ = fill_store()
    command = 'cmd:python3 -c "import time; [time.sleep(0.1) for _ in range(30)]; print(1)"'
    events = recorded_events("20261128-100000-0123abcd")
    first = events[0]
    assert isinstance(first, protocol.RunStarted)
    events[0] = msgspec.structs.replace(
        first, spec=msgspec.structs.replace(first.spec, workload=command))
    with Store() as store:
        store.ingest_many(sid, events)
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG)
    async with app.run_test(size=(160, 45)) as pilot:
        await until(pilot, lambda: _home_ready(app))
        app.open_sessions()
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen) and any(
            t.row_count == 2 for t in app.screen.query("#runs").results(DataTable)))
        runs = app.screen.query_one("#runs", DataTable)
        column = _column(runs, "workload")
        assert column.width >= len(command) and _fits(runs)
        await app.shutdown()


async def test_the_attach_picker_shows_the_workload_at_80x24() -> None:
    """Finding 17: the picker's workload column came last and showed only "cmd"."""
    runs = [protocol.RunInfo(run_id=f"20261128-0940{i}5-0123abc{i}", status="running",
                             started=1_795_270_000.0 + i, last_seq=12,
                             workload='cmd:sh -c "echo start; sleep 30; echo end"')
            for i in range(3)]
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: _home_ready(app))
        await app.push_screen(PickRunScreen(runs))
        table = app.screen.query_one(DataTable)
        await until(pilot, lambda: table.row_count == 3)
        workload = _column(table, "workload")
        # Its first 30 characters drawn inside the picker (the start time and the event
        # count come after it now, scrolled to if wanted).
        left = sum(c.get_render_width(table) for c in list(table.columns.values())[:2])
        assert left + 1 + 30 <= table.scrollable_content_region.width
        assert list(table.columns.values())[2] is workload
        await app.shutdown()


# ---------------------------------------------------------------- 28: captions
async def test_figures_a_kernel_engineer_questions_carry_their_caption() -> None:
    """Finding 28, on the H200 saxpy recording: its point sits at 102% of the bandwidth
    roof with no word on what the roof is; ncu's estimated speedups ranked the findings
    with no caution. The roof's origin is said where a point is above it, and the ▲
    figures are said to be ncu's estimates, which order the list."""
    app = replay_app(RECORDING)
    async with app.run_test(size=(160, 45)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, RunScreen)
                    and bool(app.screen.query("RunPanes"))
                    and app.screen.panes.model.finished is not None)
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ResultsScreen)
                    and app.screen.results is not None)
        roofline = _drawn(app.screen.query_one(Roofline))
        assert "% of its roof" in roofline
        assert "above its roof: the bandwidth roof is measured: device-to-device" in roofline
        assert "not a hard limit" in roofline
        rules = _drawn(app.screen.query_one("#rules", RuleList))
        assert rules.startswith(" ".join(SPEEDUP_NOTE.split())), rules[:200]
        await app.shutdown()


def test_a_full_theoretical_occupancy_is_not_limited_by_anything() -> None:
    """Finding 28: "theoretical occupancy 100% (limited by registers)": nothing limits it
    at 100%. Below 100% the limiter is still named."""
    def occupancy(pct: float) -> str:
        return render_static([protocol.StaticAnalysis(
            run_id="r", seq=1, ts=1.0, kernel="saxpy", registers_per_thread=16,
            shared_mem_per_block=0, local_mem_per_thread=0, block_size=256,
            theoretical_occupancy_pct=pct, limiter="registers", source="cuobjdump")]).plain

    full = occupancy(100.0)
    assert "theoretical occupancy 100% (the most an SM allows)" in full
    assert "limited by" not in full
    assert "(limited by registers)" in occupancy(62.5)


# ---------------------------------------------------------------- 17: the output pane
async def test_the_output_pane_wraps_a_long_line_at_160_columns() -> None:
    """Finding 17: the run screen's output pane cut lines at ~55 characters at 160x45
    ("Generated: ~/.cache/gpuws/runs/20261124-202257-bf403999/…" cut mid-path), with no
    horizontal scroll. A long line is wrapped, its continuation marked."""
    from textual.widgets import Log

    from gpuws.tui.messages import RunEvents

    started = recorded_events()[0]
    assert isinstance(started, protocol.RunStarted)
    path = ("~/.cache/gpuws/runs/20261124-202257-bf403999/" + "deep/" * 20
            + "report.ncu-rep")
    line = protocol.Output(run_id=started.run_id, seq=1, ts=started.ts + 1, stream="stdout",
                           text=f"Generated: {path}")
    app = GpuwsApp(StartHome(), ssh_config=NO_SSH_CONFIG)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = RunScreen(started.run_id or "", live=True, backfill=False)
        await app.push_screen(screen)
        await until(pilot, lambda: bool(screen.query("#run-log")))
        log = screen.query_one("#run-log", Log)
        await until(pilot, lambda: log.scrollable_content_region.width > 0)
        screen.post_message(RunEvents(screen.run_id, [started, line], [0.0, 0.0]))
        await until(pilot, lambda: screen.panes._log_lines == 1)
        width = log.scrollable_content_region.width
        rows = list(log.lines)
        assert len(rows) > 1 and all(len(r) <= width for r in rows), (width, rows)
        assert all(r.startswith(WRAP_MARK) for r in rows[1:])
        whole = rows[0] + "".join(r[len(WRAP_MARK):] for r in rows[1:])
        assert whole.endswith(f"Generated: {path}"), whole
        # Another size (80x24 stacks the log under the tabs, wider than beside them):
        # wrapped again to the new width, the first row filling it, nothing lost.
        await pilot.resize_terminal(80, 24)
        await until(pilot, lambda: log.scrollable_content_region.width != width
                    and len(log.lines[0]) == log.scrollable_content_region.width)
        assert all(len(r) <= log.scrollable_content_region.width for r in log.lines)
        rows = list(log.lines)
        assert rows[0] + "".join(r[len(WRAP_MARK):] for r in rows[1:]) == whole
        await app.shutdown()


def test_the_timing_tabs_rate_past_its_roof_says_what_the_roof_is() -> None:
    """Finding 28, the Timing tab: the H200 saxpy recording reads "4,300 GB/s (102% of
    4,230)"; beside it, the same caption the CLI prints says the roof is a measured
    device copy's bandwidth, not the memory's limit."""
    from gpuws.live.model import RunModel
    from gpuws.tui.widgets.run.timing import _stats
    from tui.tuikit import recorded_events  # type: ignore[import-not-found]

    events = recorded_events()
    model = RunModel(events[0].run_id)
    model.apply(events)
    assert model.tier1 is not None and (model.tier1.pct_peak_bw or 0) > 100
    text, _ = _stats(model)
    plain = text.plain
    assert "% of its roof: the roof, " in plain, plain
    assert "what a device copy reaches, not the memory's limit" in plain
