"""The TUI launcher's workspace: the directory is synced, the command runs in it, and the
run records its code, through the same engine as `gpuws run -W` (against the local agent)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.message import Message
from textual.widgets import Input

from gpuws.live.link import Target
from gpuws.sessions.store import Store
from gpuws.tui.app import GpuwsApp, StartConnect
from gpuws.tui.screens.dashboard import DashboardScreen
from gpuws.tui.screens.run import RunScreen
from tui.tuikit import outputs, run_screen, until  # type: ignore[import-not-found]


async def test_a_run_launched_with_a_workspace_runs_in_it(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    (root / "mykern").mkdir(parents=True)
    (root / "mykern" / "__init__.py").write_text("VALUE = 'from-the-workspace'\n")
    app = GpuwsApp(StartConnect(Target("local")))
    messages: list[Message] = []
    async with app.run_test(size=(100, 30), message_hook=messages.append) as pilot:
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
        await pilot.press("n")
        await until(pilot, lambda: pilot.app.screen.query("#kind-cmd"))
        await pilot.click("#kind-cmd")
        await until(pilot, lambda: getattr(pilot.app.focused, "id", None) == "cmd")
        screen: Any = pilot.app.screen
        screen.query_one("#cmd", Input).value = 'python3 -c "import mykern; print(mykern.VALUE)"'
        screen.query_one("#workspace", Input).value = str(root)
        await pilot.press("ctrl+r")
        await until(pilot, lambda: isinstance(pilot.app.screen, RunScreen))
        run = run_screen(pilot.app)
        await until(pilot, lambda: run.panes.model.finished is not None)
        assert run.panes.model.status == "ok"
        # The run's end and its output reach the screen by separate deliveries: under load
        # (the suite on parallel workers) the end came first, so wait for the line itself.
        await until(pilot, lambda: bool(outputs(messages)))
        assert outputs(messages) == ["from-the-workspace"]
        with Store() as s:
            code = s.code(run.run_id)
        assert code is not None and code.directory == str(root) and code.files == 1
        await app.shutdown()
