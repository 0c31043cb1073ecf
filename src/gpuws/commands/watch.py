"""``gpuws watch POD -w WORKLOAD [-W DIR]``: every save of the project is a measured run.

One connection, held open through the one laptop engine; a file watcher (``watchfiles``)
over the workspace (or the ``file:`` workload's folder); on each debounced save: sync what
changed, run the chosen tiers (default Tier 1), and print one line: the iteration, what
changed, the median with its CI, the change against the previous iteration and against
the baseline (the first iteration, or ``--baseline RUN``) with a verdict that respects
noise (``sessions.compare``'s bootstrap CI of the median ratio, at 95%). A workload that
fails prints its error and the loop waits for the next save. Ctrl+C ends it with a table
of the iterations. Every iteration is a stored run of the session, tied to its code.

The loop itself is ``live.watchloop.WatchLoop``, shared with the TUI's watch screen; this
module holds the arguments and the printing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from pathlib import Path

import msgspec
from rich.table import Table
from rich.text import Text

from .. import protocol
from ..errors import UsageError
from ..gpu import gpus
from ..live.watchloop import Iteration, WatchLoop
from ..live.watchloop import watched_paths as _watched
from ..sessions.compare import change_text, verdict_word
from ..sessions.store import Store
from ..text import humanfmt
from ..text.textsafe import visible
from .common import console, target_of
from .lease import connect_starting
from .run import Printer, build_spec, make_engine

__all__ = ["Iteration", "change_text", "line", "summary", "verdict_word", "watch",
           "watch_spec", "watched_paths"]


def watched_paths(args: argparse.Namespace) -> list[Path]:
    """What to watch for these arguments (``live.watchloop.watched_paths``).

    Raises:
        UsageError: nothing to watch (a ``builtin:`` or ``cmd:`` workload without ``-W``).
    """
    return _watched(getattr(args, "workspace", None), str(args.workload))


def line(it: Iteration) -> Text:
    """The iteration's one line."""
    what = ", ".join(it.changed[:3]) + (f" +{len(it.changed) - 3}" if len(it.changed) > 3
                                         else "") if it.changed else "start"
    head = Text(f"#{it.n:<3} ", style="bold")
    head.append(visible(what, 60))
    if it.note:  # what the sync skipped (describe() made it visible)
        head.append(f"  ({it.note})", "yellow")
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


#: run's options that mean nothing to a watch (it stays in the foreground, prints its own
#: lines and has no single result to fail on): refused, not silently ignored.
_RUN_ONLY = (("detach", "--detach"), ("fail_if_slower", "--fail-if-slower"),
             ("json", "--json"))


async def watch(args: argparse.Namespace) -> int:
    for dest, flag in _RUN_ONLY:
        if getattr(args, dest, None) not in (None, False):
            raise UsageError(f"{flag} is a `gpuws run` option; watch does not take it",
                             remedy=f"drop {flag}, or use `gpuws run` for one run")
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
    # The workload, tiers and options checked before connecting; a watch that could
    # measure nothing on any pod is refused here too.
    refuse_unmeasurable(args, build_spec(args), None)
    workspace = None
    if args.workspace:
        from ..workspace.sync import WorkspaceSync

        workspace = WorkspaceSync(args.workspace)
        await asyncio.to_thread(workspace.scan)  # refused before anything connects

    printer = Printer(False)
    printer.muted = True  # one line per iteration, not the run's stream
    engine = make_engine(args, printer)
    out = console(markup=False)
    err = console(stderr=True, markup=False)
    loop = asyncio.get_running_loop()
    watcher = WatchLoop(engine, roots, lambda: watch_spec(args), workspace=workspace,
                        baseline=baseline_samples, debounce_ms=args.debounce_ms,
                        # one line each, whatever the width
                        on_iteration=lambda it: out.print(line(it), soft_wrap=True))
    # Ctrl+C ends the loop; an iteration's run goes on on the pod.
    loop.add_signal_handler(signal.SIGINT, watcher.stop)
    refused: str | None = None  # the session of a watch refused once connected
    try:
        await connect_starting(engine, target_of(args), args)
        if engine.link is not None:
            try:
                refuse_unmeasurable(args, build_spec(args), engine.link.probe)
            except UsageError:
                refused = engine.session_id  # nothing watched: no empty session kept
                raise
            gpus.check_on_pod(build_spec(args).gpu, engine.link.probe)
        err.print(Text(f"watching {', '.join(visible(str(r)) for r in roots)} on "
                       f"{visible(args.host)}: save a file to measure; Ctrl+C ends",
                       style="dim"))
        await watcher.run()
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        with contextlib.suppress(Exception):
            await engine.close()
        if refused is not None:
            sid = refused
            await engine.store.call(lambda s: s.discard_if_empty(sid))
        await engine.store.close()
    if watcher.iterations:
        out.print(summary(watcher.iterations))
    return 0


def refuse_unmeasurable(args: argparse.Namespace, spec: protocol.RunSpec,
                        probe: protocol.Probe | None) -> None:
    """Refuse a watch whose every save would fail, or measure nothing, the same way.

    One run shows such a failure once; a watch repeated it on every save (issue 34,
    finding 8). The TUI's Launch asks before such a run; a command line cannot ask, so
    ``--yes`` is the answer given in advance (what the other confirmations take).

    Args:
        args: the watch's arguments (``--yes``, the host as named).
        spec: the iteration's spec.
        probe: the pod's probe once connected (None before: only the workload is judged).

    Raises:
        UsageError: a ``cmd:`` workload (no Tier 1, so no median to compare), or a pod
            without a GPU (a bundled kernel or a Python file fails at once).
    """
    if getattr(args, "yes", False):
        return
    if spec.workload.startswith("cmd:"):
        raise UsageError(
            "a cmd: workload has no Tier 1 (it times a Python file's run()): every save "
            "would re-run the command and print no median to compare",
            remedy="watch a Python file (-w file:PATH, -W DIR for its project), or add "
                   "--yes to re-run the command on every save anyway")
    if probe is not None and not probe.gpus:
        why = visible(probe.gpu_error or "none was found", 200)
        raise UsageError(
            f"{visible(args.host, 80)} has no GPU ({why}): every save's run would fail at "
            "once, the same way",
            remedy=f"watch on a pod with a GPU (`{visible(target_of(args).command('doctor'))}`"
                   " says what this one has), or add --yes to watch anyway")


def watch_spec(args: argparse.Namespace) -> protocol.RunSpec:
    """The iteration's spec: the run's, as one of this connection's session
    (``RunSpec.fork_server``: the pod probed once, the Tier-1 child of a Python workload
    forked from a pre-imported parent), unless ``--no-fork-server``."""
    spec = build_spec(args)
    if getattr(args, "fork_server", True):
        spec = msgspec.structs.replace(spec, fork_server=True)
    return spec
