"""``gpuws sessions``, ``history``, ``export``, ``compare``, ``baseline`` (``pull``: pull.py).

The laptop's memory. Every id a person types is resolved by :func:`find_run` or
:func:`find_session`: an unknown or ambiguous one is a usage error (exit 2) that points
to the listing where ids are found (``gpuws history``, ``gpuws sessions``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import msgspec
from rich import box
from rich.table import Table
from rich.text import Text

from ..errors import StoreError, UsageError
from ..mcp.actions import actions, agent_runs, agent_section
from ..sessions.compare import compare_runs, comparison_json, refuse_if_empty, render_comparison
from ..sessions.cost import economics
from ..sessions.export import export_session
from ..sessions.runlist import RUN_LISTING_REMEDY, RunSummary, list_runs
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
    """The stored runs (all, or one session's): id, workload, status, Tier-1 median."""
    with Store() as store:
        session = find_session(store, args.session).id if args.session else None
        runs = list_runs(store, session)
        by_agent = agent_runs(store)  # runs a coding agent made through `gpuws mcp`
    if args.json:
        print_json([dict(msgspec.to_builtins(r), by="agent" if r.run_id in by_agent
                         else "person") for r in runs])
        return 0
    out = console(markup=False)
    if not runs:
        where = f"session {args.session}" if args.session else "the store"
        out.print(Text(f"no runs in {where} yet: `gpuws run HOST -w WORKLOAD` makes one",
                       "yellow"))
        return 0
    # One table per session (newest first): the session's id, pod and day head it, so a
    # row has room for the full run id, which is never cut.
    by_session: dict[str, list[RunSummary]] = {}
    for r in runs:
        by_session.setdefault(r.session_id, []).append(r)
    for session_id, rows in by_session.items():
        out.print(_history_table(session_id, rows, out.width, set(by_agent)))
    out.print(Text("run ids (or prefixes) go to compare, baseline, pull and replay SESSION "
                   "--run", "dim"))
    return 0


#: Below this many columns the table drops "started" (the run id holds the start time).
NARROW = 100


def _history_table(session_id: str, rows: list[RunSummary], width: int,
                   by_agent: set[str] | None = None) -> Table:
    """One session's runs, each row at most three lines at any width: the run id whole,
    the workload, its reason and its code on one line each, cut with an ellipsis (before,
    a row folded to 13-17 lines at 80 columns)."""
    first = rows[0]
    narrow = width < NARROW
    t = Table(title=Text.assemble("session ", (visible(session_id), "bold"),
                                  f" · {visible(first.host, 200)} · ",
                                  humanfmt.when(first.started)[:10]),
              title_justify="left", box=box.SIMPLE_HEAD, show_edge=False)
    t.add_column("run id", no_wrap=True, min_width=max(len(r.run_id) for r in rows))
    if not narrow:
        t.add_column("started", no_wrap=True)
    t.add_column("status", no_wrap=True, max_width=12)
    t.add_column("Tier-1 median", justify="right", no_wrap=True)
    # The one column that gives way: the others keep their width, this one is cut.
    t.add_column("workload")
    for r in rows:
        cells = [safe(r.run_id)]
        if not narrow:
            cells.append(Text(humanfmt.when(r.started)[11:]))
        status = _status(r)
        if by_agent and r.run_id in by_agent:
            status.append("\nby agent", "cyan")
        t.add_row(*cells, status, Text(_median(r)), _workload(r))
    return t


def _workload(r: RunSummary) -> Text:
    # Text, not str: a workload may hold "[...]", which must never be read as markup, and
    # made visible: "\x1b]0;…" must not retitle the terminal. Each line is cut, not
    # folded (no_wrap): the newlines are ours, a reason's own are shown as \n.
    text = safe(r.workload)
    if r.why:
        # "cancelled during tier 1" beside "cancelled" reads as "during tier 1".
        why = r.why.removeprefix(r.status).strip() or r.why
        text.append(f"\n{visible(why)}", "dim")
    if r.code is not None:
        # Which code gave the number: tree, commit, dirty files.
        text.append(f"\n{visible(r.code.short(), 300)}", "dim")
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text


def _status(r: RunSummary) -> Text:
    colour = {"ok": "green", "running": "cyan", "cancelled": "yellow"}.get(r.status, "red")
    text = safe(r.status, colour, 40)
    if r.is_baseline:
        text.append("\nbaseline", "magenta")
    text.overflow = "ellipsis"
    return text


def _median(r: RunSummary) -> str:
    if r.tier1_median_ms is None:
        return humanfmt.DASH if 1 in r.tiers or not r.tiers else "not run"
    ci = f" ±{r.tier1_ci_pct:.1f}%" if r.tier1_ci_pct is not None else ""
    return f"{humanfmt.ms(r.tier1_median_ms)}{ci}"


async def export(args: argparse.Namespace) -> int:
    check_output(args.output)
    with Store() as store:
        session = find_session(store, args.session)
        text = export_session(store, session.id) + agent_section(actions(store, session.id))
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
