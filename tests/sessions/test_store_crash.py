"""kill -9 during ingest never corrupts the store or loses a committed batch."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from gpuws.sessions.store import Store

BATCH = 300
TRIALS = 10

# The writer: ingests batches forever, printing "begin N" before each batch and N once
# ingest_many returned (i.e. once it is committed). Every batch holds samples and one rule
# finding, so both the events table and a derived table are being written when the kill lands.
WRITER = r"""
import json, sys
from pathlib import Path
from gpuws.sessions.store import Store

store = Store(Path(sys.argv[1]))
sid, batch_size = sys.argv[2], int(sys.argv[3])
# Lines are cheap to make (a template), so the writer spends its time inside ingest_many
# and the kill usually lands mid-transaction.
values = json.dumps([0.24] * 40)
samples = '{"type":"samples","run_id":"r","seq":%d,"ts":%d,"values_ms":' + values + '}'
rule = ('{"type":"rule_findings","run_id":"r","seq":%d,"ts":%d,"rules":[{"kernel":"saxpy",'
        '"rule":"R","kind":"OPT","message":"batch %d","est_speedup_pct":1.0}]}')
batch = 0
while True:
    first = batch * batch_size
    lines = [(rule % (first, first, batch)).encode()]
    lines += [(samples % (seq, seq)).encode() for seq in range(first + 1, first + batch_size)]
    print("begin", batch, flush=True)
    store.ingest_many(sid, lines)
    print(batch, flush=True)
    batch += 1
"""


def test_sigkill_mid_ingest_keeps_the_store_whole(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    with Store(path) as s:
        sid = s.open_session("pod", "local", None, 1.0)
    rng = random.Random(7)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    committed = -1
    mid_batch = 0
    for trial in range(TRIALS):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), sid, str(BATCH)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert proc.stdout is not None
        # Let it commit a few more batches, then kill it at a random moment inside the next.
        target = committed + rng.randint(1, 4)
        deadline = time.monotonic() + 30
        while committed < target:
            line = proc.stdout.readline()
            assert line, f"writer died: {proc.stderr.read().decode() if proc.stderr else ''}"
            if not line.startswith(b"begin"):
                committed = int(line)
            assert time.monotonic() < deadline
        time.sleep(rng.random() * 0.004)
        proc.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate()
        tail = rest.splitlines()  # printed between our last read and the kill
        for line in tail:
            if not line.startswith(b"begin"):
                committed = int(line)
        mid_batch += bool(tail) and tail[-1].startswith(b"begin")
        assert proc.returncode == -signal.SIGKILL

        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)], trial
        count, high = conn.execute("SELECT COUNT(*), MAX(seq) FROM events").fetchone()
        conn.close()
        # Every batch that was reported committed is there, and batches are all-or-nothing.
        assert count % BATCH == 0 and count == high + 1, (trial, count, high)
        assert count >= (committed + 1) * BATCH, (trial, count, committed)
        committed = count // BATCH - 1  # the next writer resumes after what is stored

        with Store(path) as s:
            assert s.last_seq("r") == count - 1
            assert len(s.rules("r")) == count // BATCH  # derived rows went with their events
    # The point is killing inside a transaction: most trials must have done so.
    assert mid_batch >= TRIALS // 2, mid_batch
