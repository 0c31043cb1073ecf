"""``gpuws pull`` reads over SFTP without starting the agent, and starts it only where the
server has no SFTP (issue 13, item 5: the agent's start was a seventh of a pull).

Real sshd servers (with and without an SFTP subsystem), the real store and the real
command. The run is recorded in the store as the engine records one (its ``run_started``
and ``artifact`` events), with its file in the pod's run directory, so the pull is the
only thing that touches the pod: whether it started the agent shows in the pod's agent
cache, emptied first.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import os
import time
from pathlib import Path

import pytest

from gpuws import protocol
from gpuws.cli import main
from gpuws.sessions.artifacts import SftpSource, pull_run
from gpuws.sessions.store import Store
from gpuws.transport.local import LocalTransport
from gpuws.transport.ssh import SSHTransport
from sshd import SshServer  # type: ignore[import-not-found]

SIZE = 3 * 1024 * 1024 + 5


def _record_run(pod: SshServer, run_id: str) -> tuple[Path, str]:
    """A stored run whose one artifact lies in the pod's run directory; (file, sha256)."""
    run_dir = pod.pod_cache / "runs" / run_id
    remote = run_dir / "artifacts" / "data.bin"
    remote.parent.mkdir(parents=True)
    data = os.urandom(SIZE)
    remote.write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    now = time.time()
    with Store() as store:
        sid = store.open_session("pod", "ssh+sftp", None, None)
        store.ingest(sid, protocol.RunStarted(
            run_id=run_id, seq=0, ts=now, run_dir=str(run_dir), pid=1,
            spec=protocol.RunSpec(workload="cmd:true", tiers=[])))
        store.ingest(sid, protocol.Artifact(run_id=run_id, seq=1, ts=now, name="data.bin",
                                            path=str(remote), size=SIZE, sha256=sha))
    return remote, sha


def _agents(pod: SshServer) -> list[str]:
    folder = pod.pod_cache / "agent"
    return sorted(p.name for p in folder.glob("*.pyz")) if folder.exists() else []


def _pulled(run_id: str, sha: str) -> None:
    with Store() as store:
        [row] = store.artifacts(run_id)
        assert row.status == "pulled" and row.local_path
        assert hashlib.sha256(Path(row.local_path).read_bytes()).hexdigest() == sha


def test_pull_over_sftp_starts_no_agent(sshd: SshServer, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    sshd.reset_pod()
    cfg = sshd.client_files(tmp_path / "client")
    _remote, sha = _record_run(sshd, "pull-sftp-1")
    assert main(["pull", "-F", str(cfg), "pod", "pull-sftp-1"]) == 0
    assert "pulled data.bin" in capsys.readouterr().out
    _pulled("pull-sftp-1", sha)
    assert _agents(sshd) == []  # nothing was deployed, nothing started


def test_pull_without_sftp_starts_the_agent(sshd_nosftp: SshServer, tmp_path: Path) -> None:
    sshd_nosftp.reset_pod()
    cfg = sshd_nosftp.client_files(tmp_path / "client")
    _remote, sha = _record_run(sshd_nosftp, "pull-exec-1")
    assert main(["pull", "-F", str(cfg), "pod", "pull-exec-1", "--json"]) == 0
    _pulled("pull-exec-1", sha)
    assert len(_agents(sshd_nosftp)) == 1  # deployed: its cat carried the file


def test_an_sftp_source_needs_sftp() -> None:
    with pytest.raises(ValueError, match="SFTP"):
        SftpSource(LocalTransport())


def test_a_pull_that_stops_at_the_announced_size_leaves_nothing_behind(
        sshd: SshServer, tmp_path: Path) -> None:
    """The file on the pod is longer than announced (it grew): the pull stops at the
    announced size with reads still in flight, and the link closes at once. The reads
    must be closed while the link is up; before, the loop finalised them after it closed
    and printed "Task exception was never retrieved: SFTPConnectionLost" on stderr."""
    sshd.reset_pod()
    cfg = sshd.client_files(tmp_path / "client")
    remote, _sha = _record_run(sshd, "pull-grown-1")
    with remote.open("ab") as f:
        f.write(os.urandom(16 << 20))  # grew after it was announced
    problems: list[dict[str, object]] = []

    async def go() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: problems.append(ctx))
        transport = SSHTransport("pod", config_file=str(cfg))
        await transport.connect()
        await transport.settled()
        source = SftpSource(transport)
        with Store() as store:
            run = store.run("pull-grown-1")
            await pull_run(source, store, run.session_id, run.run_id)
        await source.close()
        for _ in range(20):
            gc.collect()
            await asyncio.sleep(0.05)

    asyncio.run(go())
    assert problems == []
