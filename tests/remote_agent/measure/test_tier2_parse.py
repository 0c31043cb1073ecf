"""Tier 2 parsers: nsys kernel summaries, the nsys sqlite timeline, torch.profiler tables."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import msgspec
import pytest

from gpuws.protocol import KernelRow, KernelTable
from gpuws.remote_agent.measure import tier2_parse as t2

FIXTURES = Path(__file__).parents[2] / "fixtures" / "ncu-2025.3.1-h200"
TORCH_TABLE = (FIXTURES / "torch_profiler_key_averages.txt").read_text()

# `nsys stats --report cuda_gpu_kern_sum --format csv`. The header is the one NVIDIA's
# report script cuda_gpu_kern_sum.py produces (<nsys>/host-linux-x64/reports/; column
# aliases "Time:ratio_%", "Total Time:dur_ns", "Instances", "Avg:dur_ns", ... "Name").
# The rows are the top three of a real cuda_gpu_kern_sum printed on the NVIDIA forum
# (https://forums.developer.nvidia.com/t/what-does-the-instance-mean/280209), as CSV.
NSYS_NEW = (
    "Generating SQLite file report1.sqlite from report1.nsys-rep\n"
    "Processing [report1.sqlite] with [/opt/nvidia/nsight-systems/2024.5.1/host-linux-x64/"
    "reports/cuda_gpu_kern_sum.py]... \n"
) + """\
Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name
24.4,6699857869,182028,36806.7,14335.0,1984,1054500,95039.9,"void BoxKernel<PhaseRelPerm::[lambda(int, int, int) (instance 12)]>(T1, int, int, int)"
18.7,5134744349,31766,161642.8,129792.0,2208,9585345,200396.2,"void BoxKernel<Saturation::[lambda(int, int, int) (instance 6)]>(T1, int, int, int)"
15.7,4298160518,30352,141610.5,81920.5,1855,997091,179394.0,"void BoxKernel<PhaseRelPerm::[lambda(int, int, int) (instance 28)]>(T1, int, int, int)"

"""  # noqa: E501 - real lines are long
# `nsys stats --report gpukernsum --format csv` of nsys 2020.x/2021.x: the aliases of the
# old gpukernsum.py query ("Time(%)", "Total Time (ns)", "Instances", "Average",
# "Minimum", "Maximum", "Name").
NSYS_OLD = (
    "Using report1.sqlite for SQL queries.\n"
    "Running [/opt/nvidia/nsight-systems/2021.3.1/target-linux-x64/reports/gpukernsum.py "
    "report1.sqlite]... \n"
) + """\
Time(%),Total Time (ns),Instances,Average,Minimum,Maximum,Name
60.0,1200000,40,30000.0,29000,32000,saxpy_kernel
40.0,800000,10,80000.0,79000,81000,"reduce_kernel<float, 256>"
"""
# nsys 2022.4's gpukernsum adds GridXYZ,BlockXYZ and splits a kernel per launch shape.
NSYS_2022_4 = """\
Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),GridXYZ,BlockXYZ,Name
70.0,700000,7,100000.0,100000.0,99000,101000,500.0," 896    1    1"," 256    1    1",gemm_kernel
20.0,200000,2,100000.0,100000.0,99000,101000,500.0," 448    1    1"," 256    1    1",gemm_kernel
10.0,100000,10,10000.0,10000.0,9000,11000,100.0," 128    1    1"," 128    1    1",relu_kernel
"""  # noqa: E501


def test_nsys_cuda_gpu_kern_sum_csv() -> None:
    rows = t2.parse_nsys_kern_sum_csv(NSYS_NEW)
    assert len(rows) == 3
    first = rows[0]
    assert first["name"].startswith("void BoxKernel<PhaseRelPerm::[lambda(int, int, int) "
                                    "(instance 12)]>")
    assert (first["calls"], first["total_ns"], first["mean_ns"]) == (182028, 6699857869.0,
                                                                     36806.7)
    assert (first["median_ns"], first["min_ns"], first["max_ns"], first["stddev_ns"]) == (
        14335.0, 1984.0, 1054500.0, 95039.9)
    ranked = t2.rank_kernels(rows)
    assert [r["calls"] for r in ranked] == [182028, 31766, 30352]
    assert sum(r["share_pct"] for r in ranked) == pytest.approx(100.0)
    assert ranked[0]["share_pct"] == pytest.approx(
        100 * 6699857869 / (6699857869 + 5134744349 + 4298160518))


def test_nsys_old_gpukernsum_csv() -> None:
    rows = t2.parse_nsys_kern_sum_csv(NSYS_OLD)
    assert [(r["name"], r["calls"], r["total_ns"], r["mean_ns"]) for r in rows] == [
        ("saxpy_kernel", 40, 1200000.0, 30000.0),
        ("reduce_kernel<float, 256>", 10, 800000.0, 80000.0)]
    assert rows[0]["min_ns"] == 29000.0 and "median_ns" not in rows[0]


def test_nsys_2022_4_rows_merge_per_kernel() -> None:
    rows = t2.parse_nsys_kern_sum_csv(NSYS_2022_4)
    assert rows[0]["grid"] == "896 1 1" and rows[0]["block"] == "256 1 1"
    ranked = t2.rank_kernels(rows)
    assert [(r["name"], r["calls"], r["total_ns"]) for r in ranked] == [
        ("gemm_kernel", 9, 900000.0), ("relu_kernel", 10, 100000.0)]
    assert ranked[0]["share_pct"] == pytest.approx(90.0)


def test_nsys_timeunit_and_text_numbers() -> None:
    # `--timeunit usec` renames the columns; the values are then microseconds.
    usec = NSYS_OLD.replace("Total Time (ns)", "Total Time (us)").replace("Average",
                                                                          "Avg (us)")
    rows = t2.parse_nsys_kern_sum_csv(usec)
    assert rows[0]["total_ns"] == 1200000.0 * 1000 and rows[0]["mean_ns"] == 30000.0 * 1000


def test_nsys_csv_without_kernels_or_garbage() -> None:
    skipped = ("Processing [report1.sqlite] with [cuda_gpu_kern_sum.py]... \n"
               "SKIPPED: report1.sqlite does not contain CUDA kernel data.\n")
    assert t2.parse_nsys_kern_sum_csv(skipped) == []
    with pytest.raises(t2.Tier2ParseError, match="no CUDA kernel summary"):
        t2.parse_nsys_kern_sum_csv("ERROR: report1.nsys-rep: no such file\n")


def test_torch_key_averages_fixture() -> None:
    rows = t2.parse_torch_key_averages(TORCH_TABLE)
    assert rows == [{
        "name": "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wg...", "calls": 5,
        "total_ns": pytest.approx(234433.0), "mean_ns": pytest.approx(46886.6),
        "truncated": True}]
    with_memops = t2.parse_torch_key_averages(TORCH_TABLE, include_memops=True)
    assert [(r["name"], r["calls"]) for r in with_memops] == [
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wg...", 5), ("Memset (Device)", 7)]
    # The table's own "Self CUDA time total: 240.225us" is these device rows' sum.
    assert sum(r["total_ns"] for r in with_memops) == pytest.approx(240225.0)
    table = KernelTable(source="torch.profiler",
                        kernels=[msgspec.convert(k, KernelRow)
                                 for k in t2.rank_kernels(rows)])
    assert table.kernels[0].share_pct == 100.0


def test_torch_other_device_names_and_errors() -> None:
    # torch's _build_table names the device columns f"Self {use_device.upper()}", ...
    xpu = TORCH_TABLE.replace("Self CUDA", "Self XPU ").replace("CUDA total", "XPU total ")
    header = next(line for line in xpu.splitlines() if "# of Calls" in line)
    assert "Self XPU" in header and "XPU total" in header
    assert t2.parse_torch_key_averages(xpu)[0]["total_ns"] == pytest.approx(234433.0)
    # Without device activity torch prints no device columns: cut them out of the fixture.
    lines = TORCH_TABLE.splitlines()
    sep = next(line for line in lines if line.startswith("-----"))
    starts = [m.start() for m in re.finditer(r"-+", sep)]
    cut_from, cut_to = starts[6], starts[10]  # Self CUDA .. CUDA time avg
    cpu_only = "\n".join(line[:cut_from] + line[cut_to:] for line in lines)
    assert "CUDA total" not in cpu_only and "# of Calls" in cpu_only
    with pytest.raises(t2.Tier2ParseError, match="Self CUDA"):
        t2.parse_torch_key_averages(cpu_only)
    with pytest.raises(t2.Tier2ParseError, match=r"no torch\.profiler"):
        t2.parse_torch_key_averages("Self CPU time total: 1.000ms\n")


def test_rank_kernels() -> None:
    rows = [{"name": "b", "calls": 1, "total_ns": 300.0}, {"name": "a", "calls": 3,
            "total_ns": 600.0, "extra": "ignored"}, {"name": "b", "calls": 1, "total_ns": 300.0},
            {"name": "c", "calls": 0, "total_ns": 0.0}]
    ranked = t2.rank_kernels(rows)
    assert [msgspec.convert(r, KernelRow) for r in ranked] == [
        KernelRow(name="a", calls=3, total_ns=600.0, mean_ns=200.0, share_pct=50.0),
        KernelRow(name="b", calls=2, total_ns=600.0, mean_ns=300.0, share_pct=50.0),
        KernelRow(name="c", calls=0, total_ns=0.0, mean_ns=0.0, share_pct=0.0)]
    assert [r["name"] for r in t2.rank_kernels(rows, limit=1)] == ["a"]
    assert t2.rank_kernels([]) == []


# ----------------------------------------------------------------------------- sqlite
# Columns of the nsys SQLite export schema reference
# (https://docs.nvidia.com/nsight-systems/2021.5/nsys-exporter/exported_data.html), trimmed
# to those the parser reads plus a few neighbours.
SCHEMA = """
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
    correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL,
    shortName INTEGER NOT NULL, gridX INTEGER NOT NULL, blockX INTEGER NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
    correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER NOT NULL, end INTEGER NOT NULL,
    deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
    correlationId INTEGER, globalPid INTEGER, value INTEGER NOT NULL, bytes INTEGER NOT NULL);
"""


def _db(path: Path, memcpy: bool = True) -> str:
    con = sqlite3.connect(path)
    con.executescript(SCHEMA)
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [
        (1, "void scale<float>(float *, int)"), (2, "scale"),
        (3, "void add<float>(const float *, float *)"), (4, "add"), (5, "relu_kernel")])

    def k(start: int, end: int, dev: int, name: int, short: int, stream: int = 7) -> tuple[
            int, ...]:
        return (start, end, dev, 1, stream, 0, 0, name, short, 1, 256)

    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?,?,?,?,?,?)", [
        # device 0: scale, add on another stream overlapping scale, then add again
        k(1000, 2000, 0, 1, 2), k(2500, 3000, 0, 3, 4, 8), k(2800, 3500, 0, 1, 2),
        k(4200, 5000, 0, 3, 4),
        k(0, 0, 0, 1, 2),  # no timestamps collected: ignored
        # device 1: relu twice with a 2 µs hole
        k(10000, 11000, 1, 5, 5), k(13000, 14000, 1, 5, 5),
    ])
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (2000, 2200, 0, 1, 7, 0, 0, 0, "
                "4096)")
    if memcpy:
        con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?,?,?,1,7,0,0,?,?)", [
            (0, 1000, 0, 1 << 20, 1),  # HtoD before the first kernel: outside the span
            (3500, 4000, 0, 1 << 20, 2),  # DtoH between kernels
        ])
    con.commit()
    con.close()
    return str(path)


def test_sqlite_gaps_and_memcpy_share(tmp_path: Path) -> None:
    result = t2.parse_nsys_sqlite(_db(tmp_path / "report1.sqlite"))
    # device 0 span 1000..5000 (4000 ns): busy [1000,2200] [2500,4000] [4200,5000] = 3500;
    # device 1 span 10000..14000 (4000 ns): busy 2000.
    assert (result["span_ns"], result["busy_ns"], result["idle_ns"]) == (8000, 5500, 2500)
    assert (result["kernel_ns"], result["memcpy_ns"], result["memset_ns"]) == (4800, 500, 200)
    assert (result["gap_count"], result["largest_gap_ns"]) == (3, 2000)
    assert result["gpu_idle_pct"] == pytest.approx(31.25)
    assert result["memcpy_pct"] == pytest.approx(6.25)
    assert (result["devices"], result["kernel_count"]) == (2, 6)
    ranked = t2.rank_kernels(result["kernels"])
    assert [(r["name"], r["calls"], r["total_ns"]) for r in ranked] == [
        ("relu_kernel", 2, 2000.0), ("void scale<float>(float *, int)", 2, 1700.0),
        ("void add<float>(const float *, float *)", 2, 1300.0)]
    table = KernelTable(source="nsys", kernels=[msgspec.convert(r, KernelRow) for r in ranked],
                        gpu_idle_pct=result["gpu_idle_pct"], memcpy_pct=result["memcpy_pct"])
    assert table.kernels[0].share_pct == pytest.approx(40.0)


def test_sqlite_without_optional_tables(tmp_path: Path) -> None:
    path = _db(tmp_path / "a.sqlite", memcpy=False)
    con = sqlite3.connect(path)
    con.execute("DROP TABLE StringIds")
    con.commit()
    con.close()
    result = t2.parse_nsys_sqlite(path)
    assert result["memcpy_ns"] == 0 and result["memcpy_pct"] == 0.0
    assert {k["name"] for k in result["kernels"]} == {"kernel #1", "kernel #3", "kernel #5"}
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).close()
    assert t2.parse_nsys_sqlite(str(empty))["gpu_idle_pct"] is None


def test_sqlite_errors(tmp_path: Path) -> None:
    with pytest.raises(t2.Tier2ParseError, match="no such file"):
        t2.parse_nsys_sqlite(str(tmp_path / "missing.sqlite"))
    not_db = tmp_path / "report1.nsys-rep"
    not_db.write_bytes(b"\x00QDSTRM" + b"\xff" * 200)
    with pytest.raises(t2.Tier2ParseError, match="not an nsys sqlite export"):
        t2.parse_nsys_sqlite(str(not_db))


def test_timeline_stats_directly() -> None:
    spans = {0: (0, 100)}
    intervals = [(0, 0, 40, "kernel"), (0, 30, 50, "memcpy"), (0, 60, 100, "kernel"),
                 (0, 90, 150, "memcpy")]
    stats = t2.timeline_stats(spans, intervals)
    assert (stats["busy_ns"], stats["idle_ns"], stats["memcpy_ns"]) == (90, 10, 30)
    assert stats["gpu_idle_pct"] == pytest.approx(10.0)
    assert t2.timeline_stats({}, [])["gpu_idle_pct"] is None
