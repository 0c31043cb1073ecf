"""Canonical metrics from ncu's CSV pages and from a report through ``ncu_report``."""

from __future__ import annotations

import csv
import io
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuws import protocol
from gpuws.remote_agent.profilers import ncu_reader
from gpuws.remote_agent.profilers.ncu_reader import (
    CANONICAL,
    clean_rule_message,
    detect_decimal,
    kernel_metrics_event,
    parse_number,
    read_csv,
    read_details_csv,
    read_ncu_rep,
    read_raw_csv,
    rule_findings_event,
    scale_value,
)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "ncu-2025.3.1-h200"
GEMM = "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT"


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


def one(launches: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(launches) == 1
    return launches[0]


# ----------------------------------------------------------------------------- CSV edits
def split_csv(raw: str) -> tuple[list[str], list[list[str]], list[str]]:
    """Lines before the header, the CSV rows, and lines after them (program output)."""
    lines = raw.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    end = start
    while end < len(lines) and lines[end].startswith('"'):
        end += 1
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:end]))))
    return lines[:start], rows, lines[end:]


def join_csv(pre: list[str], rows: list[list[str]], post: list[str]) -> str:
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    return "\n".join([*pre, out.getvalue().rstrip("\n"), *post]) + "\n"


def edit_raw(raw: str, edit: Callable[[str, str, str], tuple[str, str]]) -> str:
    """Apply ``edit(name, unit, value) -> (unit, value)`` to every metric cell of a raw page."""
    pre, rows, post = split_csv(raw)
    header, units = rows[0], rows[1]
    for row in rows[2:]:
        for i, name in enumerate(header[11:], start=11):
            units[i], row[i] = edit(name, units[i], row[i])
    return join_csv(pre, rows, post)


def swap_separators(value: str) -> str:
    """``3,198,785,285.09`` → ``3.198.785.285,09`` (a locale with the separators swapped)."""
    if parse_number(value) is None or value.startswith("("):
        return value
    return value.replace(",", "\0").replace(".", ",").replace("\0", ".")


# ----------------------------------------------------------------------------- raw page
def test_saxpy_raw_page() -> None:
    k = one(read_raw_csv(text("saxpy_raw.csv")))
    assert (k["kernel"], k["launch"], k["block"], k["grid"], k["source"]) == (
        "saxpy", 0, "(256, 1, 1)", "(262144, 1, 1)", "ncu_csv_raw")
    m = k["metrics"]
    assert list(m) == list(CANONICAL)
    assert m["duration_ns"] == 246528.0
    assert m["sm_throughput_pct"] == 43.59
    assert m["memory_throughput_pct"] == 66.34 and m["dram_throughput_pct"] == 66.34
    assert m["achieved_occupancy_pct"] == 74.29 and m["theoretical_occupancy_pct"] == 100.0
    assert m["registers_per_thread"] == 16.0 and m["shared_mem_per_block"] == 1024.0
    assert m["l1_hit_pct"] == 32.89 and m["l2_hit_pct"] == 33.64
    assert m["tensor_pipe_active_pct"] == 0.0
    # No instruction counters in these sections: FLOPs unknown, not zero.
    assert m["flops"] is None and m["arithmetic_intensity"] is None
    # DRAM bytes from the rate times the duration: ~3 x 4 B x 2^26 moved.
    assert m["dram_bytes"] == pytest.approx(3_192_232_606_438.21 * 246_528e-9)
    assert m["dram_bytes"] == pytest.approx(3 * 4 * 2**26, rel=0.03)
    # Stalls: share of the 55.28 cycles between two issues (ncu's CPIStall arithmetic).
    assert k["stalls"][0] == {"reason": "long_scoreboard", "pct": round(100 * 44.93 / 55.28, 2)}
    assert [s["reason"] for s in k["stalls"]] == [
        "long_scoreboard", "short_scoreboard", "wait", "drain", "mio_throttle"]
    assert k["rules"] == []


def test_saxpy_agrees_with_what_a_person_saw() -> None:
    # saxpy_human.txt is another run of the same kernel: the same numbers within run noise.
    m = one(read_csv(text("saxpy_raw.csv")))["metrics"]
    human = {"duration_ns": 246_400.0, "sm_throughput_pct": 43.95,
             "memory_throughput_pct": 66.37, "dram_throughput_pct": 66.37,
             "achieved_occupancy_pct": 73.38, "l1_hit_pct": 32.90, "l2_hit_pct": 33.65}
    for key, value in human.items():
        assert m[key] == pytest.approx(value, rel=0.02), key
    assert m["theoretical_occupancy_pct"] == 100.0  # "Theoretical Occupancy  %  100"
    assert m["registers_per_thread"] == 16.0  # "Registers Per Thread  16"
    assert m["shared_mem_per_block"] == 1024.0  # "Driver Shared Memory Per Block 1.02 Kbyte"


def test_gemm_raw_page_flops_from_tensor_ops() -> None:
    k = one(read_raw_csv(text("gemm_raw.csv")))
    m = k["metrics"]
    assert k["kernel"] == GEMM and k["grid"] == "(2, 66, 1)" and k["block"] == "(384, 1, 1)"
    assert m["duration_ns"] == pytest.approx(1_639_104.0)  # printed as 1.639104 ms
    assert m["registers_per_thread"] == 168.0
    assert m["shared_mem_per_block"] == pytest.approx(189_660.0)  # 189.66 Kbyte/block
    assert m["theoretical_occupancy_pct"] == 18.75
    assert m["tensor_pipe_active_pct"] == 97.040636
    # bf16 8192^3 matmul in 320-row tiles: 26 x 320 = 8320 rows computed, 2 FLOPs per MAC.
    assert m["flops"] == 2 * 8320 * 8192 * 8192
    assert m["dram_bytes"] == pytest.approx(1.250017e9 + 130.354688e6)
    assert m["arithmetic_intensity"] == pytest.approx(m["flops"] / m["dram_bytes"])
    assert k["stalls"][0] == {"reason": "gmma", "pct": round(100 * 4.840961 / 14.504692, 2)}
    assert "selected" not in [s["reason"] for s in k["stalls"]]


# ----------------------------------------------------------------------------- details page
def test_saxpy_details_page() -> None:
    k = one(read_details_csv(text("saxpy_details.csv")))
    m = k["metrics"]
    assert k["source"] == "ncu_csv_details" and k["kernel"] == "saxpy"
    assert m["duration_ns"] == 246_752.0
    assert m["memory_throughput_pct"] == 66.29  # the "%" one, not the byte/s one
    assert m["sm_throughput_pct"] == 43.18 and m["dram_throughput_pct"] == 66.29
    assert m["achieved_occupancy_pct"] == 74.38 and m["theoretical_occupancy_pct"] == 100.0
    assert m["l1_hit_pct"] == 32.90 and m["l2_hit_pct"] == 33.63
    assert m["shared_mem_per_block"] == 1024.0  # static 0 + dynamic 0 + driver 1,024
    assert m["dram_bytes"] == pytest.approx(3_189_160_420_178.96 * 246_752e-9)
    assert m["flops"] is None and m["tensor_pipe_active_pct"] is None and k["stalls"] == []
    rules = k["rules"]
    assert [(r["rule"], r["kind"]) for r in rules] == [
        ("SOLBottleneck", "OPT"), ("HighPipeUtilization", "OPT"), ("CPIStall", "WRN"),
        ("CPIStall", "OPT"), ("CPIStall", "INF"), ("AchievedOccupancy", "OPT")]
    assert (rules[1]["est_speedup_pct"], rules[1]["speedup_type"]) == (93.53, "local")
    assert (rules[0]["est_speedup_pct"], rules[0]["speedup_type"]) == (None, None)
    assert rules[3]["message"].startswith("On average, each warp of this workload spends 44.9")
    assert all(r["kernel"] == "saxpy" for r in rules)


def test_gemm_details_page() -> None:
    k = one(read_csv(text("gemm_details.csv")))
    m = k["metrics"]
    assert k["source"] == "ncu_csv_details"
    assert m["duration_ns"] == pytest.approx(1_640_000.0)  # "1.64 ms"
    assert m["theoretical_occupancy_pct"] == 18.75 and m["registers_per_thread"] == 168.0
    assert m["shared_mem_per_block"] == pytest.approx(188_640.0 + 1_020.0)  # Kbyte/block, 2 dp
    assert m["dram_bytes"] == pytest.approx(842.15e9 * 1.64e-3)
    by_rule = {r["rule"]: r for r in k["rules"]}
    assert by_rule["TheoreticalOccupancy"]["est_speedup_pct"] == 5.391
    assert by_rule["TheoreticalOccupancy"]["speedup_type"] == "global"
    assert by_rule["MemoryL2Compression"]["est_speedup_pct"] == 15.59


# ----------------------------------------------------------------------------- variants
def test_time_units_are_normalised() -> None:
    def to_us(name: str, unit: str, value: str) -> tuple[str, str]:
        if unit == "ns":
            return "us", f"{parse_number(value) / 1000:.3f}"  # type: ignore[operator]
        return unit, value

    def to_ms(name: str, unit: str, value: str) -> tuple[str, str]:
        if unit == "ns":
            return "msecond", f"{parse_number(value) / 1e6:.6f}"  # type: ignore[operator]
        return unit, value

    for edit in (to_us, to_ms):
        variant = edit_raw(text("saxpy_raw.csv"), edit)
        assert '"us"' in variant or '"msecond"' in variant
        assert one(read_raw_csv(variant))["metrics"]["duration_ns"] == pytest.approx(246_528.0)


def test_byte_units_are_normalised() -> None:
    def to_kbyte(name: str, unit: str, value: str) -> tuple[str, str]:
        if unit == "byte/block":
            return "Kbyte/block", f"{parse_number(value) / 1000:.3f}"  # type: ignore[operator]
        if unit == "byte/s":
            return "Tbyte/s", f"{parse_number(value) / 1e12:.9f}"  # type: ignore[operator]
        return unit, value

    m = one(read_raw_csv(edit_raw(text("saxpy_raw.csv"), to_kbyte)))["metrics"]
    assert m["shared_mem_per_block"] == pytest.approx(1024.0)
    assert m["dram_bytes"] == pytest.approx(3_192_232_606_438.21 * 246_528e-9)


def test_separators_removed_or_swapped_read_the_same() -> None:
    for name, reader in (("saxpy_raw.csv", read_raw_csv), ("saxpy_details.csv", read_csv),
                         ("gemm_raw.csv", read_raw_csv)):
        base = reader(text(name))
        pre, rows, post = split_csv(text(name))
        plain = [[c.replace(",", "") if parse_number(c) is not None else c for c in r]
                 for r in rows]
        assert reader(join_csv(pre, plain, post)) == base, name
        swapped = [[swap_separators(c) for c in r] for r in rows]
        assert "3.198.785.285,09" in join_csv(pre, swapped, post) or name != "saxpy_details.csv"
        assert reader(join_csv(pre, swapped, post)) == base, name


def test_ambiguous_values_follow_the_file() -> None:
    # "1,024" alone could be either; the file's other values decide.
    assert detect_decimal(["1,024", "66.37", "246,528"]) == "."
    assert detect_decimal(["1,024", "66,37", "3.198.785,09"]) == ","
    assert detect_decimal(["1,024"]) == "."
    assert parse_number("1,024", ",") == 1.024 and parse_number("1,024") == 1024.0
    assert parse_number("3.198.785.285,09", ",") == 3_198_785_285.09
    for empty in ("n/a", "N/A", "", "no data", "-", "(256, 1, 1)", "PolicySpread", None):
        assert parse_number(empty) is None


def test_columns_reordered() -> None:
    pre, rows, post = split_csv(text("gemm_raw.csv"))
    order = list(range(11)) + list(range(len(rows[0]) - 1, 10, -1))
    reordered = [[r[i] for i in order] for r in rows]
    assert read_raw_csv(join_csv(pre, reordered, post)) == read_raw_csv(text("gemm_raw.csv"))


def test_long_templated_names_with_commas_and_quotes() -> None:
    name = ('void cutlass::Kernel<cutlass::gemm::Gemm<float, 128, 64, "x,y">, '
            'std::pair<int, float>>(Params<3, (int)4> const&, float*, int)')
    for fixture, reader in (("saxpy_raw.csv", read_raw_csv),
                            ("saxpy_details.csv", read_details_csv)):
        pre, rows, post = split_csv(text(fixture))
        for row in rows[1:]:
            if row[0].isdigit():
                row[4] = name
        k = one(reader(join_csv(pre, rows, post)))
        assert k["kernel"] == name
        assert all(r["kernel"] == name for r in k["rules"])
        assert k["metrics"]["registers_per_thread"] == 16.0


def test_interleaved_program_output_and_na() -> None:
    pre, rows, _post = split_csv(text("saxpy_raw.csv"))
    col = rows[0].index("l1tex__t_sector_hit_rate.pct")
    rows[2][col] = "n/a"
    noisy = join_csv(pre, rows, ["==PROF== Disconnected from process 454", "done", "1. x, y"])
    m = one(read_raw_csv(noisy))["metrics"]
    assert m["l1_hit_pct"] is None and m["l2_hit_pct"] == 33.64


def test_truncated_and_empty_files() -> None:
    raw = text("gemm_raw.csv")
    row = raw.index('\n"0",')  # the data row: cut it in the middle
    cut = raw[: row + (len(raw) - row) // 2]
    k = one(read_raw_csv(cut))
    assert k["kernel"] == GEMM
    _pre, rows, _ = split_csv(raw)
    kept = len(next(csv.reader(io.StringIO(cut.splitlines()[-1])))) - 1
    # Columns the cut kept are read; the ones it lost are None, never garbage.
    names = rows[0]
    assert names.index("dram__bytes_read.sum") < kept
    assert names.index("sm__warps_active.avg.pct_of_peak_sustained_active") > kept
    assert k["metrics"]["achieved_occupancy_pct"] is None
    details = text("saxpy_details.csv")
    partial = one(read_details_csv(details[: len(details) // 2]))
    assert partial["metrics"]["duration_ns"] == 246_752.0
    assert partial["metrics"]["theoretical_occupancy_pct"] is None
    for empty in ("", "\n", "==PROF== Connected to process 1 (x)\n", '"ID","Kernel Name"\n'):
        assert read_csv(empty) == []


# ----------------------------------------------------------------------------- units, rules
def test_scale_value() -> None:
    assert scale_value(1.5, "ms") == (1_500_000.0, "ns")
    assert scale_value(2.0, "usecond") == (2000.0, "ns")
    assert scale_value(1.02, "Kbyte/block") == (1020.0, "byte/block")
    assert scale_value(3.0, "Gbyte/s") == (3e9, "byte/s")
    assert scale_value(1.0, "KiB") == (1024.0, "byte")
    assert scale_value(1.5, "Ghz") == (1.5e9, "hz")
    assert scale_value(2.0, "Mcycle") == (2e6, "cycle")
    assert scale_value(66.0, "%") == (66.0, "%")
    assert scale_value(None, "ms") == (None, "ns")


def test_clean_rule_message() -> None:
    raw = ("Check the @section:SourceCounters:Warp Stall Sampling (All Samples)@ table. The "
           "@url:Profiling Guide:https://docs.nvidia.com/nsight-compute/ProfilingGuide/"
           "index.html#metrics-reference@ provides more. See @sass:0x1f0:this LDG@ and "
           "@source:/src/k.cu:42:line 42@.")
    assert clean_rule_message(raw) == (
        "Check the Warp Stall Sampling (All Samples) table. The Profiling Guide "
        "(https://docs.nvidia.com/nsight-compute/ProfilingGuide/index.html#metrics-reference) "
        "provides more. See this LDG and line 42.")


# ----------------------------------------------------------------------------- ncu_report
class FakeMetric:
    """The part of ncu_report.IMetric the reader uses."""

    def __init__(self, value: float | str, unit: str) -> None:
        self._value, self._unit = value, unit

    def has_value(self) -> bool:
        return True

    def kind(self) -> int:
        return 2 if isinstance(self._value, str) else 4

    def as_double(self) -> float:
        return 0.0 if isinstance(self._value, str) else float(self._value)

    def unit(self) -> str:
        return self._unit


class FakeAction:
    NameBase_DEMANGLED = 1

    def __init__(self, name: str, metrics: dict[str, FakeMetric], rules: Any) -> None:
        self._name, self._metrics, self._rules = name, metrics, rules

    def name(self, base: int = 0) -> str:
        return self._name if base == 1 else self._name.split("(")[0]

    def metric_names(self) -> tuple[str, ...]:
        return tuple(self._metrics)

    def metric_by_name(self, name: str) -> FakeMetric | None:
        return self._metrics.get(name)


class FakeRange:
    def __init__(self, actions: list[Any]) -> None:
        self._actions = actions

    def num_actions(self) -> int:
        return len(self._actions)

    def action_by_idx(self, i: int) -> Any:
        return self._actions[i]


def fake_module(actions: list[Any]) -> types.SimpleNamespace:
    """An ``ncu_report`` stand-in with the 2025.3 API shape and the real enum values."""
    ctx = types.SimpleNamespace(num_ranges=lambda: 1, range_by_idx=lambda i: FakeRange(actions))
    return types.SimpleNamespace(
        load_report=lambda path: ctx,
        IAction=FakeAction, IMetric=types.SimpleNamespace(ValueKind_STRING=2),
        MsgType_NONE=0, MsgType_OK=1, MsgType_OPTIMIZATION=2, MsgType_WARNING=3, MsgType_ERR=4,
        SpeedupType_LOCAL=1, SpeedupType_GLOBAL=2)


def metrics_from_raw(name: str) -> dict[str, FakeMetric]:
    """The report's metrics as the raw CSV page printed them (same names, units, values)."""
    _pre, rows, _ = split_csv(text(name))
    header, units, values = rows[0], rows[1], rows[2]
    out: dict[str, FakeMetric] = {}
    for i in range(11, len(header)):
        number = parse_number(values[i])
        out[header[i]] = FakeMetric(values[i] if number is None else number, units[i])
    return out


RULE_DICTS = [
    {"rule_identifier": "CPIStall", "name": "CPI Stall", "section_identifier": "WarpStateStats",
     "rule_message": {"title": "Long Scoreboard Stalls", "type": 2,
                      "message": "Stalls: see the @section:SourceCounters:Source Counters@."},
     "speedup_estimation": {"type": 2, "speedup": 73.02}},
    {"rule_identifier": "SOLFPRoofline", "rule_message": {"title": "", "type": 1,
                                                          "message": "Roofline."}},
    {"rule_identifier": "Passed", "rule_message": {"title": "", "type": 0, "message": ""}},
]


class DictRules(FakeAction):
    def rule_results_as_dicts(self) -> list[dict[str, Any]]:
        return self._rules  # type: ignore[no-any-return]


class ObjectRules(FakeAction):
    """An older ncu_report: rule results as objects only."""

    def rule_results(self) -> list[Any]:
        out = []
        for d in self._rules:
            est = d.get("speedup_estimation")
            out.append(types.SimpleNamespace(
                rule_identifier=lambda d=d: d["rule_identifier"],
                rule_message=lambda d=d: d["rule_message"],
                has_speedup_estimation=lambda est=est: est is not None,
                speedup_estimation=lambda est=est: est))
        return out


def test_report_reader_matches_the_csv_reader(tmp_path: Path) -> None:
    rep = tmp_path / "gemm.ncu-rep"
    rep.write_bytes(b"NVIDIA Nsight Compute report stand-in")
    gemm = DictRules(f"{GEMM}(Params)", metrics_from_raw("gemm_raw.csv"), RULE_DICTS)
    saxpy = ObjectRules("saxpy(int, float, const float *, float *)",
                        metrics_from_raw("saxpy_raw.csv"), RULE_DICTS)
    launches = read_ncu_rep(str(rep), module=fake_module([gemm, saxpy]))
    assert [k["launch"] for k in launches] == [0, 1]
    assert launches[0]["kernel"] == f"{GEMM}(Params)"  # the demangled name
    assert launches[0]["block"] == "(384, 1, 1)" and launches[0]["grid"] == "(2, 66, 1)"
    assert launches[0]["source"] == "ncu_report"
    csv_gemm = one(read_raw_csv(text("gemm_raw.csv")))
    assert launches[0]["metrics"] == csv_gemm["metrics"]
    assert launches[0]["stalls"] == csv_gemm["stalls"]
    assert launches[1]["metrics"] == one(read_raw_csv(text("saxpy_raw.csv")))["metrics"]
    for k in launches:  # both API generations give the same rules; a silent rule is dropped
        assert k["rules"] == [
            {"kernel": k["kernel"], "rule": "CPIStall", "kind": "OPT",
             "message": "Stalls: see the Source Counters.", "est_speedup_pct": 73.02,
             "speedup_type": "global"},
            {"kernel": k["kernel"], "rule": "SOLFPRoofline", "kind": "INF",
             "message": "Roofline.", "est_speedup_pct": None, "speedup_type": None}]


def test_report_reader_without_rule_api_or_metrics(tmp_path: Path) -> None:
    rep = tmp_path / "r.ncu-rep"
    rep.write_bytes(b"x")
    bare = FakeAction("k()", {"launch__block_dim_x": FakeMetric(1, "")}, None)
    (k,) = read_ncu_rep(str(rep), module=fake_module([bare]))
    assert k["rules"] == [] and k["stalls"] == [] and k["block"] is None
    assert all(v is None for v in k["metrics"].values())
    with pytest.raises(FileNotFoundError):
        read_ncu_rep(str(tmp_path / "missing.ncu-rep"), module=fake_module([]))


def test_ncu_report_module_found_next_to_ncu(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    install = tmp_path / "nsight-compute" / "2025.3.1"
    (install / "extras" / "python").mkdir(parents=True)
    (install / "extras" / "python" / "ncu_report.py").write_text("WHERE = 'extras'\n")
    (install / "ncu").write_text("#!/bin/sh\n")
    monkeypatch.delitem(sys.modules, "ncu_report", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    module = ncu_reader.load_ncu_report_module(str(install / "ncu"))
    assert module.WHERE == "extras"
    assert sys.path[0] == str(install / "extras" / "python")
    # Drop the stand-in by hand: monkeypatch.delitem would record it and put it back at
    # teardown, shadowing the real ncu_report for every later test.
    sys.modules.pop("ncu_report", None)


# ----------------------------------------------------------------------------- events
def test_events_decode_strictly() -> None:
    launches = (read_csv(text("gemm_raw.csv")) + read_csv(text("gemm_details.csv"))
                + read_csv(text("saxpy_details.csv")))
    for launch in launches:
        event = msgspec.convert(kernel_metrics_event(launch), protocol.KernelMetrics)
        assert event.kernel == launch["kernel"] and event.metrics == launch["metrics"]
        assert event.source == launch["source"]
    findings = msgspec.convert(rule_findings_event(launches), protocol.RuleFindings)
    assert len(findings.rules) == sum(len(k["rules"]) for k in launches) == 15
    assert msgspec.convert(kernel_metrics_event(launches[0]), protocol.KernelMetrics).stalls[0] \
        == protocol.Stall(reason="gmma", pct=33.38)
