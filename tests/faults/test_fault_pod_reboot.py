"""The pod rebooted or replaced: its runs are gone; the laptop says so and keeps its record.

"Rebooted" here is what a person meets after a pod restart or replacement: every gpuws
process on the pod is gone (serve and the workers, SIGKILLed) and the run directories
are deleted. The laptop recorded part of each run before that. Re-attaching, through
``gpuws attach`` on the command line, must answer with one clear line and a non-zero
exit, and the store must still hold exactly what it had (the export still renders it).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
import uuid
from pathlib import Path

import pytest

from faults.figures import record  # type: ignore[import-not-found]
from faults.helpers import (  # type: ignore[import-not-found]
    Recorder,
    alive,
    ticker_spec,
    tracebacks,
)
from gpuws import protocol
from gpuws.cli import main
from gpuws.client import AgentClient
from gpuws.errors import AgentError
from gpuws.sessions.store import Store
from gpuws.transport.ssh import SSHTransport
from sshd import SshServer  # type: ignore[import-not-found]

REBOOTS = 3


def test_pod_reboot_is_reported_and_the_store_keeps_its_record(
        ssh_config: Path, sshd: SshServer, capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.monotonic()
    lost_events = 0
    reported = 0
    crashes = 0
    with Store() as store:
        sid = store.open_session("pod", "ssh", None, 2.0)
    for trial in range(REBOOTS):
        store = Store()
        rec = Recorder(store, sid)

        async def part_of_a_run(store: Store = store, rec: Recorder = rec,
                                trial: int = trial) -> tuple[str, int]:
            client = await AgentClient.connect(SSHTransport("pod", config_file=str(ssh_config)))
            client.add_listener(rec)
            stop = sshd.pod_cache / f"stop-{uuid.uuid4().hex}"
            run_id = (await client.start_run(ticker_spec(stop))).run_id
            await rec.wait_events(run_id, 20 + 30 * trial)
            started = store.events(run_id)[0]
            assert isinstance(started, protocol.RunStarted)
            # The reboot: every process gone at once, then the disk wiped.
            os.killpg(started.pid, signal.SIGKILL)
            os.kill(client.hello.pid, signal.SIGKILL)
            await asyncio.wait_for(client.wait_closed(), 10)
            await client.close()
            while alive(started.pid):
                await asyncio.sleep(0.01)
            shutil.rmtree(sshd.pod_cache / "runs" / run_id)
            return run_id, len(store.events(run_id))

        run_id, kept = asyncio.run(part_of_a_run())
        before = store.events(run_id)
        store.close()
        capsys.readouterr()
        code = main(["attach", "pod", run_id, "-F", str(ssh_config)])
        err = capsys.readouterr().err
        assert code == AgentError.exit_code
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert "No such run" in lines[0] and run_id in lines[0]
        assert "does not exist on this pod" in lines[0] and "gpuws runs" in lines[0]
        # Reported clearly: the documented exit, one line, the cause and the remedy.
        reported += (code == AgentError.exit_code and len(lines) == 1 and all(
            w in lines[0] for w in ("No such run", run_id, "does not exist on this pod",
                                    "gpuws runs")))
        crashes += tracebacks(err)
        with Store() as after:
            now = after.events(run_id)
            lost_events += len({e.seq for e in before} - {e.seq for e in now})
            assert now == before and len(now) == kept
            assert after.run(run_id).session_id == sid
    # The pod lists no runs now, and the record still exports.
    capsys.readouterr()
    assert main(["runs", "pod", "-F", str(ssh_config), "--json"]) == 0
    assert capsys.readouterr().out.strip() == "[]"
    assert main(["export", sid]) == 0
    report = capsys.readouterr().out
    with Store() as store:
        run_ids = [r.run_id for r in store.runs(sid)]
    assert len(run_ids) == REBOOTS
    for run_id in run_ids:
        assert run_id in report
    assert (lost_events, reported, crashes) == (0, REBOOTS, 0)
    record("pod_reboot", trials=REBOOTS, faults=REBOOTS, reported_clearly=reported,
           events_lost=lost_events, crashes=crashes, seconds=round(time.monotonic() - t0, 1))
