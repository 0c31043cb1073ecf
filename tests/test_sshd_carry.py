"""The carried OpenSSH server (tests/gpu/make_carry.sh + tests/sshd.py), run here.

The GPU machine has no sshd; the lead carries this machine's, with its libraries, in a
git-ignored folder. Here the carry is made into a temporary folder and started the way
the GPU machine starts it (``GPUWS_CARRIED_SSHD``, a clean environment with
``LD_LIBRARY_PATH`` for sshd alone), then used by ``gpuws doctor``. What cannot be shown
here is a machine without OpenSSH's files; that part runs in tests/gpu/test_gpu_python.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuws.cli import main
from gpuws.transport.ssh import SSHTransport
from sshd import CARRIED_ENV, SshServer, find_sshd  # type: ignore[import-not-found]

MAKE_CARRY = Path(__file__).resolve().parent / "gpu" / "make_carry.sh"
GLIBC_OWN = ("libc.so.6", "ld-linux-x86-64.so.2", "libm.so.6", "libresolv.so.2")

pytestmark = pytest.mark.skipif(
    not os.path.exists("/usr/sbin/sshd") or shutil.which("ldd") is None,
    reason="needs OpenSSH's sshd and ldd to make the carry")


def session_run(cfg: Path, argv: list[str]) -> str:
    async def go() -> bytes:
        t = SSHTransport("pod", config_file=str(cfg))
        await t.connect()
        try:
            return (await t.run(argv)).stdout
        finally:
            await t.close()
    return asyncio.run(go()).decode()


async def connection_children(cfg: Path, pid: int) -> dict[int, str]:
    """The maps of the processes sshd ``pid`` started for one open connection."""
    t = SSHTransport("pod", config_file=str(cfg))
    await t.connect()
    try:
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid == pid:
                    found[int(entry.name)] = (entry / "maps").read_text()
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
        return found
    finally:
        await t.close()


def test_carried_sshd_serves_gpuws_with_its_own_libraries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "carry" / "sshd"
    made = subprocess.run(["bash", str(MAKE_CARRY), str(dest)], capture_output=True, text=True,
                          timeout=120)
    assert made.returncode == 0, made.stderr
    with capsys.disabled():
        print("\n" + made.stdout.strip())
    assert sorted(p.name for p in (dest / "bin").iterdir()) == [
        "scp", "sftp-server", "ssh", "ssh-keygen", "sshd"]
    # The clients the benches' by-hand path runs there start on the carried libraries.
    client = subprocess.run([str(dest / "bin" / "ssh"), "-V"], capture_output=True, text=True,
                            timeout=30, env={**os.environ, "LD_LIBRARY_PATH": str(dest / "lib")})
    assert client.returncode == 0 and client.stderr.startswith("OpenSSH_"), client.stderr
    libs = {p.name for p in (dest / "lib").iterdir()}
    assert "libcrypto.so.3" in libs and not libs & set(GLIBC_OWN)
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    assert size < 20 << 20, size
    assert (dest / "GLIBC").read_text().strip().startswith("2.")

    monkeypatch.setenv(CARRIED_ENV, str(dest))
    assert find_sshd() == str(dest / "bin" / "sshd")
    server = SshServer(tmp_path / "srv").start()
    try:
        assert server.proc is not None
        pid = server.proc.pid
        assert os.readlink(f"/proc/{pid}/exe") == str(dest / "bin" / "sshd")
        # The carried libraries are the ones loaded, from the carry folder...
        assert str(dest / "lib" / "libcrypto.so.3") in Path(f"/proc/{pid}/maps").read_text()
        cfg = server.client_files(tmp_path / "client")
        # A connection's own sshd (re-executed per connection) loads them as well...
        children = asyncio.run(connection_children(cfg, pid))
        assert children and all(str(dest / "lib" / "libcrypto.so.3") in maps
                                for maps in children.values()), children.keys()
        # ...but a session (the login shell, the agent) does not inherit them.
        env = session_run(cfg, ["env"])
        assert "LD_LIBRARY_PATH" not in env and "GPUWS_POD_CACHE=" in env
        assert str(dest) not in session_run(cfg, ["cat", "/proc/self/maps"])
        code = main(["doctor", "pod", "-F", str(cfg), "--json"])
        out, err = capsys.readouterr()
        assert code == 0, err
        report = json.loads(out)
        assert report["transport"]["kind"] == "ssh" and report["transport"]["sftp"]
        assert report["python_choice"]["how"] in ("login", "found", "fallback")
    finally:
        server.stop()


def test_a_carry_that_is_not_there_is_one_clear_line(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CARRIED_ENV, str(tmp_path / "nothing"))
    with pytest.raises(RuntimeError, match=r"make_carry\.sh"):
        find_sshd()
