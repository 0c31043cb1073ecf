"""The headless twins end to end over a real sshd: run, pull, sessions, export, attach, report."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from gpuws.cli import main
from gpuws.errors import RunError, UsageError
from gpuws.sessions.store import Store

FIX = Path(__file__).parent / "fixtures" / "ncu-2025.3.1-h200"


def test_cmd_run_over_ssh_pulls_artifacts_and_exports(ssh_config: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    cmd = ("cmd:echo hello-from-pod; head -c 200000 /dev/urandom > $GPUWS_ARTIFACT_DIR/blob.bin;"
           " echo warn >&2")
    code = main(["run", "pod", "-F", str(ssh_config), "-w", cmd, "--rate", "2.0"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "hello-from-pod" in out and "pulled blob.bin" in out
    with Store() as store:
        (session,) = store.sessions()
        (run,) = store.runs(session.id)
        (art,) = store.artifacts(run.run_id)
        assert art.status == "pulled" and art.size == 200000
        assert hashlib.sha256(Path(art.local_path or "").read_bytes()).hexdigest() == art.sha256
        assert session.rate_usd_per_hour == 2.0 and session.probe is not None
    assert main(["sessions", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["runs"] == 1 and rows[0]["host"] == "pod"
    report = tmp_path / "session.md"
    assert main(["export", rows[0]["id"][:6], "-o", str(report)]) == 0
    md = report.read_text()
    assert "blob.bin" in md and art.sha256 in md and "hello-from-pod" not in md.split("##")[0]
    assert "/bin/sh -c" in md  # the exact command is there to reproduce


def test_detach_attach_runs_and_cancel(ssh_config: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "pod", "-F", str(ssh_config), "-w",
                 "cmd:for i in 1 2 3; do echo tick-$i; sleep 0.2; done", "--detach"]) == 0
    run_id = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", run_id)
    assert main(["attach", "pod", "-F", str(ssh_config), run_id]) == 0
    out = capsys.readouterr().out
    assert out.count("tick-3") == 1 and "run ok" in out
    with Store() as store:
        evs = store.events(run_id)
        assert [e.seq for e in evs] == list(range(len(evs)))  # exactly once, no gaps
    assert main(["run", "pod", "-F", str(ssh_config), "-w", "cmd:sleep 30", "--detach"]) == 0
    long_id = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(["runs", "pod", "-F", str(ssh_config), "--json"]) == 0
    listed = {r["run_id"]: r["status"] for r in json.loads(capsys.readouterr().out)}
    assert listed[run_id] == "ok" and listed[long_id] == "running"
    assert main(["cancel", "pod", "-F", str(ssh_config), long_id]) == 0
    assert "cancelled" in capsys.readouterr().out


def test_failing_workloads_give_one_clear_line(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    assert main(["run", "local", "-w", f"file:{tmp_path}/missing.py"]) == UsageError.exit_code
    err = capsys.readouterr().err
    assert "cannot read the workload file" in err and len(err.strip().splitlines()) == 1
    assert main(["run", "local", "-w", "builtin:saxpy"]) == RunError.exit_code
    assert "No GPU on the pod" in capsys.readouterr().out
    assert main(["run", "local", "-w", "builtin:no_such_kernel"]) == RunError.exit_code
    assert "saxpy" in capsys.readouterr().out  # the error lists the valid names


def test_report_reads_ncu_csv_on_the_laptop(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(FIX / "saxpy_raw.csv"), "--json"]) == 0
    (kernel,) = json.loads(capsys.readouterr().out)
    assert kernel["kernel"].startswith("saxpy") and kernel["metrics"]["duration_ns"] > 0
    assert main(["report", str(FIX / "no_such.csv")]) != 0
