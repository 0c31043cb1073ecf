"""Flows across a real SSH connection: an unknown host key, and a link that drops mid-run.

Against the real OpenSSH sshd fixture; runs are ``cmd:`` workloads, which need no GPU.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from textual.message import Message
from textual.widgets import Static

from gpuws.live.link import Target
from gpuws.sessions.store import Store
from gpuws.tui.app import GpuwsApp, StartConnect
from gpuws.tui.messages import LinkDown, LinkUp
from gpuws.tui.screens.connecting import ConnectingScreen
from gpuws.tui.screens.dashboard import DashboardScreen
from sshd import SshServer  # type: ignore[import-not-found]
from tui.tuikit import gated_count, launch_command, until  # type: ignore[import-not-found]


async def test_unknown_host_key_is_asked_then_recorded(sshd: SshServer, tmp_path: Path) -> None:
    config = sshd.client_files(tmp_path / "client", known=False)
    app = GpuwsApp(StartConnect(Target("pod", ssh_config=str(config))))
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ConnectingScreen)
                    and app.screen.state == "host_key")
        shown = str(app.screen.query_one("#hostkey-text", Static).render())
        fingerprint = subprocess.run(["ssh-keygen", "-lf", str(sshd.host_key) + ".pub"],
                                     capture_output=True, text=True, check=True).stdout.split()[1]
        assert fingerprint in shown
        assert (tmp_path / "client" / "known_hosts").read_text() == ""
        await pilot.press("a")
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
        await app.shutdown()
    assert sshd.known_hosts_line().split()[2] in (tmp_path / "client" / "known_hosts").read_text()


async def test_dropped_link_reattaches_from_the_last_stored_event(
        sshd: SshServer, ssh_config: Path, tmp_path: Path) -> None:
    app = GpuwsApp(StartConnect(Target("pod", ssh_config=str(ssh_config))))
    messages: list[Message] = []
    async with app.run_test(size=(100, 30), message_hook=messages.append) as pilot:
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
        gate = tmp_path / "go-on"
        screen = await launch_command(pilot, gated_count(gate))
        await until(pilot, lambda: screen.panes._log_lines == 10)
        assert app.link is not None
        app.link.client.transport._conn.abort()  # type: ignore[attr-defined]
        await until(pilot, lambda: any(isinstance(m, LinkDown) for m in messages))
        seen_before = screen.panes.model.last_seq
        gate.touch()  # the rest of the run happens while nobody is connected
        app.action_reconnect()
        await until(pilot, lambda: sum(isinstance(m, LinkUp) for m in messages) == 2)
        await until(pilot, lambda: screen.panes.model.finished is not None)
        assert 0 < seen_before < screen.panes.model.last_seq
        assert screen.panes._log_lines == 40
        notes = [str(m.notification.message) for m in messages
                 if type(m).__name__ == "Notify"]
        # The engine reconnects and re-attaches by itself (or R does, if it gave up).
        assert any(n.startswith(f"attached to {screen.run_id} from event ")
                   or f"resumed {screen.run_id} from event " in n for n in notes), notes
        with Store() as s:
            seqs = [e.seq for e in s.events(screen.run_id)]
        assert seqs == list(range(len(seqs)))  # gap-free, each event once
        await app.shutdown()
