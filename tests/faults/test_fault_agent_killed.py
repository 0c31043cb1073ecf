"""The agent killed on the pod: ``serve`` (the link's end) or the run's worker.

Over a real sshd, through the headless ``gpuws run`` path (``commands.run.Ingest``: the
store first, then the console):

- ``serve`` SIGKILLed mid-run, SERVE_KILLS times: the laptop says the link dropped and
  how to resume (one clear ``ConnectError``), the worker goes on, and a re-attach from
  the store's last seq completes the run with every event exactly once;
- the worker (or its whole process group) SIGKILLed at a random moment, WORKER_KILLS
  runs: the run ends with ``run_finished`` *failed* saying the worker died, which the
  laptop records; what was recorded before stays.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
import uuid
from pathlib import Path

import pytest

from faults.figures import record  # type: ignore[import-not-found]
from faults.helpers import (  # type: ignore[import-not-found]
    Recorder,
    alive,
    pod_log,
    ticker_spec,
)
from gpuws import protocol
from gpuws.client import AgentClient
from gpuws.commands.run import Ingest, Printer
from gpuws.errors import ConnectError
from gpuws.sessions.store import Store
from gpuws.transport.ssh import SSHTransport
from sshd import SshServer  # type: ignore[import-not-found]

SERVE_KILLS = 5
WORKER_KILLS = 6


async def connect(cfg: Path) -> AgentClient:
    return await AgentClient.connect(SSHTransport("pod", config_file=str(cfg)))


def test_serve_killed_is_reported_and_the_run_resumes(ssh_config: Path, sshd: SshServer,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    rng = random.Random(5)
    stop_file = sshd.pod_cache / f"stop-{uuid.uuid4().hex}"
    store = Store()
    sid = store.open_session("pod", "ssh", None, 1.0)
    errors: list[ConnectError] = []

    async def go() -> str:
        client = await connect(ssh_config)
        ingest = Ingest(store, sid, Printer(as_json=False))
        client.add_listener(ingest.listener)
        run_id = (await client.start_run(ticker_spec(stop_file))).run_id
        worker_pid = None
        for _ in range(SERVE_KILLS):
            await asyncio.sleep(rng.uniform(0.1, 0.4))
            os.kill(client.hello.pid, signal.SIGKILL)  # serve, on the pod
            with pytest.raises(ConnectError) as info:
                await asyncio.wait_for(ingest.until_finished(run_id, client), 10)
            errors.append(info.value)
            await client.close()
            worker_pid = worker_pid or store.events(run_id)[0].pid  # type: ignore[attr-defined]
            assert alive(worker_pid), "killing serve must not touch the run"
            client = await connect(ssh_config)
            client.add_listener(ingest.listener)
            info_ = await client.attach(run_id, from_seq=store.last_seq(run_id) + 1)
            assert info_.status == "running"
        stop_file.touch()
        fin = await asyncio.wait_for(ingest.until_finished(run_id, client), 30)
        assert fin.status == "ok"
        await client.close()
        return run_id

    t0 = time.monotonic()
    run_id = asyncio.run(go())
    capsys.readouterr()
    for err in errors:
        # One clear line, saying what happened and exactly how to resume.
        assert err.title == "Connection lost"
        assert "the run goes on there" in err.message
        assert f"gpuws attach HOST {run_id}" in err.remedy
    pod = [protocol.decode_event(line) for line in pod_log(sshd.pod_cache, run_id)]
    assert store.events(run_id) == pod
    assert store.run(run_id).status == "ok"
    store.close()
    record("serve_killed", trials=SERVE_KILLS, faults=SERVE_KILLS, events=len(pod),
           lost=0, reported_clearly=len(errors), crashes=0,
           seconds=round(time.monotonic() - t0, 1))


def test_worker_killed_ends_the_run_failed_and_keeps_what_was_recorded(
        ssh_config: Path, sshd: SshServer) -> None:
    rng = random.Random(6)
    store = Store()
    sid = store.open_session("pod", "ssh", None, 1.0)
    rec = Recorder(store, sid)
    outcomes: list[protocol.RunFinished] = []

    async def go() -> list[str]:
        client = await connect(ssh_config)
        client.add_listener(rec)
        run_ids = []
        for trial in range(WORKER_KILLS):
            stop_file = sshd.pod_cache / f"stop-{uuid.uuid4().hex}"
            run_id = (await client.start_run(ticker_spec(stop_file))).run_id
            run_ids.append(run_id)
            await rec.wait_events(run_id, rng.randint(3, 60))
            worker = store.events(run_id)[0]
            assert isinstance(worker, protocol.RunStarted)
            if trial % 2:
                os.killpg(worker.pid, signal.SIGKILL)  # the worker and the workload
            else:
                os.kill(worker.pid, signal.SIGKILL)  # the worker alone
            before = len(rec.seqs(run_id))
            fin = await rec.wait_finished(run_id, timeout=15)
            outcomes.append(fin)
            assert len(rec.seqs(run_id)) > before  # the laptop learnt it, promptly
        assert (await client.ping()) < 5  # serve is fine
        await client.close()
        return run_ids

    t0 = time.monotonic()
    run_ids = asyncio.run(go())
    for run_id, fin in zip(run_ids, outcomes, strict=True):
        assert fin.status == "failed"
        assert "worker process died" in (fin.error or "")
        pod = [protocol.decode_event(line) for line in pod_log(sshd.pod_cache, run_id)]
        assert store.events(run_id) == pod  # nothing recorded before the kill is missing
        assert rec.seqs(run_id) == list(range(len(pod)))
        assert store.run(run_id).status == "failed"
    store.close()
    record("worker_killed", trials=WORKER_KILLS, faults=WORKER_KILLS,
           runs_ended_failed=len(outcomes), lost=0, crashes=0,
           seconds=round(time.monotonic() - t0, 1))
