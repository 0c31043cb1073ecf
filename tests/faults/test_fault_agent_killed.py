"""The agent killed on the pod: ``serve`` (the link's end) or the run's worker.

Over a real sshd, through the laptop engine both faces use (``live.engine.Engine``: the
boundary, the store first, then the face):

- ``serve`` SIGKILLed mid-run, SERVE_KILLS times: the engine says the link dropped (one
  clear line), reconnects by itself and re-attaches from the store's last seq; the worker
  goes on, and the run completes with every event exactly once;
- the worker (or its whole process group) SIGKILLed at a random moment, WORKER_KILLS
  runs: the run ends with ``run_finished`` *failed* saying the worker died, which the
  laptop records; what was recorded before stays.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import time
import uuid
from pathlib import Path

from faults.figures import record  # type: ignore[import-not-found]
from faults.helpers import (  # type: ignore[import-not-found]
    Comparison,
    Recorder,
    alive,
    catch_loop_errors,
    pod_log,
    ticker_spec,
    tracebacks,
)
from gpuws import protocol
from gpuws.client import AgentClient
from gpuws.errors import ConnectError
from gpuws.live.engine import Engine, Notice, ReconnectPolicy
from gpuws.live.link import Target
from gpuws.live.storeio import StoreHandle
from gpuws.sessions.store import Store
from gpuws.transport.ssh import SSHTransport
from sshd import SshServer  # type: ignore[import-not-found]

SERVE_KILLS = 5
WORKER_KILLS = 6


async def connect(cfg: Path) -> AgentClient:
    return await AgentClient.connect(SSHTransport("pod", config_file=str(cfg)))


def test_serve_killed_is_reported_and_the_run_resumes(ssh_config: Path, sshd: SshServer
                                                      ) -> None:
    rng = random.Random(5)
    stop_file = sshd.pod_cache / f"stop-{uuid.uuid4().hex}"
    notices: list[Notice] = []
    printed: list[protocol.Events] = []
    loop_errors: list[dict[str, object]] = []

    async def go() -> tuple[str, protocol.RunFinished]:
        catch_loop_errors(loop_errors)
        engine = Engine(StoreHandle(), on_notice=notices.append,
                        on_batch=lambda b: printed.extend(b.events),
                        reconnect=ReconnectPolicy(first_s=0.2, max_s=1.0, give_up_s=20))
        try:
            link = await engine.connect(Target("pod", ssh_config=str(ssh_config)))
            run_id = (await engine.start_run(ticker_spec(stop_file))).run_id
            worker_pid = None
            for kill in range(SERVE_KILLS):
                await asyncio.sleep(rng.uniform(0.1, 0.4))
                os.kill(link.client.hello.pid, signal.SIGKILL)  # serve, on the pod
                # The engine notices, reconnects by itself and re-attaches the run.
                deadline = time.monotonic() + 15
                while sum(n.kind == "reconnected" for n in notices) <= kill:
                    assert time.monotonic() < deadline, notices
                    await asyncio.sleep(0.05)
                assert engine.link is not None and engine.link is not link
                link = engine.link
                events = await engine.store.call(lambda s: s.events(run_id))
                worker_pid = worker_pid or events[0].pid  # type: ignore[attr-defined]
                assert alive(worker_pid), "killing serve must not touch the run"
            stop_file.touch()
            fin = await asyncio.wait_for(engine.wait_finished(run_id), 30)
            return run_id, fin
        finally:
            await engine.close()
            await engine.store.close()

    t0 = time.monotonic()
    run_id, fin = asyncio.run(go())
    assert fin.status == "ok"
    lost = [n for n in notices if n.kind == "link_lost"]
    assert len(lost) == SERVE_KILLS
    for n in lost:  # one clear line each: what happened, and that the run goes on
        assert "dropped" in n.message and "runs on the pod go on" in n.message
    reported = sum("dropped" in n.message and "runs on the pod go on" in n.message
                   and "\n" not in n.message for n in lost)
    assert all(f"resumed {run_id} from event" in n.message
               for n in notices if n.kind == "reconnected")
    pod = [protocol.decode_event(line) for line in pod_log(sshd.pod_cache, run_id)]
    with Store() as store:
        seen = Comparison(sshd.pod_cache, run_id, store.events(run_id))
        assert store.events(run_id) == pod  # every event, exactly once
        assert store.run(run_id).status == "ok"
        (session,) = store.sessions()
        assert session.ended is not None  # one session across the reconnects, ended
    # What the face was given: every event, in order, none twice.
    assert sorted({e.seq for e in printed if e.run_id == run_id}) == list(range(len(pod)))
    # A crash: an exception the laptop's loop was left with (the killed serves had no
    # time to write one).
    crashes = len(loop_errors)
    assert (seen.lost, seen.duplicated, reported, crashes) == (0, 0, SERVE_KILLS, 0)
    record("serve_killed", trials=SERVE_KILLS, faults=SERVE_KILLS, events=seen.events,
           lost=seen.lost, duplicated=seen.duplicated, reported_clearly=reported,
           crashes=crashes, seconds=round(time.monotonic() - t0, 1))


def test_worker_killed_ends_the_run_failed_and_keeps_what_was_recorded(
        ssh_config: Path, sshd: SshServer) -> None:
    rng = random.Random(6)
    store = Store()
    sid = store.open_session("pod", "ssh", None, 1.0)
    rec = Recorder(store, sid)
    outcomes: list[protocol.RunFinished] = []
    crashes = 0

    async def go() -> list[str]:
        nonlocal crashes
        loop_errors = catch_loop_errors()
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
        crashes = tracebacks("\n".join(client.stderr_tail))
        await client.close()
        crashes += len(loop_errors)
        return run_ids

    t0 = time.monotonic()
    run_ids = asyncio.run(go())
    lost = duplicated = ended_failed = events = 0
    for run_id, fin in zip(run_ids, outcomes, strict=True):
        assert fin.status == "failed"
        assert "worker process died" in (fin.error or "")
        ended_failed += "worker process died" in (fin.error or "")
        pod = [protocol.decode_event(line) for line in pod_log(sshd.pod_cache, run_id)]
        seen = Comparison(sshd.pod_cache, run_id, store.events(run_id))
        lost, duplicated = lost + seen.lost, duplicated + seen.duplicated
        events += seen.events
        assert store.events(run_id) == pod  # nothing recorded before the kill is missing
        assert rec.seqs(run_id) == list(range(len(pod)))
        assert store.run(run_id).status == "failed"
    store.close()
    assert (lost, duplicated, ended_failed, crashes) == (0, 0, WORKER_KILLS, 0)
    record("worker_killed", trials=WORKER_KILLS, faults=WORKER_KILLS, events=events,
           runs_ended_failed=ended_failed, lost=lost, duplicated=duplicated,
           crashes=crashes, seconds=round(time.monotonic() - t0, 1))


def test_a_run_gone_after_the_reconnect_ends_its_wait_with_the_reason(
        ssh_config: Path, sshd: SshServer) -> None:
    """The link drops and, behind the same name, the pod no longer has the run (its
    directory removed, as on a rebuilt pod): the reconnect succeeds, the re-attach is
    refused, and whoever waits for the run learns why at once — before this, the refusal
    died inside the engine's reconnect task and ``gpuws run`` waited for ever."""
    stop_file = sshd.pod_cache / f"stop-{uuid.uuid4().hex}"
    notices: list[Notice] = []

    async def go() -> tuple[str, BaseException]:
        engine = Engine(StoreHandle(), on_notice=notices.append,
                        reconnect=ReconnectPolicy(first_s=0.2, max_s=1.0, give_up_s=20))
        worker = None
        try:
            link = await engine.connect(Target("pod", ssh_config=str(ssh_config)))
            info = await engine.start_run(ticker_spec(stop_file))
            while not (events := await engine.store.call(lambda s: s.events(info.run_id))):
                await asyncio.sleep(0.05)
            worker = events[0]
            assert isinstance(worker, protocol.RunStarted)
            os.killpg(worker.pid, signal.SIGSTOP)  # nothing more is written for the run
            shutil.rmtree(worker.run_dir)
            os.kill(link.client.hello.pid, signal.SIGKILL)  # serve: the link drops
            try:
                await asyncio.wait_for(engine.wait_finished(info.run_id), 20)
            except ConnectError as exc:
                return info.run_id, exc
            raise AssertionError("wait_finished returned for a run the pod no longer has")
        finally:
            if worker is not None:
                os.killpg(worker.pid, signal.SIGKILL)
            await engine.close()
            await engine.store.close()

    run_id, error = asyncio.run(go())
    assert f"run {run_id} could not be resumed" in str(error)
    assert any(n.kind == "reconnected" for n in notices)  # the link itself came back
    assert any(n.kind == "not_resumed" and n.run_id == run_id for n in notices)
    with Store() as store:
        assert store.events(run_id)  # what arrived before the drop is kept
