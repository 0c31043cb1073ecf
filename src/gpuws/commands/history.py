"""``gpuws sessions``, ``history``, ``export``, ``compare``, ``baseline`` (``pull``: pull.py).

The laptop's memory. Every id a person types is resolved by :func:`find_run` or
:func:`find_session`: an unknown or ambiguous one is a usage error (exit 2) that points
to the listing where ids are found (``gpuws history``, ``gpuws sessions``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from ..errors import StoreError, UsageError
from ..sessions.agent_actions import actions, agent_runs, agent_section
from ..sessions.cost import economics
from ..sessions.runlist import CHUNK, RUN_LISTING_REMEDY, RunSummary, iter_runs
from ..sessions.store import RunRow, SessionRow, Store
from ..text.textsafe import visible_lines
from .common import check_output, console, write_report


def find_run(store: Store, run_id: str) -> RunRow:
    """A stored run by id or unique prefix.

    Raises:
        UsageError: no run (or more than one) matches; the remedy points to
            ``gpuws history``.
    """
    try:
        return store.run(run_id)
    except StoreError as exc:
        raise UsageError(exc.message, remedy=RUN_LISTING_REMEDY) from None


def find_session(store: Store, session_id: str) -> SessionRow:
    """A stored session by id or unique prefix.

    Raises:
        UsageError: no session (or more than one) matches; the remedy points to
            ``gpuws sessions``.
    """
    try:
        return store.session(session_id)
    except StoreError as exc:
        remedy = "`gpuws sessions` lists the sessions and their ids; give an id or a " \
                 "unique prefix of one"
        try:  # a fleet's id given where a session's goes (`gpuws export FLEET_ID`)
            fleet = store.fleet(session_id)
        except StoreError:
            pass
        else:
            import shlex

            remedy = (f"{fleet.id} is a fleet: `gpuws export --fleet {shlex.quote(fleet.id)}`"
                      " exports it")
        raise UsageError(exc.message, remedy=remedy) from None


async def sessions(args: argparse.Namespace) -> int:
    """The recorded sessions, newest first (``--limit``: only the newest N)."""
    with Store() as store:
        rows = (_session_item(store, s) for s in store.newest_sessions(args.limit))
        if args.json:
            print_json_stream(rows)  # one session at a time, whatever the store holds
            return 0
        shown = list(rows)
    from .listing import sessions_table  # Rich, for people only: not for --json

    console(markup=False).print(sessions_table(shown))
    return 0


def _session_item(store: Store, s: SessionRow) -> dict[str, Any]:
    econ = economics(store, s.id)
    gpu = s.probe.gpus[0].name if s.probe and s.probe.gpus else None
    return {"id": s.id, "host": s.host, "gpu": gpu, "started": s.started, "ended": s.ended,
            "duration_s": econ.connected_s, "runs": s.run_count,
            "rate_usd_per_hour": s.rate_usd_per_hour, "cost_usd": econ.total_cost_usd}


async def history(args: argparse.Namespace) -> int:
    """The stored runs (all, or one session's): id, workload, status, Tier-1 median.

    Streamed a chunk of runs at a time, JSON included: 20,000 runs took 8.4 s before the
    first line and held 122 MiB of JSON; now the first screenful is out after the first
    chunk is read (within one session too), and memory is one chunk's runs.
    """
    with Store() as store:
        session = find_session(store, args.session).id if args.session else None
        runs = iter_runs(store, session, args.limit)
        by_agent = agent_runs(store)  # runs a coding agent made through `gpuws mcp`
        if args.json:
            print_json_stream(dict(msgspec.to_builtins(r),
                                   by="agent" if r.run_id in by_agent else "person")
                              for r in runs)
            return 0
        # Rich is imported for people only: `history --json` never loads it.
        from rich.text import Text

        from .listing import SessionTable

        out = console(markup=False)
        shown = 0
        table: SessionTable | None = None
        session_id = None
        for chunk in _chunks(runs):
            # A chunk is of one session; a new session starts a new table.
            if table is None or chunk[0].session_id != session_id:
                table, session_id = SessionTable(out.width, by_agent), chunk[0].session_id
            block = table.add(chunk)
            if out.color_system is None:
                # No styles go out (a pipe, a file, a pager): Rich would only split the
                # lines and join them again, half the time of 20,000 runs. The lines are
                # laid out to the width already and every field was made visible; the same
                # net as the console's goes over the whole block. The bytes are Rich's.
                out.file.write(visible_lines(block.plain) + "\n")
            else:
                out.print(block, no_wrap=True, overflow="ellipsis")
            # Flushed per chunk: a pager shows the first screenful at once.
            out.file.flush()
            shown += len(chunk)
    if not shown:
        where = f"session {args.session}" if args.session else "the store"
        out.print(Text(f"no runs in {where} yet: `gpuws run HOST -w WORKLOAD` makes one",
                       "yellow"))
        return 0
    out.print(Text("run ids (or prefixes) go to compare, baseline, pull and replay SESSION "
                   "--run", "dim"))
    return 0


def _chunks(runs: Iterator[RunSummary]) -> Iterator[list[RunSummary]]:
    """The runs in the chunks they are read in (:data:`~gpuws.sessions.runlist.CHUNK`),
    never two sessions in one."""
    chunk: list[RunSummary] = []
    for run in runs:
        if chunk and run.session_id != chunk[0].session_id:
            yield chunk
            chunk = []
        chunk.append(run)
        if len(chunk) == CHUNK:  # given at once: the next run would read the next chunk
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def print_json_stream(items: Iterable[Any]) -> None:
    """A JSON array written one item at a time, the same text ``print_json`` writes."""
    import json

    write = sys.stdout.write
    opened = False
    for item in items:
        write(",\n  " if opened else "[\n  ")
        # Indented one level more, as inside the array: JSON text holds no raw newline
        # but the ones indent= put between its lines.
        write(json.dumps(item, indent=2).replace("\n", "\n  "))
        opened = True
    write("\n]\n" if opened else "[]\n")


async def export(args: argparse.Namespace) -> int:
    # The report and comparison builders are imported by the commands that use them:
    # `history` and `sessions` start without them.
    from ..sessions.export import export_session
    from ..sessions.export_images import Figures

    check_output(args.output)
    # Pictures lie beside a report file; a report on stdout has nowhere to put them.
    to_file = bool(args.output) and args.output != "-"
    figures = Figures(_stem(Path(args.output).name)) \
        if to_file and not getattr(args, "no_images", False) else None
    with Store() as store:
        session = find_session(store, args.session)
        text = export_session(store, session.id, figures=figures) \
            + agent_section(actions(store, session.id))
    if figures is not None:
        # Before the report, so a report never links a picture that is not there.
        write_pictures(Path(args.output).parent, figures.files)
    write_report(text, args.output)
    return 0


def write_pictures(folder: Path, files: dict[str, str]) -> None:
    """Each picture (file name → SVG text) into ``folder``, each whole or not at all.

    Raises:
        UsageError: a file could not be written (its temporary file is removed).
    """
    for name, svg in sorted(files.items()):
        path = folder / name
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_bytes(svg.encode("utf-8"))
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise UsageError(f"{path}: {exc.strerror or exc}",
                             remedy="give -o a file in a writable directory, or leave the "
                                    "pictures out with --no-images") from exc


def _stem(name: str) -> str:
    """``report`` for ``report.md``: the pictures' names begin with it."""
    return name[:-3] if name.lower().endswith(".md") and len(name) > 3 else name


async def compare(args: argparse.Namespace) -> int:
    from ..sessions.compare import (
        compare_runs,
        comparison_json,
        refuse_if_empty,
        render_comparison,
    )

    with Store() as store:
        a, b = find_run(store, args.run_a).run_id, find_run(store, args.run_b).run_id
        if a == b:
            raise UsageError(f"{args.run_a} and {args.run_b} are the same run ({a})",
                             remedy="compare two different runs (`gpuws history` lists them)")
        cmp = compare_runs(store, a, b)
    refuse_if_empty(cmp)
    if args.json:
        sys.stdout.write(comparison_json(cmp) + "\n")
    else:
        render_comparison(cmp, console(markup=False))
    return 0


async def baseline(args: argparse.Namespace) -> int:
    with Store() as store:
        run = find_run(store, args.run_id)
        store.set_baseline(run.run_id, not args.off)
    console().print(f"{run.run_id} {'is no longer' if args.off else 'is now'} a baseline")
    return 0
