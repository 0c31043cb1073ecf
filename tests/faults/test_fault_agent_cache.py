"""The pod's agent cache: stale or corrupt bundles, and several laptops deploying at once.

The bootstrap names the cached agent by its sha256 and checks the hash before starting
it. Here the cache is damaged in every way we could think of (truncated, empty, garbage,
an older build planted under the current name that would leave a marker if it ever ran,
a stale build under its own old name, a crashed upload's temp file, a directory in the
bundle's place) and each connect must either repair it and run the right agent, or say
clearly why not. Then LAPTOPS laptops connect to one pod at the same moment, ROUNDS
times, with an empty cache: all must work and the shared cache must end up exactly the
bundle, with no temp files left behind.
"""

from __future__ import annotations

import asyncio
import io
import os
import time
import zipfile
from pathlib import Path

import pytest

from faults.figures import record  # type: ignore[import-not-found]
from faults.helpers import tracebacks  # type: ignore[import-not-found]
from gpuws import deploy
from gpuws.client import AgentClient
from gpuws.errors import DeployError
from gpuws.transport.local import LocalTransport
from gpuws.transport.ssh import SSHTransport
from sshd import SshServer  # type: ignore[import-not-found]

LAPTOPS = 4
ROUNDS = 5


def planted_bundle(marker: Path) -> bytes:
    """A valid agent zipapp of another build that leaves ``marker`` behind if it runs."""
    src = zipfile.ZipFile(io.BytesIO(deploy.build_bundle().data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "__main__.py":
                data = f"open({str(marker)!r}, 'w').close()\n".encode() + data
            zf.writestr(info, data)
    return out.getvalue()


def test_stale_or_corrupt_cache_is_never_run(sshd: SshServer, ssh_config: Path,
                                             tmp_path: Path) -> None:
    bundle = deploy.build_bundle()
    agent_dir = sshd.pod_cache / "agent"
    cached = agent_dir / f"{bundle.sha256}.pyz"
    marker = tmp_path / "planted-bundle-ran"
    old_sha = "0" * 64
    damage = {
        "truncated": lambda: cached.write_bytes(bundle.data[: len(bundle.data) // 2]),
        "empty": lambda: cached.write_bytes(b""),
        "garbage": lambda: cached.write_bytes(os.urandom(len(bundle.data))),
        "planted_build": lambda: cached.write_bytes(planted_bundle(marker)),
        "stale_name": lambda: (agent_dir / f"{old_sha}.pyz").write_bytes(planted_bundle(marker)),
        "crashed_upload": lambda: (agent_dir / f"{bundle.sha256}.pyz.4242.tmp").write_bytes(
            bundle.data[:1000]),
    }
    states: dict[str, str] = {}
    serve_said: list[str] = []

    async def connect() -> str:
        client = await AgentClient.connect(SSHTransport("pod", config_file=str(ssh_config)))
        try:
            assert client.hello.agent_sha256 == bundle.sha256  # the right agent answers
            await client.ping()
            return client.deploy.cache_state
        finally:
            serve_said.extend(client.stderr_tail)
            await client.close()

    t0 = time.monotonic()
    repaired = foreign_runs = 0
    for name, harm in damage.items():
        sshd.reset_pod()
        agent_dir.mkdir(mode=0o700)
        harm()
        states[name] = asyncio.run(connect())
        foreign_runs += marker.exists()
        assert cached.read_bytes() == bundle.data, name
        assert oct(cached.stat().st_mode & 0o777) == "0o600"
        assert not marker.exists(), f"{name}: a bundle that is not ours was executed"
        reused = asyncio.run(connect())
        # Repaired: the cache holds exactly our bundle, private, and the next connect
        # reuses it.
        repaired += (cached.read_bytes() == bundle.data and reused == "cached"
                     and cached.stat().st_mode & 0o777 == 0o600)
        assert reused == "cached"  # repaired once, then reused
    assert states == {"truncated": "corrupt", "empty": "corrupt", "garbage": "corrupt",
                      "planted_build": "corrupt", "stale_name": "need",
                      "crashed_upload": "need"}
    # A directory where the bundle should be cannot be repaired: one clear error.
    sshd.reset_pod()
    cached.mkdir(parents=True)
    with pytest.raises(DeployError, match="Is a directory") as refused:
        asyncio.run(connect())
    reported = int("Is a directory" in refused.value.message
                   and "\n" not in refused.value.message)
    foreign_runs += marker.exists()
    # A crash: a traceback on the agent's stderr, in any of the connects above.
    crashes = tracebacks(*serve_said)
    assert (repaired, reported, foreign_runs, crashes) == (len(damage), 1, 0, 0)
    record("agent_cache_damage", trials=len(damage) + 1, faults=len(damage) + 1,
           repaired=repaired, reported_clearly=reported, foreign_code_run=foreign_runs,
           crashes=crashes, seconds=round(time.monotonic() - t0, 1))


def test_laptops_deploying_at_once_share_one_cache(sshd: SshServer, ssh_config: Path) -> None:
    bundle = deploy.build_bundle()
    failures: list[BaseException] = []
    uploads = 0

    async def laptop() -> AgentClient:
        return await AgentClient.connect(SSHTransport("pod", config_file=str(ssh_config)))

    async def round_() -> int:
        clients = await asyncio.gather(*(laptop() for _ in range(LAPTOPS)),
                                       return_exceptions=True)
        sent = 0
        for c in clients:
            if isinstance(c, BaseException):
                failures.append(c)
                continue
            assert c.hello.agent_sha256 == bundle.sha256
            await c.ping()
            await c.list_runs()
            sent += c.deploy.transferred > 0
            await c.close()
        return sent

    t0 = time.monotonic()
    corrupted = temp_left = 0
    for _ in range(ROUNDS):
        sshd.reset_pod()  # an empty cache each round
        uploads += asyncio.run(round_())
        files = sorted(p.name for p in (sshd.pod_cache / "agent").iterdir())
        ours = sshd.pod_cache / "agent" / f"{bundle.sha256}.pyz"
        temp_left += len([f for f in files if f != ours.name])
        corrupted += not ours.exists() or ours.read_bytes() != bundle.data
        assert files == [f"{bundle.sha256}.pyz"], files  # no temp file left behind
        assert (sshd.pod_cache / "agent" / files[0]).read_bytes() == bundle.data
    assert failures == []
    assert uploads >= ROUNDS  # somebody uploaded each time; the others may have reused it
    assert (corrupted, temp_left) == (0, 0)
    record("concurrent_laptops", trials=ROUNDS, laptops=LAPTOPS,
           connects=ROUNDS * LAPTOPS, uploads=uploads, failures=len(failures),
           cache_corrupted=corrupted, temp_files_left=temp_left,
           seconds=round(time.monotonic() - t0, 1))


def test_many_bootstraps_racing_on_a_missing_cache_dir(tmp_path: Path) -> None:
    """Eight bootstraps at once on a pod where not even the cache root exists yet."""
    bundle = deploy.build_bundle()
    failures: list[str] = []

    async def race(cache: Path) -> None:
        transports = [LocalTransport(env={"GPUWS_POD_CACHE": str(cache)}) for _ in range(8)]
        results = await asyncio.gather(*(deploy.start_agent(t) for t in transports),
                                       return_exceptions=True)
        for res in results:
            if isinstance(res, BaseException):
                failures.append(f"{type(res).__name__}: {res}")
                continue
            proc, _, _ = res
            proc.stdin.write_eof()
            await proc.wait()

    for i in range(4):
        cache = tmp_path / f"cache{i}"
        asyncio.run(race(cache))
        assert (cache / "agent" / f"{bundle.sha256}.pyz").read_bytes() == bundle.data
    assert failures == []
