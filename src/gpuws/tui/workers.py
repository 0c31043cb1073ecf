"""The app's workers: SSH and store work, each posting typed results when done.

Each function is run by :meth:`GpuwsApp._work` as an async worker on the app's loop,
so a failure lands in the app's single ``Worker.StateChanged`` handler. None of them
blocks the loop: SSH is asyncio, and the store runs on its own thread.
"""

from __future__ import annotations

import asyncio
import os
import statistics
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.screen import Screen

from .. import protocol
from ..errors import GpuwsError, StoreError, UsageError
from ..live.link import Link, Target
from ..live.replay import MAX_RUNS, RecordingFile, play, read_session, stream
from ..live.uptime import power
from ..locations import ensure_private_dir
from ..sessions.cost import economics as session_economics
from ..sessions.export import export_session
from ..sessions.store import Store
from ..text.textsafe import text as safe_text
from ..text.textsafe import visible
from .hosts import home_hosts, last_workload, summarize_sessions
from .messages import (
    ArtifactsData,
    Backfill,
    Exported,
    HomeData,
    HostStarted,
    LinkUp,
    NcuPlanReady,
    NsysPlanReady,
    PullDone,
    PullProgress,
    ResultsData,
    SessionsData,
    StartWaiting,
    StepChanged,
    WatchIterationDone,
    WatchStatusChanged,
)
from .results import load_results as read_results
from .screens.artifacts import ArtifactsScreen
from .screens.sessions import SessionsScreen

if TYPE_CHECKING:
    from ..live.watchloop import Iteration, WatchLoop, WatchStatus
    from ..runspec import LaunchOptions
    from .app import GpuwsApp, StartReplay
    from .screens.connecting import ConnectingScreen
    from .screens.run import RunScreen
    from .screens.watch import WatchScreen


async def connect(app: GpuwsApp, target: Target, screen: ConnectingScreen) -> None:
    """Connect step by step; the screen sees each step, the app gets the link."""

    def on_step(step: str, state: str, seconds: float | None, detail: str) -> None:
        screen.post_message(StepChanged(step, state, seconds, detail))

    link = await app.engine.connect(target, on_step, app.step_clock)
    app.post_message(LinkUp(link))


async def start_host(app: GpuwsApp, target: Target, argv: list[str],
                     screen: ConnectingScreen) -> None:
    """Run the host's ``start`` command and wait for SSH to answer (the countdown goes to
    ``screen``), recorded for the billed time; then the screen connects again.

    Cancelled (the screen's Back), the core kills the provider's tool.
    """

    def on_wait(what: str, seconds_left: float) -> None:
        screen.post_message(StartWaiting(what, seconds_left))

    async with power.recorded(app.engine.save_host_action, target.host, "start"):
        # A host that answers and refuses comes back as the refusal: the start worked, and
        # connecting again shows the person why (the host-key question, the login's error).
        await power.start(target, argv, on_wait=on_wait)
    app.notify(f"{target.host} started by its `start` command", timeout=8, markup=False)
    screen.post_message(HostStarted())


async def after_connect(app: GpuwsApp, link: Link) -> None:
    """Start 1 Hz telemetry and ask which ncu fits and which nsys works."""
    await link.client.telemetry(1.0)
    app.post_message(NcuPlanReady(await link.client.ncu_plan()))
    app.post_message(NsysPlanReady(await link.client.nsys_plan()))


async def disconnect(app: GpuwsApp) -> None:
    """End the session, close the link, go Home."""
    app.link = None
    await app.engine.disconnect()
    app.go_home()


async def economics(app: GpuwsApp, session_id: str) -> None:
    """The session's cost figures, for the ticker."""
    econ = await app.store.call(lambda s: session_economics(s, session_id, now=app.now()))
    app.on_economics_ready(econ)


async def install_ncu(app: GpuwsApp) -> None:
    """Run the confirmed install plan and verify it (its steps stream as agent logs)."""
    link = _link(app)
    app.notify("installing ncu on the pod… (the steps show in the Agent pane)", timeout=8,
               markup=False)
    plan = await link.client.ncu_plan(install=True)
    app.post_message(NcuPlanReady(plan))
    if plan.selected:
        app.notify(visible(f"ncu {plan.selected_version} is ready: "
                           f"{plan.verified or plan.selected}"), markup=False)


async def install_nsys(app: GpuwsApp) -> None:
    """Run the confirmed nsys install plan and verify it (its steps stream as agent logs)."""
    link = _link(app)
    app.notify("installing nsys on the pod… (the steps show in the Agent pane)", timeout=8,
               markup=False)
    plan = await link.client.nsys_plan(install=True)
    app.post_message(NsysPlanReady(plan))
    if plan.selected:
        app.notify(visible(f"nsys {plan.selected_version} is ready: "
                           f"{plan.verified or plan.selected}"), markup=False)


async def open_launcher(app: GpuwsApp) -> None:
    """Open the launcher with the runs that could serve as a baseline."""
    from .screens.launcher import LauncherScreen

    def candidates(s: Store) -> list[tuple[str | Text, str]]:
        out: list[tuple[str | Text, str]] = []
        for sess in s.sessions()[:10]:
            for r in reversed(s.runs(sess.id)):
                star = "★ " if r.is_baseline else ""
                # Text of visible(): a workload is the pod's (or a recording's) word, and a
                # Select reads a str prompt as markup.
                out.append((safe_text(f"{star}{r.run_id} · {visible(r.workload, 40)} · "
                                      f"{r.status}"), r.run_id))
        return out[:30]

    # The form opens on the workload chosen last on this pod: in this session, else the
    # last one run there (the store remembers across sessions; the kernel was forgotten).
    host = app.link.target.host if app.link is not None else None
    remembered = app.chosen_workloads.get(host) if host is not None else None
    if remembered is None and host is not None:
        remembered = await app.store.call(lambda s: last_workload(s, host))
    app.push_screen(LauncherScreen(await app.store.call(candidates), workload=remembered))


async def launch(app: GpuwsApp, spec: protocol.RunSpec, baseline: str | None,
                 workspace: str | None = None) -> None:
    """Start a run and open its live panes; with ``workspace``, sync that directory to the
    pod first (a refusal is the worker's error, shown as a banner) and record its code."""
    link = _link(app)
    if workspace is None:
        info = await app.engine.start_run(spec)
    else:
        from ..commands.sync import sync_line
        from ..workspace.sync import WorkspaceSync

        ws = WorkspaceSync(workspace)
        manifest = await asyncio.to_thread(ws.scan)
        synced = await ws.sync(link.client, manifest)
        code = await asyncio.to_thread(ws.code, manifest)
        app.notify(sync_line(synced, code).plain, timeout=8, markup=False)
        info = await app.engine.start_run(spec, code, manifest.entries)
    if baseline:
        app.pending_baselines[info.run_id] = baseline
    app.pop_screen()  # the launcher
    app.open_run_screen(info.run_id, live=True)


async def watch(app: GpuwsApp, screen: WatchScreen, options: LaunchOptions, roots: list[Path],
                baseline: str | None) -> None:
    """The watch loop (``live.watchloop``, as ``gpuws watch`` runs it) on the app's engine:
    each iteration and status goes to ``screen``; it ends when the screen's esc stops it.
    Each iteration's spec is the launcher's, as one of this connection's session
    (``RunSpec.fork_server``, as ``gpuws watch`` sends it)."""
    import msgspec

    from ..live.watchloop import WatchLoop, WatchStatus
    from ..runspec import build_spec
    from .screens.watch import snapshot

    samples: list[float] | None = None
    workspace = None
    try:
        _link(app)
        if baseline:
            base = baseline
            samples = await app.store.call(lambda s: s.samples(s.run(base).run_id))
            if not samples:
                raise UsageError(f"baseline {base}: that run has no Tier-1 samples",
                                 remedy="choose a run that ran Tier 1, or none")
        if options.workspace:
            from ..workspace.sync import WorkspaceSync

            workspace = WorkspaceSync(options.workspace)
            await asyncio.to_thread(workspace.scan)  # refused before anything runs
    except GpuwsError:
        # The banner says why (the app's one failure handler); the screen says it stopped.
        screen.post_message(WatchStatusChanged(WatchStatus("stopped", 0, 0)))
        raise

    def make_spec() -> protocol.RunSpec:
        return msgspec.structs.replace(build_spec(options), fork_server=True)

    def iteration(it: Iteration) -> None:
        median = statistics.median(loop.baseline) if loop.baseline else None
        screen.post_message(WatchIterationDone(snapshot(it), loop.baseline_n, median))

    def status(now: WatchStatus) -> None:
        screen.post_message(WatchStatusChanged(now))

    loop = WatchLoop(app.engine, roots, make_spec, workspace=workspace, baseline=samples,
                     baseline_label=baseline, on_iteration=iteration, on_status=status)
    app.watch_loop = loop
    try:
        await loop.run()
    finally:
        loop.stop()  # a failure ends the loop too: the screen's esc then only leaves
    app.notify(f"watch ended after {len(loop.iterations)} iteration(s), each a stored run of "
               "this session", timeout=6, markup=False)


async def watch_baseline(app: GpuwsApp, loop: WatchLoop, n: int) -> None:
    """Make iteration ``n`` the watch loop's baseline (its iterations compared again)."""
    await loop.set_baseline(n)


async def cancel(app: GpuwsApp, run_id: str) -> None:
    """Cancel a run on the pod; its RunFinished(cancelled) arrives as an event."""
    _link(app)
    going = run_id in app.runs_going
    info = await app.engine.cancel(run_id)
    if not going:
        # A run this connection follows says "cancelled" itself when its end arrives; a
        # second toast for the same cancel read as two events ("finished", "cancelled").
        app.notify(f"run {run_id}: {visible(info.status, 40)}", timeout=5, markup=False)


async def pick_run(app: GpuwsApp) -> None:
    """List the pod's runs and attach to the one picked."""
    from .screens.pick_run import PickRunScreen

    _link(app)
    runs = await app.engine.list_runs()
    if not runs:
        app.notify("the pod holds no runs", timeout=5, markup=False)
        return

    def picked(run_id: str | None) -> None:
        if run_id:
            app.attach_to(run_id)

    app.push_screen(PickRunScreen(runs), picked)


async def attach(app: GpuwsApp, run_id: str) -> None:
    """Follow a run from after the last event stored, and show it."""
    link = _link(app)
    if run_id not in link.following:
        from_seq = await app.store.call(lambda s: s.last_seq(run_id)) + 1
        await app.engine.attach(run_id, from_seq=from_seq)
        app.notify(f"attached to {visible(run_id, 80)} from event {from_seq}", timeout=5,
                   markup=False)
    if not app.run_screens.get(run_id):
        app.open_run_screen(run_id, live=True)


async def pull(app: GpuwsApp, run_id: str, quiet: bool) -> None:
    """Pull a run's artifacts home with progress; skipped quietly if there are none."""
    _link(app)
    rows = await app.store.call(lambda s: s.artifacts(run_id))
    if not any(r.status != "pulled" for r in rows):
        if not quiet:
            app.notify("every artifact of this run is home already", timeout=5, markup=False)
        return

    def progress(name: str, done: int, total: int) -> None:
        app.post_to_screens(ArtifactsScreen, lambda: PullProgress(run_id, name, done, total))

    try:
        results = await app.engine.pull(run_id, progress)
    except GpuwsError as exc:
        message = exc.message
        app.post_to_screens(ArtifactsScreen, lambda: PullDone(run_id, [], message))
        raise
    app.post_to_screens(ArtifactsScreen,
                     lambda: PullDone(run_id, [r.name for r in results]))
    for screen in app.run_screens.get(run_id, []):  # its Timeline tab
        screen.post_message(PullDone(run_id, [r.name for r in results]))
    if results:
        names = ", ".join(f"{visible(r.name, 200)} → {r.local_path}" for r in results)
        app.notify(f"pulled {names}", title="Artifacts home", timeout=10, markup=False)


async def export(app: GpuwsApp, session_id: str, name: str | None = None) -> None:
    """Write the session as markdown (atomically) and say where.

    Args:
        app: the app.
        session_id: the session.
        name: the file's name (a replay's, after its recording); else the session's.
    """
    text = await app.store.call(lambda s: export_session(s, session_id, now=app.now()))
    path = app.exports_dir() / (name or f"gpuws-session-{session_id}.md")
    size = await asyncio.to_thread(write_atomic, path, text)
    if name is not None:
        app.notify(f"{path} ({size:,} bytes) — the report lasts; the replay itself is not "
                   "kept in your sessions", title="Recording exported", timeout=15,
                   markup=False)
        return
    app.notify(f"{path} ({size:,} bytes)", title="Session exported", timeout=15, markup=False)
    app.post_to_screens(SessionsScreen, lambda: Exported(session_id, str(path), size))


def write_atomic(path: Path, text: str) -> int:
    """Write ``text`` as UTF-8, whole or not at all; the bytes written (a count of
    characters said 2,112 bytes of a file of 2,140: µ, ±, → and — take two or three)."""
    ensure_private_dir(path.parent)  # reports name hosts and commands
    data = text.encode("utf-8")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # never leave a half-written report behind
    return len(data)


async def set_baseline_of(app: GpuwsApp, run_id: str, baseline: str) -> None:
    """Compare ``run_id`` with the baseline the launcher chose."""
    await app.store.call(lambda s: s.set_baseline_of(run_id, s.run(baseline).run_id))


async def mark_baseline(app: GpuwsApp, run_id: str) -> None:
    """Make the run its workload's baseline."""
    await app.store.call(lambda s: s.set_baseline(run_id))
    app.notify(f"{run_id} is now the baseline for its workload", timeout=6, markup=False)


# ---------------------------------------------------------------------- store readers
async def load_home(app: GpuwsApp, screen: Screen[Any]) -> None:
    """Home's hosts (ssh config + used before) and recent sessions."""
    config = app.ssh_config

    def read(s: Store) -> HomeData:
        return HomeData(home_hosts(s, config), summarize_sessions(s, 10))

    screen.post_message(await app.store.call(read))


async def load_sessions(app: GpuwsApp, screen: Screen[Any], session_id: str | None) -> None:
    """Every session, and the runs of the selected (or newest) one."""

    def read(s: Store) -> SessionsData:
        sessions = summarize_sessions(s)
        sid = s.session(session_id).id if session_id else (sessions[0].row.id
                                                            if sessions else None)
        return SessionsData(sessions, sid, s.runs(sid) if sid else [])

    screen.post_message(await app.store.call(read))


async def backfill(app: GpuwsApp, screen: RunScreen) -> None:
    """What the store holds of a run, for its newly opened screen."""
    run_id = screen.run_id
    events = await app.store.call(lambda s: s.events(run_id))
    screen.post_message(Backfill(run_id, events))


async def load_results(app: GpuwsApp, screen: Screen[Any]) -> None:
    """A run's results."""
    run_id: str = screen.run_id  # type: ignore[attr-defined]
    screen.post_message(ResultsData(await app.store.call(lambda s: read_results(s, run_id))))


async def load_artifacts(app: GpuwsApp, screen: Screen[Any]) -> None:
    """A run's artifacts."""
    run_id: str = screen.run_id  # type: ignore[attr-defined]
    rows = await app.store.call(lambda s: s.artifacts(s.run(run_id).run_id))
    screen.post_message(ArtifactsData(run_id, rows))


# ---------------------------------------------------------------------- replay
#: Run screens a replay keeps open at once (the person goes back through them with esc).
MAX_REPLAY_SCREENS = 8


async def replay(app: GpuwsApp, start: StartReplay) -> None:
    """Play a recording through the feed (store first), opening each run's panes.

    A file is read a batch at a time as it plays (never whole, at most
    ``replay.MAX_RECORDING_BYTES``). The first :data:`MAX_REPLAY_SCREENS` runs get their
    panes; later runs are stored without (the Sessions screen opens any of them), so a
    recording with hundreds of run ids cannot open hundreds of screens.
    """
    path = Path(start.source).expanduser()
    rec_file: RecordingFile | None = None
    if path.exists():
        if not app.store.is_throwaway:
            raise StoreError("a file replay needs a throwaway store",
                             remedy="start it with `gpuws replay FILE`")
        rec_file = RecordingFile(path, only_run=start.run).open()
        events: AsyncIterator[protocol.Events] | list[protocol.Events] = stream(rec_file)
        label = rec_file.label
        first = await _first_ts(rec_file)
        session_id = await app.store.call(
            lambda s: s.open_session(f"replay of {path.name}", "replay", None, None,
                                     started=first))
    else:
        session_id, rec = await app.store.call(lambda s: read_session(s, start.source,
                                                                      start.run))
        events, label = rec.events, rec.label
    app.feed.set_session(session_id)
    last_ts: list[float] = []

    def push(ev: protocol.Events) -> None:
        last_ts[:] = [ev.ts]
        app.engine.push_recorded(ev)

    runs = [0]

    async def open_run(run_id: str) -> None:
        from .screens.run import RunScreen

        runs[0] += 1
        if runs[0] <= MAX_REPLAY_SCREENS:
            # Awaited until mounted: the run's first events must find its screen registered.
            await app.push_screen(RunScreen(run_id, live=False, backfill=False))

    count = await play(events, push, speed=start.speed, on_run=open_run,
                       backlog=lambda: app.feed.backlog, drained=app.feed.drained)
    await app.feed.drained()
    if rec_file is not None and last_ts:
        await app.store.call(lambda s: s.end_session(session_id, ended=last_ts[0]))
    if rec_file is not None and (rec_file.bad_lines or rec_file.skipped_events):
        said = []
        if rec_file.bad_lines:
            bad = rec_file.first_bad
            why = f" ({visible(bad.reason, 200)})" if bad is not None else ""
            said.append(f"{rec_file.bad_lines:,} unreadable line(s) skipped{why}")
        if rec_file.skipped_events:
            said.append(f"{rec_file.skipped_events:,} events of runs past the first "
                        f"{MAX_RUNS} skipped")
        app.notify("; ".join(said), severity="warning", markup=False)
    unshown = max(0, runs[0] - MAX_REPLAY_SCREENS)
    more = (f"; {unshown:,} more runs were stored without panes (Sessions lists them)"
            if unshown else "")
    app.notify(f"replay of {visible(label, 200)} finished: {count} events{more}",
               timeout=6 if not unshown else 15, markup=False)


async def _first_ts(rec: RecordingFile) -> float | None:
    """The first event's time, without reading past it (peeked and put back)."""
    batch = await asyncio.to_thread(rec.batch, 1)
    rec.unread(batch)
    return batch[0].ts if batch else None


# ---------------------------------------------------------------------- helpers
def _link(app: GpuwsApp) -> Link:
    if app.link is None or app.link.client.closed:
        raise GpuwsError("not connected to a pod", title="Not connected",
                         remedy="connect first (R on the dashboard reconnects)")
    return app.link

