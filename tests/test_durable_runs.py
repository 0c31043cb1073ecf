"""Durable runs: detached workers, re-attach after a dropped link, cancel, list — for real."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpuws import protocol
from gpuws.client import AgentClient
from gpuws.errors import AgentError
from gpuws.transport.local import LocalTransport
from gpuws.transport.ssh import SSHTransport
from sshd import SshServer  # type: ignore[import-not-found]

COUNT = "for i in $(seq 1 40); do echo line-$i; sleep 0.03; done"


async def wait_finished(events: list, timeout: float = 30) -> protocol.RunFinished:
    for _ in range(int(timeout / 0.05)):
        for e in events:
            if isinstance(e, protocol.RunFinished):
                return e
        await asyncio.sleep(0.05)
    raise AssertionError(f"run did not finish; got {[type(e).__name__ for e in events]}")


def test_cmd_run_streams_output_artifacts_and_decodes_strictly() -> None:
    async def go() -> tuple[list, AgentClient]:
        client = await AgentClient.connect(LocalTransport())
        events: list = []
        client.add_listener(events.append)
        cmd = ("echo to-stdout; echo to-stderr >&2; printf 'abc' > $GPUWS_ARTIFACT_DIR/out.txt;"
               " exit 0")
        info = await client.start_run(protocol.RunSpec(workload=f"cmd:{cmd}", tiers=[1]))
        assert info.status in ("running", "ok")
        await wait_finished(events)
        await client.close()
        return events, client

    events, client = asyncio.run(go())
    assert client.bad_lines == []  # every line the agent wrote decoded strictly
    assert [e.seq for e in events] == list(range(len(events)))
    texts = [(e.stream, e.text) for e in events if isinstance(e, protocol.Output)]
    assert ("stdout", "to-stdout") in texts and ("stderr", "to-stderr") in texts
    skipped = [e for e in events if isinstance(e, protocol.TierFinished) and e.tier == 1]
    assert skipped[0].status == "skipped" and "command" in skipped[0].reason
    art = next(e for e in events if isinstance(e, protocol.Artifact))
    assert art.name == "out.txt" and art.size == 3
    assert art.sha256 == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    fin = events[-1]
    assert isinstance(fin, protocol.RunFinished) and fin.status == "ok" and fin.exit_code == 0


def test_failing_command_records_exit_code() -> None:
    async def go() -> protocol.RunFinished:
        client = await AgentClient.connect(LocalTransport())
        events: list = []
        client.add_listener(events.append)
        await client.start_run(protocol.RunSpec(workload="cmd:echo boom >&2; exit 3", tiers=[]))
        fin = await wait_finished(events)
        await client.close()
        return fin

    fin = asyncio.run(go())
    assert fin.status == "failed" and fin.exit_code == 3 and "code 3" in (fin.error or "")


def test_dropped_link_loses_nothing_and_reattach_is_exactly_once(
        ssh_config: Path, sshd: SshServer) -> None:
    async def go() -> tuple[list, list, str]:
        first = await AgentClient.connect(SSHTransport("pod", config_file=str(ssh_config)))
        seen: list = []
        first.add_listener(seen.append)
        info = await first.start_run(protocol.RunSpec(workload=f"cmd:{COUNT}", tiers=[]))
        while not any(isinstance(e, protocol.Output) for e in seen):
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        # Drop the link abruptly, mid-run.
        first.transport._conn.abort()  # type: ignore[attr-defined]
        await first.wait_closed()
        before = list(seen)
        second = await AgentClient.connect(SSHTransport("pod", config_file=str(ssh_config)))
        rest: list = []
        second.add_listener(rest.append)
        await second.attach(info.run_id, from_seq=before[-1].seq + 1)
        await wait_finished(rest)
        await second.close()
        return before, rest, info.run_id

    before, rest, _run_id = asyncio.run(go())
    allev = before + rest
    assert [e.seq for e in allev] == list(range(len(allev)))  # gap-free, no duplicates
    lines = [e.text for e in allev if isinstance(e, protocol.Output)]
    assert lines == [f"line-{i}" for i in range(1, 41)]
    assert 0 < len([e for e in before if isinstance(e, protocol.Output)]) < 40  # really mid-run
    assert isinstance(allev[-1], protocol.RunFinished) and allev[-1].status == "ok"


def test_attach_from_zero_replays_everything(ssh_config: Path) -> None:
    async def go() -> tuple[list, list]:
        c = await AgentClient.connect(SSHTransport("pod", config_file=str(ssh_config)))
        live: list = []
        c.add_listener(live.append)
        info = await c.start_run(protocol.RunSpec(workload="cmd:echo a; echo b", tiers=[]))
        await wait_finished(live)
        c.remove_listener(live.append)
        replay: list = []
        c.add_listener(replay.append)
        await c.attach(info.run_id, from_seq=0)
        await wait_finished(replay)
        runs = await c.list_runs()
        assert [r.status for r in runs if r.run_id == info.run_id] == ["ok"]
        await c.close()
        return live, replay

    live, replay = asyncio.run(go())
    assert live == replay


def test_cancel_kills_the_process_group() -> None:
    async def go() -> tuple[protocol.RunInfo, list, int]:
        client = await AgentClient.connect(LocalTransport())
        events: list = []
        client.add_listener(events.append)
        info = await client.start_run(protocol.RunSpec(
            workload="cmd:sleep 60 & echo child=$!; wait", tiers=[]))
        while not any(isinstance(e, protocol.Output) for e in events):
            await asyncio.sleep(0.02)
        child = int(next(e.text for e in events if isinstance(e, protocol.Output)).split("=")[1])
        result = await client.cancel(info.run_id)
        await wait_finished(events)
        await client.close()
        return result, events, child

    result, events, child = asyncio.run(go())
    assert result.status == "cancelled"
    assert isinstance(events[-1], protocol.RunFinished) and events[-1].status == "cancelled"
    assert not alive(child)


def alive(pid: int) -> bool:
    """Running and not a zombie (an orphan may wait a moment for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_attach_to_unknown_run_is_a_clear_error() -> None:
    async def go() -> None:
        client = await AgentClient.connect(LocalTransport())
        try:
            await client.attach("20990101-000000-abcdef")
        finally:
            await client.close()

    with pytest.raises(AgentError, match="does not exist"):
        asyncio.run(go())


def test_unknown_request_is_refused() -> None:
    async def go() -> protocol.Events:
        client = await AgentClient.connect(LocalTransport())
        try:
            fut = asyncio.get_running_loop().create_future()
            client._pending[99] = fut
            client.proc.stdin.write(b'{"type":"rm_rf","req":99}\n')
            return await asyncio.wait_for(fut, 10)
        finally:
            await client.close()

    ev = asyncio.run(go())
    assert isinstance(ev, protocol.Error) and ev.code == "unknown_request"
