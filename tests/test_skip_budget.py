"""The skip budget (issue 31): under ``GPUWS_EXPECTED_SKIPS=gpu`` (set by scripts/test) a
skip outside tests/gpu/ fails the run and is named with its reason; the GPU files' skips
do not. Real pytest runs, in a temporary tree, with this suite's conftest as a plugin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent


def _pytest(tree: Path, expected: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUWS_EXPECTED_SKIPS"}
    if expected is not None:
        env["GPUWS_EXPECTED_SKIPS"] = expected
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-rs", "-q", "--rootdir", str(tree),
         "-c", os.devnull, "-p", "no:cacheprovider", *args],
        cwd=tree, env=env, capture_output=True, text=True, timeout=120)


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "tests" / "gpu").mkdir(parents=True)
    (tmp_path / "tests" / "cli").mkdir()
    (tmp_path / "tests" / "gpu" / "test_on_gpu.py").write_text(
        "import pytest\npytest.skip('no NVIDIA GPU here', allow_module_level=True)\n")
    (tmp_path / "tests" / "cli" / "test_quiet.py").write_text(
        "import pytest\n\ndef test_ok():\n    pass\n\n"
        "def test_gone_quiet():\n    pytest.skip('zstd is not installed')\n")
    return tmp_path


def test_a_skip_outside_the_gpu_files_fails_the_run_and_is_named(tmp_path: Path) -> None:
    res = _pytest(_tree(tmp_path), "gpu")
    assert res.returncode == 1, res.stdout + res.stderr
    assert ("unexpected skip: tests/cli/test_quiet.py::test_gone_quiet: zstd is not installed"
            in res.stdout), res.stdout
    assert "unexpected skip: tests/gpu" not in res.stdout
    assert "SKIPPED" in res.stdout and "no NVIDIA GPU here" in res.stdout  # -rs: reasons


def test_the_gpu_files_may_skip(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    res = _pytest(tree, "gpu", "tests/gpu", "tests/cli/test_quiet.py::test_ok")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 passed, 1 skipped" in res.stdout


def test_without_the_variable_a_skip_is_only_a_skip(tmp_path: Path) -> None:
    res = _pytest(_tree(tmp_path), None)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "unexpected skip" not in res.stdout
