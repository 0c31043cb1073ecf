"""``gpuws sessions``, ``export``, ``compare``, ``baseline``, ``pull``: the laptop's memory."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
from rich.table import Table

from ..errors import GpuwsError
from ..sessions.compare import compare_runs, comparison_json, render_comparison
from ..sessions.cost import economics
from ..sessions.export import export_session
from ..sessions.store import Store
from .common import connect, console, print_json


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
    t = Table(title="sessions", title_justify="left")
    for col in ("id", "host", "GPU", "started", "duration", "runs", "cost"):
        t.add_column(col, justify="right" if col in ("runs", "cost", "duration") else "left")
    for r in rows:
        cost = "—" if r["cost_usd"] is None else f"${r['cost_usd']:.2f}"
        t.add_row(r["id"], r["host"], r["gpu"] or "—",
                  time.strftime("%Y-%m-%d %H:%M", time.localtime(r["started"])),
                  f"{r['duration_s'] / 60:.1f} min", str(r["runs"]), cost)
    console().print(t)
    return 0


async def export(args: argparse.Namespace) -> int:
    with Store() as store:
        session = store.session(args.session)
        text = export_session(store, session.id)
    if args.output and args.output != "-":
        path = Path(args.output)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)  # never leave a half-written report behind
        console(stderr=True).print(f"wrote {path} ({len(text)} bytes)")
    else:
        sys.stdout.write(text)
    return 0


async def compare(args: argparse.Namespace) -> int:
    with Store() as store:
        a, b = store.run(args.run_a).run_id, store.run(args.run_b).run_id
        cmp = compare_runs(store, a, b)
    if args.json:
        sys.stdout.write(comparison_json(cmp) + "\n")
    else:
        render_comparison(cmp, console())
    return 0


async def baseline(args: argparse.Namespace) -> int:
    with Store() as store:
        run = store.run(args.run_id)
        store.set_baseline(run.run_id, not args.off)
    console().print(f"{run.run_id} {'is no longer' if args.off else 'is now'} a baseline")
    return 0


async def pull(args: argparse.Namespace) -> int:
    from ..sessions.artifacts import pull_run

    with Store() as store:
        run = store.run(args.run_id)
        if not store.artifacts(run.run_id):
            raise GpuwsError(f"run {run.run_id} announced no artifacts", title="Nothing to pull")
        client = await connect(args)
        try:
            results = await pull_run(client, store, run.session_id, run.run_id)
        finally:
            await client.close()
        rows = store.artifacts(run.run_id)
    if args.json:
        print_json(msgspec.to_builtins(rows))
        return 0
    out = console()
    for r in results:
        resumed = f" (resumed at {r.resumed_from} B)" if r.resumed_from else ""
        out.print(f"pulled {r.name} → {r.local_path}{resumed}")
    for row in rows:
        out.print(f"{row.status:>8}  {row.name}  {row.size} B  sha256 {row.sha256}")
    return 0
