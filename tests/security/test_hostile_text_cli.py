"""The headless commands and the TUI over a store of hostile text, as real processes.

The store is filled the way a pod fills it (``hostile_text.py``: a lying agent's probe and
the real H200 recording with hostile strings in every free-text field, through the real
engine). Then the real ``gpuws`` runs as a subprocess:

- with its output on pipes: every byte it writes is searched for ESC, BEL, C0/C1 controls
  (0x9b is a one-byte CSI), DEL and bidi overrides; the pod's escapes must be there as
  visible text instead, and a newline in a failure reason must not start a line of its own;
- in a real terminal (tmux, ``set-clipboard on``): ``history``, ``sessions``, ``export``
  and the ``replay`` TUI, after which the terminal's title must be what it was and its
  clipboard (tmux's paste buffers, which OSC 52 fills) empty. Before this round all four
  retitled the terminal and ``export`` wrote the clipboard.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from faults.figures import record  # type: ignore[import-not-found]
from gpuws import protocol
from gpuws.commands import doctor
from gpuws.commands.run import Printer
from security.hostile_text import (  # type: ignore[import-not-found]
    HOSTILE,
    PIECES,
    hostile_store,
    liar,
    poisoned_recording,
    unsafe_chars,
)


@pytest.fixture
def store_ids() -> tuple[str, list[str]]:
    return hostile_store()


def _gpuws(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "gpuws.cli", *args], capture_output=True,
                          timeout=120, env={**os.environ, "COLUMNS": "200"})


def test_headless_commands_print_no_escape(store_ids: tuple[str, list[str]],
                                           tmp_path: Path) -> None:
    session_id, (saxpy, again, failed) = store_ids
    report = tmp_path / "report.md"
    commands = [["sessions"], ["history"], ["history", session_id], ["export", session_id],
                ["export", session_id, "-o", str(report)], ["compare", saxpy, again],
                ["compare", saxpy, failed],
                ["sessions", "--json"], ["history", "--json"]]
    escapes = 0
    for argv in commands:
        done = _gpuws(*argv)
        out = done.stdout.decode("utf-8") + done.stderr.decode("utf-8")
        # compare with the failed run: 2, nothing to compare (said in one line)
        assert done.returncode == (2 if failed in argv else 0), (argv, out[-2000:])
        bad = unsafe_chars(out)
        escapes += len(bad)
        assert not bad, (argv, sorted(set(bad)))
    # Shown as characters: the title escape of the workload, the reason's newline.
    history = _gpuws("history").stdout.decode()
    assert "\\e]0;pwned\\x07" in history.replace("\n", "").replace("│", "").replace(" ", "")
    for line in history.splitlines():
        assert not line.lstrip("│ ").startswith(("# Forged", "| forged", "---"))
    # The report file is as safe as the report printed.
    assert not unsafe_chars(report.read_text())
    record("test_headless_commands_print_no_escape", commands=len(commands),
           hostile_pieces=len(PIECES), unsafe_bytes_out=escapes)


def test_doctor_prints_a_lying_pods_probe_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    """``gpuws doctor``'s report and printer over the liar's probe (asked over the wire):
    doctor needs a live agent, and the liar is the only pod that lies on request."""

    async def report() -> dict[str, object]:
        client = liar()
        try:
            probe = await client.probe()
            return doctor.doctor_report("liar", client, probe, 1.0)
        finally:
            await client.close()

    r = asyncio.run(report())
    assert HOSTILE in r["system"]["hostname"]  # type: ignore[index]  # as the pod sent it
    doctor.render(r)
    out = capsys.readouterr()
    assert unsafe_chars(out.out + out.err) == []
    assert "\\e]0;pwned\\x07" in out.out and "[link=http://evil.example/]" in out.out
    record("test_doctor_prints_a_lying_pods_probe_as_text", hostile_pieces=len(PIECES),
           unsafe_chars_out=len(unsafe_chars(out.out + out.err)))


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_gpuws_run_prints_a_hostile_run_as_text(as_json: bool,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """``gpuws run``'s printer (both faces) over the poisoned recording: its own events,
    decoded strictly as the client decodes them. NDJSON keeps every value exactly (C1 and
    bidi characters as \\u escapes, which msgspec writes raw)."""
    lines = [json.dumps(e).encode() for e in poisoned_recording("20261124-000000-aaaaaa")]
    events = [protocol.decode_event(line) for line in lines]
    printer = Printer(as_json)
    for ev in events:
        assert not isinstance(ev, protocol.BadLine)
        printer.show(ev)
    out = capsys.readouterr()
    assert unsafe_chars(out.out + out.err) == []
    if as_json:
        # The same values msgspec encodes (every string exact), escaped, not altered.
        assert [json.loads(x) for x in out.out.splitlines()] == [
            json.loads(protocol.encode(ev)) for ev in events]
    else:
        assert "\\e]0;pwned\\x07" in out.out
    record(f"test_gpuws_run_prints_a_hostile_run_as_text[{'json' if as_json else 'text'}]",
           events=len(events), unsafe_chars_out=len(unsafe_chars(out.out + out.err)))


def test_an_agents_refusal_is_one_visible_line() -> None:
    """The liar refuses a request with hostile title, message and remedy (an ``error``
    answer, through the real client): ``gpuws: …`` is still one line, with no escape."""
    from gpuws.cli import error_line
    from gpuws.errors import AgentError

    async def refused() -> AgentError:
        client = liar()
        try:
            with pytest.raises(AgentError) as caught:
                await client.request(protocol.Cancel(req=client.next_req(), run_id="x"))
            return caught.value
        finally:
            await client.close()

    line = error_line(asyncio.run(refused()))
    assert line.endswith("\n") and line.count("\n") == 1
    assert unsafe_chars(line.rstrip("\n")) == [] and "\\e]0;pwned" in line


class Tmux:
    """A detached tmux server of our own, with OSC 52 reaching its paste buffers."""

    def __init__(self, socket: str) -> None:
        self.socket = socket

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args], check=True,
                              capture_output=True, text=True).stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-J", "-t", "gpuws")

    def wait_for(self, needle: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.screen()
            if needle in text:
                return text
            time.sleep(0.1)
        raise AssertionError(f"{needle!r} never appeared; the screen:\n{self.screen()}")


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    t = Tmux(f"gpuws-text-{os.getpid()}")
    t.tmux("new-session", "-d", "-s", "gpuws", "-x", "160", "-y", "50", "sleep 600")
    t.tmux("set-option", "-g", "set-clipboard", "on")
    yield t
    subprocess.run(["tmux", "-L", t.socket, "kill-server"], capture_output=True)


def test_a_real_terminal_keeps_its_title_and_clipboard(store_ids: tuple[str, list[str]],
                                                       tmux: Tmux, tmp_path: Path) -> None:
    session_id, _ = store_ids
    title = tmux.tmux("display", "-p", "-t", "gpuws", "#{pane_title}").strip()
    env = " ".join(f"{k}={v}" for k, v in (("GPUWS_HOME", os.environ["GPUWS_HOME"]),
                                          ("GPUWS_CONFIG", os.environ["GPUWS_CONFIG"]),
                                          ("TERM", "xterm-256color")))
    gpuws = f"env -u COLUMNS -u LINES {env} {sys.executable} -m gpuws.cli"
    done = tmp_path / "done"
    retitled: list[str] = []
    clipboard: list[str] = []
    for argv in ("history", "sessions", f"export {session_id}", f"replay {session_id} --instant"):
        done.unlink(missing_ok=True)
        tmux.tmux("respawn-pane", "-k", "-t", "gpuws",
                  f"{gpuws} {argv}; echo $? > {done}; echo gpuws-exited; sleep 600")
        if argv.startswith("replay"):
            tmux.wait_for("replay of", timeout=90)  # the notification: every run shown
            tmux.tmux("send-keys", "-t", "gpuws", "q")
        tmux.wait_for("gpuws-exited", timeout=90)
        assert done.read_text().strip() == "0", tmux.screen()
        now = tmux.tmux("display", "-p", "-t", "gpuws", "#{pane_title}").strip()
        buffers = tmux.tmux("list-buffers")
        if now != title:
            retitled.append(f"{argv}: {now!r}")
            tmux.tmux("select-pane", "-t", "gpuws", "-T", title)
        if buffers:
            clipboard.append(f"{argv}: {buffers!r}")
            tmux.tmux("delete-buffer")
    assert retitled == [] and clipboard == []
    record("test_a_real_terminal_keeps_its_title_and_clipboard", commands=4,
           titles_changed=len(retitled), clipboard_writes=len(clipboard))
