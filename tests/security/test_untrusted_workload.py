"""A hostile workload, through a real OpenSSH sshd and the real agent, with ``gpuws run``.

The workload is an ordinary ``cmd:`` run: what it does, any benchmark script could do.
It appends forged lines to its own run's ``events.ndjson`` (``$GPUWS_RUN_DIR`` is in its
environment), leaves a FIFO and links to /dev/zero in its artifact directory, prints
markup, escape sequences and a long ``\\r`` progress bar. Afterwards: nothing was written
outside the data dir, the earlier run in the store is unchanged, the disk and the process
stayed bounded, nothing crashed, every honest event of the run is stored, and ``runs``,
``export`` and ``attach`` still work with that run on the pod.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpuws import protocol
from gpuws.cli import main
from gpuws.sessions.store import Store
from sshd import SshServer  # type: ignore[import-not-found]

pytestmark = pytest.mark.ssh


def _forgeries(old_run: str, escape: Path) -> list[str]:
    """Lines a workload appends to its own event log (run id and seq filled in by sh)."""
    now = time.time()
    forged = [
        # Another (earlier) run: refused, that run is untouched.
        {"type": "run_finished", "run_id": old_run, "seq": 99, "ts": now, "status": "failed",
         "wall_s": 1.0},
        {"type": "kernel_metrics", "run_id": old_run, "seq": 100, "ts": now, "kernel": "k",
         "launch": 0, "metrics": {"duration_ns": 1.0}},
        # Its own run, with impossible numbers and names.
        {"type": "output", "run_id": "RUN", "seq": 2**63, "ts": now, "stream": "stdout",
         "text": "seq 2^63"},
        {"type": "output", "run_id": "RUN", "seq": -1, "ts": now, "stream": "stdout",
         "text": "seq -1"},
        {"type": "output", "run_id": "RUN", "seq": 3, "ts": 1e300, "stream": "stdout",
         "text": "ts 1e300"},
        {"type": "artifact", "run_id": "RUN", "seq": 4, "ts": now,
         "name": f"../../../../../../../..{escape}", "path": str(escape), "size": 16,
         "sha256": "0" * 64},
        {"type": "artifact", "run_id": "RUN", "seq": 5, "ts": now, "name": "zero.bin",
         "path": "/dev/zero", "size": 16, "sha256": "0" * 64},
        {"type": "artifact", "run_id": "RUN", "seq": 6, "ts": now, "name": "\x1b]0;pwned\x07",
         "path": "x", "size": 1, "sha256": "0" * 64},
    ]
    return [json.dumps(f) for f in forged]


def test_a_hostile_workload_changes_nothing_outside_its_run(
        ssh_config: Path, sshd: SshServer, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    # An earlier, honest run in the store.
    assert main(["run", "pod", "-F", str(ssh_config), "-w", "cmd:echo honest"]) == 0
    capsys.readouterr()
    with Store() as store:
        (old,) = [r for s in store.sessions() for r in store.runs(s.id)]
        before = (old, store.events(old.run_id), store.artifacts(old.run_id))

    escape = tmp_path / "escaped-file"
    script = tmp_path / "hostile.sh"
    lines = "\n".join(f"printf '%s\\n' {json.dumps(line)} | sed \"s/RUN/$GPUWS_RUN_ID/\" "
                      f">> \"$GPUWS_RUN_DIR/events.ndjson\"" for line in _forgeries(
                          old.run_id, escape))
    script.write_text(f"""#!/bin/sh
echo 'plain [/] [bold]markup[/bold] and an escape \033]0;pwned\007 \033[2J'
{lines}
cd "$GPUWS_ARTIFACT_DIR"
mkfifo fifo
ln -s /dev/zero zero-link
ln -s /etc/passwd passwd-link
echo real > 'name [bold]x with markup.txt'
echo report > report.txt
# A progress bar: one long line of carriage-return updates.
i=0; while [ $i -lt 2000 ]; do printf '\\r%s' "step $i ......................"
  i=$((i+1)); done
echo
echo done
""")
    script.chmod(0o755)
    code = main(["run", "pod", "-F", str(ssh_config), "-w", f"cmd:sh {script}"])
    out = capsys.readouterr()
    assert code == 0, out.err
    printed = out.out + out.err
    assert "Traceback" not in printed
    assert "\x1b" not in printed and "\x07" not in printed  # shown, never interpreted
    assert "[/] [bold]markup[/bold]" in printed
    assert not escape.exists()
    with Store() as store:
        assert (store.run(old.run_id), store.events(old.run_id),
                store.artifacts(old.run_id)) == before
        runs = [r for s in store.sessions() for r in store.runs(s.id) if r.run_id != old.run_id]
        (run,) = runs
        events = store.events(run.run_id)
        arts = {a.name: a for a in store.artifacts(run.run_id)}
        sessions = store.sessions()
    assert run.status == "ok"
    # The honest files came home; the FIFO and the links were reported, not followed.
    assert {"report.txt", "name [bold]x with markup.txt"} <= set(arts)
    assert all(a.status == "pulled" for a in arts.values())
    assert not {"fifo", "zero-link", "passwd-link", "zero.bin"} & set(arts)
    home = Path(str(arts["report.txt"].local_path)).resolve()
    assert home.read_text() == "report\n"
    # Every honest event the worker wrote is stored (the pod's log, forgeries aside).
    pod_log = (sshd.pod_cache / "runs" / run.run_id / "events.ndjson").read_bytes()
    honest = [protocol.decode_event(line) for line in pod_log.splitlines()]
    honest = [e for e in honest if isinstance(e, protocol.Event) and e.run_id == run.run_id
              and e.seq is not None and 0 <= e.seq < 2**31 and (e.ts or 0) < 4e9
              and not (isinstance(e, protocol.Artifact) and e.size == 16)
              and not (isinstance(e, protocol.Artifact) and e.sha256 == "0" * 64)]
    stored = {(e.seq, type(e).__name__) for e in events}
    missing = [e for e in honest if (e.seq, type(e).__name__) not in stored]
    assert not [e for e in missing if not isinstance(e, protocol.Output)], missing
    assert any(isinstance(e, protocol.Output) and "step 1999" in e.text for e in events)
    assert all(s.ended is not None for s in sessions)  # every session ended
    # The run stays listable and exportable.
    assert main(["runs", "pod", "-F", str(ssh_config)]) == 0
    report = tmp_path / "report.md"
    assert main(["export", run.session_id[:8], "-o", str(report)]) == 0
    assert "\x1b" not in report.read_text()
