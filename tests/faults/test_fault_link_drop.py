"""The SSH link dropped at random moments of a live run: every event arrives exactly once.

A real sshd, a real detached worker writing an event every few milliseconds, a real
SQLite store. The link is cut DROPS times, alternating between aborting the laptop's TCP
connection and SIGKILLing the server-side sshd session process (found among the sshd
daemon's children). After each cut the laptop reconnects and re-attaches from
``store.last_seq + 1``, as ``gpuws attach`` does. At the end the store is compared with
the pod's own ``events.ndjson``, read directly from disk.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import time
import uuid
from pathlib import Path

from faults.figures import record  # type: ignore[import-not-found]
from faults.helpers import (  # type: ignore[import-not-found]
    Comparison,
    catch_loop_errors,
    child_pids,
    ticker_spec,
    tracebacks,
)
from gpuws import protocol
from gpuws.client import AgentClient
from gpuws.sessions.store import Store
from gpuws.transport.ssh import SSHTransport
from sshd import SshServer  # type: ignore[import-not-found]

DROPS = 24


def kill_server_sessions(server: SshServer) -> int:
    """SIGKILL every per-connection sshd process (the daemon's children)."""
    assert server.proc is not None
    killed = 0
    for pid in child_pids(server.proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    return killed


def test_link_dropped_mid_run_loses_and_duplicates_nothing(ssh_config: Path,
                                                          sshd: SshServer) -> None:
    rng = random.Random(20261121)
    stop_file = sshd.pod_cache / f"stop-{uuid.uuid4().hex}"
    store = Store()
    sid = store.open_session("pod", "ssh", None, 1.0)
    received: list[int] = []
    torn: list[protocol.BadLine] = []
    methods = {"tcp_abort": 0, "sshd_kill": 0}
    statuses: list[str] = []
    loop_errors: list[dict[str, object]] = []
    serve_said: list[str] = []

    def on_event(ev: protocol.Events | protocol.BadLine) -> None:
        if isinstance(ev, protocol.Event) and ev.run_id is not None and ev.seq is not None:
            received.append(ev.seq)
            store.ingest(sid, ev)  # committed before the next event is looked at

    async def connect() -> AgentClient:
        client = await AgentClient.connect(SSHTransport("pod", config_file=str(ssh_config)))
        client.add_listener(on_event)
        return client

    async def go() -> str:
        catch_loop_errors(loop_errors)
        client = await connect()
        run_id = (await client.start_run(ticker_spec(stop_file))).run_id
        for trial in range(DROPS):
            # A random moment: sometimes right after (re)attaching, sometimes well into
            # the stream.
            await asyncio.sleep(rng.uniform(0.02, 0.35))
            if trial % 2 == 0:
                methods["tcp_abort"] += 1
                client.transport._conn.abort()  # type: ignore[attr-defined]
            else:
                methods["sshd_kill"] += 1
                assert kill_server_sessions(sshd) >= 1
            await asyncio.wait_for(client.wait_closed(), 10)
            torn.extend(client.bad_lines)
            serve_said.extend(client.stderr_tail)
            await client.close()
            client = await connect()
            info = await client.attach(run_id, from_seq=store.last_seq(run_id) + 1)
            statuses.append(info.status)
        stop_file.touch()
        deadline = time.monotonic() + 30
        while store.run(run_id).status == "running":
            assert time.monotonic() < deadline, "the run did not finish"
            await asyncio.sleep(0.05)
        assert client.bad_lines == []  # the one link never cut saw no torn frame
        serve_said.extend(client.stderr_tail)
        await client.close()
        return run_id

    t0 = time.monotonic()
    run_id = asyncio.run(go())
    elapsed = time.monotonic() - t0

    pod_lines = (sshd.pod_cache / "runs" / run_id / "events.ndjson").read_bytes().splitlines()
    pod_events = [protocol.decode_event(line) for line in pod_lines]
    stored = store.events(run_id)
    worker_log = (sshd.pod_cache / "runs" / run_id / "worker.log").read_text()
    lost = len(set(range(len(pod_lines))) - set(received))
    duplicated = len(received) - len(set(received))
    seen = Comparison(sshd.pod_cache, run_id, stored)
    out_of_order = sum(1 for a, b in itertools.pairwise(received) if b <= a)
    # Every drop really was mid-run: the run was still going at each re-attach.
    assert statuses == ["running"] * DROPS
    assert received == list(range(len(pod_lines)))  # exactly once, in order
    assert stored == pod_events  # the store holds the pod's log, event for event
    ticks = [e.text for e in stored if isinstance(e, protocol.Output)]
    assert ticks[-1].startswith("ticks=") and len(ticks) == int(ticks[-1][6:]) + 1
    assert isinstance(stored[-1], protocol.RunFinished) and stored[-1].status == "ok"
    assert store.run(run_id).status == "ok"
    assert worker_log == ""
    store.close()
    running = statuses.count("running")
    # A crash: a traceback from the worker or any serve, or an exception the laptop's
    # loop was left with.
    crashes = tracebacks(worker_log, *serve_said) + len(loop_errors)
    assert (lost, duplicated, out_of_order, seen.lost, crashes) == (0, 0, 0, 0, 0)
    record("link_drop", trials=DROPS, faults=DROPS, tcp_abort=methods["tcp_abort"],
           sshd_kill=methods["sshd_kill"], events=len(pod_lines), lost=lost,
           duplicated=duplicated, out_of_order=out_of_order, store_lost=seen.lost,
           running_at_reattach=running, final_status=stored[-1].status,
           torn_frames_reported=len(torn), crashes=crashes, seconds=round(elapsed, 1))
