"""The verdict pane and the kernel table's full names, driven by a replay (pilot)."""

from __future__ import annotations

import json
from pathlib import Path

from textual.widgets import DataTable

from gpuws.tui.screens.run import RunScreen
from gpuws.tui.widgets.quiet import QuietStatic
from gpuws.tui.widgets.run.verdict import VerdictView
from tui.tuikit import RECORDING, replay_app, replayed  # type: ignore[import-not-found]

CUTLASS = ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>("
           "cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)")


def launch_bound_recording(tmp_path: Path) -> Path:
    """The recorded H200 run with its kernel table made an LLM decode's: a CUTLASS GEMM and
    a dozen short kernels, the GPU idle 99.5% of the span (nsys-shaped shares)."""
    out = tmp_path / "decode.ndjson"
    lines = []
    for line in RECORDING.read_text().splitlines():
        event = json.loads(line)
        if event["type"] == "kernel_table":
            event.update(source="nsys", gpu_idle_pct=99.5, memcpy_pct=0.2, kernels=[
                {"name": CUTLASS if i == 0 else f"triton_poi_fused_{i}", "calls": 64,
                 "total_ns": 64 * (5800.0 - i * 100), "mean_ns": 5800.0 - i * 100,
                 "share_pct": 100 / 14} for i in range(14)])
        lines.append(json.dumps(event))
    out.write_text("\n".join(lines) + "\n")
    return out


async def test_launch_bound_first_and_full_names_on_demand(tmp_path: Path) -> None:
    app = replay_app(launch_bound_recording(tmp_path))
    async with app.run_test(size=(120, 40)) as pilot:
        await replayed("5")(pilot)
        screen = app.screen
        assert isinstance(screen, RunScreen)
        shown = str(screen.query_one(VerdictView).render())
        assert shown.startswith("Program  (kernel times from nsys)\n★ Launch-bound: the GPU "
                                "is idle 100% of the time between 896 short kernels")
        assert "CUDA graph" in shown and "none of which Tier 2 ranked" in shown
        await pilot.press("2")
        await pilot.pause()
        table = screen.query_one("#kernels", DataTable)
        assert table.row_count == 11  # the top 10 and one "others"
        assert str(table.get_row_at(10)[0]) == "4 others"
        table.focus()
        table.move_cursor(row=0)
        await pilot.pause(0.2)
        assert str(table.get_row_at(0)[0]) == (
            "Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>")
        full = screen.query_one("#kernel-full", QuietStatic)
        assert str(full.render()) == CUTLASS
    app.store.close_blocking()


def two_rank_recording(tmp_path: Path) -> Path:
    """The recorded H200 run with its kernel table replaced by what gpuws reads from the
    real two-rank DDP traces (tests/fixtures/real-programs-h200): a window, ranks, code."""
    import gzip
    import shutil

    from gpuws.remote_agent.measure.torch_profile import read_results

    real = Path(__file__).parents[1] / "fixtures" / "real-programs-h200"
    traces = tmp_path / "traces"
    traces.mkdir()
    for rank, pid in ((0, 1593), (1, 1594)):
        with gzip.open(real / f"ddp-rank{rank}.trace.json.gz", "rb") as src, \
                open(traces / f"torch-trace-{pid}-r{rank}.json", "wb") as dst:
            shutil.copyfileobj(src, dst)
    got = read_results(str(traces))
    got.pop("processes")
    got.pop("problems")
    out = tmp_path / "ddp.ndjson"
    lines = []
    for line in RECORDING.read_text().splitlines():
        event = json.loads(line)
        if event["type"] == "kernel_table":
            event = {k: event[k] for k in ("type", "run_id", "seq", "ts")}
            event.update(source="torch.profiler (injected)", **got)
        lines.append(json.dumps(event))
    out.write_text("\n".join(lines) + "\n")
    return out


async def test_the_judged_window_and_each_kernel_s_code_are_shown(tmp_path: Path) -> None:
    app = replay_app(two_rank_recording(tmp_path))
    async with app.run_test(size=(160, 40)) as pilot:
        await replayed("5")(pilot)
        screen = app.screen
        assert isinstance(screen, RunScreen)
        shown = str(screen.query_one(VerdictView).render())
        assert "judged: steps 2\u201339, " in shown and "left out: " in shown
        assert "★ Communication-bound: collectives not overlapped" in shown
        await pilot.press("2")
        await pilot.pause()
        table = screen.query_one("#kernels", DataTable)
        assert [str(c.label) for c in table.columns.values()][-1] == "from"
        assert str(table.get_row_at(0)[-1]) == "ddp_step.py:18 in main"
    app.store.close_blocking()
