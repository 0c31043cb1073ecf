"""The agent starts without ``site`` (a faster connect), yet sees the pod's packages.

Stage 1 and ``serve`` run in one interpreter, under ``python3 -S``: processing
site-packages (and whatever ``.pth`` files import) cost 64 ms of a 593 ms bootstrap under
load. What ``site`` would
have found must still be found: the probe reads site-packages itself, so CuPy installed
in a venv named with ``--python`` is reported, through the real bootstrap over a real sshd.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuws import deploy
from gpuws.cli import main
from gpuws.client import AgentClient
from gpuws.transport.ssh import SSHTransport


def test_serve_runs_without_site_and_still_finds_cupy_in_a_venv(
        ssh_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tmp_path.chmod(0o755)  # the venv must be reachable by the sshd session's user (root)
    venv = tmp_path / "venv"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    (site_packages,) = (venv / "lib").glob("python3*/site-packages")
    dist = site_packages / "cupy_cuda12x-13.3.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: cupy-cuda12x\n"
                                   "Version: 13.3.0\n")
    python = str(venv / "bin" / "python")

    async def serve_argv() -> list[str]:
        client = await AgentClient.connect(SSHTransport("pod", config_file=str(ssh_config)),
                                           python=python)
        try:
            cmdline = Path(f"/proc/{client.hello.pid}/cmdline").read_bytes()
            return cmdline.decode().split("\0")[:-1]
        finally:
            await client.close()

    argv = asyncio.run(serve_argv())
    assert argv[:2] == [python, "-S"] and "serve" in argv, argv  # no site in serve

    assert main(["doctor", "pod", "-F", str(ssh_config), "--python", python, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["python"]["path"] == python
    cupy = [p for p in report["python_packages"] if p["name"] == "cupy-cuda12x"]
    assert cupy == [{"name": "cupy-cuda12x", "version": "13.3.0", "cuda": "12", "error": None}]


@pytest.mark.parametrize("make_argv", [deploy.bootstrap_argv, deploy.text_bootstrap_argv])
def test_no_module_in_the_start_directory_can_stand_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        make_argv: Callable[[deploy.Bundle, list[str], str], list[str]]) -> None:
    """Exec sessions start in the pod's home; ``python -c`` puts that directory first on
    sys.path. The bootstrap drops it before importing anything, so a ``hashlib.py`` (or
    ``runpy.py``, ``base64.py``, ``zlib.py``) left there is never run."""
    bundle = deploy.build_bundle()
    cache = tmp_path / "cache"
    (cache / "agent").mkdir(parents=True, mode=0o700)
    cache.chmod(0o700)
    (cache / "agent" / f"{bundle.sha256}.pyz").write_bytes(bundle.data)
    monkeypatch.setenv("GPUWS_POD_CACHE", str(cache))
    home = tmp_path / "home"
    home.mkdir()
    marker = tmp_path / "shadowed"
    for name in ("hashlib", "runpy", "base64", "zlib", "json", "threading"):
        (home / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r})\n")
    argv = make_argv(bundle, ["serve"], sys.executable)
    proc = subprocess.run(argv, cwd=home, input=b"", capture_output=True, timeout=60)
    assert b'"type":"hello"' in proc.stdout, proc.stdout + proc.stderr
    assert not marker.exists(), marker.read_text()
