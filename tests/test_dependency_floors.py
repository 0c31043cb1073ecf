"""The dependency floors in pyproject.toml are true: gpuws works with exactly them.

A virtualenv (kept in ``.venv-floors/`` and rebuilt when the floors change) gets each
dependency at its declared minimum (``>=X`` installed as ``==X``) plus the test tools,
then the TUI's pilot flows, the headless commands and the SSH doctor run in it against
this checkout's sources. A floor nobody tested is a promise nobody kept: when one breaks
here, raise it in pyproject.toml.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-floors"
#: What the floors run: pilot-driven TUI flows, the headless twins, ssh to a real sshd.
TESTS = ["tests/tui/test_flows_local.py", "tests/tui/test_ui_actions.py",
         "tests/tui/test_flows_pod.py", "tests/cli/test_cli_headless.py",
         "tests/transport/test_ssh_doctor.py"]
TOOLS = ["pytest", "pytest-asyncio", "pytest-timeout", "hypothesis",
         "pytest-textual-snapshot"]


def floors() -> list[str]:
    """``name==X`` for every ``name>=X`` in the project's dependencies."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    out = []
    for dep in deps:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9][0-9A-Za-z.]*)", dep.replace(" ", ""))
        assert m, f"{dep}: every dependency needs a tested floor (name>=X)"
        out.append(f"{m.group(1)}=={m.group(2)}")
    return out


def _venv(pins: list[str]) -> Path:
    python = VENV / "bin" / "python"
    stamp = VENV / "floors.txt"
    want = "\n".join(pins + TOOLS)
    if python.exists() and stamp.exists() and stamp.read_text() == want:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True,
                   timeout=300)
    res = subprocess.run([str(python), "-m", "pip", "install", "-q",
                          "--disable-pip-version-check", *pins, *TOOLS],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, "installing the floors failed:\n" + res.stderr[-3000:]
    stamp.write_text(want)
    return python


@pytest.mark.timeout(1800)  # a first run builds the venv from the package index
def test_the_declared_floors_run_the_tui_and_the_headless_commands() -> None:
    pins = floors()
    python = _venv(pins)
    got = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze",
                          "--disable-pip-version-check"],
                         capture_output=True, text=True, check=True).stdout.lower()
    for pin in pins:
        assert pin.lower() in got.splitlines(), f"{pin} is not what the floors venv holds"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    env.pop("PYTEST_ADDOPTS", None)
    res = subprocess.run([str(python), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                          *TESTS], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, (f"with {', '.join(pins)}:\n" + res.stdout[-4000:]
                                 + res.stderr[-2000:])
