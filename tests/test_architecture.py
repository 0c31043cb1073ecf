"""The architecture, enforced: the agent is stdlib-only, the core never imports textual."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gpuws import deploy

CORE = ["gpuws.protocol", "gpuws.transport", "gpuws.transport.ssh", "gpuws.deploy",
        "gpuws.client", "gpuws.sessions.store", "gpuws.sessions.export", "gpuws.sessions.compare",
        "gpuws.cli", "gpuws.commands.doctor"]


@pytest.mark.parametrize("module", CORE)
def test_core_never_imports_textual(module: str) -> None:
    code = f"import sys, {module}; sys.exit(1 if 'textual' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0, module


def test_agent_bundle_runs_on_the_bare_standard_library(tmp_path: Path) -> None:
    """`python3 -I -S` has no site-packages: only the stdlib and the bundle itself."""
    bundle = tmp_path / "agent.pyz"
    bundle.write_bytes(deploy.build_bundle().data)
    env = {"GPUWS_POD_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path)}
    probe = subprocess.run([sys.executable, "-I", "-S", str(bundle), "probe"],
                           capture_output=True, text=True, env=env, timeout=60)
    assert probe.returncode == 0, probe.stderr
    assert '"hostname"' in probe.stdout
    # Every module in the bundle imports without site-packages.
    names = [n[:-3].replace("/", ".") for n in zipfile.ZipFile(bundle).namelist()
             if n.startswith("gpuws/") and n.endswith(".py") and not n.endswith("__main__.py")]
    code = ("import importlib, sys\nfor n in sys.argv[1:]:\n    importlib.import_module(n)\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('msgspec','asyncssh','textual','rich','cupy','torch','numpy')]\n"
            "assert not bad, bad\n")
    res = subprocess.run([sys.executable, "-I", "-S", "-c",
                          f"import sys; sys.path.insert(0, {str(bundle)!r})\n" + code, *names],
                         capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr


def test_bundle_is_deterministic_and_small() -> None:
    deploy.build_bundle.cache_clear()
    a = deploy.build_bundle()
    deploy.build_bundle.cache_clear()
    b = deploy.build_bundle()
    assert a.data == b.data and a.sha256 == b.sha256
    assert a.size <= 200_000
