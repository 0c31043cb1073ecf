"""Issue 32's real programs through Tier 2 on a real GPU, over a real SSH server on loopback
(the ``pod`` of test_gpu_e2e): the verdict judges the steady state and explains host time.

(a) A Hugging Face Llama ``generate`` (tests/gpu/programs/hf_generate.py: a warm-up call,
    then the counted one): the window judged is the decode steps, the first finding names
    dispatch overhead and the Python function it comes from (``forward`` in
    modeling_llama.py, under generate's loop), with CUDA graphs / reduce-overhead / a
    static KV cache among the remedies and no DataLoader remedy (the program has none);
    the top kernels carry the code that launched them.
(b) A two-rank ``torchrun`` step (tests/gpu/programs/ddp_step.py): one table per rank
    and the merged one, the steps window judged (NCCL/gloo set-up left out), and the
    communication share named (gloo on a one-GPU machine, NCCL with two GPUs).

The commands name the Python that has torch (``sys.executable``), as a person names their
venv's on a pod: over the carried sshd, root's ``python3`` is the system one, without it.
These need Tier 2 through torch.profiler (the injected one): where the pod has a working
nsys, Tier 2 takes nsys and this test skips with that reason. Every stream is saved under
``$GPUWS_GPU_OUT/real-programs/``. About 3 minutes of GPU time (transformers' import and
the profiler's CPU activity with Python stacks dominate). Skipped without a GPU.
Run alone: ``GPU_TESTS=real_programs:600 bash tests/gpu/run_gpu_check.sh``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuws import protocol
from gpuws.cli import main
from gpuws.live import verdicts

pytestmark = pytest.mark.gpu
if shutil.which("nvidia-smi") is None:
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)

OUT = Path(os.environ["GPUWS_GPU_OUT"]) / "real-programs" if os.environ.get(
    "GPUWS_GPU_OUT") else None
PROGRAMS = Path(__file__).parent / "programs"


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from sshd import SshServer, find_sshd  # type: ignore[import-not-found]

    root = tmp_path_factory.mktemp("pod")
    if find_sshd():
        server: Any = SshServer(root / "sshd").start()
    else:
        from sshserver import AsyncSSHServer  # type: ignore[import-not-found]

        server = AsyncSSHServer(root / "srv").start()
    yield server.client_files(root / "client")
    server.stop()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gpuws-home")


@pytest.fixture(autouse=True)
def _shared_home(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWS_HOME", str(home))
    monkeypatch.setenv("COLUMNS", "200")


def run(capsys: pytest.CaptureFixture[str], pod: Path, name: str, command: str
        ) -> list[dict[str, Any]]:
    code = main(["run", "pod", "-F", str(pod), "-w", f"cmd:{command}", "--tiers", "2",
                 "--json", "--no-pull"])
    out = capsys.readouterr().out
    if OUT is not None:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{name}.ndjson").write_text(out)
    events = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    if OUT is not None:
        # The timeline trace of a real program: the TUI's and the export's fixture.
        for a in of(events, "artifact"):
            if a["name"].endswith(".trace.json.gz") and Path(a["path"]).is_file():
                shutil.copy(a["path"], OUT / f"{name}.{Path(a['name']).name}")
    assert code == 0, [e for e in events if e["type"] in ("diagnosis", "run_finished")]
    return events


def of(events: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == type_]


def torch_table(events: list[dict[str, Any]]) -> dict[str, Any]:
    (table,) = of(events, "kernel_table")
    if not str(table["source"]).startswith("torch.profiler"):
        pytest.skip(f"Tier 2 took {table['source']} (a working nsys on this pod); the "
                    "host evidence comes with the injected torch.profiler")
    return table


def test_hf_generate_is_dispatch_bound_from_the_model_code(
        pod: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = run(capsys, pod, "hf_generate", f"{sys.executable} {PROGRAMS / 'hf_generate.py'}")
    table = torch_table(events)
    window = table["window"]
    assert window is not None and window["label"] == "decode steps", window
    assert window["steps"] >= 10  # 24 new tokens a call: the counted call's decode steps
    assert table["host"]["launches"] > 0 and table["kernels"][0].get("code")
    (pv,) = of(events, "program_verdict")
    first = pv["findings"][0]
    assert first["code"] == "dispatch_bound", first
    assert "forward in modeling_llama.py" in first["title"]
    remedies = " ".join(first["remedies"])
    assert "reduce-overhead" in remedies and "static KV cache" in remedies
    assert not any("DataLoader" in r for f in pv["findings"] for r in f["remedies"])
    assert pv["window"].startswith("decode steps ")
    # The laptop's logic over the stored events says the same.
    stored = [protocol.decode_event(json.dumps(e).encode()) for e in events]
    program = verdicts.derive(verdicts.inputs_from_events(
        [e for e in stored if not isinstance(e, protocol.BadLine)])).program
    assert program is not None and program.findings[0].code == "dispatch_bound"


def test_ddp_two_ranks_judge_the_steps_and_name_communication(
        pod: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = run(capsys, pod, "ddp_step", f"{sys.executable} -m torch.distributed.run --standalone "
                 f"--nproc-per-node 2 {PROGRAMS / 'ddp_step.py'}")
    table = torch_table(events)
    decoded = msgspec.convert(table, protocol.KernelTable)
    assert decoded.ranks is not None and sorted(r.rank or 0 for r in decoded.ranks) == [0, 1]
    for r in decoded.ranks:
        assert r.window is not None and r.window.basis == "kernel repeats"
        assert r.window.steps >= 30, r.window  # of 40: warm-up and the closing step out
    assert decoded.comm is not None and decoded.comm.comm_pct is not None
    (pv,) = of(events, "program_verdict")
    assert pv["window"].startswith("steps ")
    codes = [f["code"] for f in pv["findings"]]
    assert "communication_bound" in codes or "communication" in codes, codes
    assert pv["left_out"], "the set-up (CUDA, the process group) is named and left out"
