"""What a newcomer met in the TUI, third round (issue 34, the TUI findings left: 8, 10, 12,
13a, 17, 18, 19's toast, 22, 23's watch keys, 28). Each test failed before its fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from textual.geometry import Region
from textual.message import Message
from textual.notifications import Notify
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets import Input, Label, Static

from gpuws import protocol
from gpuws.live.link import Target
from gpuws.tui.app import GpuwsApp, StartConnect, StartHome, run_end_line
from gpuws.tui.screens.confirm import ConfirmScreen
from gpuws.tui.screens.dashboard import DashboardScreen
from gpuws.tui.screens.launcher import LauncherScreen
from gpuws.tui.widgets.marked import MarkedRadioButton
from tui.tuikit import h200_probe, launch_command, until  # type: ignore[import-not-found]

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
    """What a widget draws, its lines joined with spaces (a wrapped sentence reads whole)."""
    strips = widget.render_lines(Region(0, 0, widget.size.width, widget.size.height))
    return " ".join(" ".join(s.text.split()) for s in strips)


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
        await until(pilot, lambda: note.size.height > 1)
        assert "a command runs, without Tiers 2 and 3." in _drawn(note), _drawn(note)
        assert note.region.right <= 80
        helps = [_drawn(h) for h in launcher.query(".help").results(Label) if h.display]
        assert any("which executes in it" in h and "every save in it" in h for h in helps)
        impl = next(h for h in helps if "float4 copy kernel" in h)
        assert impl.endswith("(memcpy/kernel)"), impl
        await app.shutdown()
