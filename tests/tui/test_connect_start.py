"""The connect screen offers to start a host that does not answer (issue 22, point 1).

The pod is a real OpenSSH sshd that is stopped; its "provider's tool" is a script that
starts that sshd (daemonised, as a booted pod's would be), fails as a provider's tool
does, or hangs. The app is driven with Textual's pilot and connects over real SSH.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from textual.message import Message
from textual.widgets import Button, Static

from gpuws.errors import AuthError, ConnectError, DeployError, HostKeyError
from gpuws.live.link import Target
from gpuws.live.uptime.power import PowerError
from gpuws.sessions.store import Store
from gpuws.tui.app import GpuwsApp, StartConnect
from gpuws.tui.screens.connecting import ConnectingScreen, may_be_stopped
from gpuws.tui.screens.dashboard import DashboardScreen
from gpuws.tui.screens.home import HomeScreen
from lease.leasekit import script  # type: ignore[import-not-found]
from sshd import SshServer  # type: ignore[import-not-found]
from tui.tuikit import until  # type: ignore[import-not-found]


def _script(path: Path, body: str) -> list[str]:
    return [script(path, body)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def pod(stopped_pod: SshServer) -> SshServer:
    """The pod is stopped (tests/conftest.py)."""
    return stopped_pod


def _config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start: list[str]) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"[hosts.pod]\nstart = {start!r}\n".replace("'", '"'))
    monkeypatch.setenv("GPUWS_CONFIG", str(cfg))


def _app(pod: SshServer, tmp_path: Path) -> GpuwsApp:
    config = pod.client_files(tmp_path / "ssh")
    return GpuwsApp(StartConnect(Target("pod", ssh_config=str(config))),
                    ssh_config=str(config))


def _failed(app: GpuwsApp) -> bool:
    return isinstance(app.screen, ConnectingScreen) and app.screen.state == "failed"


def _text(app: GpuwsApp, widget_id: str) -> str:
    return str(app.screen.query_one(widget_id, Static).render())


async def test_a_stopped_pod_is_started_with_a_countdown_then_connected(
        pod: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The tool returns at once, as a provider's does; the pod's sshd comes up later, when
    # the test has seen the countdown (the gate), so the wait is really waited through.
    gate = tmp_path / "boot"
    boot = (f"i=0; while [ ! -e {gate} ]; do i=$((i+1)); [ $i -gt 1200 ] && exit 0; "
            f"sleep 0.05; done; exec {pod.boot_command()}")
    _config(tmp_path, monkeypatch, _script(tmp_path / "start.sh",
                                           f"( {boot} ) </dev/null >/dev/null 2>&1 &\n"))
    app = _app(pod, tmp_path)
    messages: list[Message] = []
    async with app.run_test(size=(100, 30), message_hook=messages.append) as pilot:
        await until(pilot, lambda: _failed(app))
        failure = _text(app, "#failure-text")
        assert "✗ Connection refused" in failure
        assert f"pod has a start command: {tmp_path / 'start.sh'}" in failure
        start_button = app.screen.query_one("#start-host", Button)
        assert start_button.display and app.focused is start_button
        await pilot.press("s")
        await until(pilot, lambda: "waiting for pod to answer: " in _text(app, "#starting-text"))
        first = _text(app, "#starting-text")
        assert first.startswith(f"Starting pod with `{tmp_path / 'start.sh'}` …")
        assert first.endswith(" left") and "4:5" in first  # of 5:00 (power.WAIT_S)
        assert app.screen.state == "starting"
        # Only Back works while it starts: no Retry, no second start.
        assert app.screen.check_action("retry", ()) is False
        assert app.screen.check_action("start_host", ()) is False
        await until(pilot, lambda: _text(app, "#starting-text") != first)  # it ticks
        gate.touch()
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
        notes = [str(m.notification.message) for m in messages if type(m).__name__ == "Notify"]
        assert "pod started by its `start` command" in notes
        await app.shutdown()
    with Store() as store:
        rows = store.host_actions("pod")
    assert [(r.action, r.ok) for r in rows] == [("start", True)]


async def test_a_started_pod_whose_key_is_unknown_asks_for_it(
        pod: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pod answers the wait and refuses (its key is in no known_hosts): it started, and
    connecting again asks about the key, as it would have without the start."""
    _config(tmp_path, monkeypatch, _script(tmp_path / "start.sh",
                                           f"exec {pod.boot_command()}\n"))
    config = pod.client_files(tmp_path / "ssh", known=False)
    app = GpuwsApp(StartConnect(Target("pod", ssh_config=str(config))))
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: _failed(app))
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, ConnectingScreen)
                    and app.screen.state == "host_key")
        assert (tmp_path / "ssh" / "known_hosts").read_text() == ""
        await app.shutdown()
    with Store() as store:
        rows = store.host_actions("pod")
    assert [(r.action, r.ok) for r in rows] == [("start", True)]


async def test_a_failing_start_command_is_shown_with_retry_and_back(
        pod: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _config(tmp_path, monkeypatch, _script(
        tmp_path / "start.sh", "echo 'Error: pod abc not found' >&2; exit 3\n"))
    app = _app(pod, tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: _failed(app))
        await pilot.press("s")
        await until(pilot, lambda: _failed(app) and "Lease" in _text(app, "#failure-text"))
        failure = _text(app, "#failure-text")
        assert ("start command for pod failed (exit 3): Error: pod abc not found"
                in failure), failure
        assert "→ fix the cause it names, or `start` under [hosts.pod]" in failure
        screen = app.screen
        assert isinstance(screen, ConnectingScreen)
        assert not screen.query_one("#starting").display
        for button in ("#retry", "#back-fail", "#start-host"):  # and Start, to try again
            assert screen.query_one(button, Button).display
        assert screen.check_action("retry", ()) and screen.check_action("start_host", ())
        await app.shutdown()
    with Store() as store:
        rows = store.host_actions("pod")
    assert [(r.action, r.ok) for r in rows] == [("start", False)]
    assert "Error: pod abc not found" in rows[0].detail


async def test_no_start_command_no_offer(pod: SshServer, tmp_path: Path) -> None:
    app = _app(pod, tmp_path)  # the hermetic config file does not exist: no `start`
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: _failed(app))
        screen = app.screen
        assert isinstance(screen, ConnectingScreen)
        assert not screen.query_one("#start-host", Button).display
        assert app.focused is screen.query_one("#retry", Button)
        assert "start command" not in _text(app, "#failure-text")
        assert screen.check_action("start_host", ()) is False
        await pilot.press("s")
        await pilot.pause()
        assert screen.state == "failed"
        await app.shutdown()
    with Store() as store:
        assert store.host_actions("pod") == []


async def test_back_during_a_start_cancels_it_and_kills_the_tool(
        pod: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pid_file = tmp_path / "tool.pid"
    _config(tmp_path, monkeypatch, _script(tmp_path / "start.sh",
                                           f"echo $$ > {pid_file}; exec sleep 60\n"))
    app = _app(pod, tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: _failed(app))
        await pilot.press("s")
        await until(pilot, lambda: pid_file.exists() and pid_file.read_text().strip())
        pid = int(pid_file.read_text())
        assert _alive(pid)
        assert "Starting pod with" in _text(app, "#starting-text")
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, HomeScreen))
        assert not any(w.group == "connect" and not w.is_finished for w in app.workers)
        await until(pilot, lambda: not _alive(pid))
        await app.shutdown()


@pytest.mark.parametrize(("error", "startable"), [
    (ConnectError("connection refused"), True),
    (PowerError("start command for pod failed (exit 3): no"), True),
    (HostKeyError("the host key changed"), False),  # it answered: it is up
    (AuthError("permission denied"), False),
    (DeployError("no python3"), False),
])
def test_only_a_host_that_may_be_stopped_is_offered_a_start(error: Exception,
                                                              startable: bool) -> None:
    assert may_be_stopped(error) is startable
