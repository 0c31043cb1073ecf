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

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .errors import GpuwsError, UsageError
from .text import humanfmt
from .text.textsafe import json_visible, valid_text, visible
from .text.textsafe import text as safe

__all__ = ["read_report", "render_report", "report_json"]

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

#: The child's default limits (``gpuws report --max-memory/--timeout``). An honest H200
#: saxpy report peaks at 144 MiB in the child (most of it ``ncu_report``'s native library
#: and libnvperf_host), and loads under an address-space limit of 256 MiB; 512 MiB leaves
#: room for reports a few hundred launches long while keeping a hostile one far below
#: what a laptop notices.
DEFAULT_MEMORY_MIB = 512
DEFAULT_TIMEOUT_S = 60.0
#: Largest answer (the launches as JSON) the parent reads back from the child.
MAX_ANSWER_BYTES = 64 << 20
#: Longest string kept from a report (a kernel name, a finding), and most entries kept in
#: one list (launches, stalls, findings): the rest is cut, never rendered whole.
MAX_STRING = 20_000
MAX_ITEMS = 100_000


#: The child's default limits (``gpuws report --max-memory/--timeout``). An honest H200
#: saxpy report peaks at 144 MiB in the child (most of it ``ncu_report``'s native library
#: and libnvperf_host), and loads under an address-space limit of 256 MiB; 512 MiB leaves
#: room for reports a few hundred launches long while keeping a hostile one far below
#: what a laptop notices.
DEFAULT_MEMORY_MIB = 512
DEFAULT_TIMEOUT_S = 60.0
#: Largest answer (the launches as JSON) the parent reads back from the child.
MAX_ANSWER_BYTES = 64 << 20
#: Longest string kept from a report (a kernel name, a finding), and most entries kept in
#: one list (launches, stalls, findings): the rest is cut, never rendered whole.
MAX_STRING = 20_000
MAX_ITEMS = 100_000


class ReportError(GpuwsError):
    """A report file that cannot be read."""

    title = "Cannot read the report"
    exit_code = 2


def install_hint(prefix: str | None = None) -> str:
    """How to add the ``report`` extra, in the form that fits how gpuws was installed.

    pipx keeps each app in ``…/pipx/venvs/NAME``, ``uv tool`` in ``…/uv/tools/NAME``;
    anything else is a plain environment that pip manages. Where that cannot be told,
    all three forms are given.
    """
    where = (prefix if prefix is not None else sys.prefix).replace("\\", "/")
    pip = "pip install 'gpuws[report]'"
    pipx = "pipx inject gpuws ncu-report zstandard"
    uv = "uv tool install --reinstall 'gpuws[report]'"
    if "/pipx/venvs/" in where:
        return pipx
    if "/uv/tools/" in where:
        return uv
    if where != getattr(sys, "base_prefix", where) or prefix is not None:
        return pip
    return f"{pip} (pipx: {pipx}; uv: {uv})"


def read_report(path: str | Path, *, max_memory_mib: int = DEFAULT_MEMORY_MIB,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> list[dict[str, Any]]:
    """Canonical metrics of every profiled launch in a report file, parsed in a child.

    Args:
        path: a ``.ncu-rep`` / ``.ncu-repz`` (read through ``ncu_report``), or the CSV of
            ``ncu --csv --page raw`` or ``--page details`` (told apart by its header).
        max_memory_mib: the child's address-space limit; the file, and a ``.ncu-repz``'s
            decompressed size, may be at most half of it.
        timeout_s: the child's wall-clock (and CPU) limit.

    Returns:
        One dict per launch, as :mod:`gpuws.remote_agent.profilers.ncu_reader` gives them,
        checked here: strings valid and bounded, numbers finite or None.

    Raises:
        UsageError: the path is missing or a folder.
        ReportError: not a report, ``ncu_report`` missing, a file over the limits, or the
            parser crashed, ran out of memory or time (nothing of it is kept).
    """
    p = Path(path)
    name = visible(p.name, 200)
    remedy = "give the path of a pulled .ncu-rep/.ncu-repz or ncu's CSV"
    if p.is_dir():
        raise UsageError(f"{visible(p, 500)} is a folder, not a report file", remedy=remedy)
    if not p.exists():
        raise UsageError(f"{visible(p, 500)}: no such file", remedy=remedy)
    if not p.is_file():
        raise UsageError(f"{visible(p, 500)} is not a regular file", remedy=remedy)
    memory = max(64, int(max_memory_mib)) << 20
    cap = memory // 2
    raise_remedy = (f"if the file is honest, raise --max-memory (now {memory >> 20} MiB) "
                    "or export a CSV on the pod: ncu --import FILE --csv --page raw > FILE.csv")
    size = p.stat().st_size
    if size > cap:
        raise ReportError(f"{name} is {humanfmt.size(size)}, over the {humanfmt.size(cap)} "
                          "a report may have here", remedy=raise_remedy)
    answer = _run_child(p, name, memory, cap, timeout_s, raise_remedy)
    if not answer.get("ok"):
        _refusal(answer, name, cap, raise_remedy)
    kernels = _checked(answer.get("kernels"))
    if not kernels:
        raise ReportError(f"{name} holds no profiled kernel",
                          remedy="check that ncu profiled something (no 'No kernels were "
                                 "profiled' warning) and that the file is not truncated")
    return kernels


def _run_child(p: Path, name: str, memory: int, cap: int, timeout_s: float,
               raise_remedy: str) -> dict[str, Any]:
    """Run :mod:`gpuws.report_child` on ``p`` under its limits; its answer, or a
    ``ReportError`` saying how it ended."""
    import gpuws

    scratch = tempfile.mkdtemp(prefix="gpuws-report-")
    try:
        answer_path = os.path.join(scratch, "answer.json")
        err_path = os.path.join(scratch, "stderr")
        job = json.dumps({"path": str(p.resolve()), "scratch": scratch, "answer": answer_path,
                          "memory": memory, "cpu_s": max(1, math.ceil(timeout_s)),
                          "fsize": max(cap, MAX_ANSWER_BYTES), "decompressed_cap": cap})
        env = dict(os.environ)
        # The child imports this very copy of gpuws, whether installed or run from a tree.
        root = str(Path(gpuws.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(x for x in (root, env.get("PYTHONPATH")) if x)
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpuws.report_child", job], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True)
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill(proc)
                raise ReportError(
                    f"{name}: reading it took longer than {timeout_s:g} s, so it was stopped",
                    remedy="if the file is honest, raise --timeout or --max-memory, or export "
                           "a CSV on the pod: ncu --import FILE --csv --page raw > FILE.csv"
                ) from None
            except BaseException:
                _kill(proc)  # Ctrl+C: the child and anything it started end with us
                raise
        tail = _tail(err_path)
        if code != 0:
            raise ReportError(_crash_cause(name, code, tail, memory),
                              remedy=raise_remedy if _out_of_memory(code, tail)
                              else "check that the file was copied whole (its parser "
                                   "cannot read it), or export a CSV on the pod: ncu "
                                   "--import FILE --csv --page raw > FILE.csv")
        try:
            if os.path.getsize(answer_path) > MAX_ANSWER_BYTES:
                raise ReportError(f"{name}: its launches take more than "
                                  f"{humanfmt.size(MAX_ANSWER_BYTES)} as JSON",
                                  remedy=raise_remedy)
            with open(answer_path, encoding="ascii") as f:
                answer = json.load(f)
        except (OSError, ValueError) as exc:
            raise ReportError(f"{name}: its parser gave no answer ({type(exc).__name__})",
                              remedy="check that the file was copied whole") from None
        if not isinstance(answer, dict):
            raise ReportError(f"{name}: its parser gave no answer",
                              remedy="check that the file was copied whole")
        return answer
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _tail(path: str, limit: int = 16384) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - limit))
        return f.read().decode("utf-8", errors="replace")


def _out_of_memory(code: int, tail: str) -> bool:
    return ("bad_alloc" in tail or "MemoryError" in tail or "Cannot allocate memory" in tail
            or code == -signal.SIGXFSZ)


def _crash_cause(name: str, code: int, tail: str, memory: int) -> str:
    if code == -signal.SIGXCPU or (code == -signal.SIGKILL and "bad_alloc" not in tail):
        return f"{name}: reading it used up its CPU time, so it was stopped"
    if code == -signal.SIGXFSZ:
        return f"{name}: reading it wrote more than its file-size limit, so it was stopped"
    if _out_of_memory(code, tail):
        return (f"{name}: reading it needed more than {memory >> 20} MiB of memory, so it "
                "was stopped")
    if code < 0:
        try:
            sig = signal.Signals(-code).name
        except ValueError:
            sig = f"signal {-code}"
        return f"{name}: its parser (ncu_report) crashed on it ({sig})"
    return f"{name}: its parser (ncu_report) failed on it (exit {code})"


def _refusal(answer: dict[str, Any], name: str, cap: int, raise_remedy: str) -> NoReturn:
    """The child's refusal as the one error a person reads."""
    kind = answer.get("error")
    detail = visible(answer.get("detail") if isinstance(answer.get("detail"), str) else "",
                     300)
    not_report = (f"{name} is not an Nsight Compute report (.ncu-rep/.ncu-repz or ncu's "
                  "CSV)")
    remedy = "give the path of a pulled .ncu-rep/.ncu-repz or the CSV of ncu --csv"
    if kind == "not_report":
        raise ReportError(not_report, remedy=remedy)
    if kind == "empty":
        raise ReportError(f"{name} is empty", remedy="check that the file was copied whole")
    if kind == "no_module":
        raise ReportError(
            f"{name} is an Nsight Compute report and the ncu_report module is not "
            f"installed ({detail})",
            remedy=f"{install_hint()}, or export a CSV on the pod: "
                   "ncu --import FILE --csv --page raw > FILE.csv")
    if kind == "decompressed_too_large":
        raise ReportError(f"{name} decompresses to more than {humanfmt.size(cap)}, so "
                          "reading it was stopped", remedy=raise_remedy)
    if kind == "memory":
        raise ReportError(f"{name}: reading it needed more memory than its limit",
                          remedy=raise_remedy)
    raise ReportError(f"{name}: ncu_report could not read it ({detail})",
                      remedy="check that the file was copied whole")


def _checked(kernels: Any) -> list[dict[str, Any]]:
    """The child's launches, trusted no further than their shape: every string valid
    Unicode (invalid bytes replaced) and bounded, every number finite (else None), every
    list bounded. Anything of the wrong type is dropped."""
    if not isinstance(kernels, list):
        raise ReportError("the report's parser answered in a form gpuws does not know",
                          remedy="check that the file was copied whole")
    return [c for c in (_clean(k) for k in kernels[:MAX_ITEMS]) if isinstance(c, dict)]


def _clean(value: Any, depth: int = 0) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if abs(value) < 1 << 63 else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return valid_text(value[:MAX_STRING])
    if depth > 6:
        return None
    if isinstance(value, list):
        return [_clean(v, depth + 1) for v in value[:MAX_ITEMS]]
    if isinstance(value, dict):
        return {valid_text(str(k)[:200]): _clean(v, depth + 1)
                for k, v in list(value.items())[:MAX_ITEMS]}
    return None


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
    parts: list[Any] = [metrics]

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
    """The launches as indented JSON (non-finite numbers become null)."""
    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, str):
            return valid_text(value)
        if isinstance(value, dict):
            return {valid_text(str(k)): clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value
    # Valid UTF-8 always (lone surrogates replaced), and nothing a terminal obeys.
    return json_visible(json.dumps(clean(kernels), indent=2, ensure_ascii=False))
