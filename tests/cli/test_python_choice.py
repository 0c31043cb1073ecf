"""The workloads' Python, end to end: `gpuws doctor` names it and a run uses it.

Over the local transport and over a real OpenSSH sshd (a pod user made for the test): the
login PATH's ``python3`` is this machine's ``/usr/bin/python3``, which has neither CuPy nor
torch; a real venv in that user's home has them. torch and CuPy cannot be installed here,
so "has them" is a stand-in package in the venv's site-packages (metadata as pip writes
it and an importable-looking package directory; see tests/remote_agent/pod/test_pythons.py).
A ``cmd:python3 ...`` workload proves the run really starts under the chosen interpreter
(a Python workload needs a GPU; tests/gpu/test_gpu_python.py runs one on the H200).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuws.cli import main
from sshd import SshServer  # type: ignore[import-not-found]

SYSTEM_PYTHON = "/usr/bin/python3"
PRINT_EXE = "cmd:python3 -c 'import sys; print(\"EXE=\" + sys.executable)'"

pytestmark = pytest.mark.skipif(
    not os.path.exists(SYSTEM_PYTHON) or subprocess.run(
        [SYSTEM_PYTHON, "-c", "import venv, importlib.util as u; "
         "assert u.find_spec('torch') is None and u.find_spec('cupy') is None"],
        capture_output=True).returncode != 0,
    reason="needs a /usr/bin/python3 with venv and without torch/CuPy (Debian: python3-venv)")


def venv_with_both(home: Path) -> Path:
    """``home/.venv`` made by the system python3, with stand-in torch and CuPy."""
    venv = home / ".venv"
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True,
                   capture_output=True, timeout=60)
    site = next(venv.glob("lib/python3.*/site-packages"))
    for dist, top in (("torch-2.11.0", "torch"), ("cupy_cuda12x-13.6.0", "cupy")):
        name, version = dist.split("-")
        (site / f"{dist}.dist-info").mkdir()
        (site / f"{dist}.dist-info" / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
        (site / top).mkdir()
        (site / top / "__init__.py").write_text("raise ImportError('a stand-in')\n")
    (site / "torch" / "version.py").write_text("__version__ = '2.11.0+cu130'\ncuda = '13.0'\n")
    return venv / "bin" / "python3"


def cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    if "doctor" in args:
        return code, json.loads(out) if code == 0 else {}, err
    return code, [json.loads(x) for x in out.splitlines() if x.startswith("{")], err


def outputs(events: list[dict[str, Any]]) -> str:
    return "".join(e["text"] for e in events if e["type"] == "output")


@pytest.fixture
def login_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This machine as a pod: PATH with only the system python3, a home with the venv."""
    home = tmp_path / "podhome"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    monkeypatch.delenv("GPUWS_PYTHON_GIVEN", raising=False)
    return home


def test_local_doctor_and_run_use_the_found_venv(login_env: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    found = venv_with_both(login_env)
    code, r, err = cli_json(capsys, "doctor", "local", "--json")
    assert code == 0, err
    assert r["python"]["path"] == SYSTEM_PYTHON  # the agent itself: the login python3
    choice = r["python_choice"]
    with capsys.disabled():
        print(f"\nlocal: {choice['how']} {choice['path']}\n  {choice['reason']}")
    assert (choice["how"], choice["path"]) == ("found", str(found))
    assert {p["name"] for p in r["python_packages"] if p["version"]} == {"torch",
                                                                          "cupy-cuda12x"}
    code, events, err = cli_json(capsys, "run", "local", "-w", PRINT_EXE, "--tiers", "1",
                                 "--json", "--no-pull")
    assert code == 0, (err, events[-1:])
    assert f"EXE={found}" in outputs(events)
    started = [e for e in events if e["type"] == "tier_started" and e["tier"] == 0]
    assert started[0]["argv"][0] == str(found)


def test_local_python_flag_overrides(login_env: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    venv_with_both(login_env)
    code, r, err = cli_json(capsys, "doctor", "local", "--python", SYSTEM_PYTHON, "--json")
    assert code == 0, err
    choice = r["python_choice"]
    assert (choice["how"], choice["path"]) == ("--python", SYSTEM_PYTHON)
    assert [c["path"] for c in choice["candidates"]] == [SYSTEM_PYTHON]  # no search
    code, events, err = cli_json(capsys, "run", "local", "--python", SYSTEM_PYTHON, "-w",
                                 PRINT_EXE, "--tiers", "1", "--json", "--no-pull")
    assert code == 0, err
    assert f"EXE={SYSTEM_PYTHON}" in outputs(events)  # named: python3 is that one


def test_doctor_prints_the_choice(login_env: Path, capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    found = venv_with_both(login_env)
    monkeypatch.setenv("COLUMNS", "1000")  # one line per row: the long path stays whole
    assert main(["doctor", "local"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"{found} (Python 3." in out and ", found)" in out
    assert "has neither CuPy nor torch" in out
    assert "the agent itself runs on 3." in out and SYSTEM_PYTHON in out


@pytest.fixture(scope="module")
def shells_server(tmp_path_factory: pytest.TempPathFactory,
                  need_sshd: None) -> Iterator[SshServer]:
    if os.geteuid() != 0:
        pytest.skip("making a pod user needs root (CI runs the suite as root)")
    server = SshServer(tmp_path_factory.mktemp("sshd-python"), "shells").start()
    try:
        yield server
    finally:
        server.stop()


def test_doctor_over_sshd_finds_the_venv_without_python_flag(
        shells_server: SshServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    user = shells_server.login_user("/bin/sh")
    home = Path(os.path.expanduser(f"~{user}"))
    found = venv_with_both(home)
    subprocess.run(["chown", "-R", f"{user}:", str(home / ".venv")], check=True)
    cfg = shells_server.client_files(tmp_path / "c")
    code, r, err = cli_json(capsys, "doctor", "pod", "-F", str(cfg), "-l", user, "--json")
    assert code == 0, err
    choice = r["python_choice"]
    with capsys.disabled():
        print(f"\nsshd ({user}): {choice['how']} {choice['path']}\n  {choice['reason']}")
    assert r["system"]["user"] == user
    assert r["python"]["path"] == SYSTEM_PYTHON, "the login PATH's python3 should be the system's"
    assert (choice["how"], choice["path"]) == ("found", str(found))
    code, events, err = cli_json(capsys, "run", "pod", "-F", str(cfg), "-l", user, "-w",
                                 PRINT_EXE, "--tiers", "1", "--json", "--no-pull")
    assert code == 0, err
    assert f"EXE={found}" in outputs(events), shlex.join(e["type"] for e in events)
