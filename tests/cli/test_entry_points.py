"""What a person types is checked before anything is done (issue 24): each mistake is one
``gpuws: …`` line on stderr with the documented exit code, no traceback, nothing
half-written left behind. The real CLI runs as a subprocess over a real store.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gpuws.sessions.store import Store


def _recorded() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gpuws_entry_recorded", Path(__file__).parents[1] / "sessions" / "recorded.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECORDED = _recorded()


def gpuws(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuws", *argv], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL, cwd=cwd,
                          env=os.environ.copy())


def one_clean_line(res: subprocess.CompletedProcess[str], code: int) -> str:
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuws: "), res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    return lines[0]


@pytest.fixture
def session_id() -> str:
    with Store() as store:
        sid = store.open_session("pod", "local", None, 3.99, started=RECORDED.T0)
        store.ingest_many(sid, RECORDED.saxpy_run("r1"))
        return sid


def test_export_refuses_an_output_it_cannot_write_before_reading_anything(
        session_id: str, tmp_path: Path) -> None:
    a_file = tmp_path / "plain.txt"
    a_file.write_text("x")
    cases = {str(tmp_path): "is a directory",
             str(tmp_path / "missing" / "r.md"): "does not exist",
             str(a_file / "r.md"): "is not a directory"}
    for output, cause in cases.items():
        line = one_clean_line(gpuws("export", session_id, "-o", output), 2)
        assert cause in line and "-o" in line
    assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))


def test_export_to_a_file_says_its_size_in_bytes_not_characters(session_id: str,
                                                                tmp_path: Path) -> None:
    out = tmp_path / "r.md"
    res = gpuws("export", session_id, "-o", str(out))
    assert res.returncode == 0, res.stderr
    size = out.stat().st_size
    assert f"({size:,} bytes)" in res.stderr
    assert size > len(out.read_text())  # the report holds multi-byte characters (µs, ·)


@pytest.mark.ssh
def test_attach_and_cancel_of_an_unknown_id_are_usage_errors_that_leave_no_session(
        ssh_config: Path) -> None:
    for verb in ("attach", "cancel"):
        line = one_clean_line(gpuws(verb, "pod", "nosuchrun", "-F", str(ssh_config)), 2)
        # The hint carries the -F the pod was reached with (issue 34): pasted, it works.
        assert "no run nosuchrun on pod" in line, line
        assert f"`gpuws runs -F {ssh_config} pod` lists" in line, line
    with Store() as store:
        assert store.sessions() == []


def test_only_a_session_without_runs_is_discarded(session_id: str) -> None:
    with Store() as store:
        assert not store.discard_if_empty(session_id)  # it holds run r1
        empty = store.open_session("pod", "ssh", None, 1.0, started=RECORDED.T0 + 10)
        store.add_phase(empty, None, "connect", RECORDED.T0 + 10, RECORDED.T0 + 11)
        assert store.discard_if_empty(empty)
        assert [s.id for s in store.sessions()] == [session_id]


def test_a_bad_rate_is_refused_before_connecting() -> None:
    # "nosuchhost.invalid" would fail to resolve: the refusal must come first.
    for verb in ("run", "connect"):
        for rate in ("-3", "nan", "inf", "cheap"):
            argv = [verb, "nosuchhost.invalid", "--rate", rate]
            if verb == "run":
                argv += ["-w", "builtin:saxpy"]
            res = gpuws(*argv)
            assert res.returncode == 2, (verb, rate, res.stderr)
            assert "argument --rate" in res.stderr and "Traceback" not in res.stderr
            assert "resolve" not in res.stderr.lower() and "connect" not in res.stderr.split(
                "error:")[-1].lower()


def test_only_a_run_that_finished_ok_can_be_the_baseline(session_id: str) -> None:
    with Store() as store:
        store.ingest_many(session_id, RECORDED.cancelled_run("c1", t0=RECORDED.T0 + 60))
    line = one_clean_line(gpuws("baseline", "c1"), 2)
    assert "c1 cancelled and cannot be a baseline" in line and "gpuws history" in line
    with Store() as store:
        assert not store.run("c1").is_baseline
    assert gpuws("baseline", "r1").returncode == 0
    assert gpuws("baseline", "c1", "--off").returncode == 0  # unmarking is always fine


def test_a_failed_run_says_why_on_stderr_with_exit_7() -> None:
    res = gpuws("run", "local", "-w", "cmd:echo started; exit 3", "--rate", "0")
    assert res.returncode == 7, (res.stdout, res.stderr)
    assert "started" in res.stdout  # the run's own output stays on stdout
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("gpuws: ")]
    assert len(lines) == 1 and lines[0].startswith("gpuws: Run ") and " failed: " in lines[0]
    assert "Traceback" not in res.stderr


def test_a_headless_run_over_budget_says_so(tmp_path: Path) -> None:
    """$3,600/h ($1/s) and a $20 budget: 80% is reached 16 s and 100% 20 s into the
    session, while the workload sleeps 22 s; both lines reach stderr, whole, as the TUI
    shows them. (The lines give the share reached when said: a $2 budget's 80% came
    before a connect of more than 1.6 s on a loaded machine had finished.)"""
    Path(os.environ["GPUWS_CONFIG"]).write_text(
        "[hosts.local]\nrate_usd_per_hour = 3600.0\nbudget_usd = 20.0\n")
    res = gpuws("run", "local", "-w", "cmd:sleep 22; echo done")
    assert res.returncode == 0, res.stderr
    budget = [ln for ln in res.stderr.splitlines() if "budget" in ln]
    assert len(budget) == 2, res.stderr
    assert "80% of its $20.00 budget at $3600.00/h" in budget[0]
    assert "100% of its" in budget[1] and "keeps billing until it is stopped" in budget[1]


def test_run_json_keeps_stdout_ndjson_when_artifacts_come_home() -> None:
    res = gpuws("run", "local", "--json", "-w",
                "cmd:head -c 1000 /dev/urandom > $GPUWS_ARTIFACT_DIR/b.bin; echo made")
    assert res.returncode == 0, res.stderr
    import json

    events = [json.loads(line) for line in res.stdout.splitlines()]  # every line is JSON
    assert any(e["type"] == "artifact" for e in events)
    assert "pulled b.bin" in res.stderr
