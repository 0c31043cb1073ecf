"""``gpuws run``, ``attach``, ``cancel``, ``runs``: profiling runs from scripts and CI.

Arguments and printing only: connecting, checking, storing, reconnecting and pulling are
the laptop engine's (:mod:`gpuws.live.engine`), the same one the TUI uses. Every event is
stored before it is printed, so what is printed is what was recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
import signal
import sys
from typing import Any

import msgspec
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .. import protocol, runspec
from ..errors import AgentError, ConnectError, RunError, StoreError, UsageError
from ..gpu import clocks, evidence, gpus
from ..gpu.roofs import roof_caption
from ..live import verdicts
from ..live.boundary import SeqGate
from ..live.engine import Engine, Notice
from ..live.feed import Batch
from ..live.model import LineJoiner, LogLine
from ..live.storeio import StoreHandle
from ..sessions.compare import compare_runs, regression_gate, render_comparison
from ..sessions.store import Store
from ..text import humanfmt
from ..text.textsafe import json_visible, visible
from ..text.textsafe import text as safe
from .common import connect, console, print_json, target_of
from .lease import connect_starting
from .sync import sync_line


def build_spec(args: argparse.Namespace) -> protocol.RunSpec:
    """The run's spec from the command line (shared with the TUI's launcher)."""
    return runspec.build_spec(runspec.options_from_args(args))


class Printer:
    """Renders recorded events for a person (or as NDJSON with --json).

    Every string that came from the pod goes through :mod:`gpuws.text.textsafe`, and the
    console never parses markup: a workload printing ``[/]`` or an escape sequence is
    shown as those characters. Events are printed once each, in ``seq`` order, however
    often they arrive (a backfill from the store, then the live stream).
    """

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.out = console(markup=False)
        self.err = console(stderr=True, markup=False)
        self.samples = 0
        self._last_progress = ""
        self._gates: dict[str, SeqGate] = {}
        #: Per run: the pieces of long output lines, joined into one printed line.
        self._joiners: dict[str, LineJoiner] = {}
        #: Set once a detached run's id is printed: stdout ends with it.
        self.muted = False
        #: Output lines waiting to be printed together (one print per run of lines).
        self._lines: list[LogLine] = []
        #: The session's $/hour (set once connected), for Tier 3's estimate in dollars.
        self.rate: float | None = None
        #: Per run: Tier 1's mode (cold windows hold flushes and idle), for GPM's line.
        self._modes: dict[str, str] = {}
        #: Per run: Tier 3's estimate, set beside the time Tier 3 took.
        self._estimates: dict[str, protocol.Tier3Estimate] = {}
        #: Per run: error diagnoses held until the run's next event, which says whether
        #: they are why the run failed (said once then, in the closing ``gpuws:`` line).
        self._held: dict[str, list[protocol.Diagnosis]] = {}
        #: Per run: the diagnosis whose cause the run's failure repeats, for that line.
        self.fatal: dict[str, protocol.Diagnosis] = {}

    def batch(self, batch: Batch) -> None:
        """The engine's ``on_batch``: print each event not printed before."""
        if self.muted:
            return
        for ev in batch.events:
            if ev.run_id is not None and ev.seq is not None:
                gate = self._gates.setdefault(ev.run_id, SeqGate())
                if not gate.admit(ev):
                    continue
            self.show(ev)
        self._flush_lines()

    def warn_busy(self, ev: protocol.RunStarted) -> None:
        """Name the other processes on the run's GPU on stderr, before any figure."""
        warning = gpus.busy_warning(ev.gpu) if ev.gpu is not None else None
        if warning is not None:
            # One line, however narrow the terminal: scripts grep stderr.
            self.err.print(Text(f"gpuws: warning: {warning}", style="yellow"), soft_wrap=True)

    def notice(self, notice: Notice) -> None:
        """The engine's ``on_notice``: one line on stderr (pulls are printed on their own;
        housekeeping such as ending an orphaned session is not a script's business)."""
        if notice.severity == "information" and notice.kind != "reconnected":
            return
        style = {"error": "red", "warning": "yellow"}.get(notice.severity, "dim")
        # One line each, unwrapped: a script reads them line by line.
        self.err.print(Text(f"gpuws: {notice.message}", style=style), soft_wrap=True)

    def release(self) -> None:
        """Print the diagnoses still held (the command ends before their run did)."""
        if self.muted:  # a detached run's id was the last line: nothing after it
            self._held.clear()
            return
        for held in self._held.values():
            for diagnosis in held:
                self._diagnosis(diagnosis)
        self._held.clear()

    def _hold(self, ev: protocol.Events) -> bool:
        """Hold an error diagnosis back, or settle the held ones at the run's next event.

        "No GPU on the pod: …" came three times when it ended the run: the diagnosis, the
        run's last line and the closing ``gpuws:`` line (issue 34, finding 14). A held
        diagnosis that the failure repeats is said once, by the closing line with its
        remedies; any other is printed before the event that follows it.

        Returns:
            True when ``ev`` itself was held (nothing to print now).
        """
        if self.as_json:
            return False
        rid = ev.run_id or ""
        if isinstance(ev, protocol.Diagnosis) and ev.severity == "error":
            self._held.setdefault(rid, []).append(ev)
            return True
        held = self._held.pop(rid, [])
        if isinstance(ev, protocol.RunFinished) and ev.status != "ok" and ev.error:
            said = [d for d in held if d.cause and d.cause in ev.error]
            if said:
                self.fatal[rid] = said[0]
                held = [d for d in held if d is not said[0]]
        for diagnosis in held:
            self._diagnosis(diagnosis)
        return False

    def _diagnosis(self, ev: protocol.Diagnosis) -> None:
        o = self.out
        colour = {"error": "red", "warning": "yellow"}.get(ev.severity, "blue")
        o.print(Text.assemble(("! ", colour + " bold"), safe(ev.title, colour + " bold"),
                              ": ", safe(ev.cause)))
        if ev.meaning:
            o.print(Text.assemble("  ", safe(ev.meaning)))
        for remedy in ev.remedies:
            o.print(Text.assemble("  → ", safe(remedy)))
        if ev.unmeasured:
            o.print(Text.assemble("  not measured: ", safe(", ".join(ev.unmeasured))))

    def show(self, ev: protocol.Events) -> None:
        if not isinstance(ev, protocol.Output):
            self._flush_lines()  # what the run printed comes before what follows it
        if self._hold(ev):
            return
        if isinstance(ev, protocol.RunStarted):
            self.warn_busy(ev)  # on stderr, so also beside --json's NDJSON
        if self.as_json:
            sys.stdout.write(json_visible(protocol.encode(ev).decode()))
            return
        o = self.out
        match ev:
            case protocol.RunStarted():
                where = f" ({gpus.label(ev.gpu.index, ev.gpu.name)})" if ev.gpu else ""
                o.print(Text.assemble(("run ", "bold"), (ev.run_id or "", "bold"), " on ",
                                      safe(ev.hostname), where, ": ", safe(ev.spec.workload)))
            case protocol.TierStarted():
                line = Text.assemble((f"▶ tier {ev.tier} ", "cyan"), safe(ev.name))
                if ev.argv:
                    # Quoted as a shell reads it (as the export does): `sh -c sleep 5; echo`
                    # read as two commands (issue 34, finding 24).
                    line.append_text(safe("  $ " + shlex.join(ev.argv), "dim"))
                o.print(line)
                if ev.estimate is not None:
                    self._estimates[ev.run_id or ""] = ev.estimate
                    for text in estimate_lines(ev.estimate, self.rate):
                        o.print(text)
            case protocol.TierFinished():
                colour = {"ok": "green", "skipped": "yellow", "fallback": "yellow"}.get(
                    ev.status, "red")
                gpu = f", GPU {humanfmt.duration(ev.gpu_s)}" if ev.gpu_s else ""
                line = Text.assemble((f"■ tier {ev.tier} ", colour), safe(ev.status, colour),
                                     f" in {humanfmt.duration(ev.wall_s)}{gpu}")
                if ev.reason:
                    line.append_text(Text.assemble(" — ", safe(ev.reason)))
                est = self._estimates.get(ev.run_id or "") if ev.tier == 3 else None
                against = evidence.estimate_against(est, ev) if est is not None else None
                if against is not None:
                    line.append_text(Text(f" ({against})", "dim"))
                o.print(line)
                gpm = evidence.gpm_line(ev.gpm, evidence.gpm_over(
                    ev.tier, self._modes.get(ev.run_id or "")))
                if gpm is not None:
                    o.print(Text(f"  {gpm}", "" if evidence.gpm_measured(ev.gpm) else "dim"))
            case protocol.Samples():
                self.samples += len(ev.values_ms)
            case protocol.Tier1Result():
                self._modes[ev.run_id or ""] = ev.mode
                o.print(tier1_table(ev))
                for line in clock_lines(ev):
                    o.print(line)
            case protocol.KernelTable():
                o.print(kernel_table(ev))
                for table in rank_tables(ev):
                    o.print(table)
            case protocol.NcuProgress():
                progress = f"{visible(ev.kernel, 200)}: {ev.percent}%" + (
                    f" · {ev.passes} passes" if ev.passes else "")
                if ev.done and progress != self._last_progress:
                    o.print(Text(f"  ncu {progress}"))
                self._last_progress = progress
            case protocol.KernelMetrics():
                o.print(metrics_table(ev))
            case protocol.ProgramVerdict() | protocol.KernelVerdict() | protocol.Tier3Coverage():
                for line in verdict_lines(ev):
                    o.print(line)
            case protocol.RuleFindings():
                shown = sorted(ev.rules, key=lambda r: -(r.est_speedup_pct or 0))[:8]
                for r in shown:
                    sp = f" (est. speedup {r.est_speedup_pct:.0f}%)" if r.est_speedup_pct else ""
                    o.print(Text.assemble("  ", safe(r.rule, "magenta"), sp, ": ",
                                          safe(r.message, limit=300)))
                if any(r.est_speedup_pct for r in shown):
                    o.print(Text(f"  {SPEEDUP_CAPTION}", "dim"))
            case protocol.StaticAnalysis():
                occ = ev.theoretical_occupancy_pct
                # At 100% nothing limits it: "100% (registers)" read as a limit reached.
                limiter = "full: nothing limits it" if occ is not None and occ >= 100.0 \
                    else ev.limiter or "—"
                regs = humanfmt.DASH if ev.registers_per_thread is None \
                    else str(ev.registers_per_thread)
                o.print(Text.assemble(
                    "  static: ", safe(verdicts.short(ev.kernel)),
                    f": {regs} regs/thread, {humanfmt.size(ev.shared_mem_per_block)} "
                    f"smem/block, {humanfmt.size(ev.local_mem_per_thread)} local, theoretical "
                    f"occupancy {humanfmt.pct(occ, 0)} (", safe(limiter), ")"))
            case protocol.Diagnosis():
                self._diagnosis(ev)
            case protocol.Artifact():
                o.print(Text.assemble("  artifact ", safe(ev.name),
                                      f" ({humanfmt.size(ev.size)}, sha256 "
                                      f"{visible(ev.sha256, 16)[:16]}…)"))
            case protocol.Output():
                joined = self._joiners.setdefault(ev.run_id or "", LineJoiner()).feed(ev)
                if joined is not None:
                    self._print_line(joined)
            case protocol.Log():
                if ev.level != "debug":
                    o.print(safe(f"  {ev.level}: {ev.message}", "dim"))
            case protocol.RunFinished():
                for joined in self._joiners.pop(ev.run_id or "", LineJoiner()).flush():
                    self._print_line(joined)
                self._flush_lines()
                colour = "green" if ev.status == "ok" else "red"
                # Why it failed is not repeated here: the closing `gpuws:` line on stderr
                # (finish_run) says it, with its remedy.
                o.print(Text.assemble((f"run {ev.status}", colour + " bold"),
                                      f" in {humanfmt.duration(ev.wall_s)}"))
            case _:
                pass

    def _print_line(self, line: LogLine) -> None:
        self._lines.append(line)

    def _flush_lines(self) -> None:
        # The joiner already capped each line (MAX_JOINED_CHARS): print it whole, as one
        # line the terminal wraps (soft_wrap), as the workload printed it. A run of lines
        # goes out in one print: one print per line cost 165 µs, most of a flood's time.
        if not self._lines:
            return
        lines, self._lines = self._lines, []
        text = Text("\n").join(Text.assemble((f"  {visible(line.stream, 10)}│ ", "dim"),
                                              safe(line.text, limit=None)) for line in lines)
        self.out.print(text, soft_wrap=True)


def tier1_table(ev: protocol.Tier1Result) -> Table:
    s = ev.stats
    ms = humanfmt.ms
    t = Table(title=visible(f"Tier 1 · {ev.timing_source or 'CUDA events'} · {ev.mode}, "
                            f"batch {ev.batch} · {ev.stop_reason}"), title_justify="left")
    for col in ("n", "median", "95% CI", "mean", "stdev", "min", "p5", "p95"):
        t.add_column(col, justify="right")
    t.add_row(humanfmt.num(s.n), ms(s.median_ms),
              f"[{ms(s.ci_low_ms)}, {ms(s.ci_high_ms)}] ±"
              f"{humanfmt.share(s.ci_rel_halfwidth, 2)}",
              ms(s.mean_ms), ms(s.stdev_ms), ms(s.min_ms), ms(s.p5_ms), ms(s.p95_ms))
    rates = []
    if ev.gbps is not None:
        source = f" {visible(ev.peak_source, 40)}" if ev.peak_source else ""
        pct = (f" ({humanfmt.pct(ev.pct_peak_bw, 0)} of {humanfmt.num(ev.peak_gbps, 'GB/s')}"
               f"{source})" if ev.pct_peak_bw is not None and ev.peak_gbps else "")
        rates.append(f"{humanfmt.num(ev.gbps, 'GB/s', 1)}{pct}")
    if ev.tflops is not None:
        pct = (f" ({humanfmt.pct(ev.pct_peak_flops, 0)} of "
               f"{humanfmt.num(ev.peak_tflops, 'TFLOP/s')})"
               if ev.pct_peak_flops is not None and ev.peak_tflops else "")
        rates.append(f"{humanfmt.num(ev.tflops, 'TFLOP/s', 2)}{pct}")
    notes = [" · ".join(rates)] if rates else []
    notes += [caption for caption in (
        roof_caption(ev.pct_peak_bw, ev.peak_gbps, "GB/s", ev.peak_source),
        roof_caption(ev.pct_peak_flops, ev.peak_tflops, "TFLOP/s", ev.peak_source))
        if caption is not None]
    if ev.events_median_ms is not None:  # a short call, timed again from CUPTI
        notes.append(f"CUDA events read {humanfmt.ms(ev.events_median_ms)}")
    if ev.caution:
        notes.append(f"! {visible(ev.caution, 500)}")
    if notes:
        t.caption = "\n".join(notes)
    return t


def estimate_lines(est: protocol.Tier3Estimate, rate: float | None) -> list[Text]:
    """Tier 3's estimate before ncu starts, and where each input came from."""
    lines = [Text(f"  {evidence.estimate_line(est, rate)}", "blue")]
    lines += [Text(f"    {basis}", "dim") for basis in evidence.estimate_bases(est)]
    return lines


def clock_lines(ev: protocol.Tier1Result) -> list[Text]:
    """The clocks behind the Tier-1 figure, and the caution they call for (if any)."""
    lines = [Text(f"  {clocks.line(ev.clocks)}", "dim" if ev.clocks is None else "")]
    caution = clocks.caution(ev.clocks)
    if caution is not None:
        lines.append(Text(f"  ! caution: {caution}", "yellow"))
    return lines


def kernel_table(ev: protocol.KernelTable) -> Table:
    merged = f" · {len(ev.ranks)} ranks merged" if ev.ranks else ""
    return _rows_table(f"Tier 2 · kernels by GPU time · {visible(ev.source, 80)}{merged}",
                       ev.kernels, verdicts.window_caption(ev.window, ev.comm))


def rank_tables(ev: protocol.KernelTable) -> list[Table]:
    """One table per rank where several processes ran (``torchrun``, ``mpirun``)."""
    return [_rows_table(f"Tier 2 · {verdicts.rank_name(r)} · pid {r.pid}", r.kernels,
                        verdicts.window_caption(r.window, r.comm), top=5)
            for r in ev.ranks or []]


def _rows_table(title: str, rows: list[protocol.KernelRow], caption: str,
                top: int = verdicts.TOP_ROWS) -> Table:
    t = Table(title=title, title_justify="left", caption=safe(caption) if caption else None,
              caption_justify="left")
    code = any(k.code for k in rows)
    for col in ("kernel", "calls", "total", "mean", "share", *(("from",) if code else ())):
        t.add_column(col, justify="left" if col in ("kernel", "from") else "right",
                     overflow="fold" if col in ("kernel", "from") else "ellipsis")
    shown = verdicts.top_rows(rows, top)
    for k in shown.rows:
        # The short name (Nsight's function name); --json keeps the full one.
        t.add_row(safe(verdicts.short(k.name)), humanfmt.num(k.calls),
                  humanfmt.ms(k.total_ns / 1e6), humanfmt.ms(k.mean_ns / 1e6),
                  humanfmt.pct(k.share_pct), *((safe(k.code or ""),) if code else ()))
    if shown.others:
        t.add_row(Text(f"{shown.others} others", style="dim"), humanfmt.num(shown.others_calls),
                  humanfmt.ms(shown.others_total_ns / 1e6), "",
                  humanfmt.pct(shown.others_share_pct), *(("",) if code else ()))
    return t


def verdict_lines(ev: protocol.ProgramVerdict | protocol.KernelVerdict
                  | protocol.Tier3Coverage) -> list[Text]:
    """A verdict for people: the finding first, then its evidence and what to try."""
    colour = {"launch": "yellow", "transfer": "yellow", "host": "yellow",
              "communication": "yellow"}
    out: list[Text] = []
    if isinstance(ev, protocol.ProgramVerdict):
        if ev.window:
            out.append(Text.assemble("  judged: ", safe(ev.window, "bold")))
        if ev.left_out:
            out.append(Text.assemble("  left out: ", safe(ev.left_out, "dim")))
        for i, f in enumerate(ev.findings):
            style = "yellow bold" if f.severity != "info" else ("bold" if i == 0 else "")
            out.append(Text.assemble(("★ " if i == 0 else "  ", colour.get(ev.bound, "green")),
                                     safe(f.title, style)))
            if f.detail:
                out.append(Text.assemble("    ", safe(f.detail, "dim")))
            if f.evidence:
                out.append(Text.assemble("    evidence: ", safe("; ".join(
                    verdicts.evidence_text(e) for e in f.evidence))))
            for remedy in f.remedies:
                out.append(Text.assemble("    → ", safe(remedy)))
        if ev.families:
            out.append(Text.assemble("  families: ", safe(", ".join(
                f"{fam.family} {humanfmt.pct(fam.share_pct, 0)}" for fam in ev.families))))
        if ev.tier3_advice:
            out.append(Text.assemble("  ", safe(ev.tier3_advice, "cyan")))
    elif isinstance(ev, protocol.KernelVerdict):
        out.append(Text.assemble(("★ ", "green"), safe(ev.short_name or ev.kernel, "bold"),
                                 ": ", safe(ev.sentence)))
        for r in ev.rules[:5]:
            sp = f" (est. speedup {humanfmt.pct(r.est_speedup_pct, 0)})" \
                if r.est_speedup_pct is not None else ""
            out.append(Text.assemble("  ", safe(r.rule, "magenta"), sp,
                                     " — " if r.evidence else "", safe(r.evidence, "dim"), ": ",
                                     safe(r.message, limit=300)))
        if any(r.est_speedup_pct is not None for r in ev.rules[:5]):
            out.append(Text(f"  {SPEEDUP_CAPTION}", "dim"))
    else:
        if ev.profiled or ev.missed:
            out.append(Text.assemble("  Tier 3 profiled ", safe(", ".join(
                f"{r.short_name or r.name} ({humanfmt.pct(r.share_pct, 0)})"
                for r in ev.profiled) or "none of Tier 2's top kernels")))
        for row in ev.missed:
            out.append(Text.assemble("  missed ", safe(row.short_name or row.name, "yellow"),
                                     f" ({humanfmt.pct(row.share_pct, 0)}): ", safe(row.why)))
    return out


#: Beside ncu's ranked findings: "▲ 81% TheoreticalOccupancy" first for a cuBLAS kernel
#: whose tensor pipe was 97% busy read as gpuws's own judgement (issue 34, finding 28).
SPEEDUP_CAPTION = ("est. speedup: ncu's own estimate were that one issue removed, not "
                   "gpuws's judgement; the estimates overlap and do not add up")


#: The Tier-3 metrics the CLI prints, in order; humanfmt.metric formats each by its key.
METRIC_LABELS: list[tuple[str, str]] = [
    ("duration_ns", "duration"),
    ("sm_throughput_pct", "SM throughput"),
    ("memory_throughput_pct", "memory throughput"),
    ("dram_throughput_pct", "DRAM throughput"),
    ("achieved_occupancy_pct", "achieved occupancy"),
    ("theoretical_occupancy_pct", "theoretical occupancy"),
    ("registers_per_thread", "registers/thread"),
    ("shared_mem_per_block", "shared mem/block"),
    ("l1_hit_pct", "L1 hit"),
    ("l2_hit_pct", "L2 hit"),
    ("tensor_pipe_active_pct", "tensor pipe active"),
    ("arithmetic_intensity", "arithmetic intensity"),
]


def metrics_table(ev: protocol.KernelMetrics) -> Table:
    t = Table(title=f"Tier 3 · {visible(verdicts.short(ev.kernel))} · launch {ev.launch}",
              title_justify="left")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for key, label in METRIC_LABELS:
        t.add_row(label, humanfmt.metric(key, ev.metrics.get(key)))
    if ev.stalls:
        t.caption = "top stalls: " + ", ".join(f"{visible(s.reason, 60)} {humanfmt.pct(s.pct, 0)}"
                                               for s in ev.stalls[:4])
    return t


def make_engine(args: argparse.Namespace, printer: Printer) -> Engine:
    """The laptop engine with this command's printer as its face."""
    progress = None if args.no_pull or args.json else _PullBar()
    return Engine(StoreHandle(), on_batch=printer.batch, on_notice=printer.notice,
                  auto_pull=not args.no_pull, pull_progress=progress)


class _PullBar:
    """Pull progress on stderr (a Rich bar), started at the first byte."""

    def __init__(self) -> None:
        self._bar: Any = None
        self._tasks: dict[str, Any] = {}

    def __call__(self, name: str, done: int, total: int) -> None:
        if self._bar is None:
            from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

            self._bar = Progress("{task.description}", BarColumn(), DownloadColumn(),
                                 TransferSpeedColumn(), console=console(stderr=True),
                                 transient=True)
            self._bar.start()
        if name not in self._tasks:
            self._tasks[name] = self._bar.add_task(visible(name, 60), total=total)
        self._bar.update(self._tasks[name], completed=done)
        if done >= total and all(t.finished for t in self._bar.tasks):
            self._bar.stop()
            self._bar, self._tasks = None, {}


async def finish_run(args: argparse.Namespace, engine: Engine, run_id: str,
                     fin: protocol.RunFinished, printer: Printer | None = None) -> int:
    """After a run: its pulled artifacts, the baseline comparison and the gate.

    Args:
        args: the command's arguments (``--json``, ``--baseline``, ``--fail-if-slower``).
        engine: the engine that followed the run.
        run_id: the run.
        fin: how it ended.
        printer: the printer that showed it, which knows the diagnosis (if any) that
            the failure repeats: its remedies close the failure's line.

    Returns:
        The command's exit status.
    """
    # With --json, stdout is NDJSON alone (a script parses every line): people's lines go
    # to stderr.
    out = console(stderr=bool(getattr(args, "json", False)))
    outcome = await engine.settled(run_id)
    for res in outcome.results:
        out.print(Text(f"  pulled {visible(res.name)} → {res.local_path}"))
    code = 0 if fin.status == "ok" else RunError.exit_code
    if code:
        # As every failure: one line on stderr with the exit code, whatever stdout showed.
        why = visible(fin.error, 300) if fin.error else f"it ended {fin.status}"
        said = printer.fatal.get(run_id) if printer is not None else None
        remedy = "`gpuws export` or `gpuws history` shows what it recorded"
        if said is not None and said.remedies:
            # The diagnosis's remedies, but not one the error already ends with.
            remedy = "; ".join(visible(r, 300) for r in said.remedies
                               if visible(r, 300) not in why)
        # "Run ID failed: cause — remedy": the title carries the id, so nothing stutters
        # ("Run failed: run ID failed: …").
        sys.stderr.write("gpuws: " + RunError(
            why, title=f"Run {run_id} {fin.status}", remedy=remedy).one_line() + "\n")
    if outcome.error is not None:
        code = code or outcome.error.exit_code
    if getattr(args, "baseline", None):
        baseline = args.baseline

        def compare(s: Store) -> Any:
            base = s.run(baseline).run_id
            s.set_baseline_of(run_id, base)
            return compare_runs(s, base, run_id)

        cmp = await engine.store.call(compare)
        render_comparison(cmp, out)
        if args.fail_if_slower is not None:
            failed, message = regression_gate(cmp, args.fail_if_slower)
            out.print(Text(message, style="red bold" if failed else "green"))
            if failed:
                code = code or 10
    return code


async def _follow(args: argparse.Namespace, engine: Engine, printer: Printer,
                  run_id: str) -> int:
    """Wait for the run (through reconnects), then pull and compare; Ctrl-C detaches."""
    try:
        fin = await engine.wait_finished(run_id)
    except asyncio.CancelledError:
        if engine.finished(run_id) is not None:
            # Ctrl+C just after the run ended (its pull begun): nothing goes on to attach to.
            raise
        # The whole command, -F/-p/-l included: pasted, it must reach the same pod.
        console(stderr=True).print(Text("detached; the run goes on: " + visible(
            target_of(args).command("attach", run_id))))
        return 130
    except ConnectError as exc:
        last = await engine.store.call(lambda s: s.last_seq(run_id))
        raise ConnectError(exc.message, title=exc.title,
                           remedy=f"{visible(target_of(args).command('attach', run_id))} "
                                  f"(resumes after event {last})") from exc
    return await finish_run(args, engine, run_id, fin, printer)


def _on_sigterm(task: asyncio.Task[Any] | None) -> None:
    """SIGTERM ends the command like Ctrl-C: stored events kept, the session ended."""
    if task is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)


async def run(args: argparse.Namespace) -> int:
    spec = build_spec(args)
    if args.fail_if_slower is not None and not args.baseline:
        raise UsageError("--fail-if-slower needs --baseline RUN_ID")
    workspace = None
    if getattr(args, "workspace", None):
        from ..workspace.sync import WorkspaceSync

        # Scanned (and refused, if it must be) before anything connects or is sent.
        workspace = WorkspaceSync(args.workspace)
        manifest = await asyncio.to_thread(workspace.scan)
    printer = Printer(args.json)
    engine = make_engine(args, printer)
    _on_sigterm(asyncio.current_task())
    try:
        await connect_starting(engine, target_of(args), args)
        if engine.link is not None:
            # The probe is known now: a GPU the pod lacks is refused before anything runs.
            gpus.check_on_pod(spec.gpu, engine.link.probe)
            printer.rate = engine.link.rate
        if workspace is not None and engine.link is not None:
            synced = await workspace.sync(engine.link.client, manifest)
            code = await asyncio.to_thread(workspace.code, manifest)
            console(stderr=True, markup=False).print(sync_line(synced, code))
            info = await engine.start_run(spec, code, manifest.entries)
        else:
            info = await engine.start_run(spec)
        if args.detach:
            await asyncio.sleep(0.2)
            await engine.drained()
            printer.release()  # what the run said so far comes before the id
            attach = target_of(args).command("attach", info.run_id)
            console(stderr=True).print(Text(f"started {info.run_id}; follow it with "
                                            f"`{visible(attach)}`"))
            # The id is the last line on stdout (scripts read it): nothing printed after.
            printer.muted = True
            if not args.json:
                sys.stdout.write(info.run_id + "\n")
            return 0
        return await _follow(args, engine, printer, info.run_id)
    finally:
        printer.release()
        await engine.close()
        await engine.store.close()


async def attach(args: argparse.Namespace) -> int:
    printer = Printer(args.json)
    engine = make_engine(args, printer)
    _on_sigterm(asyncio.current_task())
    refused: str | None = None  # the session of an attach the pod refused
    try:
        await engine.connect(target_of(args))
        printer.rate = engine.link.rate if engine.link is not None else None
        run_id, stored = await engine.store.call(lambda s: _known_run(s, args.run_id))
        if not stored and engine.link is not None:
            # A run only the pod knows (started by --detach elsewhere, by the TUI, by
            # another laptop): its prefix is resolved against the pod's own list.
            try:
                run_id = resolve_run(args, await engine.link.client.list_runs())
            except UsageError:
                refused = engine.session_id  # nothing attached: no empty session kept
                raise
        try:
            await engine.attach(run_id, from_seq=args.from_seq)
        except AgentError as exc:
            if exc.code != "no_such_run":
                raise
            refused = engine.session_id
            if stored:
                raise  # the laptop holds it and the pod lost it (a reboot): not a typo
            raise unknown_run(args) from exc
        return await _follow(args, engine, printer, run_id)
    finally:
        printer.release()
        await engine.close()
        if refused is not None:
            sid = refused
            await engine.store.call(lambda s: s.discard_if_empty(sid))
        await engine.store.close()


def unknown_run(args: argparse.Namespace) -> UsageError:
    """An id neither the laptop nor the pod knows: a mistake, refused as other ids are."""
    return UsageError(f"no run {visible(args.run_id, 80)} on {visible(args.host, 80)} or in "
                      "the store", remedy=f"`{_runs_hint(args)}` lists the pod's runs, "
                                          "`gpuws history` the stored ones")


def _runs_hint(args: argparse.Namespace) -> str:
    # With the -F/-p/-l the pod was reached with: pasted, it must reach the same pod.
    return visible(target_of(args).command("runs"), 300)


def resolve_run(args: argparse.Namespace, pod_runs: list[protocol.RunInfo]) -> str:
    """The pod's run that ``args.run_id`` names: its id, or a prefix of exactly one.

    An id that names none is returned as typed: the pod's own answer (no such run)
    refuses it, as it refuses a full id it does not hold.

    Args:
        args: the command's arguments (the id or prefix typed, the pod as named).
        pod_runs: the pod's runs (``ListRuns``).

    Raises:
        UsageError: the prefix names several of the pod's runs (they are listed).
    """
    typed, host = str(args.run_id), str(args.host)
    ids = [r.run_id for r in pod_runs]
    if typed in ids:
        return typed
    matches = sorted(i for i in ids if i.startswith(typed))
    if len(matches) == 1:
        return matches[0]
    if not matches:
        return typed
    # The ids come from the pod: shown, never interpreted, and a few of them at most.
    shown = ", ".join(visible(i, 80) for i in matches[:5]) + (", …" if len(matches) > 5
                                                               else "")
    raise UsageError(f"run id {visible(typed, 80)!r} is ambiguous on {visible(host, 80)}: "
                     f"{len(matches)} runs start with it ({shown})",
                     remedy=f"give more characters of the id (`{_runs_hint(args)}` "
                            "lists them)")


def _known_run(store: Store, run_id: str) -> tuple[str, bool]:
    """The full id of a stored run given by prefix (and True), or the id as typed and False
    (a run not stored yet)."""
    try:
        return store.run(run_id).run_id, True
    except StoreError:
        return run_id, False


async def cancel(args: argparse.Namespace) -> int:
    client = await connect(args)
    try:
        # "Everywhere an id is taken, a unique prefix works too": the runs to cancel are
        # the pod's, so the prefix is resolved against its list.
        info = await client.cancel(resolve_run(args, await client.list_runs()))
    except AgentError as exc:
        if exc.code != "no_such_run":
            raise
        raise unknown_run(args) from exc
    finally:
        await client.close()
    console(markup=False).print(Text(f"{visible(info.run_id)}: {visible(info.status)}"))
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
    out = console(markup=False)
    out.print(runs_table(visible(args.host), items, out.width))
    return 0


def runs_table(host: str, items: list[protocol.RunInfo], width: int) -> Table:
    """The pod's runs for ``attach``: every id whole at any width (they are what a person
    copies); the workload, the one column that gives way, is cut with an ellipsis. Below
    100 columns the start time goes (the id holds it)."""
    narrow = width < 100
    t = Table(title=f"runs on {host}", title_justify="left", box=box.SIMPLE_HEAD,
              show_edge=False)
    t.add_column("run id", no_wrap=True,
                 min_width=max((len(r.run_id) for r in items), default=6))
    t.add_column("status", no_wrap=True,
                 min_width=min(12, max((len(r.status) for r in items), default=6)))
    if not narrow:
        t.add_column("started", no_wrap=True)
    t.add_column("events", justify="right", no_wrap=True)
    t.add_column("workload")
    for r in items:
        workload = safe(r.workload, limit=300)
        workload.no_wrap, workload.overflow = True, "ellipsis"
        cells = [safe(r.run_id), safe(r.status, limit=40)]
        if not narrow:
            cells.append(Text(humanfmt.when(r.started)))
        t.add_row(*cells, Text(humanfmt.num(r.last_seq + 1)), workload)
    return t


async def ncu(args: argparse.Namespace) -> int:
    # As `doctor --install-nsys` (issue 34, finding 26): on a terminal the plan is shown
    # and asked about; without one, --yes is the answer given in advance, and without it
    # the command is refused before connecting: nothing changes on the pod unasked.
    if args.install and not args.yes and not sys.stdin.isatty():
        raise UsageError("--install changes the pod and there is no terminal to ask on",
                         remedy="run it on a terminal, or add --yes to confirm in advance")
    client = await connect(args)
    out = console(markup=False)
    # With --json, stdout is the plan alone: the steps, the question and the answer go to
    # stderr.
    said = console(stderr=args.json, markup=False)

    def show_log(ev: protocol.Events | protocol.BadLine) -> None:
        if isinstance(ev, protocol.Log):
            said.print(safe(ev.message, "dim"))

    client.add_listener(show_log)
    try:
        plan = await client.ncu_plan(install=False)
        if args.install and plan.selected:
            # Nothing to install and nothing to confirm: the agent only verifies the ncu
            # that fits (a one-pass smoke profile).
            said.print(safe(f"ncu {plan.selected_version or '?'} at {plan.selected} fits: "
                            "nothing to install; verifying it"))
            plan = await client.ncu_plan(install=True)
        elif args.install and plan.install_plan:
            if args.yes or await asyncio.to_thread(_confirm_ncu, plan, said):
                plan = await client.ncu_plan(install=True)
            else:
                said.print(Text("Nothing was installed."))
    finally:
        await client.close()
    if args.json:
        print_json(msgspec.to_builtins(plan))
        return 0
    out.print(Text(visible(f"driver {plan.driver or '—'} (CUDA {plan.cuda_driver or '—'}), "
                           f"GPU arch {plan.arch or '—'}")))
    t = Table(title="Nsight Compute installs", title_justify="left")
    for col in ("version", "path", "fits", "why"):
        t.add_column(col)
    for c in plan.choices:
        t.add_row(safe(c.version or "?"), safe(c.path),
                  Text("yes", "green") if c.compatible else Text("no", "red"), safe(c.reason))
    if plan.choices:
        out.print(t)
    else:  # an empty table (its header and no row) reads like a failure to list
        out.print(Text("no Nsight Compute install found on the pod", "dim"))
    if plan.selected:
        out.print(Text.assemble(("selected", "green bold"), " ", safe(
            f"{plan.selected} ({plan.selected_version}): {plan.reason}")))
    else:
        out.print(Text.assemble(("none fits", "red bold"), ": ", safe(plan.reason)))
    if plan.install_plan and not plan.installed:
        out.print(safe(f"install plan for {plan.install_target_version} (--install runs it, "
                       "asking first; --install --yes without asking):"))
        for step in plan.install_plan:
            out.print(safe("  $ " + shlex.join(step)))
    if plan.verified:
        out.print(Text.assemble(("verified", "green"), ": ", safe(plan.verified)))
    return 0 if plan.selected else 11


def _confirm_ncu(plan: protocol.NcuPlan, said: Console) -> bool:
    """Show the install plan's commands and ask y/N on the terminal."""
    from .doctor import ask

    said.print(Text.assemble("These commands run on the pod:", *(
        safe("\n  $ " + shlex.join(step), "bold") for step in plan.install_plan or [])))
    target = visible(plan.install_target_version or "Nsight Compute", 80)
    return ask(f"Install ncu {target} on the pod? [y/N] ")
