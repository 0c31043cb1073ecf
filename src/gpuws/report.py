"""``gpuws report``: read a pulled ``.ncu-rep`` (or ncu CSV) on the laptop and show it.

The reading is the agent's own (:mod:`gpuws.remote_agent.ncu_reader`), so a report reads
the same here as on the pod: through NVIDIA's ``ncu_report`` module, which the
``ncu-report`` wheel provides without ncu installed, or from ``ncu --csv`` output.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table

from .errors import GpuwsError, UsageError
from .remote_agent import ncu_reader

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


class ReportError(GpuwsError):
    """A report file that cannot be read."""

    title = "Cannot read the report"
    exit_code = 2


def read_report(path: str | Path) -> list[dict[str, Any]]:
    """Canonical metrics of every profiled launch in a report file.

    Args:
        path: a ``.ncu-rep`` / ``.ncu-repz`` (read through ``ncu_report``), or the CSV of
            ``ncu --csv --page raw`` or ``--page details`` (told apart by its header).

    Returns:
        One dict per launch, as :mod:`gpuws.remote_agent.ncu_reader` gives them.

    Raises:
        UsageError: the file does not exist.
        ReportError: ``ncu_report`` is not installed, or the file holds no profile results.
    """
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{p}: no such file", remedy="give the path of a pulled .ncu-rep or CSV")
    if p.name.endswith(_REP_SUFFIXES) or not _looks_like_text(p):
        try:
            module = ncu_reader.load_ncu_report_module()
        except ImportError as exc:
            raise ReportError(
                f"{p.name} is an Nsight Compute report and the ncu_report module is not "
                f"installed ({exc})",
                remedy="pip install ncu-report (or gpuws[report]), or export a CSV on the pod: "
                       "ncu --import FILE --csv --page raw > FILE.csv") from exc
        try:
            kernels = ncu_reader.read_ncu_rep(str(p), module=module)
        except (OSError, RuntimeError, ValueError) as exc:
            raise ReportError(f"{p.name}: ncu_report could not read it ({exc})",
                              remedy="check that the file was copied whole") from exc
    else:
        text = p.read_text(encoding="utf-8", errors="replace")
        kernels = ncu_reader.read_csv(text)
    if not kernels:
        raise ReportError(f"{p.name} holds no profiled kernel",
                          remedy="check that ncu profiled something (no 'No kernels were "
                                 "profiled' warning) and that the file is not truncated")
    return kernels


def _looks_like_text(path: Path) -> bool:
    with path.open("rb") as f:
        head = f.read(4096)
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}".rstrip()
    return f"{value:.4g} {unit}".rstrip()


def format_metric(key: str, value: float | None) -> str:
    """A canonical metric as a person reads it (``246.5 us``, ``66.3 %``, ``—``)."""
    if value is None or not math.isfinite(value):
        return "—"
    kind = _LABELS.get(key, (key, ""))[1]
    if kind == "time":
        for factor, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
            if value >= factor:
                return f"{value / factor:.4g} {unit}"
        return f"{value:.4g} ns"
    if kind == "%":
        return f"{value:.1f} %"
    if kind == "count":
        return f"{value:.0f}"
    if kind == "bytes":
        if value < 1e4:
            return f"{value:.0f} B"
        return _si(value, "B")
    if kind == "si":
        return _si(value, "")
    if kind == "flop/byte":
        return f"{value:.3g} FLOP/B"
    return f"{value:.4g}"


def _kernel_panel(kernel: dict[str, Any]) -> Panel:
    metrics = Table(show_header=False, box=None, pad_edge=False)
    metrics.add_column("metric", style="bold")
    metrics.add_column("value", justify="right")
    values = kernel.get("metrics") or {}
    for key, (label, _) in _LABELS.items():
        metrics.add_row(label, format_metric(key, values.get(key)))
    parts: list[Any] = [metrics]

    stalls = kernel.get("stalls") or []
    if stalls:
        st = Table(title="Top warp stalls", title_justify="left", box=None, pad_edge=False)
        st.add_column("reason")
        st.add_column("% of cycles between issues", justify="right")
        for s in stalls:
            st.add_row(str(s["reason"]).replace("_", " "), f"{float(s['pct']):.1f}")
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
            speed = "" if est is None else f"{est:.1f} %" + (
                f" ({r['speedup_type']})" if r.get("speedup_type") else "")
            style = {"OPT": "yellow", "WRN": "magenta", "ERR": "red"}.get(str(r.get("kind")), "")
            rt.add_row(f"[{style}]{r.get('kind')}[/]" if style else str(r.get("kind")),
                       str(r.get("rule")), speed, str(r.get("message")))
        parts.append(rt)

    shape = " ".join(x for x in (
        f"grid {kernel['grid']}" if kernel.get("grid") else "",
        f"block {kernel['block']}" if kernel.get("block") else "") if x)
    title = f"launch {kernel.get('launch')}: [bold]{kernel.get('kernel')}[/]"
    return Panel(Group(*parts), title=title, title_align="left",
                 subtitle=f"{shape}  ·  {kernel.get('source', '')}".strip(" ·"),
                 subtitle_align="left")


def render_report(kernels: list[dict[str, Any]], console: Console) -> None:
    """Print one panel per profiled launch: canonical metrics, top stalls, ncu's findings."""
    if not kernels:
        console.print("[dim]no profiled kernels[/]")
        return
    for kernel in kernels:
        console.print(_kernel_panel(kernel))


def report_json(kernels: list[dict[str, Any]]) -> str:
    """The launches as indented JSON (non-finite numbers become null)."""
    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value
    return json.dumps(clean(kernels), indent=2, ensure_ascii=False)
