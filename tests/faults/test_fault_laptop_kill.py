"""The laptop side SIGKILLed during heavy ingest: the store stays whole, nothing acked is lost.

A writer process ingests batches of the real recorded H200 run (re-sequenced, so every
batch is new events of every type: samples, metrics, rule findings, tier phases,
artifacts) into a real SQLite store, and reports each batch once ``ingest_many`` has
returned, i.e. once it is committed. The test SIGKILLs it at a random moment, usually
inside a transaction, then checks the file: ``PRAGMA integrity_check``, every
acknowledged event present, batches all-or-nothing, the derived tables in step with the
events. The next writer resumes where the store ends, as a reconnecting laptop would.

Writers are forked from the test process (already importing gpuws) so that KILLS trials
take seconds, not a Python start-up each.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import sqlite3
import time
from pathlib import Path

from faults.figures import record  # type: ignore[import-not-found]
from gpuws.sessions.store import Store

KILLS = 60
RECORDED = Path(__file__).parent.parent / "fixtures" / "recorded" / "saxpy_h200.ndjson"
RUN = "20261121-000000-crash1"
TEMPLATE = [json.loads(line) for line in RECORDED.read_text().splitlines()]
REPEAT = 4
BATCH = len(TEMPLATE) * REPEAT
RULES_PER_BATCH = REPEAT * sum(len(e["rules"]) for e in TEMPLATE if e["type"] == "rule_findings")
TIERS_PER_BATCH = REPEAT * sum(1 for e in TEMPLATE if e["type"] == "tier_started")


def batch_lines(number: int) -> list[bytes]:
    """Batch ``number``: the recorded run REPEAT times, with fresh seqs."""
    out = []
    first = number * BATCH
    for i in range(BATCH):
        event = dict(TEMPLATE[i % len(TEMPLATE)], run_id=RUN, seq=first + i)
        out.append(json.dumps(event).encode())
    return out


def writer(path: Path, sid: str, first_batch: int, ack_fd: int) -> None:
    """Ingest batches forever; ``b N`` before a batch, ``N`` once it is committed."""
    store = Store(path)
    number = first_batch
    while True:
        lines = batch_lines(number)
        os.write(ack_fd, b"b%d\n" % number)
        store.ingest_many(sid, lines)
        os.write(ack_fd, b"%d\n" % number)
        number += 1


def start_writer(path: Path, sid: str, first_batch: int) -> tuple[int, int]:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read_fd)
            writer(path, sid, first_batch, write_fd)
        finally:
            os._exit(1)
    os.close(write_fd)
    return pid, read_fd


def read_acks(fd: int, buf: bytearray, timeout: float) -> list[bytes]:
    ready, _, _ = select.select([fd], [], [], timeout)
    if ready:
        chunk = os.read(fd, 65536)
        buf += chunk
    lines = bytes(buf).split(b"\n")
    buf[:] = lines.pop()
    return lines


def test_sigkill_during_heavy_ingest(tmp_path: Path) -> None:
    path = tmp_path / "laptop.db"
    with Store(path) as s:
        sid = s.open_session("pod", "ssh", None, 2.0)
    rng = random.Random(50)
    acked = -1  # last batch reported committed
    mid_transaction = 0
    integrity_failures = 0
    acked_lost = 0
    crashes = 0  # writers that ended other than by our SIGKILL
    t0 = time.monotonic()
    for trial in range(KILLS):
        pid, fd = start_writer(path, sid, acked + 1)
        buf = bytearray()
        target = acked + rng.randint(1, 3)
        deadline = time.monotonic() + 30
        last = b""
        while acked < target:
            assert time.monotonic() < deadline, "the writer stalled"
            for line in read_acks(fd, buf, 1.0):
                last = line
                if not line.startswith(b"b"):
                    acked = int(line)
        # A random moment inside the next batch (or two).
        time.sleep(rng.random() * 0.02)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        crashes += not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        while True:  # acks written between our last read and the kill still count
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            buf += chunk
        os.close(fd)
        for line in bytes(buf).split(b"\n"):
            if line:
                last = line
                if not line.startswith(b"b"):
                    acked = int(line)
        mid_transaction += last.startswith(b"b")

        conn = sqlite3.connect(path)
        try:
            integrity = conn.execute("PRAGMA integrity_check").fetchall()
            integrity_failures += integrity != [("ok",)]
            assert integrity == [("ok",)], trial
            count, high = conn.execute(
                "SELECT COUNT(*), MAX(seq) FROM events WHERE run_id = ?", (RUN,)).fetchone()
            rules = conn.execute("SELECT COUNT(*) FROM rules").fetchone()[0]
            phases = conn.execute("SELECT COUNT(*) FROM phases WHERE tier IS NOT NULL"
                                  ).fetchone()[0]
        finally:
            conn.close()
        # Every acknowledged batch is there; a batch is all or nothing.
        acked_lost += max(0, (acked + 1) * BATCH - count)
        assert count >= (acked + 1) * BATCH, (trial, count, acked)
        assert count % BATCH == 0 and high == count - 1, (trial, count, high)
        # The projections were written in the same transactions as their events.
        assert rules == (count // BATCH) * RULES_PER_BATCH, (trial, rules)
        assert phases == (count // BATCH) * TIERS_PER_BATCH, (trial, phases)
        acked = count // BATCH - 1  # the next writer resumes after what is stored
    with Store(path) as s:
        assert s.last_seq(RUN) == (acked + 1) * BATCH - 1
        assert len(s.events(RUN)) == (acked + 1) * BATCH  # every stored body still decodes
        assert oct(path.stat().st_mode & 0o777) == "0o600"
    # The point is to kill inside a transaction: many kills must land there (about two
    # thirds do on an idle machine; a loaded one shifts the timing, hence the margin).
    assert mid_transaction >= KILLS // 4, mid_transaction
    assert (acked_lost, integrity_failures, crashes) == (0, 0, 0)
    record("laptop_kill", trials=KILLS, faults=KILLS, mid_transaction=mid_transaction,
           batches=acked + 1, events=(acked + 1) * BATCH, acked_events_lost=acked_lost,
           integrity_failures=integrity_failures, crashes=crashes,
           seconds=round(time.monotonic() - t0, 1))
