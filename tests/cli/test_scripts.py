"""scripts/run installs once: with nothing changed it starts without pip, offline too.

The real scripts/_bootstrap.sh runs in a copy of the checkout's scripts and pyproject.toml
whose ``.venv/bin/python`` is this test's interpreter (which imports gpuws). pip is made
unable to install anything (no index), so a start that reached pip fails: the exit code
tells whether the stamp let the start skip it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _checkout(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    # A wrapper, not a link: a linked python would look for its venv beside the link.
    python = tmp_path / ".venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return tmp_path


def _ensure(root: Path, extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(root / "nowhere"),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return subprocess.run(["bash", "-c", f"source scripts/_bootstrap.sh; ensure_venv {extra}"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def _stamp(root: Path, extra: str) -> None:
    digest = subprocess.run(["sha256sum", "pyproject.toml"], cwd=root, capture_output=True,
                            text=True, check=True).stdout.split()[0]
    (root / ".venv" / ".gpuws-installed").write_text(f"{extra} {digest}\n")


def test_an_installed_checkout_starts_without_pip_even_offline(tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    _stamp(root, "report")
    res = _ensure(root, "report")
    assert res.returncode == 0, res.stderr
    # The test extras include the report extra's packages: scripts/run after scripts/test
    # installs nothing either.
    _stamp(root, "dev")
    assert _ensure(root, "report").returncode == 0


def test_a_changed_pyproject_or_extra_reinstalls(tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    _stamp(root, "report")
    # Another extra than the stamp's: pip must run (and fails here, having no index).
    assert _ensure(root, "dev").returncode != 0
    with open(root / "pyproject.toml", "a", encoding="utf-8") as f:
        f.write("\n# changed\n")
    res = _ensure(root, "report")
    assert res.returncode != 0
    assert not (root / ".venv" / ".gpuws-installed").read_text().endswith("changed\n")


def test_python_dash_m_gpuws_is_the_cli() -> None:
    res = subprocess.run([sys.executable, "-m", "gpuws", "--version"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.startswith("gpuws ")


def test_scripts_run_keeps_the_callers_folder(tmp_path: Path) -> None:
    """`scripts/run sync local -W .` from a project syncs the project, not the checkout
    (newcomer tour, finding 16): the venv work happens in the checkout, gpuws runs where
    the person stands."""
    root = _checkout(tmp_path / "checkout")
    _stamp(root, "dev")  # the test extras cover every extra scripts/run installs
    gpuws = root / ".venv" / "bin" / "gpuws"
    gpuws.write_text('#!/bin/sh\npwd\necho "$@"\n')  # stands in for the installed entry point
    gpuws.chmod(0o755)
    project = tmp_path / "project"
    project.mkdir()
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(root / "nowhere")}
    res = subprocess.run(["bash", str(root / "scripts" / "run"), "sync", "local", "-W", "."],
                         cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [str(project), "sync local -W ."]
