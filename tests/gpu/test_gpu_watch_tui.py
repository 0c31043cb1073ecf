"""The TUI's watch screen on a real GPU (issue 25, point 3's last sentences): the launcher's
Watch on the machine's own agent (``local``), a project with its own package ``kern`` (a
Triton vector add) and ``bench/attn.py`` importing it, Tier 1 only. The start is the
baseline; a save that gives the kernel 512 more multiply-adds per element must read
slower in its row and sit higher on the chart, each median with its CI drawn; esc ends
the loop. The screen as it was then is saved as ``watch_tui.svg`` and the figures as
``watch_tui.json`` under ``$GPUWS_GPU_OUT``. Skipped without a GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu
if shutil.which("nvidia-smi") is None:
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)

OUT = Path(os.environ["GPUWS_GPU_OUT"]) if os.environ.get("GPUWS_GPU_OUT") else None
KERNEL = (Path(__file__).parents[2] / "bench" / "workloads" / "triton_add.py").read_text()
BENCH = "from kern.triton_add import BYTES, FLOPS, KERNEL_REGEX, run, setup  # noqa: F401\n"
LOAD = "        x = tl.load(x_ptr + offs, mask=mask)\n"


async def until(pilot: Any, ready: Any, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out on {pilot.app.screen!r}")
        await pilot.pause(0.1)
    await pilot.wait_for_scheduled_animations()


async def test_watch_screen_rows_and_chart_on_a_gpu(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from textual.widgets import Checkbox, DataTable, Input

    from gpuws.live.link import Target
    from gpuws.sessions.store import Store
    from gpuws.tui.app import GpuwsApp, StartConnect
    from gpuws.tui.screens.dashboard import DashboardScreen
    from gpuws.tui.screens.launcher import LauncherScreen
    from gpuws.tui.screens.watch import WatchScreen
    from gpuws.tui.widgets.run.ci_chart import CiChart

    monkeypatch.setenv("GPUWS_HOME", str(tmp_path / "home"))
    root = tmp_path / "proj"
    (root / "kern").mkdir(parents=True)
    (root / "kern" / "__init__.py").write_text("")
    src = root / "kern" / "triton_add.py"
    src.write_text(KERNEL)
    (root / "bench").mkdir()
    (root / "bench" / "attn.py").write_text(BENCH)
    assert LOAD in KERNEL

    app = GpuwsApp(StartConnect(Target("local")))
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
        await pilot.press("n")
        await until(pilot, lambda: app.screen.query("#kind-file"))
        await pilot.click("#kind-file")
        launcher = app.screen
        assert isinstance(launcher, LauncherScreen)
        launcher.query_one("#file", Input).value = "bench/attn.py"
        launcher.query_one("#workspace", Input).value = str(root)
        launcher.query_one("#max-seconds", Input).value = "3"
        launcher.query_one("#t2", Checkbox).value = False
        launcher.query_one("#t3", Checkbox).value = False
        await pilot.press("ctrl+t")
        await until(pilot, lambda: isinstance(app.screen, WatchScreen))
        screen = app.screen
        assert isinstance(screen, WatchScreen)

        def waiting(n: int) -> bool:
            return (len(screen.iterations) == n and screen.status is not None
                    and screen.status.phase == "waiting")

        await until(pilot, lambda: waiting(1))
        src.write_text(KERNEL.replace(LOAD, LOAD + "        for _ in range(512):\n"
                                                   "            x = x * 0.999 + 0.001\n"))
        await until(pilot, lambda: waiting(2))
        table = screen.query_one("#iterations", DataTable)
        rows = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
        chart = screen.query_one(CiChart)
        drawn = str(chart.render())
        its = [screen.iterations[n] for n in (1, 2)]
        figures = {"rows": rows, "chart": drawn,
                   "medians_ms": [it.median_ms for it in its],
                   "ci_ms": [[it.ci_low_ms, it.ci_high_ms] for it in its],
                   "status": [it.status for it in its], "errors": [it.error for it in its]}
        if OUT:
            app.save_screenshot("watch_tui.svg", str(OUT))
            (OUT / "watch_tui.json").write_text(json.dumps(figures, indent=2))
        print(json.dumps(figures, indent=1))
        assert [it.status for it in its] == ["ok", "ok"], figures
        m1, m2 = (it.median_ms for it in its)
        assert m1 is not None and m2 is not None and m2 > m1 * 1.1
        assert rows[0][0] == "★1" and rows[0][5] == "baseline"
        assert "kern/triton_add.py" in rows[1][1] and rows[1][5] == "slower"
        assert rows[1][3].startswith("+") and rows[1][4].startswith("+")
        # Both medians are points of the chart, the slower one higher up.
        lines = drawn.splitlines()
        marks = [(r, line.index("●")) for r, line in enumerate(lines) if "●" in line]
        assert len(marks) == 2 and marks[0][1] > marks[1][1] and marks[0][0] < marks[1][0]
        assert "µs" in lines[0] or "ms" in lines[0]

        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, WatchScreen)
                    and app.watch_loop is not None and app.watch_loop.stopped)
        with Store() as store:
            (session,) = store.sessions()
            runs = store.runs(session.id)
        assert len(runs) == 2 and all(r.spec is not None and r.spec.fork_server for r in runs)
        await app.shutdown()
