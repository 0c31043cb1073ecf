"""``gpuws sessions``, ``history``, ``export``, ``compare``, ``baseline`` (``pull``: pull.py).

The laptop's memory. Every id a person types is resolved by :func:`find_run` or
:func:`find_session`: an unknown or ambiguous one is a usage error (exit 2) that points
to the listing where ids are found (``gpuws history``, ``gpuws sessions``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from itertools import groupby
from typing import Any

import msgspec
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from ..errors import StoreError, UsageError
from ..sessions.compare import compare_runs, comparison_json, refuse_if_empty, render_comparison
from ..sessions.cost import economics
from ..sessions.export import export_session
from ..sessions.runlist import RUN_LISTING_REMEDY, RunSummary, iter_runs
from ..sessions.store import RunRow, SessionRow, Store
from ..text import humanfmt
from ..text.textsafe import text as safe
from ..text.textsafe import visible
from .common import check_output, console, print_json, write_report


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
        raise UsageError(exc.message, remedy="`gpuws sessions` lists the sessions and their "
                                             "ids; give an id or a unique prefix of one") \
            from None


async def sessions(args: argparse.Namespace) -> int:
    with Store() as store:
        rows: list[dict[str, Any]] = []
        for s in store.sessions():
            econ = economics(store, s.id)
            gpu = s.probe.gpus[0].name if s.probe and s.probe.gpus else None
            rows.append({"id": s.id, "host": s.host, "gpu": gpu, "started": s.started,
                         "ended": s.ended, "duration_s": econ.connected_s,
                         "runs": s.run_count, "rate_usd_per_hour": s.rate_usd_per_hour,
                         "cost_usd": econ.total_cost_usd})
    if args.json:
        print_json(rows)
        return 0
    t = Table(title="sessions", title_justify="left",
              caption="`gpuws history SESSION` lists a session's runs and their ids",
              caption_justify="left")
    for col in ("id", "host", "GPU", "started", "duration", "runs", "cost"):
        t.add_column(col, justify="right" if col in ("runs", "cost", "duration") else "left")
    for r in rows:
        # The GPU's name is the pod's word, the host may be a recorded one: shown, never
        # read as markup or sent to the terminal as a control sequence.
        t.add_row(safe(r["id"]), safe(r["host"], limit=200),
                  safe(r["gpu"] or humanfmt.DASH, limit=200),
                  humanfmt.when(r["started"]),
                  humanfmt.duration(r["duration_s"]), str(r["runs"]),
                  humanfmt.usd(r["cost_usd"]))
    console(markup=False).print(t)
    return 0


async def history(args: argparse.Namespace) -> int:
    """The stored runs (all, or one session's): id, workload, status, Tier-1 median.

    Streamed one session at a time, JSON included: 20,000 runs took 8.4 s before the
    first line and held 122 MiB of JSON; now the first screenful is out after the first
    session's runs are read, and memory is one session's runs.
    """
    with Store() as store:
        session = find_session(store, args.session).id if args.session else None
        runs = iter_runs(store, session, args.limit)
        if args.json:
            print_json_stream(msgspec.to_builtins(r) for r in runs)
            return 0
        out = console(markup=False)
        shown = 0
        for _, group in groupby(runs, key=lambda r: r.session_id):
            rows = list(group)
            out.print(history_block(rows, out.width), no_wrap=True, overflow="ellipsis")
            # Flushed per session: a pager shows the first screenful at once.
            out.file.flush()
            shown += len(rows)
    if not shown:
        where = f"session {args.session}" if args.session else "the store"
        out.print(Text(f"no runs in {where} yet: `gpuws run HOST -w WORKLOAD` makes one",
                       "yellow"))
        return 0
    out.print(Text("run ids (or prefixes) go to compare, baseline, pull and replay SESSION "
                   "--run", "dim"))
    return 0


def print_json_stream(items: Iterable[Any]) -> None:
    """A JSON array written one item at a time, the same text ``print_json`` writes."""
    import json
    import textwrap

    write = sys.stdout.write
    opened = False
    for item in items:
        write(",\n" if opened else "[\n")
        write(textwrap.indent(json.dumps(item, indent=2), "  "))
        opened = True
    write("\n]\n" if opened else "[]\n")


#: Below this many columns the table drops "started" (the run id holds the start time).
NARROW = 100
#: The fewest columns the workload keeps, however narrow the terminal.
_MIN_WORKLOAD = 8


def history_block(rows: list[RunSummary], width: int) -> Text:
    """One session's runs as a table: a title line, a header, a rule, then the runs.

    Each row is at most three lines at any width: the run id whole, the workload, its
    reason and its code on one line each, cut with an ellipsis (before, a row folded to
    13-17 lines at 80 columns). Laid out here, with widths known from the rows, rather
    than by a Rich ``Table`` per session: measuring every cell made ``history`` of
    2,000 runs take 5 s, of 20,000 runs 50 s.
    """
    first = rows[0]
    narrow = width < NARROW
    # One list of lines per cell, per column: (header, right-justified, max width, cells).
    columns: list[tuple[str, bool, int | None, list[list[Text]]]] = [
        ("run id", False, None, [[safe(r.run_id)] for r in rows])]
    if not narrow:
        columns.append(("started", False, None,
                        [[Text(humanfmt.when(r.started)[11:])] for r in rows]))
    columns += [("status", False, 12, [_status(r) for r in rows]),
                ("Tier-1 median", True, None, [[Text(_median(r))] for r in rows])]
    workload = [_workload(r) for r in rows]
    widths = [_natural(header, cells, most) for header, _, most, cells in columns]
    # The one column that gives way: the others keep their width, this one is cut.
    room = width - sum(widths) - 3 * (len(widths) + 1) + 1
    widths.append(max(_MIN_WORKLOAD, min(_natural("workload", workload, None), room)))
    columns.append(("workload", False, None, workload))
    rule = "─" * (sum(widths) + 3 * len(widths) - 1)
    lines = [Text.assemble("session ", (visible(first.session_id), "bold"),
                           f" · {visible(first.host, 200)} · ",
                           humanfmt.when(first.started)[:10]),
             _line([Text(c[0], "bold") for c in columns], columns, widths), Text(rule)]
    for i in range(len(rows)):
        cells = [c[3][i] for c in columns]
        for k in range(max(len(cell) for cell in cells)):
            lines.append(_line([cell[k] if k < len(cell) else Text() for cell in cells],
                               columns, widths))
    for line in lines:
        line.truncate(width, overflow="ellipsis")
    return Text("\n").join(lines)


def _natural(header: str, cells: list[list[Text]], most: int | None) -> int:
    """A column's width: its widest line (or header), at most ``most``."""
    wide = max([cell_len(header), *(line.cell_len for cell in cells for line in cell)])
    return wide if most is None else min(wide, most)


def _line(parts: list[Text], columns: list[tuple[str, bool, int | None, list[list[Text]]]],
          widths: list[int]) -> Text:
    line = Text(" ")
    for j, (part, width) in enumerate(zip(parts, widths, strict=True)):
        part = part.copy()
        part.truncate(width, overflow="ellipsis")
        part.align("right" if columns[j][1] else "left", width)
        if j:
            line.append("   ")
        line.append(part)
    line.rstrip()
    return line


def _workload(r: RunSummary) -> list[Text]:
    # Text, not str: a workload may hold "[...]", which must never be read as markup, and
    # made visible: "\x1b]0;…" must not retitle the terminal. Each line is cut, not
    # folded: the lines are ours, a reason's own newlines are shown as \n.
    lines = [safe(r.workload)]
    if r.why:
        # "cancelled during tier 1" beside "cancelled" reads as "during tier 1".
        why = r.why.removeprefix(r.status).strip() or r.why
        lines.append(Text(visible(why), "dim"))
    if r.code is not None:
        # Which code gave the number: tree, commit, dirty files.
        lines.append(Text(visible(r.code.short(), 300), "dim"))
    return lines


def _status(r: RunSummary) -> list[Text]:
    colour = {"ok": "green", "running": "cyan", "cancelled": "yellow"}.get(r.status, "red")
    lines = [safe(r.status, colour, 40)]
    if r.is_baseline:
        lines.append(Text("baseline", "magenta"))
    return lines


def _median(r: RunSummary) -> str:
    if r.tier1_median_ms is None:
        return humanfmt.DASH if 1 in r.tiers or not r.tiers else "not run"
    ci = f" ±{r.tier1_ci_pct:.1f}%" if r.tier1_ci_pct is not None else ""
    return f"{humanfmt.ms(r.tier1_median_ms)}{ci}"


async def export(args: argparse.Namespace) -> int:
    check_output(args.output)
    with Store() as store:
        session = find_session(store, args.session)
        text = export_session(store, session.id)
    write_report(text, args.output)
    return 0


async def compare(args: argparse.Namespace) -> int:
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
