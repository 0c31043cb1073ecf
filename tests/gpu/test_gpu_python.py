"""On the GPU machine, over a real OpenSSH sshd: gpuws finds the torch Python by itself.

There, as root over SSH, the login PATH's ``python3`` is ``/usr/bin/python3`` without CuPy
or torch, and the interpreter that has them is ``/opt/torch/.venv/bin/python3`` (issue 14;
``GPUWS_EXPECT_PYTHON`` names another). Without ``--python``, ``gpuws doctor`` must name
that one (how "found") and a ``builtin:saxpy`` Tier-1 run must go through it.

The machine has no sshd: carry this machine's (``bash tests/gpu/make_carry.sh`` fills the
git-ignored ``.carry/sshd``) and run with ``GPUWS_CARRIED_SSHD=$PWD/.carry/sshd``, as root
(tests/sshd.py adds the ``sshd`` user and ``/run/sshd`` when they are missing). Prints what
was chosen and how long discovery took; with ``GPUWS_GPU_OUT`` set the figures go to
``$GPUWS_GPU_OUT/python.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuws.cli import main
from gpuws.transport.ssh import SSHTransport

pytestmark = pytest.mark.gpu
if shutil.which("nvidia-smi") is None:
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)

EXPECTED = os.environ.get("GPUWS_EXPECT_PYTHON", "/opt/torch/.venv/bin/python3")
SRC = Path(__file__).resolve().parents[2] / "src"
OUT = Path(os.environ["GPUWS_GPU_OUT"]) if os.environ.get("GPUWS_GPU_OUT") else None
FIGURES: dict[str, Any] = {"expected": EXPECTED}
#: Discovery as the agent runs it, in the SSH session's own environment.
DISCOVER = ("import sys, time, json; sys.path.insert(0, sys.argv[1]); "
            "from gpuws.remote_agent.pod import pythons; t = time.monotonic(); "
            "c, _ = pythons.choose(); "
            "print(json.dumps({'s': time.monotonic() - t, 'how': c['how'], 'path': c['path'], "
            "'looked_at': len(c['candidates'])}))")


def _root_locked() -> bool:
    """sshd without PAM refuses an account whose password field starts with '!'."""
    try:
        for line in Path("/etc/shadow").read_text().splitlines():
            if line.startswith("root:"):
                return line.split(":")[1].startswith("!")
    except OSError:
        pass
    return False


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    from sshd import SshServer, carried_sshd, find_sshd  # type: ignore[import-not-found]

    carried = carried_sshd()
    if find_sshd() is None:
        pytest.fail("no OpenSSH sshd here: run tests/gpu/make_carry.sh on a machine with one, "
                    "carry .carry/ and set GPUWS_CARRIED_SSHD=$PWD/.carry/sshd")
    if os.geteuid() == 0 and _root_locked():
        pytest.fail("root's password field is locked ('!' in /etc/shadow) and sshd runs "
                    "without PAM, so it refuses root: run `usermod -p '*' root` first")
    FIGURES["ssh_server"] = (f"carried OpenSSH sshd ({carried})" if carried
                             else f"OpenSSH sshd ({find_sshd()})")
    root = tmp_path_factory.mktemp("pod")
    server = SshServer(root / "sshd").start()
    try:
        yield server.client_files(root / "client")
    finally:
        server.stop()
        if OUT:
            OUT.mkdir(parents=True, exist_ok=True)
            (OUT / "python.json").write_text(json.dumps(FIGURES, indent=2))
        print("\npython figures: " + json.dumps(FIGURES, indent=2))


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gpuws-home")


@pytest.fixture(autouse=True)
def _shared_home(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWS_HOME", str(home))


def over_ssh(cfg: Path, argv: list[str]) -> tuple[int | None, str, str]:
    async def go() -> tuple[int | None, str, str]:
        t = SSHTransport("pod", config_file=str(cfg))
        await t.connect()
        try:
            res = await t.run(argv)
            return res.returncode, res.stdout.decode(), res.stderr.decode()
        finally:
            await t.close()
    return asyncio.run(go())


def test_the_machine_is_as_the_issue_says(pod: Path) -> None:
    """What the login session sees: which python3, and whether it has torch."""
    code, out, err = over_ssh(pod, ["sh", "-c", "command -v python3; echo $PATH"])
    assert code == 0, err
    login_python, path = out.split("\n")[:2]
    has = subprocess.run([login_python, "-c", "import importlib.util as u; print("
                          "u.find_spec('torch') is not None, u.find_spec('cupy') is not None)"],
                         capture_output=True, text=True, timeout=60)
    FIGURES["login"] = {"python3": login_python, "PATH": path,
                        "torch_cupy": has.stdout.strip() or has.stderr.strip()[-200:]}
    FIGURES["expected_exists"] = os.path.exists(EXPECTED)
    assert os.path.exists(EXPECTED), f"{EXPECTED} is not on this machine"


def test_discovery_in_the_login_session(pod: Path) -> None:
    times = []
    for _ in range(3):
        code, out, err = over_ssh(pod, ["python3", "-c", DISCOVER, str(SRC)])
        assert code == 0, err
        got = json.loads(out.strip().splitlines()[-1])
        times.append(got["s"])
    FIGURES["discovery"] = {**got, "s_runs": [round(t, 4) for t in times],
                            "s_median": round(statistics.median(times), 4)}
    print(f"\ndiscovery: {got['how']} {got['path']} — {got['looked_at']} listed, "
          f"median {statistics.median(times):.3f} s over 3 runs")
    assert (got["how"], got["path"]) == ("found", EXPECTED)


def test_doctor_names_the_torch_python_without_python_flag(
        pod: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.monotonic()
    code = main(["doctor", "pod", "-F", str(pod), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    choice = report["python_choice"]
    FIGURES["doctor"] = {"wall_s": round(time.monotonic() - t0, 3),
                         "agent_python": report["python"], "python_choice": choice,
                         "python_packages": report["python_packages"],
                         "probe_s": report["timings"]["probe_s"]}
    with capsys.disabled():
        print(f"\ndoctor: {choice['how']} {choice['path']}\n  {choice['reason']}")
    assert (choice["how"], choice["path"]) == ("found", EXPECTED)
    names = {p["name"].split("-")[0] for p in report["python_packages"] if p["version"]}
    assert {"torch", "cupy"} <= names, report["python_packages"]


def test_saxpy_tier1_runs_through_it(pod: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "pod", "-F", str(pod), "-w", "builtin:saxpy", "--tiers", "1",
                 "--json", "--no-pull", "--max-seconds", "3"])
    out = capsys.readouterr().out
    events = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    started = [e for e in events if e["type"] == "tier_started" and e["tier"] == 1]
    result = [e for e in events if e["type"] == "tier1_result"]
    FIGURES["saxpy_tier1"] = {
        "exit": code, "argv": started[0]["argv"] if started else None,
        "median_ms": result[0]["stats"]["median_ms"] if result else None,
        "n": result[0]["stats"]["n"] if result else None,
        "problems": [e for e in events if e["type"] in ("diagnosis", "run_finished")][-3:]}
    with capsys.disabled():
        print(f"\nsaxpy Tier 1 under {started[0]['argv'][0] if started else '?'}: "
              f"{FIGURES['saxpy_tier1']['median_ms']} ms")
    assert code == 0, FIGURES["saxpy_tier1"]["problems"]
    assert started and started[0]["argv"][0] == EXPECTED
    assert result and result[0]["stats"]["median_ms"] > 0


def test_a_shell_cmd_reaches_the_torch_python_by_path(
        pod: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``cmd:python3 … | cat`` needs a shell, so the argv is not rewritten: the chosen
    environment's bin first on PATH is what makes its ``python3`` the torch one."""
    prog = "import sys, torch; print('PYTHON', sys.executable, torch.cuda.is_available())"
    code = main(["run", "pod", "-F", str(pod), "-w", f"cmd:python3 -c \"{prog}\" | cat",
                 "--tiers", "1", "--json", "--no-pull"])
    out = capsys.readouterr().out
    events = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    lines = [e["text"] for e in events if e["type"] == "output" and "PYTHON" in e["text"]]
    FIGURES["shell_cmd"] = {"exit": code, "lines": lines}
    assert code == 0, [e for e in events if e["type"] in ("diagnosis", "run_finished")]
    assert lines == [f"PYTHON {EXPECTED} True"], lines
