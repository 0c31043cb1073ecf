"""``gpuws watch POD -w WORKLOAD [-W DIR]``: every save of the project is a measured run.

One connection, held open through the one laptop engine; a file watcher (``watchfiles``)
over the workspace (or the ``file:`` workload's folder); on each debounced save: sync what
changed, run the chosen tiers (default Tier 1), and print one line: the iteration, what
changed, the median with its CI, the change against the previous iteration and against
the baseline (the first iteration, or ``--baseline RUN``) with a verdict that respects
noise (``sessions.compare``'s bootstrap CI of the median ratio, at 95%). A workload that
fails prints its error and the loop waits for the next save. Ctrl+C ends it with a table
of the iterations. Every iteration is a stored run of the session, tied to its code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from rich.table import Table
from rich.text import Text

from .. import protocol
from ..errors import UsageError
from ..gpu import gpus
from ..sessions.compare import Tier1Comparison, change_text, compare_samples, verdict_word
from ..sessions.store import Store
from ..text import humanfmt
from ..text.textsafe import visible
from .common import console
from .run import Printer, build_spec, make_engine, target_of


@dataclass
class Iteration:
    """One save and its run."""

    n: int
    changed: list[str]
    run_id: str = ""
    status: str = ""
    error: str = ""
    samples: list[float] = field(default_factory=list)
    median_ms: float | None = None
    ci_pct: float | None = None
    vs_prev: Tier1Comparison | None = None
    vs_base: Tier1Comparison | None = None
    #: From the save (or the start) to the printed line.
    wall_s: float = 0.0
    #: What the loop added beyond the workload's own run on the pod (sync, start, store).
    overhead_s: float | None = None


def watched_paths(args: argparse.Namespace) -> list[Path]:
    """What to watch: the workspace, else the ``file:`` workload's file (the one file
    that travels with each run: nothing else in its folder changes what is measured).

    Raises:
        UsageError: nothing to watch (a ``builtin:`` or ``cmd:`` workload without ``-W``).
    """
    if getattr(args, "workspace", None):
        root = Path(args.workspace)
        if not root.is_dir():
            raise UsageError(f"-W {args.workspace}: not a directory",
                             remedy="give -W the project's folder")
        return [root]
    ref = str(args.workload)
    if ref.startswith("file:"):
        path = Path(ref[5:]).expanduser()
        if not path.is_file():
            raise UsageError(f"{ref}: no such file", remedy="give -w file:PATH of your benchmark")
        return [path]
    raise UsageError(f"watch has nothing to watch for {visible(ref, 80)}",
                     remedy="give -W DIR (the project), or -w file:PATH")


def line(it: Iteration) -> Text:
    """The iteration's one line."""
    what = ", ".join(it.changed[:3]) + (f" +{len(it.changed) - 3}" if len(it.changed) > 3
                                         else "") if it.changed else "start"
    head = Text(f"#{it.n:<3} ", style="bold")
    head.append(visible(what, 60))
    if it.status != "ok":
        head.append(f"  {it.status}: {visible(it.error or 'no reason given', 300)}", "red")
        return head
    if it.median_ms is None:
        head.append("  no Tier-1 samples (Tier 1 times a Python workload's run())", "yellow")
        return head
    ci = f" ±{it.ci_pct:.1f}%" if it.ci_pct is not None else ""
    head.append(f"  {humanfmt.ms(it.median_ms)}{ci}")
    for label, c in (("prev", it.vs_prev), ("base", it.vs_base)):
        if c is not None:
            style = {"faster": "green", "slower": "red"}.get(verdict_word(c), "dim")
            head.append(f"  vs {label} ")
            head.append(change_text(c), style)
    overhead = (f", overhead {humanfmt.duration(it.overhead_s)}"
                if it.overhead_s is not None else "")
    head.append(f"  ({humanfmt.duration(it.wall_s)}{overhead})", "dim")
    return head


def summary(iterations: list[Iteration]) -> Table:
    """The table Ctrl+C ends with."""
    t = Table(title="watch: the iterations", title_justify="left")
    for col in ("#", "changed", "run", "median", "vs prev", "vs base", "save→line",
                "overhead"):
        t.add_column(col)
    for it in iterations:
        median = (humanfmt.ms(it.median_ms) + (f" ±{it.ci_pct:.1f}%" if it.ci_pct else "")
                  if it.median_ms is not None else visible(it.status or "—"))
        t.add_row(str(it.n), visible(", ".join(it.changed) or "start", 60), it.run_id,
                  median, change_text(it.vs_prev), change_text(it.vs_base),
                  humanfmt.duration(it.wall_s),
                  humanfmt.duration(it.overhead_s) if it.overhead_s is not None else "—")
    return t


def _tier1(store: Store, run_id: str) -> tuple[list[float], protocol.Tier1Result | None,
                                                float | None]:
    """The run's samples, its Tier-1 result and the wall time its tiers and workload took."""
    samples = store.samples(run_id)
    result = store.tier1(run_id)
    busy = sum(ev.wall_s for ev in store.run_events(run_id, ["tier_finished"])
               if isinstance(ev, protocol.TierFinished))
    return samples, result, busy or None


async def watch(args: argparse.Namespace) -> int:
    roots = watched_paths(args)
    if args.baseline is None:
        baseline_samples: list[float] | None = None
    else:
        with Store() as store:
            base_id = store.run(args.baseline).run_id
            baseline_samples = store.samples(base_id)
        if not baseline_samples:
            raise UsageError(f"--baseline {args.baseline}: that run has no Tier-1 samples",
                             remedy="give a run that ran Tier 1 (`gpuws history` shows them)")
    build_spec(args)  # the workload, tiers and options checked before connecting
    workspace = None
    if args.workspace:
        from ..workspace.sync import WorkspaceSync

        workspace = WorkspaceSync(args.workspace)
        await asyncio.to_thread(workspace.scan)  # refused before anything connects
    import watchfiles

    printer = Printer(False)
    printer.muted = True  # one line per iteration, not the run's stream
    engine = make_engine(args, printer)
    out = console(markup=False)
    err = console(stderr=True, markup=False)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    current: asyncio.Task[Iteration] | None = None

    def interrupted() -> None:
        stop.set()
        if current is not None:
            current.cancel()  # the run goes on on the pod; the loop ends

    loop.add_signal_handler(signal.SIGINT, interrupted)
    iterations: list[Iteration] = []
    try:
        await engine.connect(target_of(args))
        if engine.link is not None:
            gpus.check_on_pod(build_spec(args).gpu, engine.link.probe)
        err.print(Text(f"watching {', '.join(visible(str(r)) for r in roots)} on "
                       f"{visible(args.host)}: save a file to measure; Ctrl+C ends",
                       style="dim"))

        async def one(n: int, changed: list[str], t0: float) -> Iteration:
            it = Iteration(n, changed)
            spec = watch_spec(args)  # a file: workload travels in the spec: read it anew
            if workspace is not None and engine.link is not None:
                manifest = await asyncio.to_thread(workspace.scan)
                synced = await workspace.sync(engine.link.client, manifest)
                code = await asyncio.to_thread(workspace.code, manifest)
                it.changed = synced.diff.paths if n > 1 else it.changed
                info = await engine.start_run(spec, code, manifest.entries)
            else:
                info = await engine.start_run(spec)
            it.run_id = info.run_id
            fin = await engine.wait_finished(info.run_id)
            it.status, it.error = fin.status, fin.error or ""
            await engine.drained()
            samples, result, busy = await engine.store.call(
                lambda s: _tier1(s, info.run_id))
            it.wall_s = time.monotonic() - t0
            if busy is not None:
                it.overhead_s = max(0.0, it.wall_s - busy)
            if fin.status == "ok" and samples and result is not None:
                it.samples = samples
                it.median_ms = result.stats.median_ms
                it.ci_pct = (result.stats.ci_rel_halfwidth * 100
                             if result.stats.ci_rel_halfwidth is not None else None)
            return it

        async def measure(changed: list[str], t0: float) -> None:
            nonlocal current, baseline_samples
            current = asyncio.create_task(one(len(iterations) + 1, changed, t0))
            try:
                it = await current
            except asyncio.CancelledError:
                return
            finally:
                current = None
            ok = [i for i in iterations if i.samples]
            if it.samples:
                if ok:
                    it.vs_prev = compare_samples(ok[-1].samples, it.samples)
                if baseline_samples is not None:
                    it.vs_base = compare_samples(baseline_samples, it.samples)
                elif not ok:
                    baseline_samples = it.samples  # the first measured iteration
            iterations.append(it)
            out.print(line(it), soft_wrap=True)  # one line each, whatever the width

        # The watcher runs from before the first iteration, and saves made while an
        # iteration runs wait in the queue: none is missed, and they make one iteration.
        saves: asyncio.Queue[tuple[float, set[str]]] = asyncio.Queue()
        # A file is watched through its folder (an editor's save often replaces the
        # file, which a watch on the file itself would lose), for that one name only.
        files = {os.path.realpath(r) for r in roots if r.is_file()}
        folders = [r.parent if r.is_file() else r for r in roots]
        recursive = not files
        default = watchfiles.DefaultFilter()

        def wanted(change: watchfiles.Change, path: str) -> bool:
            if files:
                return os.path.realpath(path) in files
            return default(change, path)

        async def watcher() -> None:
            async for changes in watchfiles.awatch(*folders, debounce=args.debounce_ms,
                                                   stop_event=stop, raise_interrupt=False,
                                                   watch_filter=wanted, recursive=recursive):
                saves.put_nowait((time.monotonic(), {_rel(p, folders) for _k, p in changes}))

        watching = asyncio.create_task(watcher())
        await asyncio.sleep(0)  # let the watcher start before anything is measured
        await measure([], time.monotonic())
        while not stop.is_set():
            waiting = asyncio.ensure_future(saves.get())
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait({waiting, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if not waiting.done():
                waiting.cancel()
                break
            t0, changed = waiting.result()
            while not saves.empty():  # saves that came meanwhile join this iteration
                changed |= saves.get_nowait()[1]
            await measure(sorted(changed), t0)
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        with contextlib.suppress(Exception):
            await engine.close()
        await engine.store.close()
    if iterations:
        out.print(summary(iterations))
    return 0


def watch_spec(args: argparse.Namespace) -> protocol.RunSpec:
    """The iteration's spec: the run's, as one of this connection's session
    (``RunSpec.fork_server``: the pod probed once, the Tier-1 child of a Python workload
    forked from a pre-imported parent), unless ``--no-fork-server``."""
    spec = build_spec(args)
    if getattr(args, "fork_server", True):
        spec = msgspec.structs.replace(spec, fork_server=True)
    return spec


def _rel(path: str, roots: list[Path]) -> str:
    for root in roots:
        with contextlib.suppress(ValueError):
            return os.path.relpath(path, root) if Path(path).is_relative_to(root) else path
    return path


