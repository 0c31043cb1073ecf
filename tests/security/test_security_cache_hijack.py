"""The pod's cache and run directories cannot be hijacked by another user of a shared pod.

Before running code from its cache, the bootstrap checks who owns the cache directories
and that nobody else may write to them; before starting a run, the agent checks its run
directories the same way. Here the real bootstrap and agent (run as the pod's user, as
over SSH) meet a cache left world-writable, group-writable, owned by another uid, a runs
directory owned by someone else or replaced by a symlink, and a run directory planted in
advance: each is refused with one clear message and nothing of ours is written there.
"""

from __future__ import annotations

import asyncio
import gc
import os
from pathlib import Path

import pytest

from faults.figures import record  # type: ignore[import-not-found]
from gpuws import protocol
from gpuws.client import AgentClient
from gpuws.errors import AgentError, DeployError
from gpuws.transport.local import LocalTransport

NOBODY = 65534
AS_ROOT = os.geteuid() == 0
FIGS = {"refused": 0, "repaired": 0, "hijacked": 0}


def written_into(where: Path, *expected: str) -> list[str]:
    """What is in a directory that should hold only ``expected``: each case where
    something of ours was written into a directory it refused counts as hijacked."""
    found = sorted(p.name for p in where.iterdir())
    extra = [n for n in found if n not in expected]
    FIGS["hijacked"] += bool(extra)
    return found


async def connect(cache: Path) -> AgentClient:
    return await AgentClient.connect(LocalTransport(env={"GPUWS_POD_CACHE": str(cache)}))


def deploy_refused(cache: Path) -> str:
    async def go() -> DeployError:
        with pytest.raises(DeployError) as info:
            await connect(cache)
        # start_agent's failure path drops the refused bootstrap's subprocess transport
        # without closing it. Collect it while this loop still runs: after the loop is
        # closed its finalizer fails, and CPython 3.11 then breaks pytest's AST work.
        await asyncio.sleep(0.1)
        gc.collect()
        return info.value

    FIGS["refused"] += 1
    return asyncio.run(go()).message


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722, 0o702])
def test_writable_cache_is_refused(tmp_path: Path, mode: int) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(mode)
    msg = deploy_refused(cache)
    assert "writable by others" in msg and str(cache) in msg
    assert written_into(cache) == []  # no bundle was written into it


def test_writable_agent_dir_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "agent").mkdir(parents=True, mode=0o700)
    cache.chmod(0o700)
    (cache / "agent").chmod(0o777)
    msg = deploy_refused(cache)
    assert str(cache / "agent") in msg
    assert written_into(cache / "agent") == []


@pytest.mark.skipif(not AS_ROOT, reason="giving a directory to another uid needs root")
@pytest.mark.parametrize("which", ["cache", "agent"])
def test_cache_owned_by_another_user_is_refused(tmp_path: Path, which: str) -> None:
    cache = tmp_path / "cache"
    (cache / "agent").mkdir(parents=True, mode=0o700)
    cache.chmod(0o700)
    os.chown(cache / "agent" if which == "agent" else cache, NOBODY, NOBODY)
    msg = deploy_refused(cache)
    assert "owned by another user" in msg
    assert written_into(cache / "agent") == []


def start_refused(cache: Path, run_id: str | None = None) -> AgentError:
    async def go() -> AgentError:
        client = await connect(cache)
        try:
            with pytest.raises(AgentError) as info:
                await client.start_run(protocol.RunSpec(workload="cmd:echo hijacked", tiers=[]),
                                       run_id=run_id)
            assert await client.ping() < 5  # serve is still there
            return info.value
        finally:
            await client.close()
    FIGS["refused"] += 1
    return asyncio.run(go())


def fresh_cache(tmp_path: Path) -> Path:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    cache.chmod(0o700)
    return cache


@pytest.mark.skipif(not AS_ROOT, reason="giving a directory to another uid needs root")
def test_runs_dir_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    cache = fresh_cache(tmp_path)
    (cache / "runs").mkdir(mode=0o700)
    os.chown(cache / "runs", NOBODY, NOBODY)
    err = start_refused(cache)
    assert err.code == "pod_error" and "owned by uid 65534" in err.message
    assert written_into(cache / "runs") == []


def test_runs_dir_symlinked_elsewhere_is_refused(tmp_path: Path) -> None:
    cache = fresh_cache(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (cache / "runs").symlink_to(elsewhere)
    err = start_refused(cache)
    assert err.code == "pod_error" and "not a plain directory" in err.message
    assert written_into(elsewhere) == []


def test_planted_run_dir_is_never_used(tmp_path: Path) -> None:
    cache = fresh_cache(tmp_path)
    planted = cache / "runs" / "20990101-000000-abcdef"
    planted.mkdir(parents=True, mode=0o700)
    (cache / "runs").chmod(0o700)
    (planted / "events.ndjson").write_text("")
    err = start_refused(cache, run_id=planted.name)
    assert err.code == "pod_error" and "File exists" in err.message
    assert written_into(planted, "events.ndjson") == ["events.ndjson"]
    assert (planted / "events.ndjson").read_text() == ""  # nothing appended to the plant


def test_loose_runs_dir_of_ours_is_made_private(tmp_path: Path) -> None:
    """Ours but group/other-writable (an old umask): tightened to 0700, then used."""
    cache = fresh_cache(tmp_path)
    (cache / "runs").mkdir()
    (cache / "runs").chmod(0o777)

    async def go() -> protocol.RunInfo:
        client = await connect(cache)
        try:
            return await client.start_run(protocol.RunSpec(workload="cmd:true", tiers=[]))
        finally:
            await client.close()

    info = asyncio.run(go())
    assert oct((cache / "runs").stat().st_mode & 0o777) == "0o700"
    assert oct((cache / "runs" / info.run_id).stat().st_mode & 0o777) == "0o700"
    FIGS["repaired"] += 1


def test_figures() -> None:
    # Counted by the tests above (this one runs last in the file).
    assert FIGS["hijacked"] == 0
    record("cache_hijack", trials=FIGS["refused"] + FIGS["repaired"], refused=FIGS["refused"],
           repaired=FIGS["repaired"], hijacked=FIGS["hijacked"])
