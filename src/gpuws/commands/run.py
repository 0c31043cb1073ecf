"""``gpuws run``, ``attach``, ``cancel``, ``runs``: profiling runs from scripts and CI.

Every event the laptop receives goes through the store first (``ingest_many``), then to
the console: what is printed is what was recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec
from rich.table import Table
from rich.text import Text

from .. import protocol, runspec
from ..client import AgentClient
from ..config import load_config
from ..errors import ConnectError, RunError, UsageError
from ..sessions.artifacts import pull_run
from ..sessions.compare import compare_runs, regression_gate, render_comparison
from ..sessions.cost import resolve_budget, resolve_rate
from ..sessions.store import Store
from .common import add_connection_args, connect, console, print_json


def add_run_args(p: argparse.ArgumentParser) -> None:
    add_connection_args(p)
    p.add_argument("--workload", "-w", required=True,
                   help="builtin:NAME[?k=v&...], file:PATH or cmd:COMMAND")
    p.add_argument("--tiers", default="1,2,3", help="comma-separated tiers (default 1,2,3)")
    t1 = p.add_argument_group("Tier 1 (CUDA events)")
    t1.add_argument("--target-ci", type=float, default=0.01,
                    help="stop when the median's 95%% CI half-width is below this (0.01 = 1%%)")
    t1.add_argument("--max-seconds", type=float, default=10.0, help="time budget for sampling")
    t1.add_argument("--min-samples", type=int, default=10)
    t1.add_argument("--warmup", type=int, default=5)
    mode = t1.add_mutually_exclusive_group()
    mode.add_argument("--cold", dest="timing", action="store_const", const="cold",
                      default="auto",
                      help="flush L2 clean and idle 1 ms before every sample: the "
                           "conditions ncu measures in (default for calls >= 10 us)")
    mode.add_argument("--hot", dest="timing", action="store_const", const="hot",
                      help="back-to-back samples, L2 warm: steady-state throughput "
                           "(default for calls < 10 us, which are batched)")
    t3 = p.add_argument_group("Tier 3 (Nsight Compute)")
    t3.add_argument("--kernel-regex", "-k", help="kernels to profile (default: Tier 2's top)")
    t3.add_argument("--launch-skip", type=int, default=0)
    t3.add_argument("--launch-count", type=int, default=1)
    t3.add_argument("--ncu-set", help="a section set from `ncu --list-sets` instead of the "
                                      "focused default")
    t3.add_argument("--ncu-sections", help="comma-separated section identifiers")
    t3.add_argument("--replay-mode", choices=["kernel", "application", "range", "app-range"])
    t3.add_argument("--clock-control", choices=["none", "base"], default="none",
                    help="none (default) keeps the clocks Tier 1 saw")
    t3.add_argument("--cache-control", choices=["all", "none"], default="all")
    t3.add_argument("--ncu", dest="ncu_path", help="use this ncu instead of the selected one")
    p.add_argument("--profile-iters", type=int, default=10,
                   help="workload calls per profiled process (Tier 2/3)")
    p.add_argument("--timeout", type=float, help="kill a workload process after this many s")
    p.add_argument("--install-cupy", action="store_true",
                   help="install the CuPy wheel that fits the driver if the pod has none")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="environment for the workload (repeatable)")
    p.add_argument("--rate", type=float, help="the pod's price in USD per hour")
    p.add_argument("--detach", action="store_true",
                   help="start the run, print its id and return; it goes on on the pod")
    p.add_argument("--no-pull", action="store_true", help="leave the artifacts on the pod")
    p.add_argument("--baseline", help="compare with this run id (from the store)")
    p.add_argument("--fail-if-slower", type=float, metavar="PCT",
                   help="exit non-zero when slower than the baseline by more than PCT%% "
                        "beyond noise")
    p.add_argument("--json", action="store_true", help="print the run's events as NDJSON")


def build_spec(args: argparse.Namespace) -> protocol.RunSpec:
    """The run's spec from the command line (shared with the TUI's launcher)."""
    return runspec.build_spec(runspec.options_from_args(args))


class Printer:
    """Renders recorded events for a person (or as NDJSON with --json)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.out = console()
        self.samples = 0
        self._last_progress = ""

    def show(self, ev: protocol.Events) -> None:
        if self.as_json:
            sys.stdout.write(protocol.encode(ev).decode())
            return
        o = self.out
        match ev:
            case protocol.RunStarted():
                o.print(f"[bold]run {ev.run_id}[/] on {ev.hostname}: {ev.spec.workload}")
            case protocol.TierStarted():
                cmd = f"  [dim]$ {' '.join(ev.argv)}[/]" if ev.argv else ""
                o.print(f"[cyan]▶ tier {ev.tier}[/] {ev.name}{cmd}")
            case protocol.TierFinished():
                colour = {"ok": "green", "skipped": "yellow", "fallback": "yellow"}.get(
                    ev.status, "red")
                gpu = f", GPU {ev.gpu_s:.3f} s" if ev.gpu_s else ""
                why = f" — {ev.reason}" if ev.reason else ""
                o.print(f"[{colour}]■ tier {ev.tier} {ev.status}[/] in {ev.wall_s:.1f} s{gpu}{why}")
            case protocol.Samples():
                self.samples += len(ev.values_ms)
            case protocol.Tier1Result():
                o.print(tier1_table(ev))
            case protocol.KernelTable():
                o.print(kernel_table(ev))
            case protocol.NcuProgress():
                line = f"{ev.kernel}: {ev.percent}%" + (f" · {ev.passes} passes" if ev.passes
                                                         else "")
                if ev.done and line != self._last_progress:
                    o.print(f"  ncu {line}")
                self._last_progress = line
            case protocol.KernelMetrics():
                o.print(metrics_table(ev))
            case protocol.RuleFindings():
                for r in sorted(ev.rules, key=lambda r: -(r.est_speedup_pct or 0))[:8]:
                    sp = f" (est. speedup {r.est_speedup_pct:.0f}%)" if r.est_speedup_pct else ""
                    o.print(f"  [magenta]{r.rule}[/]{sp}: {r.message[:300]}")
            case protocol.StaticAnalysis():
                occ = ev.theoretical_occupancy_pct
                o.print(f"  static: {ev.kernel}: {ev.registers_per_thread} regs/thread, "
                        f"{ev.shared_mem_per_block} B smem/block, {ev.local_mem_per_thread} B "
                        f"local, theoretical occupancy "
                        f"{'—' if occ is None else f'{occ:.0f}%'} ({ev.limiter or '—'})")
            case protocol.Diagnosis():
                colour = {"error": "red", "warning": "yellow"}.get(ev.severity, "blue")
                o.print(f"[{colour} bold]! {ev.title}[/]: {ev.cause}")
                if ev.meaning:
                    o.print(f"  {ev.meaning}")
                for remedy in ev.remedies:
                    o.print(f"  → {remedy}")
                if ev.unmeasured:
                    o.print(f"  not measured: {', '.join(ev.unmeasured)}")
            case protocol.Artifact():
                o.print(f"  artifact {ev.name} ({ev.size} B, sha256 {ev.sha256[:16]}…)")
            case protocol.Output():
                o.print(Text.assemble((f"  {ev.stream}│ ", "dim"), ev.text), highlight=False)
            case protocol.Log():
                if ev.level != "debug":
                    o.print(f"  [dim]{ev.level}: {ev.message}[/]")
            case protocol.RunFinished():
                colour = "green" if ev.status == "ok" else "red"
                err = f" — {ev.error}" if ev.error else ""
                o.print(f"[{colour} bold]run {ev.status}[/] in {ev.wall_s:.1f} s{err}")
            case _:
                pass


def tier1_table(ev: protocol.Tier1Result) -> Table:
    s = ev.stats
    t = Table(title=f"Tier 1 · CUDA events · {ev.mode}, batch {ev.batch} · {ev.stop_reason}",
              title_justify="left")
    for col in ("n", "median", "95% CI", "mean", "stdev", "min", "p5", "p95"):
        t.add_column(col, justify="right")
    t.add_row(str(s.n), f"{s.median_ms:.4f} ms",
              f"[{s.ci_low_ms:.4f}, {s.ci_high_ms:.4f}] ±{s.ci_rel_halfwidth * 100:.2f}%",
              f"{s.mean_ms:.4f}", f"{s.stdev_ms:.4f}", f"{s.min_ms:.4f}", f"{s.p5_ms:.4f}",
              f"{s.p95_ms:.4f}")
    rates = []
    if ev.gbps is not None:
        pct = f" ({ev.pct_peak_bw:.0f}% of {ev.peak_gbps:.0f} GB/s {ev.peak_source or ''})" \
            if ev.pct_peak_bw is not None and ev.peak_gbps else ""
        rates.append(f"{ev.gbps:.1f} GB/s{pct}")
    if ev.tflops is not None:
        pct = f" ({ev.pct_peak_flops:.0f}% of {ev.peak_tflops:.0f})" \
            if ev.pct_peak_flops is not None and ev.peak_tflops else ""
        rates.append(f"{ev.tflops:.2f} TFLOP/s{pct}")
    if rates:
        t.caption = " · ".join(rates)
    return t


def kernel_table(ev: protocol.KernelTable) -> Table:
    t = Table(title=f"Tier 2 · kernels by GPU time · {ev.source}", title_justify="left")
    for col in ("kernel", "calls", "total", "mean", "share"):
        t.add_column(col, justify="left" if col == "kernel" else "right",
                     overflow="fold" if col == "kernel" else "ellipsis")
    for k in ev.kernels[:10]:
        t.add_row(k.name[:120], str(k.calls), f"{k.total_ns / 1e6:.3f} ms",
                  f"{k.mean_ns / 1e3:.1f} µs", f"{k.share_pct:.1f}%")
    return t


METRIC_LABELS: list[tuple[str, str, Callable[[float], str]]] = [
    ("duration_ns", "duration", lambda v: f"{v / 1e3:.1f} µs"),
    ("sm_throughput_pct", "SM throughput", lambda v: f"{v:.1f}%"),
    ("memory_throughput_pct", "memory throughput", lambda v: f"{v:.1f}%"),
    ("dram_throughput_pct", "DRAM throughput", lambda v: f"{v:.1f}%"),
    ("achieved_occupancy_pct", "achieved occupancy", lambda v: f"{v:.1f}%"),
    ("theoretical_occupancy_pct", "theoretical occupancy", lambda v: f"{v:.1f}%"),
    ("registers_per_thread", "registers/thread", lambda v: f"{v:.0f}"),
    ("shared_mem_per_block", "shared mem/block", lambda v: f"{v:.0f} B"),
    ("l1_hit_pct", "L1 hit", lambda v: f"{v:.1f}%"),
    ("l2_hit_pct", "L2 hit", lambda v: f"{v:.1f}%"),
    ("tensor_pipe_active_pct", "tensor pipe active", lambda v: f"{v:.1f}%"),
    ("arithmetic_intensity", "arithmetic intensity", lambda v: f"{v:.2f} FLOP/B"),
]


def metrics_table(ev: protocol.KernelMetrics) -> Table:
    t = Table(title=f"Tier 3 · {ev.kernel[:100]} · launch {ev.launch}", title_justify="left")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for key, label, fmt in METRIC_LABELS:
        v = ev.metrics.get(key)
        t.add_row(label, "—" if v is None else fmt(v))
    if ev.stalls:
        t.caption = "top stalls: " + ", ".join(f"{s.reason} {s.pct:.0f}%" for s in ev.stalls[:4])
    return t


class Ingest:
    """Store first, then show; batches so a fast stream costs one transaction per batch."""

    def __init__(self, store: Store, session_id: str, printer: Printer) -> None:
        self.store, self.session_id, self.printer = store, session_id, printer
        self.queue: asyncio.Queue[protocol.Events | None] = asyncio.Queue()
        self.finished: dict[str, protocol.RunFinished] = {}
        self.last_seq: dict[str, int] = {}

    def listener(self, ev: protocol.Events | protocol.BadLine) -> None:
        if isinstance(ev, protocol.BadLine):
            self.printer.out.print(f"[yellow]bad line from the agent skipped: {ev.reason}[/]")
            return
        if ev.run_id is not None:
            self.queue.put_nowait(ev)

    async def until_finished(self, run_id: str, client: AgentClient) -> protocol.RunFinished:
        closed = asyncio.create_task(client.wait_closed())
        try:
            while run_id not in self.finished:
                getter = asyncio.create_task(self.queue.get())
                done, _ = await asyncio.wait({getter, closed}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    self.drain()
                    if run_id in self.finished:
                        break
                    raise ConnectError(
                        "the link to the pod dropped; the run goes on there",
                        title="Connection lost",
                        remedy=f"gpuws attach HOST {run_id} (resumes after seq "
                               f"{self.last_seq.get(run_id, -1)})")
                batch = [getter.result()]
                while not self.queue.empty():
                    batch.append(self.queue.get_nowait())
                self.handle([e for e in batch if e is not None])
        finally:
            closed.cancel()
        return self.finished[run_id]

    def drain(self) -> None:
        batch = []
        while not self.queue.empty():
            item = self.queue.get_nowait()
            if item is not None:
                batch.append(item)
        self.handle(batch)

    def handle(self, batch: list[protocol.Events]) -> None:
        if not batch:
            return
        self.store.ingest_many(self.session_id, batch)
        for ev in batch:
            assert ev.run_id is not None
            self.last_seq[ev.run_id] = max(self.last_seq.get(ev.run_id, -1), ev.seq or 0)
            self.printer.show(ev)
            if isinstance(ev, protocol.RunFinished):
                self.finished[ev.run_id] = ev


async def open_session(args: argparse.Namespace, client: AgentClient, store: Store) -> str:
    cfg = load_config()
    rate = resolve_rate(getattr(args, "rate", None), args.host, cfg)
    budget = resolve_budget(None, args.host, cfg)
    probe = await client.probe()
    sid = store.open_session(args.host, client.transport.info.kind
                             + ("+sftp" if client.transport.info.sftp else ""),
                             probe, rate, budget)
    now = time.time()
    store.add_phase(sid, None, "connect", now - client.deploy.deploy_s
                    - (client.transport.info.connect_s or 0.0), now)
    return sid


async def finish_run(args: argparse.Namespace, client: AgentClient, store: Store, sid: str,
                     run_id: str, fin: protocol.RunFinished) -> int:
    out = console()
    if not args.no_pull:
        arts = [a for a in store.artifacts(run_id) if a.status != "pulled"]
        if arts:
            from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

            with Progress("{task.description}", BarColumn(), DownloadColumn(),
                          TransferSpeedColumn(), console=console(stderr=True),
                          transient=True) as bar:
                tasks: dict[str, Any] = {}

                def progress(name: str, done: int, total: int) -> None:
                    if name not in tasks:
                        tasks[name] = bar.add_task(name, total=total)
                    bar.update(tasks[name], completed=done)

                for res in await pull_run(client, store, sid, run_id, progress):
                    out.print(f"  pulled {res.name} → {res.local_path}")
    code = 0 if fin.status == "ok" else RunError.exit_code
    if args.baseline:
        store.set_baseline_of(run_id, store.run(args.baseline).run_id)
        cmp = compare_runs(store, store.run(args.baseline).run_id, run_id)
        render_comparison(cmp, out)
        if args.fail_if_slower is not None:
            failed, message = regression_gate(cmp, args.fail_if_slower)
            out.print(("[red bold]" if failed else "[green]") + message + "[/]")
            if failed:
                code = code or 10
    return code


async def run(args: argparse.Namespace) -> int:
    spec = build_spec(args)
    if args.fail_if_slower is not None and not args.baseline:
        raise UsageError("--fail-if-slower needs --baseline RUN_ID")
    client = await connect(args)
    store = Store()
    sid: str | None = None
    try:
        sid = await open_session(args, client, store)
        ingest = Ingest(store, sid, Printer(args.json))
        client.add_listener(ingest.listener)
        info = await client.start_run(spec)
        if args.detach:
            await asyncio.sleep(0.2)
            ingest.drain()
            console(stderr=True).print(f"started {info.run_id}; follow it with "
                                       f"`gpuws attach {args.host} {info.run_id}`")
            sys.stdout.write(info.run_id + "\n") if not args.json else None
            return 0
        try:
            fin = await ingest.until_finished(info.run_id, client)
        except (KeyboardInterrupt, asyncio.CancelledError):
            ingest.drain()
            console(stderr=True).print(f"detached; the run goes on: "
                                       f"gpuws attach {args.host} {info.run_id}")
            return 130
        return await finish_run(args, client, store, sid, info.run_id, fin)
    finally:
        if sid is not None:
            store.end_session(sid)
        store.close()
        await client.close()


async def attach(args: argparse.Namespace) -> int:
    client = await connect(args)
    store = Store()
    try:
        known = None
        with contextlib.suppress(Exception):
            known = store.run(args.run_id)
        sid = known.session_id if known else await open_session(args, client, store)
        run_id = known.run_id if known else args.run_id
        from_seq = args.from_seq if args.from_seq is not None else store.last_seq(run_id) + 1
        ingest = Ingest(store, sid, Printer(args.json))
        client.add_listener(ingest.listener)
        await client.attach(run_id, from_seq=from_seq)
        fin = await ingest.until_finished(run_id, client)
        if not known:
            args.baseline = None
        return await finish_run(args, client, store, sid, run_id, fin)
    finally:
        store.close()
        await client.close()


async def cancel(args: argparse.Namespace) -> int:
    client = await connect(args)
    try:
        info = await client.cancel(args.run_id)
    finally:
        await client.close()
    console().print(f"{info.run_id}: {info.status}")
    return 0


async def runs(args: argparse.Namespace) -> int:
    client = await connect(args)
    try:
        items = await client.list_runs()
    finally:
        await client.close()
    if args.json:
        print_json(msgspec.to_builtins(items))
        return 0
    t = Table(title=f"runs on {args.host}", title_justify="left")
    for col in ("run id", "status", "started", "events", "workload"):
        t.add_column(col)
    for r in items:
        t.add_row(r.run_id, r.status, time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started)),
                  str(r.last_seq + 1), r.workload[:60])
    console().print(t)
    return 0


async def ncu(args: argparse.Namespace) -> int:
    if args.install and not args.yes:
        raise UsageError("--install changes the pod; add --yes to confirm")
    client = await connect(args)
    out = console()

    def show_log(ev: protocol.Events | protocol.BadLine) -> None:
        if isinstance(ev, protocol.Log):
            out.print(f"[dim]{ev.message}[/]", markup=True)

    client.add_listener(show_log)
    try:
        plan = await client.ncu_plan(install=args.install)
    finally:
        await client.close()
    if args.json:
        print_json(msgspec.to_builtins(plan))
        return 0
    out.print(f"driver {plan.driver or '—'} (CUDA {plan.cuda_driver or '—'}), GPU arch "
              f"{plan.arch or '—'}")
    t = Table(title="Nsight Compute installs", title_justify="left")
    for col in ("version", "path", "fits", "why"):
        t.add_column(col)
    for c in plan.choices:
        t.add_row(c.version or "?", c.path, "[green]yes[/]" if c.compatible else "[red]no[/]",
                  c.reason)
    out.print(t)
    if plan.selected:
        out.print(f"[green bold]selected[/] {plan.selected} ({plan.selected_version}): "
                  f"{plan.reason}")
    else:
        out.print(f"[red bold]none fits[/]: {plan.reason}")
    if plan.install_plan and not plan.installed:
        out.print(f"install plan for {plan.install_target_version} "
                  "(runs only with --install --yes):")
        for step in plan.install_plan:
            out.print("  $ " + " ".join(step), markup=False)
    if plan.verified:
        out.print(f"[green]verified[/]: {plan.verified}")
    return 0 if plan.selected else 11

