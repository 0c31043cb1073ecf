"""What the fault tests share: a ticking workload, /proc lookups, a recording listener."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from gpuws import protocol
from gpuws.sessions.store import Store

#: A line every ~3 ms (one `sleep` per line) until the file named by GPUWS_FAULT_STOP exists.
TICKER = ('i=0; while [ ! -e "$GPUWS_FAULT_STOP" ]; do i=$((i+1)); echo "tick-$i"; '
          'sleep 0.003; done; echo "ticks=$i"')


def ticker_spec(stop_file: Path) -> protocol.RunSpec:
    return protocol.RunSpec(workload=f"cmd:{TICKER}", tiers=[],
                            env={"GPUWS_FAULT_STOP": str(stop_file)})


def child_pids(ppid: int) -> list[int]:
    """Processes whose parent is ``ppid`` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == ppid:
            out.append(int(entry))
    return out


def alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False


class Recorder:
    """A listener that stores every run event as it arrives, like ``gpuws run`` does."""

    def __init__(self, store: Store, session_id: str) -> None:
        self.store = store
        self.session_id = session_id
        self.received: list[tuple[str, int]] = []
        self.finished: dict[str, protocol.RunFinished] = {}

    def __call__(self, ev: protocol.Events | protocol.BadLine) -> None:
        if isinstance(ev, protocol.Event) and ev.run_id is not None and ev.seq is not None:
            self.received.append((ev.run_id, ev.seq))
            self.store.ingest(self.session_id, ev)
            if isinstance(ev, protocol.RunFinished):
                self.finished[ev.run_id] = ev

    def seqs(self, run_id: str) -> list[int]:
        return [seq for rid, seq in self.received if rid == run_id]

    async def wait_finished(self, run_id: str, timeout: float = 30) -> protocol.RunFinished:
        deadline = time.monotonic() + timeout
        while run_id not in self.finished:
            assert time.monotonic() < deadline, f"run {run_id} did not finish"
            await asyncio.sleep(0.02)
        return self.finished[run_id]

    async def wait_events(self, run_id: str, count: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(self.seqs(run_id)) < count:
            assert time.monotonic() < deadline, f"run {run_id}: fewer than {count} events"
            await asyncio.sleep(0.01)


def pod_log(pod_cache: Path, run_id: str) -> list[bytes]:
    """The run's events.ndjson as the pod has it, line by line (each must be whole)."""
    data = (pod_cache / "runs" / run_id / "events.ndjson").read_bytes()
    assert data == b"" or data.endswith(b"\n"), "the pod's log ends in a torn line"
    return data.splitlines()
