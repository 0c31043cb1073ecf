"""The TUI's watch screen: the launcher's Watch starts the loop ``gpuws watch`` runs
(``live.watchloop``) on the embedded pod (``local``), in a real project folder changed by
real writes; each save is a stored run, a row and a chart point; a broken save shows its
error and the loop waits; esc stops the loop and cancels a running iteration on the pod.

No GPU here: the workload is a ``cmd:`` (Tier 1 times only a Python workload's ``run()``,
so these iterations carry no median); the screen with medians, CIs and verdicts is the
snapshot below (recorded H200 samples), and tests/gpu/test_gpu_watch_tui.py drives the
same screen on a GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual.widgets import Checkbox, DataTable, Input

from gpuws.live.link import Target
from gpuws.sessions.export import export_session
from gpuws.sessions.store import Store
from gpuws.tui.app import GpuwsApp, StartConnect
from gpuws.tui.screens.confirm import ConfirmScreen
from gpuws.tui.screens.dashboard import DashboardScreen
from gpuws.tui.screens.launcher import LauncherScreen
from gpuws.tui.screens.results import ResultsScreen
from gpuws.tui.screens.watch import WatchScreen
from gpuws.tui.widgets.run.ci_chart import CiChart
from tui.tuikit import until  # type: ignore[import-not-found]

PROG = 'python3 -c "import mykern; print(mykern.V)"'


def project(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "proj"
    (root / "mykern").mkdir(parents=True)
    init = root / "mykern" / "__init__.py"
    init.write_text("V = 1\n")
    return root, init


async def start_watch(pilot: Pilot[Any], command: str, workspace: Path) -> WatchScreen:
    """From the dashboard: n, a command in the workspace, Tier 1 only, Ctrl+T."""
    app = pilot.app
    await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
    await pilot.press("n")
    await until(pilot, lambda: app.screen.query("#kind-cmd"))
    await pilot.click("#kind-cmd")
    await until(pilot, lambda: getattr(app.focused, "id", None) == "cmd")
    screen = app.screen
    assert isinstance(screen, LauncherScreen)
    screen.query_one("#cmd", Input).value = command
    screen.query_one("#t2", Checkbox).value = False
    screen.query_one("#t3", Checkbox).value = False
    assert screen.query_one("#watch").disabled  # nothing to watch yet
    screen.query_one("#workspace", Input).value = str(workspace)
    await until(pilot, lambda: not screen.query_one("#watch").disabled)
    await pilot.press("ctrl+t")
    # A command has no Tier 1: the launcher asks once before watching one (issue 34, 8).
    await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
    await pilot.press("y")
    await until(pilot, lambda: isinstance(app.screen, WatchScreen))
    watch = app.screen
    assert isinstance(watch, WatchScreen)
    return watch


def watching(app: GpuwsApp) -> bool:
    """Whether the watch worker still runs."""
    return any(w.group == "watch" and w.is_running for w in app.workers)


def rows(screen: WatchScreen) -> list[list[str]]:
    table = screen.query_one("#iterations", DataTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def detail(screen: WatchScreen) -> str:
    return str(screen.query_one("#watch-detail").render())


def status_text(screen: WatchScreen) -> str:
    return str(screen.query_one("#watch-status").render())


async def test_saves_make_rows_and_points_a_broken_one_its_error_and_the_loop_waits(
        tmp_path: Path) -> None:
    root, init = project(tmp_path)
    app = GpuwsApp(StartConnect(Target("local")))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await start_watch(pilot, PROG, root)
        waiting = lambda n: (len(screen.iterations) == n  # noqa: E731
                             and screen.status is not None
                             and screen.status.phase == "waiting")
        await until(pilot, lambda: waiting(1))
        assert "waiting for a save" in status_text(screen)
        assert "watching 1 file in" in status_text(screen)
        init.write_text("V = 2\n")
        await until(pilot, lambda: waiting(2))
        (root / "mykern" / "extra.py").write_text("W = 3\n")
        await until(pilot, lambda: waiting(3))
        table = rows(screen)
        assert [r[0] for r in table] == ["1", "2", "3"]
        assert table[0][1] == "start" and "mykern/__init__.py" in table[1][1]
        assert "mykern/extra.py" in table[2][1]
        assert "watching 2 files" in status_text(screen)
        # Every iteration is a point of the chart (no median without a GPU: none drawn).
        assert [p.n for p in screen.query_one(CiChart).points] == [1, 2, 3]
        assert "failed" not in detail(screen)

        init.write_text("V = (\n")  # a broken save: its error, then the loop waits
        await until(pilot, lambda: waiting(4))
        broken = rows(screen)[3]
        assert broken[2] == "failed" and broken[5].startswith("the workload exited")
        assert "#4 · run " in detail(screen)
        assert "failed: the workload exited with code 1" in detail(screen)
        assert screen.query_one(CiChart).points[3].failed
        init.write_text("V = 4\n")
        await until(pilot, lambda: waiting(5))
        assert rows(screen)[4][2] != "failed" and "failed" not in detail(screen)

        # Enter on a row opens that iteration's stored run; esc comes back to the loop.
        table = screen.query_one("#iterations", DataTable)
        table.focus()
        table.move_cursor(row=1)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ResultsScreen))
        assert app.screen.run_id == screen.iterations[2].run_id  # type: ignore[attr-defined]
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is screen)

        loop = app.watch_loop
        assert loop is not None and not loop.stopped
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, WatchScreen) and loop.stopped
                    and not watching(app))
        with Store() as store:
            (session,) = store.sessions()  # the TUI's one connection held every iteration
            runs = sorted(store.runs(session.id), key=lambda r: r.started or 0)
            assert [r.status for r in runs] == ["ok", "ok", "ok", "failed", "ok"]
            # Stored as gpuws watch stores them: each its code, each a watch run.
            assert len({c.tree_sha256 for r in runs
                        if (c := store.code(r.run_id)) is not None}) == 5
            assert all(r.spec is not None and r.spec.fork_server for r in runs)
            # ... so the export shows the TUI's loop as it shows gpuws watch's.
            section = export_session(store, session.id).split("## Watch iterations", 1)[1]
            assert len([r for r in section.split("\n## ", 1)[0].splitlines()
                        if r.startswith("| ") and "`20" in r]) == 5
        await app.shutdown()


async def test_esc_stops_the_loop_and_cancels_the_running_iteration(tmp_path: Path) -> None:
    root, _init = project(tmp_path)
    gate = tmp_path / "never"  # the workload waits for it: the iteration is mid-run
    command = f"echo started; while [ ! -e {gate} ]; do sleep 0.05; done"
    app = GpuwsApp(StartConnect(Target("local")))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await start_watch(pilot, command, root)
        await until(pilot, lambda: screen.status is not None
                    and screen.status.phase == "running")
        loop = app.watch_loop
        assert loop is not None
        run_id = screen.status.run_id if screen.status else ""
        assert run_id and f"running iteration 1 · run {run_id}" in status_text(screen)

        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, WatchScreen))
        await until(pilot, lambda: loop.stopped and not watching(app))
        # The iteration's run was cancelled on the pod, and its end is stored.
        with Store() as store:
            assert store.run(run_id).status == "cancelled"
        assert [it.status for it in loop.iterations] == ["cancelled"]
        await app.shutdown()


async def test_leaving_the_screen_any_way_stops_its_loop(tmp_path: Path) -> None:
    """Home (or a disconnect, which goes Home) takes the watch screen away: its loop stops
    with it instead of measuring saves nobody sees."""
    root, _init = project(tmp_path)
    app = GpuwsApp(StartConnect(Target("local")))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await start_watch(pilot, PROG, root)
        await until(pilot, lambda: len(screen.iterations) == 1)
        loop = app.watch_loop
        assert loop is not None and not loop.stopped
        app.go_home()
        await until(pilot, lambda: loop.stopped and not watching(app))
        with Store() as store:
            (session,) = store.sessions()
            assert len(store.runs(session.id)) == 1
        assert len(loop.iterations) == 1
        await app.shutdown()


async def test_a_refused_workspace_is_a_banner_and_nothing_runs(tmp_path: Path) -> None:
    """A link out of the project: refused before anything is sent (the workspace's own
    check), one banner with its cause and remedy, the screen says it stopped, no run."""
    root, _init = project(tmp_path)
    outside = tmp_path / "id_ed25519"
    outside.write_text("not for the pod\n")
    (root / "secrets").symlink_to(outside)
    app = GpuwsApp(StartConnect(Target("local")))
    banners: list[tuple[str, str]] = []
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
        app.notify = (  # type: ignore[method-assign]
            lambda message, *, title="", **_: banners.append((title, message)))
        screen = await start_watch(pilot, PROG, root)
        await until(pilot, lambda: screen.status is not None
                    and screen.status.phase == "stopped" and bool(banners))
        (title, message), = banners
        assert title == "Workspace refused" and "secrets" in message and "→" in message
        assert "stopped" in status_text(screen) and not screen.iterations
        with Store() as store:
            (session,) = store.sessions()
            assert store.runs(session.id) == []
        await app.shutdown()
