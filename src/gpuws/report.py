"""``gpuws report``: read a pulled ``.ncu-rep`` (or ncu CSV) on the laptop and show it.

The reading is the agent's own (:mod:`gpuws.remote_agent.profilers.ncu_reader`), so a report reads
the same here as on the pod: through NVIDIA's ``ncu_report`` module, which the
``ncu-report`` wheel provides without ncu installed, or from ``ncu --csv`` output.
Each launch also carries the clocks ncu measured it at (its SM and DRAM frequency), since
every figure in it holds only at those clocks. Numbers are formatted by
:mod:`gpuws.text.humanfmt`, as everywhere else; kernel names and findings are shown as text,
never read as markup.
"""

from __future__ import annotations

import csv
import io
import json
import math
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from . import report_child
from .errors import GpuwsError, UsageError
from .remote_agent.profilers import ncu_reader
from .remote_agent.verdicts.kernel import kernel_verdicts
from .report_child import Limits
from .text import humanfmt
from .text.textsafe import text as safe

__all__ = ["read_report", "render_report", "report_json"]

_REP_SUFFIXES = (".ncu-rep", ".ncu-repz")

#: Label and unit of each canonical metric, in display order.
_LABELS: dict[str, tuple[str, str]] = {
    "duration_ns": ("Duration", "time"),
    "sm_throughput_pct": ("Compute (SM) throughput", "%"),
    "memory_throughput_pct": ("Memory throughput", "%"),
    "dram_throughput_pct": ("DRAM throughput", "%"),
    "achieved_occupancy_pct": ("Achieved occupancy", "%"),
    "theoretical_occupancy_pct": ("Theoretical occupancy", "%"),
    "registers_per_thread": ("Registers / thread", "count"),
    "shared_mem_per_block": ("Shared memory / block", "bytes"),
    "l1_hit_pct": ("L1/TEX hit rate", "%"),
    "l2_hit_pct": ("L2 hit rate", "%"),
    "tensor_pipe_active_pct": ("Tensor pipe active", "%"),
    "flops": ("FLOPs", "si"),
    "dram_bytes": ("DRAM bytes", "bytes"),
    "arithmetic_intensity": ("Arithmetic intensity", "flop/byte"),
}

#: The clocks ncu measured each launch at: report metric names, and the details page's
#: labels (the SpeedOfLight section collects them).
_CLOCK_METRICS = {"sm_hz": ("gpc__cycles_elapsed.avg.per_second",
                            "sm__cycles_elapsed.avg.per_second"),
                  "dram_hz": ("dram__cycles_elapsed.avg.per_second",)}
_CLOCK_LABELS = {"SM Frequency": "sm_hz", "DRAM Frequency": "dram_hz"}


class ReportError(GpuwsError):
    """A report file that cannot be read."""

    title = "Cannot read the report"
    exit_code = 2


def read_report(path: str | Path, limits: Limits | None = None) -> list[dict[str, Any]]:
    """Canonical metrics of every profiled launch in a report file.

    A binary report is parsed by a bounded child process (:mod:`gpuws.report_child`): a
    handed file is nobody's promise, and ``ncu_report``'s native code is not built for
    hostile input.

    Args:
        path: a ``.ncu-rep`` / ``.ncu-repz`` (read through ``ncu_report``, told by its
            first bytes), or the CSV of ``ncu --csv --page raw`` or ``--page details``.
        limits: the child's bounds (memory, time, file and decompressed size).

    Returns:
        One dict per launch, as :mod:`gpuws.remote_agent.profilers.ncu_reader` gives them,
        each string valid UTF-8 and each number finite or None.

    Raises:
        UsageError: no such file, a folder, or not a regular file.
        ReportError: not a report, ``ncu_report`` missing, the file over a bound, the
            reader crashed or ran out of time or memory, or no profiled kernel in it.
    """
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        raise UsageError(f"{p}: no such file",
                         remedy="give the path of a pulled .ncu-rep or CSV") from None
    if stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{p} is a folder, not a report",
                         remedy="give a .ncu-rep, .ncu-repz or ncu CSV file inside it "
                                "(`gpuws pull` puts them under the run's folder)")
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{p} is not a regular file",
                         remedy="give a .ncu-rep, .ncu-repz or ncu CSV file")
    kind = report_child.kind_of(p)
    if kind not in ("rep", "repz", "text"):
        raise _not_a_report(p)
    # A CSV too: read whole and parsed, a 200 MiB one took 3.5 GB and 63 s in-process.
    try:
        data = report_child.read_in_child(p, limits or report_child.Limits(), kind)
    except report_child.ChildFailure as exc:
        raise ReportError(f"{p.name}: {exc.cause}", remedy=exc.remedy) from None
    if kind == "text" and not data.get("kernels") and data.get("blank_or_ncu") is False:
        raise _not_a_report(p)
    kernels: list[dict[str, Any]] = data["kernels"]  # checked as it was decoded
    clocks = {int(k): v for k, v in data["clocks"].items()
              if str(k).isdigit() and isinstance(v, dict)}
    for kernel in kernels:
        found = clocks.get(int(kernel.get("launch") or 0))
        if found:
            kernel["clocks"] = {k: v for k, v in found.items()
                                if isinstance(v, float) and math.isfinite(v)}
    if not kernels:
        raise ReportError(f"{p.name} holds no profiled kernel",
                          remedy="check that ncu profiled something (no 'No kernels were "
                                 "profiled' warning) and that the file is not truncated")
    add_verdicts(kernels)
    return kernels


def add_verdicts(kernels: list[dict[str, Any]]) -> None:
    """Give each kernel's first launch the ``kernel_verdict`` a run states after Tier 3
    (the same function over the same metrics and rules). A report carries no probe, so
    the SM count is ncu's own (``launch__sm_count``) where the report has it."""
    first: dict[str, dict[str, Any]] = {}
    for kernel in kernels:
        first.setdefault(str(kernel.get("kernel")), kernel)
    try:
        verdicts = kernel_verdicts(kernels)
    except (ValueError, TypeError, KeyError, AttributeError, ZeroDivisionError):
        return  # as in a run: a verdict is a reading of the figures, which stand without it
    for verdict in verdicts:
        first[str(verdict["kernel"])]["verdict"] = verdict


def read_rep_here(path: str) -> tuple[list[dict[str, Any]], dict[int, dict[str, float]]]:
    """A binary report read in this process: what the bounded child runs."""
    module = ncu_reader.load_ncu_report_module()
    return ncu_reader.read_ncu_rep(path, module=module), _rep_clocks(module, path)


def read_csv_here(path: str) -> tuple[list[dict[str, Any]], dict[int, dict[str, float]], bool]:
    """ncu's CSV read in this process: what the bounded child runs. The flag says whether
    the text is blank or ncu's own (else it is not a report at all)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    return (ncu_reader.read_csv(text), _csv_clocks(text),
            not text.strip() or _looks_like_ncu(text))


def _not_a_report(p: Path) -> ReportError:
    return ReportError(f"{p.name} is not an Nsight Compute report (.ncu-rep, .ncu-repz or "
                       "ncu's CSV)",
                       remedy="give a report `gpuws pull` brought home, or the CSV of "
                              "`ncu --import FILE --csv --page raw`")


def _looks_like_ncu(text: str) -> bool:
    """ncu's own words or CSV header somewhere in the first lines."""
    head = text[:65536]
    return "==PROF==" in head or "==WARNING==" in head or "==ERROR==" in head \
        or '"Kernel Name"' in head or '"ID","Process ID"' in head


def _clean(value: Any) -> Any:
    """What the child handed back, made safe to print and to encode: strings valid UTF-8
    (a lone surrogate from a mangled name becomes ``?``), numbers finite or None."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {_clean(str(k)): _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return None


def _rep_clocks(module: Any, path: str) -> dict[int, dict[str, float]]:
    """The SM and DRAM clocks of each launch in a report, in ``read_ncu_rep``'s order."""
    out: dict[int, dict[str, float]] = {}
    ctx = module.load_report(path)
    launch = 0
    for r in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(r)
        for a in range(rng.num_actions()):
            action = rng.action_by_idx(a)
            names = set(action.metric_names())
            found: dict[str, float] = {}
            for key, candidates in _CLOCK_METRICS.items():
                for name in candidates:
                    value = _metric_hz(action.metric_by_name(name)) if name in names else None
                    if value is not None:
                        found[key] = value
                        break
            if found:
                out[launch] = found
            launch += 1
    return out


def _metric_hz(metric: Any) -> float | None:
    try:
        value = float(metric.as_double())
        unit = metric.unit()
    except (AttributeError, TypeError, ValueError):
        return None
    if not math.isfinite(value):
        return None
    return ncu_reader.scale_value(value, unit if isinstance(unit, str) else None)[0]


def _csv_clocks(text: str) -> dict[int, dict[str, float]]:
    """The SM and DRAM clocks of each launch (by ``ID``) in ncu's raw or details CSV."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(('"ID",', "ID,"))), None)
    if start is None:
        return {}
    # As ncu_reader: lines interleaved by the program or ncu never start with a quote.
    rows = list(csv.reader(io.StringIO("\n".join(
        [lines[start]] + [ln for ln in lines[start + 1:] if ln.startswith('"')]))))
    header, body = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(header)}
    out: dict[int, dict[str, float]] = {}
    if "Metric Name" in col and "Metric Value" in col:
        decimal = ncu_reader.detect_decimal(r[col["Metric Value"]] for r in body
                                            if len(r) > col["Metric Value"])
        for r in body:
            if len(r) <= col["Metric Value"] or not r[col["ID"]].strip().isdigit():
                continue
            key = _CLOCK_LABELS.get(r[col["Metric Name"]])
            unit = r[col["Metric Unit"]] if "Metric Unit" in col else None
            value = ncu_reader.scale_value(
                ncu_reader.parse_number(r[col["Metric Value"]], decimal), unit)[0]
            if key is not None and value is not None:
                out.setdefault(int(r[col["ID"]]), {})[key] = value
        return out
    units = body[0] if body and body[0] and body[0][0] == "" else []
    data = [r for r in body if r and r[0].strip().isdigit()]
    wanted = {key: next((col[n] for n in names if n in col), None)
              for key, names in _CLOCK_METRICS.items()}
    decimal = ncu_reader.detect_decimal(r[i] for r in data for i in wanted.values()
                                        if i is not None and i < len(r))
    for r in data:
        for key, i in wanted.items():
            if i is None or i >= len(r):
                continue
            unit = units[i] if i < len(units) else None
            value = ncu_reader.scale_value(ncu_reader.parse_number(r[i], decimal), unit)[0]
            if value is not None:
                out.setdefault(int(r[0]), {})[key] = value
    return out


def format_metric(key: str, value: float | None) -> str:
    """A canonical metric as a person reads it (``246.5 µs``, ``66.3%``, ``—``), by
    :func:`gpuws.text.humanfmt.metric` like every other face."""
    if value is None or not math.isfinite(value):
        return humanfmt.DASH
    return humanfmt.metric(key, value)


def format_clocks(clocks: dict[str, float] | None) -> str:
    """``SM 1,492 MHz · DRAM 3,199 MHz``: the clocks ncu measured a launch at."""
    if not clocks:
        return "not in the report (its SpeedOfLight section was not collected)"
    parts = []
    if clocks.get("sm_hz") is not None:
        parts.append(f"SM {humanfmt.mhz(clocks['sm_hz'] / 1e6)}")
    if clocks.get("dram_hz") is not None:
        parts.append(f"DRAM {humanfmt.mhz(clocks['dram_hz'] / 1e6)}")
    return " · ".join(parts)


def _kernel_panel(kernel: dict[str, Any]) -> Panel:
    metrics = Table(show_header=False, box=None, pad_edge=False)
    metrics.add_column("metric", style="bold")
    metrics.add_column("value", justify="right")
    values = kernel.get("metrics") or {}
    for key, (label, _) in _LABELS.items():
        metrics.add_row(label, format_metric(key, values.get(key)))
    metrics.add_row("Clocks (as ncu measured)", format_clocks(kernel.get("clocks")))
    parts: list[Any] = []
    verdict = kernel.get("verdict")
    if isinstance(verdict, dict) and verdict.get("sentence"):
        parts.append(Text.assemble(("Verdict: ", "bold"), safe(verdict.get("sentence"))))
    parts.append(metrics)

    stalls = kernel.get("stalls") or []
    if stalls:
        st = Table(title="Top warp stalls", title_justify="left", box=None, pad_edge=False)
        st.add_column("reason")
        st.add_column("% of cycles between issues", justify="right")
        for s in stalls:
            st.add_row(safe(str(s["reason"]).replace("_", " ")),
                       humanfmt.num(float(s["pct"]), digits=1))
        parts.append(st)

    rules = sorted(kernel.get("rules") or [],
                   key=lambda r: (r.get("est_speedup_pct") is None,
                                  -(r.get("est_speedup_pct") or 0.0)))
    if rules:
        rt = Table(title="ncu findings (by estimated speedup)", title_justify="left",
                   box=None, pad_edge=False, expand=True)
        rt.add_column("kind", no_wrap=True)
        rt.add_column("rule", no_wrap=True)
        rt.add_column("speedup", justify="right", no_wrap=True)
        rt.add_column("finding", ratio=1, overflow="fold")
        for r in rules:
            est = r.get("est_speedup_pct")
            speed = "" if est is None else humanfmt.pct(est) + (
                f" ({r['speedup_type']})" if r.get("speedup_type") else "")
            style = {"OPT": "yellow", "WRN": "magenta", "ERR": "red"}.get(str(r.get("kind")), "")
            rt.add_row(safe(r.get("kind"), style), safe(r.get("rule")), safe(speed),
                       safe(r.get("message")))
        parts.append(rt)

    shape = " ".join(x for x in (
        f"grid {kernel['grid']}" if kernel.get("grid") else "",
        f"block {kernel['block']}" if kernel.get("block") else "") if x)
    title = Text.assemble(f"launch {kernel.get('launch')}: ",
                          safe(kernel.get("kernel"), "bold", limit=300))
    return Panel(Group(*parts), title=title, title_align="left",
                 subtitle=safe(f"{shape}  ·  {kernel.get('source', '')}".strip(" ·")),
                 subtitle_align="left")


def render_report(kernels: list[dict[str, Any]], console: Console) -> None:
    """Print one panel per profiled launch: canonical metrics, top stalls, ncu's findings."""
    if not kernels:
        console.print("[dim]no profiled kernels[/]")
        return
    for kernel in kernels:
        console.print(_kernel_panel(kernel))


def report_json(kernels: list[dict[str, Any]]) -> str:
    """The launches as indented JSON: non-finite numbers null, every string valid UTF-8."""
    return "".join(report_json_chunks(kernels))


def report_json_chunks(kernels: list[dict[str, Any]]) -> Iterator[str]:
    """:func:`report_json` one launch at a time, the same text: a long report is never
    held twice more (its JSON whole, and its encoding) to be printed."""
    if not kernels:
        yield "[]"
        return
    for i, kernel in enumerate(kernels):
        # A string holds no raw newline in JSON, so indenting every line nests it exactly
        # as json.dumps(kernels, indent=2) would.
        body = json.dumps(_clean(kernel), indent=2, ensure_ascii=False).replace("\n", "\n  ")
        yield ("[\n  " if i == 0 else ",\n  ") + body
    yield "\n]"
