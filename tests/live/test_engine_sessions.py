"""Sessions end: on every exit the engine sees, and after a SIGKILL at the next start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpuws.cli import main
from gpuws.live.lease import close_orphans
from gpuws.sessions.store import Store

KILLED = """
import sys, time
from gpuws.live.lease import SessionLease
from gpuws.sessions.store import Store
with Store() as s:
    sid = s.open_session("pod", "ssh", None, 2.0, started=time.time() - 30)
lease = SessionLease(sid)
print(sid, flush=True)
time.sleep(60)
"""


def test_a_killed_process_leaves_its_session_to_be_ended_at_the_next_start() -> None:
    proc = subprocess.Popen([sys.executable, "-c", KILLED], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ))
    assert proc.stdout is not None
    sid = proc.stdout.readline().strip()
    with Store() as store:
        assert close_orphans(store) == []  # its process lives: the session is live
        assert store.session(sid).ended is None
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert close_orphans(store) == [sid]
        session = store.session(sid)
        # Ended at its last recorded activity (here: its start), not at "now".
        assert session.ended is not None and session.ended <= time.time() - 29


def test_attach_and_detach_end_their_sessions(ssh_config: Path, capsys: object) -> None:
    assert main(["run", "pod", "-F", str(ssh_config), "-w",
                 "cmd:for i in 1 2 3; do echo tick-$i; sleep 0.3; done", "--detach"]) == 0
    run_id = capsys.readouterr().out.split()[-1]  # type: ignore[attr-defined]
    assert main(["attach", "pod", "-F", str(ssh_config), run_id]) == 0
    with Store() as store:
        sessions = store.sessions()
        assert len(sessions) == 2 and all(s.ended is not None for s in sessions)
        assert store.run(run_id).status == "ok"
        events = store.events(run_id)
    assert [e.seq for e in events] == list(range(len(events)))


def test_attach_prints_the_whole_run_from_its_first_event(ssh_config: Path,
                                                          capsys: object) -> None:
    """The header and first events stored by --detach are shown again by attach."""
    assert main(["run", "pod", "-F", str(ssh_config), "-w",
                 "cmd:for i in $(seq 1 200); do echo line-$i; done; sleep 0.5",
                 "--detach"]) == 0
    run_id = capsys.readouterr().out.split()[-1]  # type: ignore[attr-defined]
    assert main(["attach", "pod", "-F", str(ssh_config), run_id]) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert f"run {run_id}" in out  # the header
    lines = [ln for ln in out.splitlines() if "│ line-" in ln]
    assert [ln.split("line-")[1] for ln in lines] == [str(i) for i in range(1, 201)]
