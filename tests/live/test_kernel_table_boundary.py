"""A kernel table's steady window, host time, communication and ranks at the trust
boundary: the worst value of each new field is refused (the sequence stays whole), an
honest table from the real DDP traces passes, and its views show window, ranks and code."""

from __future__ import annotations

import gzip
import shutil
import time
from pathlib import Path

import msgspec
import pytest
from rich.console import Console

from gpuws import protocol
from gpuws.commands.run import kernel_table, rank_tables, verdict_lines
from gpuws.live import verdicts
from gpuws.live.boundary import (
    MAX_CODE,
    MAX_PHASES,
    MAX_RANK_ROWS,
    MAX_RANKS,
    MAX_SITES,
    MAX_TABLE_TEXT,
    Boundary,
)
from gpuws.remote_agent.measure.torch_profile import read_results

RUN = "20261124-120000-abcdef"
REAL = Path(__file__).parents[1] / "fixtures" / "real-programs-h200"


def _boundary() -> Boundary:
    b = Boundary()
    b.expect(RUN, started=time.time())
    return b


def _row(**kw: object) -> protocol.KernelRow:
    return protocol.KernelRow(name="k", calls=1, total_ns=1.0, mean_ns=1.0, share_pct=100.0,
                              **kw)  # type: ignore[arg-type]


def _window(**kw: object) -> protocol.SteadyWindow:
    base: dict[str, object] = {"label": "steps", "basis": "kernel repeats", "first_step": 2,
                               "last_step": 40, "steps": 39}
    base.update(kw)
    return protocol.SteadyWindow(**base)  # type: ignore[arg-type]


def _table(**kw: object) -> protocol.KernelTable:
    base: dict[str, object] = {"source": "torch.profiler (injected)", "kernels": [_row()]}
    base.update(kw)
    return protocol.KernelTable(**base)  # type: ignore[arg-type]


WORST = [
    _table(kernels=[_row(code="x" * (MAX_CODE + 1))]),
    # The instance Tier 3 profiles: launch dimensions as ncu writes them, a count.
    _table(kernels=[_row(grid="(" + "9" * 100_000 + ", 1, 1)")]),
    _table(kernels=[_row(grid="(0, 1, 1)")]),
    _table(kernels=[_row(block="(128, 1, 1)\n\x1b[2J")]),
    _table(kernels=[_row(block="[128, 1, 1]")]),
    _table(kernels=[_row(launch_skip=-1)]),
    _table(kernels=[_row(launch_skip=2**60)]),
    _table(ranks=[protocol.RankTable(rank=0, kernels=[_row(grid="(1, 1)")])]),
    _table(window=_window(first_step=41)),
    _table(window=_window(steps=10**6)),
    _table(window=_window(label="s" * (MAX_TABLE_TEXT + 1))),
    _table(window=_window(left_out=[protocol.Phase(phase="p", ns=1.0)] * (MAX_PHASES + 1))),
    _table(window=_window(left_out=[protocol.Phase(phase="p", ns=1.0,
                                                   what="w" * (MAX_TABLE_TEXT + 1))])),
    _table(window=_window(step_ns=1e300)),
    _table(window=_window(step_ns=-1.0)),
    _table(host=protocol.HostTime(wall_ns=1.0, loop="l" * (MAX_CODE + 1))),
    _table(host=protocol.HostTime(wall_ns=1.0, sync_sites=[
        protocol.HostSite(code="c")] * (MAX_SITES + 1))),
    _table(host=protocol.HostTime(wall_ns=1.0, python_sites=[
        protocol.HostSite(code="c" * (MAX_CODE + 1))])),
    _table(host=protocol.HostTime(wall_ns=float("nan"))),
    _table(host=protocol.HostTime(wall_ns=1.0, dispatch_ns=-5.0)),
    _table(comm=protocol.CommShare(where="host", comm_ns=1.0, exposed_ns=1.0,
                                   exposed_pct=5000.0)),
    _table(comm=protocol.CommShare(where="w" * (MAX_TABLE_TEXT + 1), comm_ns=1.0,
                                   exposed_ns=1.0)),
    _table(ranks=[protocol.RankTable(rank=i) for i in range(MAX_RANKS + 1)]),
    _table(ranks=[protocol.RankTable(rank=0, kernels=[_row()] * (MAX_RANK_ROWS + 1))]),
    _table(ranks=[protocol.RankTable(rank=0, kernels=[_row(code="c" * (MAX_CODE + 1))])]),
    _table(ranks=[protocol.RankTable(rank=-1)]),
    _table(ranks=[protocol.RankTable(rank=0, pid=2**40)]),
    _table(ranks=[protocol.RankTable(rank=0, window=_window(first_step=9, last_step=3))]),
]


@pytest.mark.parametrize("worst", WORST)
def test_worst_values_are_refused_and_the_sequence_stays_whole(
        worst: protocol.KernelTable) -> None:
    b = _boundary()
    ev = msgspec.structs.replace(worst, run_id=RUN, seq=0, ts=time.time())
    kept = b.check(ev)
    assert isinstance(kept, protocol.Log) and "refused" in kept.message, kept
    assert b.refused_total() == 1


def real_table(tmp_path: Path) -> protocol.KernelTable:
    for rank, pid in ((0, 1593), (1, 1594)):
        with gzip.open(REAL / f"ddp-rank{rank}.trace.json.gz", "rb") as src, \
                open(tmp_path / f"torch-trace-{pid}-r{rank}.json", "wb") as dst:
            shutil.copyfileobj(src, dst)
    got = read_results(str(tmp_path))
    got.pop("processes")
    got.pop("problems")
    return msgspec.convert({"type": "kernel_table", "run_id": RUN, "seq": 1,
                            "ts": time.time(), "source": "torch.profiler (injected)", **got},
                           protocol.KernelTable)


def test_an_honest_two_rank_table_passes_and_every_view_shows_it(tmp_path: Path) -> None:
    table = real_table(tmp_path)
    b = _boundary()
    assert b.check(table) is table
    # Each row names its instance (rank 0's: the rank Tier 3 profiles by default).
    assert all(r.grid and r.block and r.launch_skip is not None for r in table.kernels)
    console = Console(width=200, record=True)
    console.print(kernel_table(table))
    for t in rank_tables(table):
        console.print(t)
    found = verdicts.derive(verdicts.Inputs(table=table))
    assert found.program is not None
    for line in verdict_lines(found.program):
        console.print(line)
    text = console.export_text()
    assert "2 ranks merged" in text and "rank 0" in text and "rank 1" in text
    assert "ddp_step.py:18 in main" in text  # the code column
    assert "judged: steps 2\u201339" in text
    assert "Communication-bound" in text
    assert "left out:" in text and "set_device" in text
