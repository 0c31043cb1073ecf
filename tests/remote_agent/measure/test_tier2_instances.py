"""Where Tier 2 comes from nsys or ncu's pass, its rows name the instance Tier 3 profiles
(issue 32).

nsys's SQLite export holds every launch's grid and block (``CUPTI_ACTIVITY_KIND_KERNEL``'s
``gridX`` … ``blockZ``). The exports are the real ones of tests/fixtures/nsys-2023.4.4-h100
(nsys 2023.4.4, H100): CuPy's saxpy 50 times, torch's one normal kernel. Their launches
each ran one configuration; the variants below change the recorded launches in a copy (the
test says which) to give a kernel two configurations, or dimensions no GPU runs. nsys is
the stand-in of test_nsys_real.py (this machine has none): it leaves the export where
``-o`` points, as 2023.4.4 did. ncu's pass reads a variant of the real
``ncu --csv --page raw`` of tests/fixtures/ncu-2025.3.1-h200 (saxpy's one launch, copied
under five launch IDs, two with another grid), which a stand-in ncu writes to its
``--log-file`` as ncu does.
"""

from __future__ import annotations

import csv
import io
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gpuws import protocol
from gpuws.remote_agent.measure import tier2_parse as t2
from gpuws.remote_agent.measure import tiers
from gpuws.remote_agent.worker import RunContext
from remote_agent.profilers.test_nsys_real import (  # type: ignore[import-not-found]
    FIX,
    ctx,  # noqa: F401
    events,
    pod_with,
    stand_in_nsys,
)


def variant(tmp_path: Path, sql: str, *params: Any) -> Path:
    """A copy of the real CuPy export with ``sql`` run on it."""
    path = tmp_path / "variant.sqlite"
    shutil.copy(FIX / "nsys_cupy.sqlite", path)
    con = sqlite3.connect(path)
    con.execute(sql, params)
    con.commit()
    con.close()
    return path


#: The first launches of saxpy (by start), as rowids of the kernel table.
FIRST_SAXPY = ("SELECT k.rowid FROM CUPTI_ACTIVITY_KIND_KERNEL AS k JOIN StringIds AS s "
               "ON s.id = k.demangledName WHERE s.value = 'saxpy' ORDER BY k.start LIMIT ?")


def test_the_real_exports_name_each_kernels_configuration() -> None:
    cupy = t2.parse_nsys_sqlite(str(FIX / "nsys_cupy.sqlite"))["instances"]
    assert cupy["saxpy"] == {"grid": "(131072, 1, 1)", "block": "(128, 1, 1)",
                             "launch_skip": 0}
    assert set(cupy) == {"saxpy", "cupy_fill", "cupy_arange__float_float_float32"}
    torch = t2.parse_nsys_sqlite(str(FIX / "nsys_torch.sqlite"))["instances"]
    ((name, instance),) = torch.items()
    assert "distribution_elementwise_grid_stride_kernel" in name
    assert instance == {"grid": "(256, 1, 1)", "block": "(256, 1, 1)", "launch_skip": 0}


def test_a_kernel_with_two_configurations_skips_to_the_one_that_took_most(
        tmp_path: Path) -> None:
    # Variant: saxpy's first 5 launches (of 50) ran a 64-block grid.
    path = variant(tmp_path, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET gridX = 64 WHERE rowid "
                   f"IN ({FIRST_SAXPY})", 5)
    got = t2.parse_nsys_sqlite(str(path))["instances"]["saxpy"]
    assert got == {"grid": "(131072, 1, 1)", "block": "(128, 1, 1)", "launch_skip": 5}
    # Variant: the small grid now runs 45 of 50: it took most, and it is first.
    path = variant(tmp_path, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET gridX = 64 WHERE rowid "
                   f"IN ({FIRST_SAXPY})", 45)
    got = t2.parse_nsys_sqlite(str(path))["instances"]["saxpy"]
    assert got == {"grid": "(64, 1, 1)", "block": "(128, 1, 1)", "launch_skip": 0}


@pytest.mark.parametrize("bad", [0, -1, "x", 2**32, 1.5, b"\x00"])
def test_dimensions_no_gpu_runs_name_no_configuration(tmp_path: Path, bad: Any) -> None:
    # Variant: saxpy's first 3 launches carry a grid no GPU launches; they still count.
    path = variant(tmp_path, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET gridY = ? WHERE rowid "
                   f"IN ({FIRST_SAXPY})", bad, 3)
    got = t2.parse_nsys_sqlite(str(path))["instances"]["saxpy"]
    assert got == {"grid": "(131072, 1, 1)", "block": "(128, 1, 1)", "launch_skip": 3}


def test_an_export_without_dimensions_gives_no_instance(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    shutil.copy(FIX / "nsys_cupy.sqlite", path)
    con = sqlite3.connect(path)
    con.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN blockZ")
    con.commit()
    con.close()
    got = t2.parse_nsys_sqlite(str(path))
    assert got["instances"] == {} and got["kernels"]


def test_tier2_from_nsys_carries_the_instance_to_its_table(ctx: RunContext,  # noqa: F811
                                                           tmp_path: Path) -> None:
    # Variant: saxpy's first 5 launches ran a 64-block grid (as above).
    path = variant(tmp_path, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET gridX = 64 WHERE rowid "
                   f"IN ({FIRST_SAXPY})", 5)
    stats = (FIX / "stats_no_nsysstats.log").read_text()
    nsys = stand_in_nsys(tmp_path / "nsys", FIX / "profile_cupy.txt", path, stats)
    rows = tiers.tier2(ctx, pod_with(nsys), ["/bin/true"], python=False)
    assert rows is not None and rows[0]["name"] == "saxpy" and rows[0]["launch_skip"] == 5
    table = next(e for e in events(ctx) if isinstance(e, protocol.KernelTable))
    top = table.kernels[0]
    assert (top.grid, top.block, top.launch_skip) == ("(131072, 1, 1)", "(128, 1, 1)", 5)


def test_tier2s_ncu_pass_names_the_instance(ctx: RunContext, tmp_path: Path) -> None:  # noqa: F811
    """ncu's pass (no nsys, no torch): its launch IDs are its launch order, and each row
    says Grid Size and Block Size. Variant: saxpy's one recorded launch as IDs 0–4, the
    first two with a 64-block grid."""
    lines = (FIX.parent / "ncu-2025.3.1-h200" / "saxpy_raw.csv").read_text().splitlines()
    header, units, row = list(csv.reader(lines[-3:]))
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerows([header, units])
    for i in range(5):
        launch = dict(zip(header, row, strict=True))
        launch["ID"] = str(i)
        if i < 2:
            launch["Grid Size"] = "(64, 1, 1)"
        writer.writerow([launch[h] for h in header])
    raw = tmp_path / "raw.csv"
    raw.write_text(out.getvalue())
    ncu = tmp_path / "ncu"
    ncu.write_text('#!/bin/sh\nfor a in "$@"; do [ "$prev" = --log-file ] && log="$a"; '
                   f'prev="$a"; done\ncat {raw} > "$log"\n')
    ncu.chmod(0o755)
    tried: list[str] = []
    rows = tiers.tier2_ncu(ctx, str(ncu), ["/bin/true"], False, tried)
    assert rows is not None and len(rows) == 1, tried
    (saxpy,) = rows
    assert saxpy["name"] == "saxpy" and saxpy["calls"] == 5
    assert (saxpy["grid"], saxpy["block"], saxpy["launch_skip"]) == (
        "(262144, 1, 1)", "(256, 1, 1)", 2)


@pytest.mark.parametrize("text", ["(64, 1)", "(0x40, 1, 1)", "", None, "(1, 1, 1) ; rm",
                                  "(" + "9" * 11 + ", 1, 1)"])
def test_ncus_dimensions_other_than_three_counts_are_none(text: Any) -> None:
    assert t2.ncu_dims(text) == [None] * 3
    assert t2.ncu_dims("(262144, 1, 1)") == [262144, 1, 1]
