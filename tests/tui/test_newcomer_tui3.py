"""What a newcomer met in the TUI, third round (issue 34, the TUI findings left: 8, 10, 12,
13a, 17, 18, 19's toast, 22, 23's watch keys, 28). Each test failed before its fix."""

from __future__ import annotations


from textual.message import Message
from textual.notifications import Notify

from gpuws import protocol
from gpuws.live.link import Target
from gpuws.tui.app import GpuwsApp, StartConnect, run_end_line
from gpuws.tui.screens.dashboard import DashboardScreen
from tui.tuikit import launch_command, until  # type: ignore[import-not-found]

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


