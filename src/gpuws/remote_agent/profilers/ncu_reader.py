"""Canonical metrics of profiled kernels, from a ``.ncu-rep`` or from ncu's CSV.

The report is read through NVIDIA's ``ncu_report`` module, which ships with every ncu
(``<ncu dir>/extras/python``) and as the ``ncu-report`` wheel on PyPI; the CSV of
``ncu --csv --page raw`` (one row per launch, a units row under the header) or
``--page details`` (one row per section metric or rule result) is the fallback. All
three end in the same dict per profiled launch::

    {"kernel", "launch", "block", "grid", "source",
     "metrics": {CANONICAL key: float | None},
     "stalls": [{"reason", "pct"}],            # top 5, protocol.Stall
     "rules": [{"kernel", "rule", "kind", "message",
                "est_speedup_pct", "speedup_type"}]}   # protocol.Rule

Values are normalised to ns, bytes, bytes/block and percent whatever units ncu printed
(``us``/``ms``, ``Kbyte``/``Gbyte``, thousands separators, a locale with ``.`` for
thousands and ``,`` for decimals, ``n/a``). A metric this arch or version does not
have is None. :func:`kernel_metrics_event` and :func:`rule_findings_event` shape the
results as the protocol's events.

Standard library only (``ncu_report`` is imported lazily): this runs on the pod's
python3 (>= 3.8) and, for ``gpuws report``, on the laptop.
"""

from __future__ import annotations

import csv
import glob
import importlib
import io
import math
import os
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "CANONICAL",
    "canonical_metrics",
    "clean_rule_message",
    "detect_decimal",
    "kernel_metrics_event",
    "load_ncu_report_module",
    "parse_number",
    "read_csv",
    "read_details_csv",
    "read_ncu_rep",
    "read_raw_csv",
    "rule_findings_event",
    "scale_value",
    "top_stalls",
]

#: Canonical metric keys, in display order.
CANONICAL = (
    "duration_ns",
    "sm_throughput_pct",
    "memory_throughput_pct",
    "dram_throughput_pct",
    "achieved_occupancy_pct",
    "theoretical_occupancy_pct",
    "registers_per_thread",
    "shared_mem_per_block",
    "l1_hit_pct",
    "l2_hit_pct",
    "tensor_pipe_active_pct",
    "flops",
    "dram_bytes",
    "arithmetic_intensity",
    "sm_count",
    "waves_per_sm",
)

# Raw metric names for each canonical key, first present wins. The same names serve the
# raw CSV page and the report (its metric names are those of the raw page).
_RAW_NAMES: dict[str, tuple[str, ...]] = {
    "duration_ns": ("gpu__time_duration.sum", "gpu__time_duration.avg"),
    "sm_throughput_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
    "memory_throughput_pct": ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",),
    "dram_throughput_pct": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                            "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    "achieved_occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "theoretical_occupancy_pct": ("sm__maximum_warps_per_active_cycle_pct",),
    "registers_per_thread": ("launch__registers_per_thread",),
    "l1_hit_pct": ("l1tex__t_sector_hit_rate.pct",),
    "l2_hit_pct": ("lts__t_sector_hit_rate.pct",),
    # The SMs the launch could use (LaunchStats), and how many full waves of blocks its
    # grid makes on them: what tells a grid too small to fill the GPU.
    "sm_count": ("launch__sm_count", "device__attribute_multiprocessor_count"),
    "waves_per_sm": ("launch__waves_per_multiprocessor",),
    "tensor_pipe_active_pct": (
        "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_active",
    ),
}
_SMEM_TOTAL = "launch__shared_mem_per_block"
_SMEM_PARTS = ("launch__shared_mem_per_block_static", "launch__shared_mem_per_block_dynamic",
               "launch__shared_mem_per_block_driver")
_DRAM_BYTES = "dram__bytes.sum"
_DRAM_RW = ("dram__bytes_read.sum", "dram__bytes_write.sum")
_DRAM_RATE = "dram__bytes.sum.per_second"
_CYCLES = "smsp__cycles_elapsed.avg"
#: FLOPs per thread instruction (a fused multiply-add is two).
_FLOP_OPS = {"fadd": 1, "fmul": 1, "ffma": 2, "dadd": 1, "dmul": 1, "dfma": 2,
             "hadd": 1, "hmul": 1, "hfma": 2}
_STALL = re.compile(r"^smsp__average_warps_issue_stalled_(?P<reason>\w+?)_per_issue_active\.ratio$")
_STALL_TOTAL = "smsp__average_warp_latency_per_inst_issued.ratio"
# Tensor-core operation counts are already FLOPs (2 per multiply-accumulate). The
# ``src_<type>`` family sums all instructions of a source type; the ``op_<inst>`` family
# splits the same work by instruction, so only one family is counted. Integer types are
# not floating-point operations.
_TENSOR_SRC = re.compile(r"^sm__ops_path_tensor_src_(?!int)\w+\.sum$")
_TENSOR_OP = re.compile(r"^sm__ops_path_tensor_op_\w+\.sum$")

_FIXED_COLUMNS = {"ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context",
                  "Stream", "Block Size", "Grid Size", "Device", "CC", "Function Name",
                  "Demangled Name"}

# Units: a scale to the base unit, by the numerator of ``unit[/denominator]``.
_TIME = {"ns": 1.0, "nsecond": 1.0, "nsec": 1.0, "us": 1e3, "usecond": 1e3, "usec": 1e3,
         "µs": 1e3, "ms": 1e6, "msecond": 1e6, "msec": 1e6, "s": 1e9, "second": 1e9,
         "sec": 1e9}
_BYTES = {"byte": 1.0, "bytes": 1.0, "b": 1.0, "kbyte": 1e3, "kb": 1e3, "mbyte": 1e6,
          "mb": 1e6, "gbyte": 1e9, "gb": 1e9, "tbyte": 1e12, "tb": 1e12, "pbyte": 1e15,
          "kib": 1024.0, "mib": 1024.0 ** 2, "gib": 1024.0 ** 3, "tib": 1024.0 ** 4}
_HZ = {"hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9, "thz": 1e12}
_SI = {"K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_COUNTS = ("cycle", "inst", "sector", "warp", "request", "thread", "block", "register",
           "wavefront", "pass", "cluster", "branches", "SM")

_EMPTY = {"", "n/a", "na", "no data", "-", "--", "nan", "inf", "-inf", "none", "null"}


# ----------------------------------------------------------------------------- numbers
def detect_decimal(values: Iterable[str]) -> str:
    """Which character is the decimal separator in a file's numbers: ``.`` or ``,``.

    ncu groups thousands (``3,198,785,285.09``); a locale may swap the two characters
    (``3.198.785.285,09``). The decision is made once per file from the values that can
    only be read one way: both separators in one value, a separator repeated, or one
    followed by other than three digits (``66.37``). With no evidence, ``.``.
    """
    dot = comma = 0
    for raw in values:
        v = raw.strip()
        if not v or not (v[0].isdigit() or v[0] == "-"):
            continue
        if re.fullmatch(r"-?\d{1,3}(,\d{3})+\.\d+", v) or re.fullmatch(r"-?\d{1,3}(,\d{3}){2,}", v):
            dot += 1
        elif re.fullmatch(r"-?\d{1,3}(\.\d{3})+,\d+", v) or re.fullmatch(r"-?\d{1,3}(\.\d{3}){2,}",
                                                                          v):
            comma += 1
        elif re.fullmatch(r"-?\d+\.(\d{1,2}|\d{4,})", v):
            dot += 1
        elif re.fullmatch(r"-?\d+,(\d{1,2}|\d{4,})", v):
            comma += 1
    return "," if comma > dot else "."


def parse_number(text: str | None, decimal: str = ".") -> float | None:
    """A number as ncu prints it, or None (``n/a``, ``no data``, not a number).

    Args:
        text: e.g. ``"3,198,785,285.09"``, ``"246,528"``, ``"66.37"``, ``"n/a"``.
        decimal: the file's decimal separator (:func:`detect_decimal`).
    """
    if text is None:
        return None
    s = text.strip().strip('"').strip()
    if s.endswith("%"):
        s = s[:-1].strip()
    if s.lower() in _EMPTY:
        return None
    for sep in (" ", "\u00a0", "\u202f", "'"):
        s = s.replace(sep, "")
    if decimal == ",":
        s = s.replace(".", "").replace(",", ".")
    else:
        s = s.replace(",", "")
    try:
        value = float(s)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def scale_value(value: float | None, unit: str | None) -> tuple[float | None, str]:
    """A value in ncu's printed unit, rescaled to the base unit.

    Time becomes ns, sizes bytes (``Kbyte`` = 1000 bytes as in ncu; ``KiB`` = 1024),
    frequencies Hz and SI-prefixed counts (``Kinst``) plain counts; the denominator of
    a rate (``Gbyte/s``, ``Kbyte/block``) is kept.

    Returns:
        ``(value, base_unit)``; an unknown unit is left as it is.
    """
    u = (unit or "").strip()
    num, sep, den = u.partition("/")
    factor, base = 1.0, num
    low = num.lower()
    if num in _TIME:
        factor, base = _TIME[num], "ns"
    elif low in _BYTES:
        factor, base = _BYTES[low], "byte"
    elif low in _HZ:
        factor, base = _HZ[low], "hz"
    elif len(num) > 1 and num[0] in _SI and num[1:] in _COUNTS:
        factor, base = _SI[num[0]], num[1:]
    out = base + sep + den
    if value is None:
        return None, out
    return value * factor, out


# ----------------------------------------------------------------------------- canonical
def _first(get: Callable[[str], float | None], names: Iterable[str]) -> float | None:
    for name in names:
        v = get(name)
        if v is not None:
            return v
    return None


def _flops(get: Callable[[str], float | None], names: Iterable[str]) -> float | None:
    """FLOPs from SASS thread-instruction counters and tensor-op counts, when collected."""
    total = 0.0
    found = False
    cycles = get(_CYCLES)
    if cycles is None:
        # Some sections collect only the clock rate: cycles = rate x duration.
        rate_hz, duration = get(_CYCLES + ".per_second"), get("gpu__time_duration.sum")
        if rate_hz is not None and duration is not None:
            cycles = rate_hz * duration * 1e-9
    for op, weight in _FLOP_OPS.items():
        count = _first(get, (f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum",
                             f"sm__sass_thread_inst_executed_op_{op}_pred_on.sum"))
        if count is None and cycles is not None:
            # The roofline sections collect only the rate; X.sum.per_cycle_elapsed is
            # X.sum divided by smsp__cycles_elapsed.avg.
            rate = get(f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum.per_cycle_elapsed"
                       )
            count = rate * cycles if rate is not None else None
        if count is not None:
            total += weight * count
            found = True
    listed = list(names)
    for family in (_TENSOR_SRC, _TENSOR_OP):
        tensor = [n for n in listed if family.match(n)
                  and not re.search(r"_src_int|_(bmma|bgmma|imma|igmma)_", n)]
        values = [get(n) for n in tensor]
        present = [v for v in values if v is not None]
        if present:
            total += sum(present)
            found = True
            break
    return total if found else None


def top_stalls(get: Callable[[str], float | None], names: Iterable[str],
               limit: int = 5) -> list[dict[str, Any]]:
    """The warp stall reasons taking the largest share of cycles between two issues.

    Each reason's ``smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio``
    is divided by the average cycles between issues (what ncu's CPIStall rule quotes as
    "represents about N% of the total average"). ``selected`` is the issue cycle itself,
    not a stall, so it counts in the total but is not listed.
    """
    ratios: dict[str, float] = {}
    for name in names:
        m = _STALL.match(name)
        if m is None or m.group("reason").endswith("_not_issued"):
            continue
        v = get(name)
        if v is not None:
            ratios[m.group("reason")] = v
    if not ratios:
        return []
    total = get(_STALL_TOTAL) or sum(ratios.values())
    if total <= 0:
        return []
    ranked = sorted(((round(100.0 * v / total, 2), r) for r, v in ratios.items()
                     if r != "selected" and v > 0), key=lambda t: (-t[0], t[1]))
    return [{"reason": r, "pct": pct} for pct, r in ranked[:limit]]


def canonical_metrics(get: Callable[[str], float | None], names: Iterable[str]
                      ) -> dict[str, float | None]:
    """The canonical metrics from raw metric values already in base units.

    Args:
        get: a metric's value by raw name (ns, bytes, percent), None when absent.
        names: every raw metric name available (for the counter families).
    """
    listed = list(names)
    out: dict[str, float | None] = {key: None for key in CANONICAL}
    for key, raw in _RAW_NAMES.items():
        out[key] = _first(get, raw)
    smem = get(_SMEM_TOTAL)
    if smem is None:
        parts = [get(n) for n in _SMEM_PARTS]
        if any(p is not None for p in parts):
            smem = sum(p for p in parts if p is not None)
    out["shared_mem_per_block"] = smem
    dram = get(_DRAM_BYTES)
    if dram is None:
        rw = [get(n) for n in _DRAM_RW]
        if all(v is not None for v in rw):
            dram = sum(v for v in rw if v is not None)
    if dram is None:
        rate = get(_DRAM_RATE)
        if rate is not None and out["duration_ns"] is not None:
            dram = rate * out["duration_ns"] * 1e-9
    out["dram_bytes"] = dram
    out["flops"] = _flops(get, listed)
    out["arithmetic_intensity"] = _intensity(out["flops"], dram)
    return out


def _intensity(flops: float | None, dram: float | None) -> float | None:
    if flops is None or dram is None or dram <= 0:
        return None
    return flops / dram


_LINK = re.compile(r"@(?P<kind>url|section|sass|source):(?P<body>[^@]*)@")


def clean_rule_message(message: str) -> str:
    """A rule message with ncu's link markup made plain text.

    ``@url:Guide:https://…@`` becomes ``Guide (https://…)``; ``@section:Id:text@``,
    ``@sass:addr:text@`` and ``@source:file:line:text@`` become their text, as in the CSV.
    """
    def repl(m: re.Match[str]) -> str:
        kind, body = m.group("kind"), m.group("body")
        if kind == "url":
            text, _, link = body.partition(":")
            return f"{text} ({link})" if link else text
        fields = {"section": 1, "sass": 1, "source": 2}[kind]
        parts = body.split(":", fields)
        return parts[-1]
    return " ".join(_LINK.sub(repl, message).split())


def _rule(kernel: str, rule: str, kind: str, message: str, speedup: float | None,
          speedup_type: str | None) -> dict[str, Any]:
    return {"kernel": kernel, "rule": rule, "kind": kind,
            "message": clean_rule_message(message),
            "est_speedup_pct": speedup, "speedup_type": speedup_type or None}


def _launch(kernel: str, launch: int, block: str | None, grid: str | None, source: str,
            metrics: dict[str, float | None], stalls: list[dict[str, Any]],
            rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kernel": kernel, "launch": launch, "block": block, "grid": grid,
            "source": source, "metrics": metrics, "stalls": stalls, "rules": rules}


# ----------------------------------------------------------------------------- CSV
def _csv_rows(text: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of ncu's CSV, ignoring ``==PROF==`` lines and program output."""
    lines = text.splitlines()
    start = None
    for i, line in enumerate(lines):
        if line.startswith('"ID",') or line.startswith("ID,"):
            start = i
            break
    if start is None:
        return [], []
    # Lines ncu or the program interleave into stdout never start with a quote.
    body = [lines[start]] + [ln for ln in lines[start + 1:] if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(body))))
    return rows[0], rows[1:]


def _row_dict(header: list[str], row: list[str]) -> dict[str, str]:
    """Cells by column name. A short (truncated) row loses its last, possibly cut, cell."""
    if len(row) < len(header):
        row = row[:-1]
    return {header[i]: row[i] for i in range(min(len(header), len(row)))}


def read_csv(text: str) -> list[dict[str, Any]]:
    """Canonical metrics from ncu's CSV, raw or details page (told apart by the header)."""
    header, _ = _csv_rows(text)
    if "Metric Name" in header and "Metric Value" in header:
        return read_details_csv(text)
    return read_raw_csv(text)


def read_raw_csv(text: str) -> list[dict[str, Any]]:
    """Canonical metrics from ``ncu --csv --page raw`` (one row per launch).

    The row under the header holds the units (the first cell is empty); with
    ``--print-units auto`` they vary per metric (``us``, ``Gbyte``) and are normalised.
    """
    header, rows = _csv_rows(text)
    if not header:
        return []
    units: dict[str, str] = {}
    if rows and rows[0] and rows[0][0] == "":
        units = _row_dict(header, rows[0])
        rows = rows[1:]
    data = [_row_dict(header, r) for r in rows]
    data = [d for d in data if re.fullmatch(r"\d+", d.get("ID", "").strip())]
    decimal = detect_decimal(v for d in data for k, v in d.items() if k not in _FIXED_COLUMNS)
    metric_names = [h for h in header if h not in _FIXED_COLUMNS]
    out: list[dict[str, Any]] = []
    for d in data:
        values: dict[str, float | None] = {}
        for name in metric_names:
            if name in d:
                values[name] = scale_value(parse_number(d[name], decimal), units.get(name))[0]
        present = [n for n in metric_names if values.get(n) is not None]
        metrics = canonical_metrics(values.get, present)
        out.append(_launch(d.get("Kernel Name", ""), int(d["ID"]), d.get("Block Size") or None,
                           d.get("Grid Size") or None, "ncu_csv_raw", metrics,
                           top_stalls(values.get, present), []))
    return out


# Details page: metric label → canonical key; "Memory Throughput" is told apart by unit.
_DETAILS: dict[str, str] = {
    "Duration": "duration_ns",
    "Compute (SM) Throughput": "sm_throughput_pct",
    "Compute (SM) [%]": "sm_throughput_pct",
    "SM [%]": "sm_throughput_pct",
    "Memory [%]": "memory_throughput_pct",
    "DRAM Throughput": "dram_throughput_pct",
    "Achieved Occupancy": "achieved_occupancy_pct",
    "Theoretical Occupancy": "theoretical_occupancy_pct",
    "Registers Per Thread": "registers_per_thread",
    "L1/TEX Hit Rate": "l1_hit_pct",
    "L2 Hit Rate": "l2_hit_pct",
}
_DETAILS_SMEM = ("Static Shared Memory Per Block", "Dynamic Shared Memory Per Block",
                 "Driver Shared Memory Per Block")


def read_details_csv(text: str) -> list[dict[str, Any]]:
    """Canonical metrics and rule results from ``ncu --csv --page details``.

    The details page has no per-reason stall metrics and no instruction counters, so
    ``stalls`` is empty and ``flops`` None; DRAM bytes come from the Memory Workload
    Analysis throughput times the duration.
    """
    header, rows = _csv_rows(text)
    if not header:
        return []
    data = [_row_dict(header, r) for r in rows]
    data = [d for d in data if re.fullmatch(r"\d+", d.get("ID", "").strip())]
    decimal = detect_decimal(d.get("Metric Value", "") for d in data)
    launches: dict[str, dict[str, Any]] = {}
    dram_rate: dict[str, float] = {}
    smem: dict[str, list[float]] = {}
    for d in data:
        lid = d["ID"].strip()
        entry = launches.get(lid)
        if entry is None:
            entry = _launch(d.get("Kernel Name", ""), int(lid), d.get("Block Size") or None,
                            d.get("Grid Size") or None, "ncu_csv_details",
                            {key: None for key in CANONICAL}, [], [])
            launches[lid] = entry
        rule = (d.get("Rule Name") or "").strip()
        if rule:
            speedup = parse_number(d.get("Estimated Speedup"), decimal)
            entry["rules"].append(_rule(entry["kernel"], rule, (d.get("Rule Type") or "").strip(),
                                        d.get("Rule Description") or "", speedup,
                                        (d.get("Estimated Speedup Type") or "").strip().lower()))
            continue
        name = (d.get("Metric Name") or "").strip()
        value, unit = scale_value(parse_number(d.get("Metric Value"), decimal),
                                  d.get("Metric Unit"))
        if value is None:
            continue
        if name == "Memory Throughput":
            if unit == "%":
                entry["metrics"]["memory_throughput_pct"] = value
            elif unit == "byte/s":
                dram_rate[lid] = value
        elif name in _DETAILS_SMEM:
            smem.setdefault(lid, []).append(value)
        elif name in _DETAILS and entry["metrics"][_DETAILS[name]] is None:
            entry["metrics"][_DETAILS[name]] = value
    for lid, entry in launches.items():
        m = entry["metrics"]
        # Static + dynamic + driver rows make the total; a report cut between them
        # must say "unknown", not a smaller number.
        if len(smem.get(lid, ())) == len(_DETAILS_SMEM):
            m["shared_mem_per_block"] = sum(smem[lid])
        if lid in dram_rate and m["duration_ns"] is not None:
            m["dram_bytes"] = dram_rate[lid] * m["duration_ns"] * 1e-9
    return list(launches.values())


# ----------------------------------------------------------------------------- .ncu-rep
def _extras_dirs(ncu_path: str) -> list[str]:
    """Where an ncu install keeps ``ncu_report.py``."""
    real = os.path.realpath(ncu_path)
    dirs = [os.path.join(os.path.dirname(real), "extras", "python"),
            os.path.join(os.path.dirname(ncu_path), "extras", "python")]
    # /usr/local/cuda/bin/ncu is a wrapper script; the install is a sibling of bin/.
    root = os.path.dirname(os.path.dirname(real))
    dirs += sorted(glob.glob(os.path.join(root, "nsight-compute*", "extras", "python")),
                   reverse=True)
    return [d for d in dirs if os.path.isfile(os.path.join(d, "ncu_report.py"))]


def load_ncu_report_module(ncu_path: str | None = None) -> Any:
    """Import NVIDIA's ``ncu_report``: the given ncu's copy first, else an installed one.

    Args:
        ncu_path: the ncu executable whose ``extras/python`` should be used.

    Raises:
        ImportError: when no ``ncu_report`` can be imported.
    """
    if ncu_path:
        for d in _extras_dirs(ncu_path):
            if d not in sys.path:
                sys.path.insert(0, d)
            break
    return importlib.import_module("ncu_report")


def _call(obj: Any, method: str, *args: Any) -> Any:
    """``obj.method(*args)``, or None where this ncu_report version lacks it."""
    fn = getattr(obj, method, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except (TypeError, AttributeError, ValueError, RuntimeError, IndexError, KeyError):
        return None


def _wanted(name: str) -> bool:
    return (name.startswith(("gpu__time_duration", "sm__throughput.avg", "gpu__compute_memory",
                             "gpu__dram_throughput.avg", "dram__", "sm__warps_active.avg",
                             "sm__maximum_warps", "launch__",
                             "device__attribute_multiprocessor_count", "l1tex__t_sector_hit_rate",
                             "lts__t_sector_hit_rate", "sm__pipe_tensor", "sm__inst_executed_pipe",
                             "smsp__cycles_elapsed.avg", "smsp__average_warp"))
            or "sass_thread_inst_executed_op_" in name
            or name.startswith("sm__ops_path_tensor"))


def _metric_value(module: Any, metric: Any) -> float | None:
    if metric is None or _call(metric, "has_value") is False:
        return None
    kind = _call(metric, "kind")
    string_kind = getattr(getattr(module, "IMetric", None), "ValueKind_STRING", None)
    if kind is not None and string_kind is not None and kind == string_kind:
        return None
    value = _call(metric, "as_double")
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    unit = _call(metric, "unit")
    return scale_value(float(value), unit if isinstance(unit, str) else None)[0]


def _dims(get: Callable[[str], float | None], prefix: str) -> str | None:
    xyz = [get(f"launch__{prefix}_dim_{axis}") for axis in "xyz"]
    if any(v is None for v in xyz):
        return None
    return "({})".format(", ".join(str(int(v)) for v in xyz if v is not None))


def _report_rules(module: Any, action: Any, kernel: str) -> list[dict[str, Any]]:
    dicts = _call(action, "rule_results_as_dicts")
    if dicts is None:
        results = _call(action, "rule_results")
        if results is None:
            return []
        dicts = []
        for r in results:
            entry: dict[str, Any] = {
                "rule_identifier": _call(r, "rule_identifier") or _call(r, "name") or "",
                "rule_message": _call(r, "rule_message") or {},
            }
            if _call(r, "has_speedup_estimation"):
                entry["speedup_estimation"] = _call(r, "speedup_estimation")
            dicts.append(entry)
    kinds = {getattr(module, "MsgType_OPTIMIZATION", 2): "OPT",
             getattr(module, "MsgType_WARNING", 3): "WRN",
             getattr(module, "MsgType_ERR", 4): "ERR",
             getattr(module, "MsgType_OK", 1): "INF",
             getattr(module, "MsgType_NONE", 0): "INF"}
    speedups = {getattr(module, "SpeedupType_LOCAL", 1): "local",
                getattr(module, "SpeedupType_GLOBAL", 2): "global"}
    rules: list[dict[str, Any]] = []
    for d in dicts:
        msg = d.get("rule_message") or {}
        text = msg.get("message") if isinstance(msg, dict) else None
        if not text:
            continue  # a rule that passed says nothing
        est = d.get("speedup_estimation") or {}
        speedup = est.get("speedup") if isinstance(est, dict) else None
        speedup = float(speedup) if isinstance(speedup, (int, float)) else None
        rules.append(_rule(kernel, str(d.get("rule_identifier") or d.get("name") or ""),
                           kinds.get(msg.get("type"), "INF"), str(text), speedup,
                           speedups.get(est.get("type")) if isinstance(est, dict) else None))
    return rules


def read_ncu_rep(path: str, *, ncu_path: str | None = None, module: Any = None
                 ) -> list[dict[str, Any]]:
    """Canonical metrics and rule results from a ``.ncu-rep`` through ``ncu_report``.

    Args:
        path: the report file.
        ncu_path: the ncu that wrote it (its ``extras/python`` is used first).
        module: an already imported ``ncu_report`` (tests, or a caller that has one).

    Raises:
        ImportError: when ``ncu_report`` cannot be imported.
        FileNotFoundError: when the report does not exist.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    mod = module if module is not None else load_ncu_report_module(ncu_path)
    ctx = mod.load_report(path)
    out: list[dict[str, Any]] = []
    demangled = getattr(getattr(mod, "IAction", None), "NameBase_DEMANGLED", None)
    launch = 0
    for r in range(_call(ctx, "num_ranges") or 0):
        rng = ctx.range_by_idx(r)
        for a in range(_call(rng, "num_actions") or 0):
            action = rng.action_by_idx(a)
            kernel = None
            if demangled is not None:
                kernel = _call(action, "name", demangled)
            if not kernel:
                kernel = _call(action, "name") or ""
            names = [str(n) for n in (_call(action, "metric_names") or ()) if _wanted(str(n))]
            values: dict[str, float | None] = {
                n: _metric_value(mod, _call(action, "metric_by_name", n)) for n in names}
            present = [n for n in names if values.get(n) is not None]
            metrics = canonical_metrics(values.get, present)
            out.append(_launch(str(kernel), launch, _dims(values.get, "block"),
                               _dims(values.get, "grid"), "ncu_report", metrics,
                               top_stalls(values.get, present),
                               _report_rules(mod, action, str(kernel))))
            launch += 1
    return out


# ----------------------------------------------------------------------------- events
def kernel_metrics_event(launch: dict[str, Any]) -> dict[str, Any]:
    """The ``protocol.KernelMetrics`` fields of one launch (envelope not set)."""
    return {
        "type": "kernel_metrics",
        "kernel": launch["kernel"],
        "launch": int(launch["launch"]),
        "metrics": dict(launch["metrics"]),
        "stalls": [dict(s) for s in launch["stalls"]],
        "source": launch.get("source", "ncu_report"),
        "block": launch.get("block"),
        "grid": launch.get("grid"),
    }


def rule_findings_event(launches: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One ``protocol.RuleFindings`` event holding the rules of every launch."""
    return {"type": "rule_findings",
            "rules": [dict(r) for launch in launches for r in launch["rules"]]}
