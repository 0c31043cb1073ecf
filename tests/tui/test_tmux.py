"""The real ``gpuws connect`` in a real terminal (tmux), against the real sshd.

Keys go in through ``tmux send-keys`` and the screen comes back through ``capture-pane``:
connect → dashboard → launch a ``cmd:`` run → see its output → export → quit, with no
traceback on the screen at any point (during the run or after exit), and exit status 0.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sshd import SshServer  # type: ignore[import-not-found]

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Tmux:
    """One detached tmux session on a private server socket."""

    def __init__(self, socket: str) -> None:
        self.socket = socket
        self.screens: list[str] = []

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True,
                              capture_output=True, text=True).stdout

    def start(self, command: str, cwd: Path) -> None:
        self.tmux("new-session", "-d", "-s", "gpuws", "-x", "120", "-y", "40", "-c", str(cwd),
                  command)
        # A detached session may still take the server's default size: pin it.
        self.tmux("set-option", "-t", "gpuws", "window-size", "manual")
        self.tmux("resize-window", "-t", "gpuws", "-x", "120", "-y", "40")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "gpuws", *keys)

    def screen(self) -> str:
        text = self.tmux("capture-pane", "-p", "-t", "gpuws")
        self.screens.append(text)
        return text

    def wait_for(self, needle: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.screen()
            if needle in text:
                return text
            time.sleep(0.1)
        raise AssertionError(f"{needle!r} never appeared; the screen:\n{self.screens[-1]}")


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    t = Tmux(f"gpuws-test-{os.getpid()}")
    yield t
    subprocess.run(["tmux", "-L", t.socket, "kill-server"], capture_output=True)


def test_connect_run_export_quit_in_a_real_terminal(tmux: Tmux, ssh_config: Path,
                                                    sshd: SshServer, tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = tmp_path / "exit-status"
    env = {"GPUWS_HOME": str(home), "GPUWS_CONFIG": str(tmp_path / "none.toml"),
           "TERM": "xterm-256color", "COLORTERM": "truecolor"}
    assignments = " ".join(f"{k}={v}" for k, v in env.items())
    # Textual draws on stderr, so both streams stay on the terminal: a traceback, even
    # one printed after the app has left the screen, would be in a capture. The pane
    # then stays open a while so that last screen can be read.
    # COLUMNS/LINES (set in the test process) would pin the app's size: drop them.
    command = (f"env -u COLUMNS -u LINES {assignments} {sys.executable} -m gpuws.cli connect "
               f"pod -F {ssh_config}; echo $? > {done}; sleep 30")
    tmux.start(command, tmp_path)

    tmux.wait_for("New run")  # the dashboard: connected, deployed, probed
    assert tmux.tmux("display", "-p", "-t", "gpuws", "#{window_width}x#{window_height}"
                     ).strip() == "120x40"
    tmux.wait_for("counters")
    tmux.keys("n")
    tmux.wait_for("Workload")
    # The form opens with the focus in the chosen kind's field (the kernel): shift+Tab
    # goes back to the kinds' radio set; move to "command" and pick it, and the launcher
    # moves the focus to the command box.
    tmux.keys("BTab", "Down", "Down", "Enter")
    # Keys sent before the focus has moved land elsewhere (seen on a loaded CI machine:
    # the box read "cho hello-from-pod", or nothing). Clear and type again until it has it.
    for _ in range(5):
        time.sleep(0.5)
        tmux.keys("-l", "echo hello-from-pod")
        with contextlib.suppress(AssertionError):
            screen = tmux.wait_for("hello-from-pod", timeout=5.0)
            if re.search(r"command\s+echo hello-from-pod", screen):
                break
        tmux.keys("C-u")
    tmux.wait_for("echo hello-from-pod")
    tmux.keys("C-r")
    tmux.wait_for("run out│ hello-from-pod")
    tmux.wait_for("skipped")  # the run finished (Tiers 1-3 do not apply to a command here)
    tmux.keys("e")
    exported = tmux.wait_for("Session exported")
    reports = list((home / "exports").glob("gpuws-session-*.md"))
    assert len(reports) == 1 and "echo hello-from-pod" in reports[0].read_text()
    assert "gpuws-session-" in exported
    tmux.keys("q")
    deadline = time.monotonic() + 20
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert done.read_text().strip() == "0"
    after = tmux.screen()  # the terminal once gpuws has exited
    assert "Session exported" not in after  # the app really left the screen
    assert not any("Traceback" in s for s in tmux.screens)
