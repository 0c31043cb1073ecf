"""A fast start (issue 36): ``gpuws --help`` and the store-only listings import only what
they need. Each command runs through the CLI's ``main()`` in a fresh interpreter, on a real
store, and the modules it loaded are read from ``sys.modules`` afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuws.sessions.store import Store

#: What connecting needs (SSH, TLS, the agent's client and bundle) and what the TUI needs.
CONNECTING = ("asyncssh", "cryptography", "gpuws.client", "gpuws.deploy",
              "gpuws.transport", "gpuws.live.link", "gpuws.live.engine")
TUI = ("textual",)
#: Rich lays text out for people: machine output and --help do without it.
PEOPLE = ("rich",)
#: The event loop (and the ssl it imports): every command runs on it, --help does not.
LOOP = ("asyncio", "ssl")
#: Built only by `export` and `compare`.
REPORTS = ("gpuws.sessions.export", "gpuws.sessions.compare")

_PROBE = """
import contextlib, io, json, sys
from gpuws.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
print(json.dumps({"code": code, "out": out.getvalue(),
                  "modules": sorted({m.split(".")[0] for m in sys.modules} | set(sys.modules))}))
"""


def _loaded(home: Path, *argv: str) -> tuple[set[str], str]:
    env = {**os.environ, "GPUWS_HOME": str(home)}
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], env=env,
                          capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(done.stdout)
    assert result["code"] == 0, (argv, result["out"], done.stderr)
    return set(result["modules"]), result["out"]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A GPUWS_HOME whose store holds one session (so the listings print a row)."""
    path = tmp_path / "gpuws-home"
    path.mkdir(mode=0o700)
    monkeypatch.setenv("GPUWS_HOME", str(path))
    with Store() as store:
        store.end_session(store.open_session("pod", "ssh+sftp", None, 2.0, started=1.8e9),
                          1.8e9 + 60)
    return path


@pytest.mark.parametrize(("argv", "unwanted"), [
    (("--help",), CONNECTING + TUI + PEOPLE + REPORTS + LOOP),
    (("history", "--help"), CONNECTING + TUI + PEOPLE + REPORTS + LOOP),
    (("sessions", "--json"), CONNECTING + TUI + PEOPLE + REPORTS),
    (("history", "--json"), CONNECTING + TUI + PEOPLE + REPORTS),
    (("sessions",), CONNECTING + TUI + REPORTS),
    (("history",), CONNECTING + TUI + REPORTS),
])
def test_a_command_imports_only_what_it_needs(home: Path, argv: tuple[str, ...],
                                              unwanted: tuple[str, ...]) -> None:
    modules, out = _loaded(home, *argv)
    assert out  # it did its work (help text, a listing, JSON)
    assert not modules & set(unwanted), sorted(modules & set(unwanted))


def test_the_probe_sees_what_a_connecting_command_loads(home: Path) -> None:
    """The check can fail: `export` builds a report, so its builder is loaded."""
    modules, out = _loaded(home, "export", "--help")
    assert "usage" in out
    sid = json.loads(_loaded(home, "sessions", "--json")[1])[0]["id"]
    modules, _ = _loaded(home, "export", sid, "-o", str(home / "report.md"))
    assert "gpuws.sessions.export" in modules
