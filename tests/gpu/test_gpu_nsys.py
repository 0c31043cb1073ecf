"""Tier 2 through a real Nsight Systems on a real GPU, over a real SSH server (issue 23).

Needs the nsys that tests/gpu/run_gpu_check.sh unpacks from ``.carry/nsys`` (Debian's
2023.4.4, made by tests/gpu/make_nsys_carry.sh) at /opt/nvidia/nsight-systems/2023.4.4,
where the agent looks. On the H100 with the CUDA 13 driver it traced a CuPy program whole
and a torch cu130 program in part (tests/fixtures/nsys-2023.4.4-h100): Tier 2 must give
nsys's table for the first, with the real argv and the .nsys-rep pulled home, and for the
second one line naming the versions, then torch.profiler's table; the next torch run on
that pod must not spend another nsys pass. Tier 2's wall time through nsys is set beside
torch.profiler's for the same workload (nsys hidden by renaming its folder), interleaved.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuws.cli import main
from gpuws.sessions.store import Store

pytestmark = pytest.mark.gpu
if shutil.which("nvidia-smi") is None:
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)
NSYS_DIR = Path("/opt/nvidia/nsight-systems/2023.4.4")
if not (NSYS_DIR / "bin" / "nsys").exists():
    pytest.skip(f"no carried nsys at {NSYS_DIR} (tests/gpu/run_gpu_check.sh unpacks it)",
                allow_module_level=True)

OUT = Path(os.environ["GPUWS_GPU_OUT"]) if os.environ.get("GPUWS_GPU_OUT") else None
FIGURES: dict[str, Any] = {}
TORCH = ("import torch; m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), "
         "torch.nn.Linear(4096, 1024)).cuda(); x = torch.randn(64, 1024, device='cuda'); "
         "[m(x) for _ in range(20)]; torch.cuda.synchronize(); print('fwd-done')")


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    from sshd import SshServer, find_sshd  # type: ignore[import-not-found]

    root = tmp_path_factory.mktemp("pod")
    if find_sshd():
        server: Any = SshServer(root / "sshd").start()
        FIGURES["ssh_server"] = "OpenSSH sshd"
    else:
        from sshserver import AsyncSSHServer  # type: ignore[import-not-found]

        server = AsyncSSHServer(root / "srv").start()
        FIGURES["ssh_server"] = "asyncssh server (no sshd on this machine)"
    yield server.client_files(root / "client")
    server.stop()
    if OUT:
        (OUT / "nsys_figures.json").write_text(json.dumps(FIGURES, indent=2))


@pytest.fixture(autouse=True)
def _home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWS_HOME", str(tmp_path_factory.getbasetemp() / "nsys-home"))


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, Any]]]:
    code = main(list(args))
    out = capsys.readouterr().out
    return code, [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def of(events: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == type_]


def tier2(events: list[dict[str, Any]]) -> dict[str, Any]:
    return next(e for e in of(events, "tier_finished") if e["tier"] == 2)


def test_a_cupy_workload_gets_nsys_table_argv_and_report(
        pod: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, events = run_json(capsys, "run", "pod", "-F", str(pod), "-w", "builtin:saxpy",
                            "--tiers", "2", "--json")
    assert code == 0, [e for e in events if e["type"] in ("diagnosis", "run_finished")]
    table = of(events, "kernel_table")[0]
    started = next(e for e in of(events, "tier_started") if e["tier"] == 2)
    assert table["source"] == "nsys", (table["source"], tier2(events))
    assert started["argv"][0].startswith(str(NSYS_DIR)) and started["argv"][1] == "profile"
    assert "saxpy" in table["kernels"][0]["name"]
    reps = [a for a in of(events, "artifact") if a["name"].endswith(".nsys-rep")]
    assert reps and len(reps[0]["sha256"]) == 64
    with Store() as store:
        pulled = {a.name: a for a in store.artifacts(events[0]["run_id"])}
        rep = pulled[reps[0]["name"]]
        assert rep.status == "pulled" and rep.local_path
        assert hashlib.sha256(Path(rep.local_path).read_bytes()).hexdigest() == reps[0]["sha256"]
    FIGURES["saxpy_nsys"] = {"argv": started["argv"], "table": table, "tier2": tier2(events),
                             "report": {"name": rep.name, "size": rep.size,
                                        "sha256": reps[0]["sha256"]}}


def test_a_file_workload_gets_nsys_table_too(pod: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A person's ``file:`` benchmark (a CuPy RawKernel add), Tier 2 through nsys."""
    bench = Path(__file__).parents[2] / "bench" / "workloads" / "cupy_add.py"
    code, events = run_json(capsys, "run", "pod", "-F", str(pod), "-w", f"file:{bench}",
                            "--tiers", "2", "--json")
    assert code == 0, [e for e in events if e["type"] in ("diagnosis", "run_finished")]
    table = of(events, "kernel_table")[0]
    assert table["source"] == "nsys", (table["source"], tier2(events))
    assert "cupy_add" in table["kernels"][0]["name"]
    assert any(a["name"].endswith(".nsys-rep") for a in of(events, "artifact"))
    FIGURES["file_nsys"] = {"table": table, "tier2": tier2(events)}


def test_a_torch_cu130_program_is_said_partial_then_passed_over(
        pod: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "pod", "-F", str(pod), "-w", f'cmd:python3 -c "{TORCH}"', "--tiers", "2",
            "--json", "--no-pull"]
    code, events = run_json(capsys, *argv)
    assert code == 0, [e for e in events if e["type"] in ("diagnosis", "run_finished")]
    first = tier2(events)
    table = of(events, "kernel_table")[0]
    FIGURES["torch_partial"] = {"tier2": first, "table_source": table["source"],
                                "top": table["kernels"][:3]}
    assert "traced this run only in part" in first["reason"], first
    assert "nsys 2023.4.4" in first["reason"] and table["source"].startswith("torch.profiler")
    assert any(k["calls"] >= 20 for k in table["kernels"])  # the whole program, not 1 kernel
    code, events = run_json(capsys, *argv)
    assert code == 0
    again = tier2(events)
    FIGURES["torch_passed_over"] = {"tier2": again}
    assert "traced this workload only in part on this pod before: not used" in again["reason"]
    assert not any(e.get("argv") and e["argv"][1:2] == ["profile"]
                   for e in of(events, "tier_started"))


def test_tier2_wall_time_nsys_beside_torch_profiler(
        pod: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """builtin:saxpy's Tier 2, three times each way, interleaved (medians kept)."""
    # Outside nsight-systems/: the agent looks for nsight-systems/*/bin/nsys.
    hidden = NSYS_DIR.parent.parent / "hidden-nsys-2023.4.4"
    walls: dict[str, list[float]] = {"nsys": [], "torch.profiler": []}
    try:
        for _ in range(3):
            for way in ("nsys", "torch.profiler"):
                if way == "nsys" and hidden.exists():
                    hidden.rename(NSYS_DIR)
                elif way != "nsys" and NSYS_DIR.exists():
                    NSYS_DIR.rename(hidden)
                code, events = run_json(capsys, "run", "pod", "-F", str(pod), "-w",
                                        "builtin:saxpy", "--tiers", "2", "--json", "--no-pull")
                assert code == 0
                assert of(events, "kernel_table")[0]["source"].startswith(way)
                walls[way].append(float(tier2(events)["wall_s"]))
    finally:
        if hidden.exists():
            hidden.rename(NSYS_DIR)
    FIGURES["tier2_wall_s"] = {w: {"runs": v, "median": statistics.median(v)}
                               for w, v in walls.items()}
    print("tier2 wall (s):", {w: statistics.median(v) for w, v in walls.items()})
