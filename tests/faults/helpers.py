"""What the fault tests share: a ticking workload, /proc lookups, a recording listener."""

from __future__ import annotations

import asyncio
import itertools
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


# ------------------------------------------------------------------ figures, computed
#: How every Python traceback starts: in a pod log or on a stderr, one is a crash.
TRACEBACK = "Traceback (most recent call last)"


def tracebacks(*texts: str) -> int:
    """Python tracebacks in ``texts`` (a worker.log, the agent's stderr, the CLI's)."""
    return sum(text.count(TRACEBACK) for text in texts)


def catch_loop_errors(into: list[dict[str, object]] | None = None
                      ) -> list[dict[str, object]]:
    """What the running loop reports as unhandled (a task's exception nobody took, a
    callback that raised): collected in ``into`` (or a new list) instead of logged, so a
    test can count them."""
    errors: list[dict[str, object]] = [] if into is None else into
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    return errors


class Comparison:
    """The store's events of a run against the pod's own log, event by event.

    ``lost``: events of the pod's log the store lacks or holds with other contents;
    ``duplicated``: seqs the store holds more than once; ``out_of_order``: stored events
    whose seq does not follow the one before; ``torn``: lines of the pod's log that are not
    a whole event (a torn write), its last line without a newline included.
    """

    def __init__(self, pod_cache: Path, run_id: str, stored: list[protocol.Events]) -> None:
        data = (pod_cache / "runs" / run_id / "events.ndjson").read_bytes()
        lines = data.splitlines()
        decoded = [protocol.decode_event(line) for line in lines]
        self.torn = sum(isinstance(e, protocol.BadLine) for e in decoded)
        self.torn += bool(data) and not data.endswith(b"\n")
        self.pod: list[protocol.Events] = [e for e in decoded
                                           if not isinstance(e, protocol.BadLine)]
        seqs = [e.seq for e in stored]
        self.duplicated = len(seqs) - len(set(seqs))
        self.out_of_order = sum(1 for a, b in itertools.pairwise(seqs)
                                if a is None or b is None or b <= a)
        by_seq = {e.seq: e for e in stored}
        self.lost = sum(1 for e in self.pod if by_seq.get(e.seq) != e)
        self.events = len(lines)
