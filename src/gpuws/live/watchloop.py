"""The optimisation loop both faces run: every save of the project is a measured run.

One connection (the caller's :class:`~gpuws.live.engine.Engine`, already connected); a
file watcher (``watchfiles``) over the workspace, or over the ``file:`` workload's folder
for that one file; on each debounced save: sync what changed, run the spec (read anew:
a ``file:`` workload travels in it), wait until its ``run_finished`` is stored, and hand
the face one :class:`Iteration`: what changed, the run, its median and CI, the change
against the previous measured iteration and against the baseline (the first measured
one, ``--baseline RUN``, or one the person marks) with the 95% verdict of
``sessions.compare``. A workload that fails is an iteration with its error, and the loop
waits for the next save. ``gpuws watch`` prints each iteration as a line; the TUI's watch
screen shows it as a row and a point of its chart. Every iteration is a stored run of the
engine's session, tied to its code, whichever face started the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from .. import protocol
from ..errors import GpuwsError, UsageError, WorkspaceError
from ..sessions.compare import Tier1Comparison, compare_samples
from ..sessions.store import Store
from ..text.textsafe import visible
from .engine import Engine

if TYPE_CHECKING:
    from watchfiles import Change

    from ..workspace.sync import WorkspaceSync


@dataclass
class Iteration:
    """One save and its run (the first iteration is the loop's start: ``changed`` empty)."""

    n: int
    changed: list[str]
    run_id: str = ""
    status: str = ""
    error: str = ""
    samples: list[float] = field(default_factory=list)
    median_ms: float | None = None
    #: The median's 95% CI half-width, in % of the median (Tier 1's own).
    ci_pct: float | None = None
    #: The median's 95% CI bounds in ms (Tier 1's own; not always symmetric).
    ci_low_ms: float | None = None
    ci_high_ms: float | None = None
    vs_prev: Tier1Comparison | None = None
    vs_base: Tier1Comparison | None = None
    #: From the save (or the start) to the iteration's result.
    wall_s: float = 0.0
    #: What the loop added beyond the workload's own run on the pod (sync, start, store).
    overhead_s: float | None = None
    #: What the sync skipped or sent as last read (``manifest.describe``), "" for nothing.
    note: str = ""


#: What the loop is doing: ``syncing`` and ``running`` name an iteration, ``waiting`` waits
#: for a save, ``stopping`` lets a cancelled run end, ``stopped`` is the end.
Phase = Literal["syncing", "running", "waiting", "stopping", "stopped"]


@dataclass(frozen=True)
class WatchStatus:
    """Where the loop is, for a face's status line."""

    phase: Phase
    #: The iteration the phase belongs to (the last one while waiting; 0 before any).
    iteration: int
    #: Files the watcher stands for: the workspace's (its last manifest), or the one file.
    files: int
    #: The iteration's run once started.
    run_id: str = ""


def watched_paths(workspace: str | None, workload: str) -> list[Path]:
    """What to watch: the workspace, else the ``file:`` workload's file (the one file
    that travels with each run: nothing else in its folder changes what is measured).

    Raises:
        UsageError: nothing to watch (a ``builtin:`` or ``cmd:`` workload without ``-W``).
    """
    if workspace:
        root = Path(workspace).expanduser()
        if not root.is_dir():
            raise UsageError(f"-W {workspace}: not a directory",
                             remedy="give -W the project's folder")
        return [root]
    if workload.startswith("file:"):
        path = Path(workload[5:]).expanduser()
        if not path.is_file():
            raise UsageError(f"{workload}: no such file",
                             remedy="give -w file:PATH of your benchmark")
        return [path]
    raise UsageError(f"watch has nothing to watch for {visible(workload, 80)}",
                     remedy="give -W DIR (the project), or -w file:PATH")


def _ignore(_value: object) -> None:
    return None


class SaveFilter:
    """Which changes the watcher reports as saves: the one file of a ``file:`` workload,
    else what ``watchfiles.DefaultFilter`` keeps (no ``.git``, caches, editor swap files)
    that lies in the project once links are resolved. The watcher follows a symlinked
    directory (a ``data -> /datasets`` link the workspace itself leaves out): without the
    last rule, writes far outside the project, the store's own among them, would each
    start an iteration."""

    def __init__(self, roots: list[Path]) -> None:
        import watchfiles  # the loop's dependency, imported where it is used

        self.files = {os.path.realpath(r) for r in roots if r.is_file()}
        self.dirs = [os.path.realpath(r) for r in roots if not r.is_file()]
        self._default = watchfiles.DefaultFilter()

    def __call__(self, change: Change, path: str) -> bool:
        real = os.path.realpath(path)
        if self.files:
            return real in self.files
        return self._default(change, path) and any(
            real == d or real.startswith(d + os.sep) for d in self.dirs)


class WatchLoop:
    """Save → sync → run → one :class:`Iteration`, until :meth:`stop`.

    Args:
        engine: the connected engine; every iteration is a run of its session.
        roots: what to watch (:func:`watched_paths`).
        make_spec: the iteration's spec, built anew each time (a ``file:`` workload is
            read from disk into it).
        workspace: the project synced before each run (None: the spec carries it all).
        baseline: Tier-1 samples every iteration is compared with (None: the first
            measured iteration's).
        baseline_label: how the faces name that baseline (e.g. a run id).
        debounce_ms: saves within this many ms make one iteration.
        on_iteration: called with each finished iteration, and again with an iteration
            whose comparison with the baseline changed (:meth:`set_baseline`).
        on_status: called as the loop changes phase.
        clock: the monotonic clock iterations are timed with.
    """

    def __init__(self, engine: Engine, roots: list[Path],
                 make_spec: Callable[[], protocol.RunSpec], *,
                 workspace: WorkspaceSync | None = None,
                 baseline: list[float] | None = None, baseline_label: str | None = None,
                 debounce_ms: int = 300,
                 on_iteration: Callable[[Iteration], None] = _ignore,
                 on_status: Callable[[WatchStatus], None] = _ignore,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.roots = roots
        self.make_spec = make_spec
        self.workspace = workspace
        self.baseline = baseline
        self.baseline_label = baseline_label
        #: The iteration that is the baseline (None while it is a stored run, or none yet).
        self.baseline_n: int | None = None
        self.debounce_ms = debounce_ms
        self.on_iteration = on_iteration
        self.on_status = on_status
        self.clock = clock
        self.iterations: list[Iteration] = []
        #: Every run the loop started (a face tells them from runs it started itself).
        self.run_ids: set[str] = set()
        self.files = 0 if workspace is not None else len(roots)
        self._stop = asyncio.Event()
        self._current: asyncio.Task[Iteration] | None = None
        #: Set by ``stop(cancel_run=True)``: the iteration's run is cancelled on the pod.
        self._cancel_run = False
        self._starting = False
        self._run_id = ""
        self._cancel_task: asyncio.Task[protocol.RunInfo] | None = None

    # ------------------------------------------------------------------ control
    def stop(self, *, cancel_run: bool = False) -> None:
        """End the loop.

        Args:
            cancel_run: also cancel the iteration's run on the pod and let its
                ``run_finished`` be stored (the iteration ends ``cancelled``, reported
                like any other); without it the run goes on on the pod and the
                iteration is dropped at once (``gpuws watch``'s Ctrl+C).
        """
        self._stop.set()
        current = self._current
        if current is None or current.done():
            return
        if not cancel_run:
            current.cancel()
            return
        self._cancel_run = True
        if self._run_id:
            self._cancel_pod_run(self._run_id)
        elif not self._starting:
            current.cancel()  # still scanning or syncing: nothing runs on the pod yet
        # else: start_run is in flight; the iteration cancels its run once it has the id

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stop.is_set()

    async def set_baseline(self, n: int) -> None:
        """Make iteration ``n`` the baseline and compare every measured iteration with it
        again (each one whose comparison changed is handed to ``on_iteration``).

        Raises:
            UsageError: no such iteration, or it has no Tier-1 samples.
        """
        it = next((i for i in self.iterations if i.n == n), None)
        if it is None or not it.samples:
            raise UsageError(f"iteration #{n} has no Tier-1 samples to compare with",
                             remedy="mark an iteration that shows a median")
        self.baseline, self.baseline_n, self.baseline_label = it.samples, n, f"#{n}"
        base = it.samples
        for other in self.iterations:
            if not other.samples:
                continue
            other.vs_base = (None if other is it
                             else await asyncio.to_thread(compare_samples, base, other.samples))
            self.on_iteration(other)

    # ------------------------------------------------------------------ the loop
    async def run(self) -> list[Iteration]:
        """Measure once now, then once per (debounced) save until :meth:`stop`."""
        import watchfiles  # only the loop needs it (and it starts a Rust thread)

        # The watcher runs from before the first iteration, and saves made while an
        # iteration runs wait in the queue: none is missed, and they make one iteration.
        saves: asyncio.Queue[tuple[float, set[str]]] = asyncio.Queue()
        # A file is watched through its folder (an editor's save often replaces the
        # file, which a watch on the file itself would lose), for that one name only.
        wanted = SaveFilter(self.roots)
        folders = [r.parent if r.is_file() else r for r in self.roots]
        recursive = not wanted.files

        async def watcher() -> None:
            async for changes in watchfiles.awatch(*folders, debounce=self.debounce_ms,
                                                   stop_event=self._stop,
                                                   watch_filter=wanted, recursive=recursive):
                saves.put_nowait((self.clock(), {_rel(p, folders) for _k, p in changes}))

        watching = asyncio.create_task(watcher())
        try:
            await asyncio.sleep(0)  # let the watcher start before anything is measured
            await self._measure([], self.clock())
            while not self._stop.is_set():
                self._status("waiting")
                waiting = asyncio.ensure_future(saves.get())
                stopped = asyncio.ensure_future(self._stop.wait())
                await asyncio.wait({waiting, stopped}, return_when=asyncio.FIRST_COMPLETED)
                stopped.cancel()
                if not waiting.done():
                    waiting.cancel()
                    break
                t0, changed = waiting.result()
                while not saves.empty():  # saves that came meanwhile join this iteration
                    changed |= saves.get_nowait()[1]
                await self._measure(sorted(changed), t0)
        finally:
            self._stop.set()
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
            if self._cancel_task is not None:
                # Refused only when the run had ended by itself meanwhile: it is stored
                # either way.
                with contextlib.suppress(GpuwsError, asyncio.CancelledError):
                    await self._cancel_task
            self._status("stopped")
        return self.iterations

    async def _measure(self, changed: list[str], t0: float) -> None:
        self._current = asyncio.create_task(self._one(len(self.iterations) + 1, changed, t0))
        try:
            it = await self._current
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the loop itself is cancelled, not only its iteration
            return  # stop() dropped the iteration; its run (if any) goes on on the pod
        finally:
            self._current = None
            self._run_id = ""
        ok = [i for i in self.iterations if i.samples]
        if it.samples:
            if ok:
                it.vs_prev = await asyncio.to_thread(compare_samples, ok[-1].samples,
                                                     it.samples)
            if self.baseline is not None:
                it.vs_base = await asyncio.to_thread(compare_samples, self.baseline,
                                                     it.samples)
            elif not ok:
                # The first measured iteration is the baseline.
                self.baseline, self.baseline_n = it.samples, it.n
                self.baseline_label = f"#{it.n}"
        self.iterations.append(it)
        self.on_iteration(it)

    async def _one(self, n: int, changed: list[str], t0: float) -> Iteration:
        engine = self.engine
        it = Iteration(n, changed)
        spec = self.make_spec()
        if self.workspace is not None and engine.link is not None:
            from ..workspace.manifest import describe

            self._status("syncing", n)
            try:
                manifest = await asyncio.to_thread(self.workspace.scan)
                self.files = len(manifest.entries)
                synced = await self.workspace.sync(engine.link.client, manifest)
            except WorkspaceError as exc:
                # The tree as saved is refused (a link out of it, a file over its cap...):
                # an iteration with the reason, and the loop waits for the save that
                # fixes it, as after a workload that fails.
                it.status = "refused"
                it.error = exc.message + (f" ({exc.remedy})" if exc.remedy else "")
                it.wall_s = self.clock() - t0
                return it
            it.note = describe(manifest.notes)
            code = await asyncio.to_thread(self.workspace.code, manifest)
            it.changed = synced.diff.paths if n > 1 else it.changed
            self._starting = True
            try:
                info = await engine.start_run(spec, code, manifest.entries)
            finally:
                self._starting = False
        else:
            self._starting = True
            try:
                info = await engine.start_run(spec)
            finally:
                self._starting = False
        it.run_id = self._run_id = info.run_id
        self.run_ids.add(info.run_id)
        self._status("running", n)
        if self._cancel_run:  # stopped while the pod was starting it
            self._cancel_pod_run(info.run_id)
        fin = await engine.wait_finished(info.run_id)
        it.status, it.error = fin.status, fin.error or ""
        await engine.drained()
        run_id = info.run_id
        samples, result, busy = await engine.store.call(lambda s: _tier1(s, run_id))
        it.wall_s = self.clock() - t0
        if busy is not None:
            it.overhead_s = max(0.0, it.wall_s - busy)
        if fin.status == "ok" and samples and result is not None:
            stats = result.stats
            it.samples = samples
            it.median_ms = stats.median_ms
            it.ci_low_ms, it.ci_high_ms = stats.ci_low_ms, stats.ci_high_ms
            it.ci_pct = (stats.ci_rel_halfwidth * 100
                         if stats.ci_rel_halfwidth is not None else None)
        return it

    def _cancel_pod_run(self, run_id: str) -> None:
        if self._cancel_task is None:
            self._status("stopping", len(self.iterations) + 1)
            self._cancel_task = asyncio.create_task(self.engine.cancel(run_id))

    def _status(self, phase: Phase, n: int | None = None) -> None:
        iteration = n if n is not None else len(self.iterations)
        self.on_status(WatchStatus(phase, iteration, self.files, self._run_id))


def _tier1(store: Store, run_id: str) -> tuple[list[float], protocol.Tier1Result | None,
                                                float | None]:
    """The run's samples, its Tier-1 result and the wall time its tiers and workload took."""
    samples = store.samples(run_id)
    result = store.tier1(run_id)
    busy = sum(ev.wall_s for ev in store.run_events(run_id, ["tier_finished"])
               if isinstance(ev, protocol.TierFinished))
    return samples, result, busy or None


def _rel(path: str, roots: list[Path]) -> str:
    for root in roots:
        with contextlib.suppress(ValueError):
            return os.path.relpath(path, root) if Path(path).is_relative_to(root) else path
    return path
