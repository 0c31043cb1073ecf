"""A session as a GitHub-flavoured markdown report, the kind pasted into a pull request.

Everything comes from the store: the probe for the environment, each run's events for
its commands and results, the derived tables for metrics, rules, diagnoses and
artifacts, and the phase ledger for the economics. The output depends on nothing but
the stored data, so exporting the same session twice gives the same bytes.

Every string from the pod goes in through ``_esc`` (inert text) or ``_code`` (a code
span), both from :mod:`gpuws.text.textsafe`: a report pasted into a pull request shows
the pod's characters and nothing else (no image, link, HTML, heading or table row of the
pod's making), and printed to a terminal it sends no escape.
"""

from __future__ import annotations

import re
import shlex
import signal
import statistics
import time
from collections.abc import Sequence
from typing import Any

from gpuws import __version__, protocol
from gpuws.errors import StoreError
from gpuws.gpu import clocks, evidence, gpus
from gpuws.live import verdicts
from gpuws.sessions.compare import (
    Comparison,
    change_text,
    code_comparison,
    compare_runs,
    compare_samples,
    gpu_rows,
    run_gpu,
)
from gpuws.sessions.cost import Economics, economics
from gpuws.sessions.export_images import Figures
from gpuws.sessions.fleet import cells, columns, failure_lines, fleet_comparison, notes
from gpuws.sessions.store import (
    ArtifactRow,
    HostActionRow,
    KernelMetricsRow,
    RunRow,
    SessionRow,
    Store,
)
from gpuws.text.textsafe import md_code, md_code_block, md_text, visible_lines
from gpuws.workspace.code import CodeRecord

#: The viewer for each artifact kind (by file suffix).
VIEWERS = {".ncu-rep": "ncu-ui", ".nsys-rep": "nsys-ui", ".qdrep": "nsys-ui"}
_TIER_NAMES = {1: "CUDA events", 2: "timeline", 3: "Nsight Compute"}
#: Readable names of the canonical ncu metrics (the key is shown too, for grepping).
_LABELS = {
    "duration_ns": "duration", "sm_throughput_pct": "SM throughput",
    "memory_throughput_pct": "memory throughput", "dram_throughput_pct": "DRAM throughput",
    "achieved_occupancy_pct": "achieved occupancy",
    "theoretical_occupancy_pct": "theoretical occupancy",
    "registers_per_thread": "registers/thread", "shared_mem_per_block": "shared memory/block",
    "l1_hit_pct": "L1 hit rate", "l2_hit_pct": "L2 hit rate",
    "tensor_pipe_active_pct": "tensor pipe active", "flops": "FLOPs",
    "dram_bytes": "DRAM bytes", "arithmetic_intensity": "arithmetic intensity",
    "sm_count": "SMs on the GPU", "waves_per_sm": "waves of blocks per SM",
}
_REPORT_TYPES = ("tier_started", "tier_finished", "tier1_result", "kernel_table",
                 "static_analysis")


def export_session(store: Store, session_id: str, now: float | None = None,
                   figures: Figures | None = None) -> str:
    """Render a whole session as markdown.

    Args:
        store: the session store.
        session_id: a session id or unique prefix.
        now: the time a still-connected session is measured up to (default: now).
        figures: where each run's pictures go (timeline, roofline), linked from its
            section; None: a report without pictures.

    Raises:
        StoreError: the session is unknown.
    """
    session = store.session(session_id)
    econ = economics(store, session.id, now=now)
    out: list[str] = [f"# gpuws session {_code(session.id, cell=False)}", ""]
    out += _summary(session, econ)
    out += ["", "## Environment", ""]
    out += _environment(session.probe)
    session_diagnoses = store.session_diagnoses(session.id)
    if session_diagnoses:
        out += ["", "### Session diagnoses", ""]
        for d in session_diagnoses:
            out += _diagnosis(d)
    runs = store.runs(session.id)
    out += _watch_iterations(store, runs)
    for run in runs:
        out += [""]
        out += _run_section(store, run, figures)
    out += ["", "## Economics", ""]
    out += _economics(econ)
    out += _billed(store, session, econ)
    out += ["", f"<sub>Exported by gpuws {__version__}.</sub>", ""]
    # Every pod string above went through _esc/_code; this pass guarantees that whatever a
    # section forgets, no control character reaches the file or a terminal.
    return visible_lines("\n".join(out))


def export_fleet(store: Store, fleet_id: str) -> str:
    """Render a fleet (one workload on several pods at once) as its comparison in markdown.

    Each pod's session has its own full report (:func:`export_session`); this is the table
    that puts them side by side, with what each pod could not give and why.

    Raises:
        StoreError: the fleet is unknown.
    """
    c = fleet_comparison(store, fleet_id)
    f = c.fleet
    end = _when(f.ended) if f.ended is not None else "not recorded (the gpuws that ran it " \
        "stopped before the end)"
    out = [f"# gpuws fleet {_code(f.id, cell=False)}", "",
           f"- Workload: {_code(f.workload, cell=False)}",
           f"- Started: {_when(f.started)} → {end}",
           f"- Pods: {len(c.lines)}, in the order given; the first is the reference"
           + (f"; {len(c.failed)} gave no result" if c.failed else ""),
           "", "## Comparison", ""]
    cols = columns(c)
    out += _table(cols, [[_code(row[col]) if col == "pod" else _esc(row[col]) for col in cols]
                         for row in map(cells, c.lines)])
    for note in notes(c):
        out += ["", _esc(note)]
    failures = failure_lines(c)
    if failures:
        out += ["", "## Pods that gave no result", ""]
        out += [f"- {_esc(line)}" for line in failures]
    out += ["", "## Sessions", ""]
    out += _table(["pod", "session", "run", "host"],
                  [[_code(line.pod), _code(line.session_id) if line.session_id else "—",
                    _code(line.run_id) if line.run_id else "—", _esc(line.hostname or "—")]
                   for line in c.lines])
    out += ["", "Each session's full report: `gpuws export SESSION`.",
            "", f"<sub>Exported by gpuws {__version__}.</sub>", ""]
    return visible_lines("\n".join(out))


# ----------------------------------------------------------------------------- header
def _summary(s: SessionRow, econ: Economics) -> list[str]:
    end = "still connected" if s.ended is None else _when(s.ended)
    lines = [
        f"- Host: {_code(s.host, cell=False)} via {_esc(s.transport)}",
        f"- Connected: {_when(s.started)} → {end} ({_dur(econ.connected_s)})",
        f"- Runs: {s.run_count}",
    ]
    if s.rate_usd_per_hour is not None:
        lines.append(f"- Rate: {_usd(s.rate_usd_per_hour)}/hour; cost so far "
                     f"{_usd(econ.total_cost_usd)}"
                     + (f" of a {_usd(s.budget_usd)} budget" if s.budget_usd is not None else ""))
    else:
        lines.append("- Rate: not set (no cost computed)")
    return lines


def _environment(probe: protocol.Probe | None) -> list[str]:
    if probe is None:
        return ["The pod was not probed in this session: no environment fingerprint."]
    rows: list[list[str]] = []
    for g in probe.gpus:
        facts = [g.name]
        if g.compute_capability:
            facts.append(f"sm {g.compute_capability}")
        if g.memory_total_mib is not None:
            facts.append(f"{g.memory_total_mib:,.0f} MiB")
        if g.sm_count is not None:
            facts.append(f"{g.sm_count} SMs")
        if g.sm_clock_max_mhz is not None:
            facts.append(f"max SM clock {g.sm_clock_max_mhz:,.0f} MHz")
        rows.append([f"GPU {g.index}", _esc(" · ".join(facts))])
        rows.append([f"GPU {g.index} UUID", _code(g.uuid) if g.uuid else "unknown"])
        if g.processes:
            rows.append([f"GPU {g.index} in use by", _esc(gpus.processes(g.processes))])
        if g.pci_bus_id:
            rows.append([f"GPU {g.index} PCI", _code(g.pci_bus_id)])
        if g.gpm_supported is not None:
            rows.append([f"GPU {g.index} NVML GPM", "answers" if g.gpm_supported
                         else _esc(f"does not answer: {g.gpm_reason or 'no reason given'}")])
    if not probe.gpus:
        rows.append(["GPU", _esc(f"none found: {probe.gpu_error or 'no reason given'}")])
    driver = probe.driver or "unknown"
    if probe.cuda_driver:
        driver += f" (supports CUDA {probe.cuda_driver})"
    rows.append(["Driver", _esc(driver)])
    rows.append(["CUDA toolkit", _tools(probe.toolkits, "none found")])
    rows.append(["Nsight Compute", _tools(probe.ncu, "none found")])
    rows.append(["Nsight Systems", _tools(probe.nsys, "none found")])
    agent = f"{_esc(probe.python_version)} ({_code(probe.python_path)})"
    choice = probe.python_choice
    if choice is not None and choice.path != probe.python_path:
        # The workloads ran under the interpreter the agent chose (the one with CuPy or
        # torch), not under the login python3 the agent itself runs on: name both.
        version = f"{_esc(choice.version)} " if choice.version else ""
        rows.append(["Python (workloads)",
                     f"{version}({_code(choice.path)}): {_esc(choice.how)}, "
                     f"{_esc(choice.reason)}"])
        rows.append(["Python (agent)", agent])
    else:
        rows.append(["Python", agent])
    for label, pattern in (("CuPy", r"cupy"), ("torch", r"torch")):
        pkgs = [p for p in probe.python_packages if re.fullmatch(pattern + r"(-cuda\w+)?", p.name)]
        rows.append([label, "; ".join(_package(p) for p in pkgs) if pkgs else "not installed"])
    c = probe.counters
    rows.append(["GPU counters", _esc(c.verdict + (f": {c.reason}" if c.reason else ""))])
    rows.append(["OS", _esc(f"{probe.os} · kernel {probe.kernel} · {probe.arch}")])
    machine = [probe.hostname]
    if probe.cpu_count is not None:
        machine.append(f"{probe.cpu_count} CPUs")
    if probe.memory_total_mib is not None:
        machine.append(f"{probe.memory_total_mib:,.0f} MiB RAM")
    rows.append(["Machine", _esc(" · ".join(machine))])
    if probe.container:
        rows.append(["Container hints", _esc(", ".join(probe.container))])
    return _table(["Item", "Value"], rows)


def _tools(installs: list[protocol.ToolInstall], none: str) -> str:
    if not installs:
        return none
    parts = []
    for t in installs:
        if t.error:
            parts.append(f"unusable {_code(t.path)}: {_esc(t.error)}")
        else:
            parts.append(f"{_esc(t.version or 'unknown version')} ({_code(t.path)})")
    return "; ".join(parts)


def _package(p: protocol.PyPackage) -> str:
    if p.error:
        return f"{_esc(p.name)}: {_esc(p.error)}"
    text = f"{p.name} {p.version or '(unknown version)'}"
    if p.cuda:
        text += f" (CUDA {p.cuda})"
    return _esc(text)


# ----------------------------------------------------------------------------- runs
def _run_section(store: Store, run: RunRow, figures: Figures | None = None) -> list[str]:
    workload = _code(run.workload or "unknown workload", cell=False)
    out = [f"## Run {_code(run.run_id, cell=False)} — {workload}", ""]
    facts = [f"Status **{_esc(run.status)}**"]
    if run.exit_code is not None:
        facts.append(exit_words(run.exit_code))
    if run.wall_s is not None:
        facts.append(f"wall {_dur(run.wall_s)}")
    if run.started is not None:
        facts.append(f"started {_when(run.started)}")
    if run.is_baseline:
        facts.append("marked as baseline")
    out += [" · ".join(facts), ""]
    out += _run_gpu(store, run)
    out += _run_code(store.code(run.run_id))

    # Today's verdicts over the stored events (an old session gets today's logic), first.
    found = verdicts.derive(verdicts.inputs_from_events(
        store.run_events(run.run_id, verdicts.INPUT_TYPES)))
    if found:
        out += ["### Verdict", ""]
        out += _verdicts(found)
        out.append("")
    events = store.run_events(run.run_id, _REPORT_TYPES)
    started = [e for e in events if isinstance(e, protocol.TierStarted)]
    finished = {e.tier: e for e in events if isinstance(e, protocol.TierFinished)}
    tier1 = [e for e in events if isinstance(e, protocol.Tier1Result)]
    tables = [e for e in events if isinstance(e, protocol.KernelTable)]
    static = [e for e in events if isinstance(e, protocol.StaticAnalysis)]

    out += ["### Commands", ""]
    out += _commands(started, finished, run.status)
    if tier1:
        out += ["", "### Tier 1 — CUDA events", ""]
        out += _tier1(tier1[-1])
    gpm = _gpm(finished, tier1[-1].mode if tier1 else None)
    if gpm:
        out += ["", "### Device activity (NVML GPM)", ""]
        out += gpm
    estimates = [t for t in started if t.estimate is not None]
    if estimates:
        out += ["", "### Tier 3 estimate (before ncu started)", ""]
        out += _estimate(estimates[-1].estimate, finished.get(3),
                         store.session(run.session_id).rate_usd_per_hour)
    if tables:
        out += ["", f"### Kernels (Tier 2, from {_esc(tables[-1].source)})", ""]
        out += _kernel_table(tables[-1])
    timeline = figures.timeline(store, run) if figures is not None else []
    if timeline:
        out += ["", *timeline]
    metrics = store.metrics(run.run_id)
    if metrics:
        out += ["", "### Nsight Compute metrics", ""]
        out += _metrics(metrics)
        roofline = figures.roofline(store, run) if figures is not None else []
        if roofline:
            out += ["", *roofline]
    if static:
        out += ["", "### Static analysis", ""]
        out += _static(static)
    rules = store.rules(run.run_id)
    if rules:
        out += ["", "### Rule findings (by estimated speedup)", ""]
        out += _rules(rules)
    out += ["", "### Not measured, and why", ""]
    out += _unmeasured(run, finished, store.diagnoses(run.run_id))
    if run.baseline_of is not None:
        out += ["", f"### Compared with baseline {_code(run.baseline_of, cell=False)}", ""]
        try:
            out += _comparison(compare_runs(store, run.baseline_of, run.run_id))
        except StoreError as exc:
            out.append(_esc(f"The baseline could not be read: {exc.message}"))
    artifacts = store.artifacts(run.run_id)
    if artifacts:
        out += ["", "### Artifacts", ""]
        out += _artifacts(artifacts)
    return out


def _run_gpu(store: Store, run: RunRow) -> list[str]:
    """The GPU the run was pinned to, and who else used it then (nothing when unknown)."""
    target = next((e.gpu for e in store.run_events(run.run_id, ["run_started"])
                   if isinstance(e, protocol.RunStarted) and e.gpu is not None), None)
    if target is None:
        return []
    gpu = run_gpu(store, run.run_id)
    line = f"GPU {target.index}" + (f" ({_esc(gpu.name)})" if gpu.name else "")
    if gpu.uuid:
        line += f", {_code(gpu.uuid, cell=False)}"
    out = [f"Ran on {line}.", ""]
    warning = gpus.busy_warning(target)
    if warning is not None:
        out += [f"**Caution:** {_esc(warning)}.", ""]
    return out


def _run_code(code: CodeRecord | None) -> list[str]:
    """The code the run measured: workspace tree, git commit, files that differ from it."""
    if code is None:
        return []
    line = (f"Code: workspace {_code(code.directory, cell=False)}, {code.files:,} files "
            f"({_size(code.total_bytes)}), tree {_code(code.tree_sha256[:16], cell=False)}")
    if code.git_commit:
        line += f", git {_code(code.git_commit[:12], cell=False)}"
    if code.git_dirty:
        shown = ", ".join(_code(p, cell=False) for p in code.git_changed[:10])
        more = f" and {len(code.git_changed) - 10} more" if len(code.git_changed) > 10 else ""
        line += f", **dirty**: {shown}{more} differ from it"
    elif code.git_dirty is False:
        line += ", clean"
    return [line, ""]


def exit_words(code: int) -> str:
    """A process's exit status for people: ``exit code 1``, or the signal that ended it
    (``stopped by SIGTERM (exit code -15)``: what a cancel does)."""
    if code >= 0:
        return f"exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"stopped by {name} (exit code {code})"


def _commands(started: list[protocol.TierStarted], finished: dict[int, protocol.TierFinished],
              run_status: str) -> list[str]:
    out: list[str] = []
    for t in started:
        out.append(f"Tier {t.tier} ({_esc(t.name)}):")
        out.append("")
        end = finished.get(t.tier)
        if end is not None and end.status == "skipped":
            # Nothing ran: the tier was only announced (Tier 1 for a command).
            why = f": {_esc(end.reason)}" if end.reason else ""
            out.append(f"skipped{why.rstrip('.')}; nothing ran.")
        elif t.argv:
            out += _code_block(shlex.join(t.argv), "sh")
            if end is not None and end.status == "failed" and run_status == "cancelled":
                # The cancel stopped it: that is not the command failing.
                out += ["", "cancelled: the run was cancelled while this ran."]
        else:
            out.append("ran inside the agent's worker (no separate command).")
        out.append("")
    if not out:
        return ["No tier started."]
    return out[:-1]


def _tier1(r: protocol.Tier1Result) -> list[str]:
    s = r.stats
    out = _table(
        ["n", "median", "mean", "stdev", "min", "p5", "p95", "max", "95% CI of median", "± rel."],
        [[str(s.n), _ms(s.median_ms), _ms(s.mean_ms), _ms(s.stdev_ms), _ms(s.min_ms),
          _ms(s.p5_ms), _ms(s.p95_ms), _ms(s.max_ms),
          f"{_ms(s.ci_low_ms)} – {_ms(s.ci_high_ms)}", f"{100 * s.ci_rel_halfwidth:.2f}%"]])
    out.append("")
    if r.mode == "cold":
        how = "L2 flushed before each sample"
        if r.l2_flush_bytes:
            # Results recorded before l2_flush_method existed were flushed by a memset.
            how += f" by a {r.l2_flush_method or 'memset'} of {r.l2_flush_bytes:,} B"
        if r.cold_gap_ms:
            how += f", GPU idle {r.cold_gap_ms:g} ms before it"
    else:
        how = "back-to-back"
    if r.requested_mode == "auto":
        how += "; chosen by auto"
    out.append(_esc(f"Mode {r.mode} ({how}), {r.warmup} warm-up calls, batch of {r.batch}; "
                    f"stopped: {r.stop_reason}."))
    if r.events_median_ms is not None:  # a short call, timed again from CUPTI
        out.append(_esc(f"Timed by {r.timing_source or 'CUPTI'}; CUDA events read "
                        f"{_ms(r.events_median_ms)}."))
    if r.caution:
        out.append(_esc(f"Caution: {r.caution}"))
    rates = []
    if r.gbps is not None:
        rates.append(f"{r.gbps:,.1f} GB/s" + _of_peak(r.pct_peak_bw, r.peak_gbps, "GB/s",
                                                       r.peak_source))
    if r.tflops is not None:
        rates.append(f"{r.tflops:,.3f} TFLOP/s" + _of_peak(r.pct_peak_flops, r.peak_tflops,
                                                            "TFLOP/s", r.peak_source))
    if rates:
        out += ["", "Throughput at the median: " + _esc("; ".join(rates)) + "."]
    seen = "not recorded" if r.clocks is None else _esc(clocks.describe(r.clocks))
    out += ["", f"Clocks while sampling: {seen}."]
    caution = clocks.caution(r.clocks)
    if caution is not None:
        out += ["", f"**Caution:** {_esc(caution)}."]
    return out


def _gpm(finished: dict[int, protocol.TierFinished], mode: str | None) -> list[str]:
    """NVML GPM per tier that sampled it: a table of figures, or why there are none."""
    out: list[str] = []
    for tier in sorted(t for t, ev in finished.items() if ev.gpm is not None):
        g = finished[tier].gpm
        assert g is not None
        over = evidence.gpm_over(tier, mode)
        if out:
            out.append("")
        if not evidence.gpm_measured(g):
            out.append(_esc(f"NVML GPM over {over}: not measured — "
                            f"{g.reason or 'no reason given'}."))
            continue
        share = (f" The timed calls took {g.timed_share_pct:.0f}% of the window."
                 if g.timed_share_pct is not None else "")
        out.append(_esc(f"Device-wide averages over {over} ({_dur(g.window_s or 0.0)}), "
                        f"source: {evidence.SOURCE}; other processes on the GPU count too."
                        + share))
        out.append("")
        out += _table(["Metric", "Value", "Source"],
                      [[_esc(label), _esc(value), evidence.SOURCE]
                       for label, value in evidence.gpm_rows(g)])
    return out


def _estimate(est: protocol.Tier3Estimate | None, fin: protocol.TierFinished | None,
              rate: float | None) -> list[str]:
    """Tier 3's estimate, its inputs, and how it compares with what Tier 3 took."""
    assert est is not None
    out = [_esc(evidence.estimate_line(est, rate)) + ".", ""]
    out += [f"- {_esc(b)}" for b in evidence.estimate_bases(est)]
    against = evidence.estimate_against(est, fin) if fin is not None else None
    if fin is not None and against is not None:
        out += ["", _esc(f"Tier 3 took {_dur(fin.wall_s)} ({against}).")]
    return out


def _of_peak(pct: float | None, peak: float | None, unit: str, source: str | None) -> str:
    if pct is None or peak is None:
        return ""
    return f" ({pct:.1f}% of {peak:,.0f} {unit}" + (f", {source} peak)" if source else ")")


def _verdicts(v: verdicts.Verdicts) -> list[str]:
    """The program's bound and findings, each kernel's bound, and what Tier 3 missed."""
    out: list[str] = []
    if v.program is not None:
        p = v.program
        if p.window:
            out += [f"Judged: {_esc(p.window)}" + (f"; left out: {_esc(p.left_out)}"
                                                    if p.left_out else "") + ".", ""]
        for i, f in enumerate(p.findings):
            out.append(f"{'**' + _esc(f.title) + '**' if i == 0 else _esc(f.title)}"
                       + (f": {_esc(f.detail)}" if f.detail else "") + "  ")
            if f.evidence:
                out.append("Evidence: " + _esc("; ".join(
                    verdicts.evidence_text(e) for e in f.evidence)) + ".")
            out += [f"- Try: {_esc(r)}" for r in f.remedies]
            out.append("")
        if p.families:
            out += _table(["kernel family", "share of kernel time", "kernels", "launches"],
                          [[_esc(fam.family), f"{fam.share_pct:.1f}%", f"{fam.kernels:,}",
                            f"{fam.calls:,}"] for fam in p.families])
            out += ["", f"Kernel times from {_esc(p.source)}."]
        if p.tier3_advice:
            out += ["", _esc(p.tier3_advice) + "."]
    for k in v.kernels:
        out += ["", f"**{_code(k.short_name or k.kernel, cell=False)}**: {_esc(k.sentence)}."]
        if k.evidence:
            out.append("Evidence: " + _esc("; ".join(
                verdicts.evidence_text(e) for e in k.evidence if e.value is not None)) + ".")
        if k.rules:
            # Ranked with the figure beside each; the findings' words are under "Rule
            # findings" below, once.
            out += ["", *_table(["ncu rule", "est. speedup", "evidence"], [
                [_esc(r.rule), "—" if r.est_speedup_pct is None else
                 f"{r.est_speedup_pct:.1f}%", _esc(r.evidence) or "—"] for r in k.rules])]
    if v.coverage is not None and (v.coverage.profiled or v.coverage.missed):
        c = v.coverage
        out += ["", "Tier 3 against Tier 2: profiled " + (", ".join(
            f"{_code(r.short_name or r.name, cell=False)} ({r.share_pct:.1f}%)"
            for r in c.profiled) or "none of Tier 2's top kernels") + "."]
        out += [f"- missed {_code(r.short_name or r.name, cell=False)} ({r.share_pct:.1f}%): "
                f"{_esc(r.why)}" for r in c.missed]
    while out and not out[0]:
        out.pop(0)
    return out


def _kernel_table(t: protocol.KernelTable) -> list[str]:
    out = _kernel_rows(t.kernels)
    out += _full_names([k.name for k in t.kernels])
    caption = verdicts.window_caption(t.window, t.comm)
    if caption:
        out += ["", _esc(caption[0].upper() + caption[1:]) + "."]
    for r in t.ranks or []:
        out += ["", f"{_esc(verdicts.rank_name(r)).capitalize()} (pid {r.pid})"
                + (f", GPU idle {r.gpu_idle_pct:.1f}%" if r.gpu_idle_pct is not None else "")
                + ":", ""]
        out += _kernel_rows(r.kernels, top=5)
        caption = verdicts.window_caption(r.window, r.comm)
        if caption:
            out += ["", _esc(caption[0].upper() + caption[1:]) + "."]
    extra = []
    if t.gpu_idle_pct is not None:
        extra.append(f"GPU idle {t.gpu_idle_pct:.1f}% of the kernel span")
    if t.memcpy_pct is not None:
        extra.append(f"memcpy {t.memcpy_pct:.1f}%")
    if extra:
        out += ["", _esc("; ".join(extra)) + "."]
    return out


def _kernel_rows(kernels: Sequence[protocol.KernelRow], top: int = verdicts.TOP_ROWS
                 ) -> list[str]:
    """The ranked rows, with the code that launched each where the profile had stacks."""
    shown = verdicts.top_rows(kernels, top)
    code = any(k.code for k in shown.rows)
    rows = [[str(i), _code(verdicts.short(k.name)), f"{k.calls:,}", _ms(k.total_ns / 1e6),
             _ms(k.mean_ns / 1e6), f"{k.share_pct:.1f}%",
             *((_code(k.code) if k.code else "—",) if code else ())]
            for i, k in enumerate(shown.rows, 1)]
    if shown.others:
        rows.append(["", f"{shown.others:,} others", f"{shown.others_calls:,}",
                     _ms(shown.others_total_ns / 1e6), "", f"{shown.others_share_pct:.1f}%",
                     *(("",) if code else ())])
    return _table(["#", "kernel", "calls", "total", "mean", "share",
                   *(("launched from",) if code else ())], rows)


def _full_names(names: Sequence[str]) -> list[str]:
    """The full demangled names behind short ones, folded away (``<details>``); only where
    some name was shortened. Each name is inert in a code span."""
    longer = [n for n in dict.fromkeys(names) if verdicts.short(n) != n]
    if not longer:
        return []
    out = ["", "<details><summary>Full kernel names</summary>", ""]
    out += [f"- {_code(verdicts.short(n), cell=False)}: {_code(n, cell=False)}" for n in longer]
    return [*out, "", "</details>"]


def _metrics(rows: list[KernelMetricsRow]) -> list[str]:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r.metrics if k not in keys]
    header = ["metric"] + [f"{_code(verdicts.short(r.kernel))} #{r.launch}" for r in rows]
    body = [[_label(k)] + [_metric(k, r.metrics.get(k)) for r in rows] for k in keys]
    body.append(["top stalls"] + [
        _esc(", ".join(f"{s.reason} {s.pct:.1f}%" for s in r.stalls)) or "—" for r in rows])
    return _table(header, body)


def _static(events: list[protocol.StaticAnalysis]) -> list[str]:
    def opt(v: Any, fmt: str = "{}") -> str:
        return "—" if v is None else _esc(fmt.format(v))

    return _table(
        ["kernel", "registers/thread", "shared mem/block", "local mem/thread", "block size",
         "theoretical occupancy", "limiter", "source"],
        [[_code(verdicts.short(e.kernel)), opt(e.registers_per_thread),
          opt(e.shared_mem_per_block, "{:,} B"), opt(e.local_mem_per_thread, "{:,} B"),
          opt(e.block_size), opt(e.theoretical_occupancy_pct, "{:.1f}%"), opt(e.limiter),
          _esc(e.source)] for e in events]) + _full_names([e.kernel for e in events])


def _rules(rules: list[protocol.Rule]) -> list[str]:
    # Biggest estimated win first; findings without an estimate keep their order, last.
    ordered = sorted(rules, key=lambda r: (r.est_speedup_pct is None, -(r.est_speedup_pct or 0)))
    return _table(
        ["kernel", "rule", "type", "est. speedup", "finding"],
        [[_code(verdicts.short(r.kernel)), _esc(r.rule), _esc(r.kind),
          "—" if r.est_speedup_pct is None else
          f"{r.est_speedup_pct:.1f}%" + (f" ({_esc(r.speedup_type)})" if r.speedup_type else ""),
          _esc(r.message)] for r in ordered])


def _unmeasured(run: RunRow, finished: dict[int, protocol.TierFinished],
                diagnoses: list[protocol.Diagnosis]) -> list[str]:
    out: list[str] = []
    wanted = run.spec.tiers if run.spec is not None else sorted(finished)
    for tier in wanted:
        name = _TIER_NAMES.get(tier, "")
        label = f"Tier {tier}" + (f" ({name})" if name else "")
        f = finished.get(tier)
        if f is None:
            out.append(f"- {label}: did not finish (run {_esc(run.status)}).")
        elif f.status != "ok":
            detail = f" using {_esc(f.source)}" if f.source and f.status == "fallback" else ""
            reason = f": {_esc(f.reason)}" if f.reason else ""
            out.append(f"- {label}: **{f.status}**{detail}{reason}.")
    for d in diagnoses:
        out += _diagnosis(d)
    return out or ["Every requested tier completed; nothing was left unmeasured."]


def _diagnosis(d: protocol.Diagnosis) -> list[str]:
    out = [f"- **{_esc(d.title)}** ({d.severity}, {_code(d.code, cell=False)}): "
           + _esc(sentences(d.cause, d.meaning))]
    if d.unmeasured:
        out.append(f"  - Not measured: {_esc(', '.join(d.unmeasured))}.")
    for r in d.remedies:
        out.append(f"  - Remedy: {_esc(r)}")
    return out


def sentences(*parts: str) -> str:
    """The pod's phrases as sentences: each starts with a capital and ends with a stop
    ("no NVIDIA GPU was found" and "the command ran …" ran together as one)."""
    out = []
    for part in parts:
        part = part.strip()
        if not part:
            continue
        part = part[0].upper() + part[1:]
        out.append(part if part[-1] in ".!?" else part + ".")
    return " ".join(out)


def _watch_iterations(store: Store, runs: list[RunRow]) -> list[str]:
    """The optimisation as ``gpuws watch`` saw it (its runs say so: ``fork_server``): one
    row per save, its code, its median and the change against the previous iteration and
    the first, with the same 95% verdict the loop printed."""
    its = [r for r in runs if r.spec is not None and r.spec.fork_server]
    if not its:
        return []
    rows: list[list[str]] = []
    first: list[float] | None = None
    prev: list[float] | None = None
    prev_id = ""
    for n, run in enumerate(its, 1):
        samples = store.samples(run.run_id)
        code = store.code(run.run_id)
        changed = "start"
        if prev_id:
            changes = code_comparison(store, prev_id, run.run_id)["code_changes"]
            changed = "—" if changes is None else ", ".join(
                _code(c) for c in changes[:5]) + (f" +{len(changes) - 5}"
                                                   if len(changes) > 5 else "") or "same code"
        prev_id = run.run_id
        cells = [str(n), _code(run.run_id), _code(code.short()) if code else "—", changed]
        if not samples:
            rows.append([*cells, _esc(run.status), "—", "—"])
            continue
        rows.append([*cells, _ms(statistics.median(samples)),
                     _esc(change_text(compare_samples(prev, samples))) if prev else "—",
                     _esc(change_text(compare_samples(first, samples))) if first else "—"])
        first = first or samples
        prev = samples
    return ["", "## Watch iterations", "",
            *_table(["#", "run", "code", "changed", "median", "vs previous", "vs first"],
                    rows),
            "", "Changes are of the median time per call, with the 95% CI of the ratio of "
                "medians (bootstrap); \"no difference\" when that CI holds 1."]


def _comparison(c: Comparison) -> list[str]:
    out: list[str] = []
    t = c.tier1
    if t is None:
        out.append(_esc(f"No Tier-1 comparison: {c.tier1_missing}."))
    else:
        out += _table(
            ["Tier 1", f"baseline {_code(c.run_a)}", f"this run {_code(c.run_b)}"],
            [["samples", str(t.n_a), str(t.n_b)],
             ["median", _ms(t.median_a_ms), _ms(t.median_b_ms)],
             *([_esc(label), _esc(a), _esc(b)] for label, a, b in gpu_rows(c))])
        out += ["", f"**Verdict:** {_esc(t.verdict)}. Speedup is baseline median / this run's "
                    f"median; the CI comes from {c.resamples:,} bootstrap resamples of both."]
        if c.cycle_note:
            out += ["", _esc(c.cycle_note[:1].upper() + c.cycle_note[1:]) + "."]
        if c.tier1_caution:
            out += ["", f"**Caution:** {_esc(c.tier1_caution)}."]
    for line in c.differences:
        out += ["", f"**Not like for like:** {_esc(line)}."]
    if c.code_changes:
        shown = ", ".join(_code(p, cell=False) for p in c.code_changes[:20])
        more = f" and {len(c.code_changes) - 20} more" if len(c.code_changes) > 20 else ""
        out += ["", f"**Code changed** from the baseline: {shown}{more}."]
    elif c.code_changes == []:
        out += ["", "**Same code** as the baseline (the same workspace tree)."]
    for side, caution in (("baseline", c.clock_caution_a), ("this run", c.clock_caution_b)):
        if caution:
            out += ["", f"**Caution ({side}):** {_esc(caution)}."]
    for k in c.kernels:
        if not (k.in_a and k.in_b):
            side = "baseline" if k.in_a else "this run"
            out += ["", f"{_code(k.kernel, cell=False)} #{k.launch} was profiled only in the "
                        f"{side}."]
            continue
        out += ["", f"{_code(k.kernel, cell=False)} #{k.launch}:", ""]
        out += _table(["metric", "baseline", "this run", "Δ", "Δ%"],
                      [[_label(m.key), _metric(m.key, m.a), _metric(m.key, m.b),
                        "—" if m.delta is None else _metric(m.key, m.delta, signed=True),
                        "—" if m.delta_pct is None else f"{m.delta_pct:+.1f}%"]
                       for m in k.metrics])
    return out


def _artifacts(rows: list[ArtifactRow]) -> list[str]:
    body = []
    for a in rows:
        viewer = next((v for suffix, v in VIEWERS.items() if a.name.endswith(suffix)), None)
        if a.status == "pulled" and a.local_path:
            where = _code(a.local_path)
            how = _code(shlex.join([viewer, a.local_path])) if viewer else "any viewer"
        else:
            where = f"not pulled ({_esc(a.status)}); on the pod: {_code(a.remote_path)}"
            how = "—"
        body.append([_code(a.name), _size(a.size), _code(a.sha256), where, how])
    return _table(["name", "size", "sha256", "local path", "open with"], body)


# ----------------------------------------------------------------------------- economics
def _economics(e: Economics) -> list[str]:
    rate = "not set" if e.rate_usd_per_hour is None else f"{_usd(e.rate_usd_per_hour)}/hour"
    out = [f"Rate {rate}; connected {_dur(e.connected_s)}"
           + (" (still connected)" if e.live else "") + "."]
    out.append("")
    body = [[_esc(r.phase) + (" (unfinished)" if r.open else ""),
             _code(r.run_id) if r.run_id else "—", _dur(r.duration_s),
             _gpu(r.gpu_s), _usd(r.cost_usd)] for r in e.rows]
    body.append(["idle", "—", _dur(e.idle_s), "—", _usd(e.idle_cost_usd)])
    body.append(["**total (connected)**", "—", _dur(e.connected_s), _gpu(e.gpu_s),
                 f"**{_usd(e.total_cost_usd)}**"])
    out += _table(["phase", "run", "duration", "GPU time", "cost"], body)
    notes = []
    if e.idle_warning:
        notes.append(f"⚠ {e.idle_pct:.0f}% of the connected time was idle "
                     f"({_dur(e.idle_s)}, {_usd(e.idle_cost_usd)}).")
    if e.over_budget:
        notes.append(f"⚠ Over budget: {_usd(e.total_cost_usd)} of {_usd(e.budget_usd)}.")
    elif e.budget_warning:
        notes.append(f"⚠ Near budget: {_usd(e.total_cost_usd)} of {_usd(e.budget_usd)}.")
    if notes:
        out += ["", *notes]
    out += ["", "Phases may overlap (a transfer during a tier); busy time counts overlaps once, "
                "and the session's cost is its connected time × the rate."]
    return out


def _billed(store: Store, session: SessionRow, e: Economics) -> list[str]:
    """What the provider bills (issue 22, point 4): from the start gpuws performed before
    this session to the stop after it (gpuws's, the pod's lease's from its log, or the one
    the host's silence after the lease's deadline implies), beside the connected time, the
    rest named as billed with nobody connected. Nothing when no start or stop is known."""
    every = store.host_actions(session.host)
    actions = [a for a in every if a.ok]
    end = session.ended if session.ended is not None else time.time()
    # A stop gpuws ran that the host still answered after (a budget's, `gpuws stop`'s)
    # ended nothing: said as such, never as "Stopped".
    failed = [f"A stop gpuws ran at {_when(a.started)} did not stop the pod "
              f"({md_text(a.detail or 'no reason recorded', 300)}): it may still bill."
              for a in every if a.action == "stop" and not a.ok and a.by == "gpuws"
              and session.started <= a.started <= end]
    return _billed_lines(actions, session, e, end) + (["", *failed] if failed else [])


def _billed_lines(actions: list[HostActionRow], session: SessionRow, e: Economics,
                  end: float) -> list[str]:
    start = next((a for a in reversed(actions)
                  if a.action == "start" and a.started <= session.started), None)
    if start is not None and any(a.action == "stop" and start.started < a.started
                                 <= session.started for a in actions):
        start = None  # stopped again before this session: that start billed another stretch
    stop = next((a for a in actions if a.action == "stop" and a.started >= session.started),
                None)
    if start is None and stop is None:
        return []
    rate = e.rate_usd_per_hour
    if start is not None and stop is not None:
        billed = stop.started - start.started if stop.by == "estimated" else \
            stop.ended - start.started
        idle = max(0.0, billed - e.connected_s)
        cost = f" at {_usd(rate)}/hour: {_usd(billed * rate / 3600.0)}" if rate else ""
        line = (f"Billed time: {'at least ' if stop.by == 'estimated' else ''}{_dur(billed)}"
                f"{cost}, from the start gpuws performed ({_when(start.started)}) to "
                f"{_stop_words(stop)}; connected {_dur(e.connected_s)} of it, so "
                f"{_dur(idle)} was billed with nobody connected.")
        if stop.by == "estimated":
            most = stop.ended - start.started
            most_cost = f", {_usd(most * rate / 3600.0)}" if rate else ""
            line += (f" At most {_dur(most)}{most_cost}: the host was found stopped at "
                     f"{_when(stop.ended)}.")
        return ["", line]
    if start is not None:
        return ["", f"The pod was started by gpuws at {_when(start.started)} and no stop was "
                    f"recorded after this session (ended {_when(end)}): it may still bill."]
    assert stop is not None
    return ["", f"Stopped: {_stop_words(stop)}; its start was not gpuws's, so the billed "
                "time before the session is not known here."]


def _stop_words(stop: HostActionRow) -> str:
    """Who stopped the pod, and when, as a clause."""
    if stop.by == "lease":
        return (f"the stop its lease performed ({_when(stop.started)}, from the pod's lease "
                "log, after the idle time with nobody there)")
    if stop.by == "estimated":
        return (f"the earliest its lease could stop it ({_when(stop.started)}: the lease's "
                "idle time after the last contact; the host no longer answered at "
                f"{_when(stop.ended)})")
    return f"gpuws's stop ({_when(stop.ended)})"


# ----------------------------------------------------------------------------- markdown
def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A GFM table; every row must have the header's number of cells."""
    width = len(header)
    for row in rows:
        if len(row) != width:
            raise ValueError(f"table row has {len(row)} cells, header has {width}: {row}")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * width]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _esc(text: str) -> str:
    """Pod (or any) text made inert markdown: no link, image, HTML, heading or row."""
    return md_text(text)


def _code(text: str, cell: bool = True) -> str:
    """An inline code span of visible text (``cell=False``: outside a table)."""
    return md_code(text, cell=cell)


def _code_block(text: str, lang: str) -> list[str]:
    return md_code_block(text, lang)


def _when(ts: float) -> str:
    # UTC, so a report reads the same wherever it is exported.
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def _dur(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        m, s = divmod(round(seconds), 60)
        return f"{m} min {s:02d} s"
    h, rest = divmod(round(seconds), 3600)
    return f"{h} h {rest // 60:02d} min"


def _gpu(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else _dur(seconds)


def _ms(ms: float) -> str:
    if ms >= 1000:
        return f"{ms / 1000:,.3f} s"
    if ms >= 1:
        return f"{ms:,.3f} ms"
    return f"{ms * 1000:,.2f} µs"


def _usd(v: float | None) -> str:
    if v is None:
        return "—"
    # Cents hide a short phase's cost entirely; show it to a hundredth of a cent instead.
    return f"${v:.4f}" if 0 < v < 0.01 else f"${v:,.2f}"


def _size(n: int) -> str:
    if n < 1024:
        return f"{n:,} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{value:,.1f} {unit} ({n:,} B)"
    raise AssertionError("unreachable: the loop returns at TiB")


def _label(key: str) -> str:
    label = _LABELS.get(key)
    return f"{label} ({_code(key)})" if label else _code(key)


def _metric(key: str, v: float | None, signed: bool = False) -> str:
    if v is None:
        return "—"
    sign = "+" if signed else ""
    if key.endswith("_ns"):
        return ("-" if v < 0 else sign if v > 0 else "") + _ms(abs(v) / 1e6)
    if key.endswith("_pct"):
        # A difference of percentages is in percentage points, not a relative change.
        return f"{v:+.2f} pp" if signed else f"{v:.2f}%"
    if key.endswith("_bytes") or key == "shared_mem_per_block":
        return f"{v:{sign},.0f} B"
    if key == "arithmetic_intensity":
        return f"{v:{sign}.3f} FLOP/B"
    if float(v).is_integer():
        return f"{v:{sign},.0f}"
    return f"{v:{sign}.4g}"
