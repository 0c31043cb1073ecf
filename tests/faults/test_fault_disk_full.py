"""The pod's disk fills up while a run writes its events: reported, and nothing recorded lost.

Two ways to run out of room, both for real:

- ``tmpfs``: the pod's run directory is a 512 KiB tmpfs (mounted here when we may, i.e.
  as root; skipped otherwise) and the workload prints until it is full: ``write`` fails
  with ENOSPC, often after taking half a line;
- ``fsize``: ``RLIMIT_FSIZE`` is put on the running worker (``prlimit``, no privilege
  needed) a little above its log's current size: ``write`` fails with EFBIG.

Either way the run must end with a ``run_finished`` *failed* that says why, the pod's
``events.ndjson`` must be whole lines only, and the laptop must have received and stored
every one of them, exactly once.
"""

from __future__ import annotations

import asyncio
import resource
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from faults.figures import record  # type: ignore[import-not-found]
from faults.helpers import (  # type: ignore[import-not-found]
    Comparison,
    Recorder,
    catch_loop_errors,
    pod_log,
    ticker_spec,
    tracebacks,
)
from gpuws import protocol
from gpuws.client import AgentClient
from gpuws.sessions.store import Store
from gpuws.transport.local import LocalTransport

#: As fast as the shell can print, 120-byte lines, until something stops it.
FLOOD = 'i=0; while :; do i=$((i+1)); echo "flood-$i-' + "x" * 100 + '"; done'


def mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                          str(where)], capture_output=True)
    return res.returncode == 0


async def run_until_finished(cache: Path, spec: protocol.RunSpec, store: Store, sid: str,
                             limit_bytes: int | None = None
                             ) -> tuple[str, protocol.RunFinished, int]:
    """The run, its final event, and the crashes seen on the way: tracebacks on serve's
    stderr and exceptions the laptop's loop was left with. (The worker's own traceback
    of the failed write, in its worker.log, is its report, not a crash: it goes on to
    end the run.)"""
    loop_errors = catch_loop_errors()
    client = await AgentClient.connect(LocalTransport(env={"GPUWS_POD_CACHE": str(cache)}))
    rec = Recorder(store, sid)
    client.add_listener(rec)
    run_id = (await client.start_run(spec)).run_id
    if limit_bytes is not None:
        await rec.wait_events(run_id, 5)
        started = store.events(run_id)[0]
        assert isinstance(started, protocol.RunStarted)
        log = cache / "runs" / run_id / "events.ndjson"
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.prlimit(started.pid, resource.RLIMIT_FSIZE,
                         (log.stat().st_size + limit_bytes, hard))
    fin = await rec.wait_finished(run_id, timeout=30)
    assert await client.ping() < 5  # serve is unharmed
    # A replay from zero gives the same events: the log on the pod is whole.
    replay = Recorder(Store(store.path), sid)
    client.remove_listener(rec)
    client.add_listener(replay)
    await client.attach(run_id, from_seq=0)
    await replay.wait_finished(run_id)
    replay.store.close()
    assert replay.seqs(run_id) == rec.seqs(run_id)
    serve_said = "\n".join(client.stderr_tail)
    await client.close()
    return run_id, fin, tracebacks(serve_said) + len(loop_errors)


def check(cache: Path, store: Store, run_id: str, fin: protocol.RunFinished) -> Comparison:
    """The store against the pod's log: the counts are the figures, asserted here."""
    lines = pod_log(cache, run_id)
    pod = [protocol.decode_event(line) for line in lines]
    seen = Comparison(cache, run_id, store.events(run_id))
    assert seen.torn == 0, "a torn line in the log"
    assert not any(isinstance(e, protocol.BadLine) for e in pod), "a torn line in the log"
    assert [e.seq for e in pod] == list(range(len(pod)))  # type: ignore[union-attr]
    assert seen.lost == 0 and seen.duplicated == 0
    assert store.events(run_id) == pod  # every recorded event reached the laptop
    assert pod[-1] == fin and fin.status == "failed"
    assert store.run(run_id).status == "failed"
    return seen


def said_why(fin: protocol.RunFinished, *words: str) -> bool:
    """The run's end is one clear reason: failed, naming the cause in these words."""
    return fin.status == "failed" and all(w in (fin.error or "") for w in words)


def test_disk_full_tmpfs(tmp_path: Path) -> None:
    cache = tmp_path / "podcache"
    runs = cache / "runs"
    if not mount_tmpfs(runs, "512k"):
        pytest.skip("cannot mount a tmpfs here (needs root); test_disk_full_fsize covers EFBIG")
    t0 = time.monotonic()
    try:
        with Store() as store:
            sid = store.open_session("pod", "local", None, 1.0)
            run_id, fin, crashes = asyncio.run(run_until_finished(
                cache, protocol.RunSpec(workload=f"cmd:{FLOOD}", tiers=[]), store, sid))
            seen = check(cache, store, run_id, fin)
            assert "No space left on device" in (fin.error or "")
            assert "every event before this one is kept" in (fin.error or "")
            reported = int(said_why(fin, "No space left on device",
                                    "every event before this one is kept"))
            assert not (runs / run_id / "events.ndjson.reserve").exists()
    finally:
        subprocess.run(["umount", "-l", str(runs)], check=False)
    assert reported == 1 and crashes == 0
    record("disk_full_tmpfs", trials=1, faults=1, events=seen.events, lost=seen.lost,
           duplicated=seen.duplicated, torn_lines=seen.torn, reported_clearly=reported,
           crashes=crashes, seconds=round(time.monotonic() - t0, 1))


def test_disk_full_fsize(tmp_path: Path) -> None:
    cache = tmp_path / "podcache"
    t0 = time.monotonic()
    trials = 3
    events = lost = duplicated = torn = reported = crashes = 0
    with Store() as store:
        sid = store.open_session("pod", "local", None, 1.0)
        for trial in range(trials):
            stop = tmp_path / f"stop-{uuid.uuid4().hex}"
            run_id, fin, crashed = asyncio.run(run_until_finished(
                cache, ticker_spec(stop), store, sid, limit_bytes=2000 + 1500 * trial))
            seen = check(cache, store, run_id, fin)
            events, lost, torn = events + seen.events, lost + seen.lost, torn + seen.torn
            duplicated += seen.duplicated
            # The worker could not write its last word to the log; serve did, quoting it.
            assert "worker process died" in (fin.error or "")
            assert "File too large" in (fin.error or "")
            reported += said_why(fin, "worker process died", "File too large")
            crashes += crashed
    assert (lost, duplicated, torn, reported, crashes) == (0, 0, 0, trials, 0)
    record("disk_full_fsize", trials=trials, faults=trials, events=events, lost=lost,
           duplicated=duplicated, torn_lines=torn, reported_clearly=reported,
           crashes=crashes, seconds=round(time.monotonic() - t0, 1))
