"""The local flows, driven through the app, asserting on messages and on what was recorded.

Connect; launch a ``cmd:`` run, see its output, pull its artifact, export; replay: against
the local transport (the agent as a subprocess of this machine), which needs no GPU.
"""

from __future__ import annotations

from pathlib import Path

from textual.message import Message
from textual.widgets import Static

from gpuws.live.link import STEPS, Target
from gpuws.live.storeio import StoreHandle
from gpuws.sessions.store import Store
from gpuws.tui.app import GpuwsApp, StartConnect, StartReplay
from gpuws.tui.messages import LinkUp, NcuPlanReady, RunEvents, StepChanged
from gpuws.tui.screens.artifacts import ArtifactsScreen
from gpuws.tui.screens.dashboard import DashboardScreen
from gpuws.tui.screens.run import RunScreen
from gpuws.tui.widgets.run.artifact_item import ArtifactItem
from tui.tuikit import RECORDING, launch_command, outputs, run_screen, until  # type: ignore[import-not-found]


async def test_connect_local_shows_each_step_then_the_dashboard() -> None:
    app = GpuwsApp(StartConnect(Target("local")))
    messages: list[Message] = []
    async with app.run_test(size=(100, 30), message_hook=messages.append) as pilot:
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
        await until(pilot, lambda: any(isinstance(m, NcuPlanReady) for m in messages))
        final = {m.step: m.state for m in messages if isinstance(m, StepChanged)}
        assert final == {"resolve": "ok", "connect": "ok", "host key": "skipped",
                         "deploy": "ok", "probe": "ok"}
        order = [m.step for m in messages if isinstance(m, StepChanged)]
        assert sorted(set(order), key=order.index) == list(STEPS)
        link = next(m.link for m in messages if isinstance(m, LinkUp))
        with Store() as s:
            session = s.session(link.session_id)
        assert session.host == "local" and session.probe == link.probe
        await app.shutdown()
    with Store() as s:
        assert s.session(link.session_id).ended is not None  # quitting ended the session


async def test_launch_a_command_pull_its_artifact_and_export_the_session() -> None:
    app = GpuwsApp(StartConnect(Target("local")))
    messages: list[Message] = []
    async with app.run_test(size=(100, 30), message_hook=messages.append) as pilot:
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
        screen = await launch_command(
            pilot, "echo hello-from-pod; echo oops >&2; printf abc > $GPUWS_ARTIFACT_DIR/out.txt")
        await until(pilot, lambda: screen.panes.model.finished is not None)
        assert screen.panes.model.status == "ok"
        assert outputs(messages) == ["hello-from-pod", "oops"]
        # A finished run's artifacts come home by themselves, verified by sha256.
        with Store() as s:
            await until(pilot, lambda: [a.status for a in s.artifacts(screen.run_id)] == ["pulled"])
            local = s.artifacts(screen.run_id)[0].local_path
        assert local is not None and Path(local).read_bytes() == b"abc"
        await pilot.press("f")
        await until(pilot, lambda: isinstance(app.screen, ArtifactsScreen)
                    and app.screen.query(ArtifactItem))
        shown = str(app.screen.query_one("#art-text", Static).render())
        assert "✓ pulled" in shown and local in shown
        await pilot.press("escape")
        await pilot.press("e")
        exported = app.exports_dir() / f"gpuws-session-{app.feed.session_id}.md"
        await until(pilot, exported.exists)
        text = exported.read_text()
        assert screen.run_id in text and "echo hello-from-pod" in text and "out.txt" in text
        await app.shutdown()


async def test_replay_goes_through_the_store_into_the_same_panes() -> None:
    app = GpuwsApp(StartReplay(str(RECORDING), speed=50.0), store=StoreHandle.throwaway())
    stored_before_shown: list[bool] = []

    def hook(message: Message) -> None:
        if isinstance(message, RunEvents):
            last = max(e.seq or 0 for e in message.events)
            stored = app.store.call_blocking(lambda s: s.last_seq(message.run_id))
            stored_before_shown.append(stored >= last)

    async with app.run_test(size=(100, 30), message_hook=hook) as pilot:
        await until(pilot, lambda: isinstance(app.screen, RunScreen)
                    and app.screen.panes.model.finished is not None)
        model = run_screen(app).panes.model
        assert model.event_count == 34 and model.tier1 is not None
        assert stored_before_shown and all(stored_before_shown)
        await app.shutdown()
