"""``gpuws start`` / ``gpuws stop`` (issue 22): the host's own commands, then SSH checked.

The "provider's tool" here is a pair of scripts that start and stop a real OpenSSH sshd
(daemonised, as a pod's would be) from the fixture's config; gpuws waits for it to answer,
and for it to stop answering, over the same transport every command uses.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuws.cli import main
from gpuws.sessions.store import Store
from lease.leasekit import script  # type: ignore[import-not-found]
from sshd import SshServer  # type: ignore[import-not-found]


def _script(path: Path, body: str) -> list[str]:
    return [script(path, body)]


@pytest.fixture
def pod(stopped_pod: SshServer) -> SshServer:
    """The pod is stopped (tests/conftest.py)."""
    return stopped_pod


def _config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start: list[str],
            stop: list[str]) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"[hosts.pod]\nstart = {start!r}\nstop = {stop!r}\n".replace("'", '"'))
    monkeypatch.setenv("GPUWS_CONFIG", str(cfg))


def _start_stop_scripts(pod: SshServer, tmp_path: Path) -> tuple[list[str], list[str]]:
    start = _script(tmp_path / "start.sh", f"exec {pod.boot_command()}\n")
    stop = _script(tmp_path / "stop.sh", f"kill $(cat {pod.root / 'sshd.pid'})\n")
    return start, stop


def test_start_waits_for_ssh_and_stop_checks_it_stopped(
        pod: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    start, stop = _start_stop_scripts(pod, tmp_path)
    _config(tmp_path, monkeypatch, start, stop)
    ssh = str(pod.client_files(tmp_path / "ssh"))
    assert main(["start", "pod", "-F", ssh, "--wait", "30"]) == 0
    assert pod.daemon_pid() is not None
    assert "pod answers" in capsys.readouterr().err
    assert main(["stop", "pod", "-F", ssh, "--wait", "30"]) == 0
    assert pod.daemon_pid() is None
    assert "pod no longer answers" in capsys.readouterr().err
    # Both are recorded, with their times, for the billed time (start to stop).
    with Store() as store:
        rows = store.host_actions("pod")
    assert [(r.action, r.ok) for r in rows] == [("start", True), ("stop", True)]
    assert rows[0].started <= rows[0].ended <= rows[1].started <= rows[1].ended


def test_a_stop_that_did_not_stop_is_said(
        pod: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    start, _ = _start_stop_scripts(pod, tmp_path)
    _config(tmp_path, monkeypatch, start, _script(tmp_path / "noop.sh", "exit 0\n"))
    ssh = str(pod.client_files(tmp_path / "ssh"))
    assert main(["start", "pod", "-F", ssh, "--wait", "30"]) == 0
    capsys.readouterr()
    assert main(["stop", "pod", "-F", ssh, "--wait", "2"]) == 1
    err = capsys.readouterr().err
    assert "gpuws: Lease: the stop did not stop: pod still answers SSH" in err
    assert "waiting for pod to stop answering" in err  # the countdown was visible
    assert pod.daemon_pid() is not None
    with Store() as store:
        stop_row = store.host_actions("pod")[-1]
    assert stop_row.action == "stop" and not stop_row.ok
    assert "the stop did not stop" in stop_row.detail


def test_start_that_never_answers_fails_after_the_bound_with_a_countdown(
        pod: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # The command succeeds but starts nothing: the pod's sshd never comes up.
    _config(tmp_path, monkeypatch, _script(tmp_path / "noop.sh", "exit 0\n"),
            _script(tmp_path / "noop2.sh", "exit 0\n"))
    ssh = str(pod.client_files(tmp_path / "ssh"))
    assert main(["start", "pod", "-F", ssh, "--wait", "2"]) == 1
    err = capsys.readouterr().err
    assert "waiting for pod to answer:" in err
    assert "pod did not answer SSH within 2 s" in err


@pytest.mark.parametrize(("body", "args", "expected"), [
    ("echo 'noise' >&2; echo 'Error: pod abc123 not found' >&2; exit 3\n", [],
     "start command for pod failed (exit 3): Error: pod abc123 not found — fix the cause"),
    ("exec sleep 30\n", ["--timeout", "1"], "start command for pod ran past 1 s"),
    ("printf '\\033]0;pwned\\007evil\\n' >&2; exit 1\n", [], "failed (exit 1): "),
])
def test_a_failing_start_command_is_one_line_with_its_stderr(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        body: str, args: list[str], expected: str) -> None:
    _config(tmp_path, monkeypatch, _script(tmp_path / "start.sh", body),
            _script(tmp_path / "stop.sh", "exit 0\n"))
    assert main(["start", "pod", *args]) == 1
    err = capsys.readouterr().err
    assert expected in err
    assert err.count("\n") == 1 and "\x1b" not in err and "\x07" not in err


def test_missing_command_or_program_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GPUWS_CONFIG", str(tmp_path / "none.toml"))
    assert main(["stop", "pod"]) == 2
    assert "no `stop` command for pod in the config" in capsys.readouterr().err
    _config(tmp_path, monkeypatch, ["/nonexistent/runpodctl", "start"], ["true"])
    assert main(["start", "pod"]) == 1
    err = capsys.readouterr().err
    assert "start command for pod could not run: /nonexistent/runpodctl" in err


def test_host_actions_refuse_nonsense_and_survive_a_reopen(tmp_path: Path) -> None:
    from gpuws.errors import StoreError

    path = tmp_path / "s.db"
    with Store(path) as store:
        with pytest.raises(StoreError, match="unknown host action 'reboot'"):
            store.add_host_action("pod", "reboot", 1.0, 2.0, ok=True)
        with pytest.raises(StoreError, match=r"ends .* before it starts"):
            store.add_host_action("pod", "stop", 5.0, 4.0, ok=True)
        store.add_host_action("pod", "start", 1.0, 2.0, ok=True)
        store.add_host_action("other", "stop", 3.0, 4.0, ok=False, detail="x")
    with Store(path) as store:
        assert [(r.host, r.action, r.ok) for r in store.host_actions()] == [
            ("pod", "start", True), ("other", "stop", False)]
        assert [r.host for r in store.host_actions("other")] == ["other"]


def test_the_export_shows_billed_time_beside_connected_time(
        pod: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 22, point 4: from the start gpuws performed to its stop is what the provider
    bills; the session's connected time is a part of it, the rest named."""
    start, stop = _start_stop_scripts(pod, tmp_path)
    _config(tmp_path, monkeypatch, start, stop)
    monkeypatch.setenv("GPUWS_HOME", str(tmp_path / "home"))
    ssh = str(pod.client_files(tmp_path / "ssh"))
    assert main(["start", "pod", "-F", ssh, "--wait", "30"]) == 0
    assert main(["run", "pod", "-F", ssh, "-w", "cmd:true", "--rate", "3.6"]) == 0
    assert main(["stop", "pod", "-F", ssh, "--wait", "30"]) == 0
    capsys.readouterr()
    with Store() as store:
        (session,) = store.sessions()
        start_row, stop_row = store.host_actions("pod")
    assert main(["export", session.id]) == 0
    md = capsys.readouterr().out
    billed = stop_row.ended - start_row.started
    assert "Billed time: " in md and "from the start gpuws performed" in md, md
    assert "was billed with nobody connected" in md
    assert billed > (session.ended or 0) - session.started  # more than the connected time


def test_run_on_a_stopped_host_says_how_and_starts_it_with_start(
        pod: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 22, point 1: a host that does not answer and has `start`: without a terminal
    the line names `--start`; with it, the host is started, waited for, and the run runs."""
    start, stop = _start_stop_scripts(pod, tmp_path)
    _config(tmp_path, monkeypatch, start, stop)
    monkeypatch.setenv("GPUWS_HOME", str(tmp_path / "home"))
    ssh = str(pod.client_files(tmp_path / "ssh"))
    assert main(["run", "pod", "-F", ssh, "-w", "cmd:echo up"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "`gpuws start pod`, or add --start" in err
    assert pod.daemon_pid() is None  # nothing was started unasked
    assert main(["run", "pod", "-F", ssh, "-w", "cmd:echo up", "--start"]) == 0
    got = capsys.readouterr()
    assert "pod answers" in got.err and "up" in got.out
    assert pod.daemon_pid() is not None
    with Store() as store:
        (action,) = store.host_actions("pod")
    assert action.action == "start" and action.ok
