"""Issue 32 on a real GPU: Tier 3 profiles the instance of a kernel Tier 2 chose.

``tests/gpu/programs/two_grids.py`` launches one kernel (float ``mul_``) 3 times with a
small grid, then 8 times with a large one. Tier 2 (torch.profiler, the machine as lent has
no nsys) must rank it first with the large grid as its configuration (kineto's
``args.grid``/``args.block``) and ``launch_skip`` 3; Tier 3 must give ncu
``--launch-skip 3`` and profile a launch whose Grid Size is that large grid (before, ncu
profiled the first launch: the small grid). Both ways a workload reaches Tier 2: a
``cmd:`` (the injected profiler, from CUDA's start, against ncu from the process's start)
and a ``file:`` (the ``torchprof`` child against the ``exec`` child under
``--profile-from-start off``: both count from cudaProfilerStart). What the lead checks:
the two tests pass; the saved streams show the ``profiling launch 4 of …`` line and no
``ncu profiled … with grid`` warning. Through the ``local`` transport, as
test_gpu_names.py. Streams saved as ``$GPUWS_GPU_OUT/instances/*.ndjson``. About a
minute of GPU time each. Skipped without a GPU.
Run alone: ``GPU_TESTS=instances:300 bash tests/gpu/run_gpu_check.sh``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from faults.figures import record  # type: ignore[import-not-found]
from gpuws.cli import main

pytestmark = pytest.mark.gpu
if shutil.which("nvidia-smi") is None:
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)

OUT = Path(os.environ["GPUWS_GPU_OUT"]) / "instances" if os.environ.get("GPUWS_GPU_OUT") \
    else None
PROGRAM = Path(__file__).parent / "programs" / "two_grids.py"
#: Blocks in x that only the large tensor's launch reaches: 2^24 floats at most 16 to a
#: thread and 128 threads to a block need 8,192 blocks; 2^12 floats, at most 32.
BIG_BLOCKS = 1000


def blocks_x(dims: str | None) -> int:
    """The x of ``(32768, 1, 1)`` (0 where there is none)."""
    return int(dims.strip("()").split(",")[0]) if dims else 0


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWS_HOME", str(tmp_path / "gpuws-home"))


def of(events: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == type_]


@pytest.mark.parametrize("workload", [f"cmd:python3 {PROGRAM}", f"file:{PROGRAM}"],
                         ids=["cmd", "file"])
def test_tier3_profiles_the_launch_configuration_tier2_chose(
        workload: str, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    code = main(["run", "local", "-w", workload, "--tiers", "2,3", "--json", "--no-pull",
                 "--timeout", "300"])
    out = capsys.readouterr().out
    kind = workload.split(":", 1)[0]
    if OUT is not None:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"two_grids_{kind}.ndjson").write_text(out)
    events = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    said = [e for e in events if e["type"] in ("diagnosis", "run_finished", "log")]
    assert code == 0, said
    table = of(events, "kernel_table")[-1]
    top = table["kernels"][0]
    argv = next(e["argv"] for e in of(events, "tier_started") if e["tier"] == 3 and e["argv"])
    metrics = of(events, "kernel_metrics")
    record(f"instances_{kind}", tier2_source=table["source"], top=top["name"][:120],
           grid=top.get("grid"), block=top.get("block"), launch_skip=top.get("launch_skip"),
           argv_skip=argv[argv.index("--launch-skip") + 1],
           profiled_grid=metrics[0].get("grid") if metrics else None)
    assert "MulFunctor" in top["name"], top
    # Tier 2: the large grid is the configuration, its first launch the fourth.
    assert blocks_x(top["grid"]) > BIG_BLOCKS and top["block"], top
    assert top["launch_skip"] == 3, top
    # Tier 3: ncu told to skip the three small launches, and the launch it profiled ran
    # the large grid.
    assert argv[argv.index("--launch-skip") + 1] == "3", argv
    fin = [e for e in of(events, "tier_finished") if e["tier"] == 3][-1]
    assert fin["status"] == "ok", said
    assert metrics and (metrics[0]["grid"], metrics[0]["block"]) == (top["grid"], top["block"]), \
        metrics[:1]
    logs = [e["message"] for e in of(events, "log")]
    assert any(m.startswith("profiling launch 4 of ") for m in logs), logs
    assert not [m for m in logs if "with grid" in m and m.startswith("ncu profiled")], logs
