"""`gpuws report` on a report that needs more than ``--max-memory`` names the limit and the
flag (issue 31): under ``RLIMIT_AS`` ``ncu_report`` did not always say it ran out of
memory; it answered an empty report ("holds no profiled kernel"), a ``SystemError``
("error return without exception set"), or failed to map its shared object (read as
"ncu_report is not installed"). The real recorded H200 report, the real bounded child.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuws.cli import main
from gpuws.report import ReportError, read_report
from gpuws.report_child import Limits

pytest.importorskip("ncu_report")

REP = Path(__file__).parent / "fixtures" / "recorded" / "saxpy_h200.ncu-rep"


def test_every_limit_either_reads_the_kernel_or_names_the_limit() -> None:
    """From an address space too small for Python itself to one that holds the read: each
    limit gives the kernel or the memory line, never another cause. (The failures between
    are where ncu_report's words were wrong; which limits fail depends on the machine, so
    every one is tried.)"""
    outcomes = {}
    for mib in range(16, 64, 4):
        try:
            outcomes[mib] = len(read_report(REP, Limits(memory_mib=mib)))
        except ReportError as exc:
            assert f"it needs more than {mib} MiB to read" in exc.message, (mib, exc.one_line())
            assert "--max-memory" in exc.remedy
            outcomes[mib] = 0
    assert outcomes[16] == 0, outcomes  # no Python with ncu_report fits in 16 MiB
    assert read_report(REP) and len(read_report(REP)) == 1  # the default reads it


def test_the_cli_names_the_limit_and_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """Through `gpuws report`: one line, exit 2, the limit in MiB and --max-memory; or, at a
    limit that holds the read on this machine, the report itself."""
    for mib in (128, 160, 200, 240):
        code = main(["report", str(REP), "--max-memory", str(mib)])
        out, err = capsys.readouterr()
        if code == 0:
            assert "saxpy" in out and not err
            continue
        assert code == 2, err
        assert re.fullmatch(rf"gpuws: Cannot read the report: {REP.name}: it needs more than "
                            rf"{mib} MiB to read — .*--max-memory.*\n", err), err
        assert "no profiled kernel" not in err and "not installed" not in err
