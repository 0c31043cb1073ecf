"""``gpuws replay``: what it is given is checked before the TUI opens, recordings are read
bounded, a hostile recording cannot open a screen per run id, esc leaves, and the
throwaway stores of killed replays do not pile up.

Before: ``replay MISSING.ndjson`` opened a blank TUI blaming "no session", ``README.md
--instant`` exited 0 after a toast, ``--speed 0`` raised ZeroDivisionError in the TUI and
``--speed -2`` played as ``--instant``, each hanging without a terminal; 300 run ids in
100 KB opened 300 screens and crashed the TUI; a SIGKILLed replay left its store in /tmp.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from faults.figures import record  # type: ignore[import-not-found]
from gpuws.live import storeio
from gpuws.live.replay import MAX_RUNS, RecordingFile, play, stream
from gpuws.live.storeio import StoreHandle
from gpuws.tui.screens.run import RunScreen
from gpuws.tui.workers import MAX_REPLAY_SCREENS
from tui.tuikit import RECORDING, fill_store, replay_app, until  # type: ignore[import-not-found]

SRC = Path(__file__).resolve().parents[2] / "src"
README = Path(__file__).resolve().parents[2] / "README.md"


def gpuws(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``gpuws ARGS`` as a person runs it, with no terminal (stdin from /dev/null)."""
    return subprocess.run(
        [sys.executable, "-c", "import sys; from gpuws.cli import main; sys.exit(main())",
         *args], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(SRC), **(env or {})})


def _refused(result: subprocess.CompletedProcess[str], *words: str) -> str:
    err = result.stderr.strip()
    assert result.returncode == 2, (result.returncode, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("gpuws: Usage error: "), err
    assert " — " in err, err  # a remedy follows the cause
    for w in words:
        assert w in err, (w, err)
    return err


def test_replay_entry_points_refuse_mistakes_before_the_tui(tmp_path: Path) -> None:
    fifo = tmp_path / "events.ndjson"
    os.mkfifo(fifo)  # would block an open, and a read, forever
    big = tmp_path / "big.ndjson"
    with big.open("wb") as f:  # sparse: 257 MiB that take no disk
        f.truncate(257 * 2**20)
    cases: list[tuple[list[str], tuple[str, ...]]] = [
        (["replay", str(tmp_path / "MISSING.ndjson")], ("no such file", "gpuws sessions")),
        (["replay", str(README), "--instant"], ("holds no run events", "events.ndjson")),
        (["replay", str(RECORDING), "--speed", "0"], ("--speed 0", "above 0", "--instant")),
        (["replay", str(RECORDING), "--speed", "-2"], ("--speed -2", "above 0")),
        (["replay", str(RECORDING), "--speed", "nan"], ("--speed nan",)),
        (["replay", str(tmp_path)], ("is a folder",)),
        (["replay", str(fifo)], ("not a regular file",)),
        (["replay", str(big)], ("269,484,032 bytes", "256 MiB")),
        (["replay", str(RECORDING), "--run", "nope"], ("no run events of run nope",)),
        # A good recording, but no terminal to show it in: said, not a TUI waiting forever.
        (["replay", str(RECORDING), "--instant"], ("needs a terminal", "gpuws export")),
    ]
    said = []
    for args, words in cases:
        said.append(_refused(gpuws(*args, env={"GPUWS_HOME": str(tmp_path / "home")}), *words))
    record("test_replay_entry_points_refuse_mistakes_before_the_tui", cases=len(cases),
           exit_2=len(said), tracebacks=sum("Traceback" in s for s in said))


def test_replay_of_an_unknown_session_or_run_is_refused(tmp_path: Path) -> None:
    env = {"GPUWS_HOME": os.environ["GPUWS_HOME"]}
    sid, _ = fill_store()
    _refused(gpuws("replay", "zzzz", env=env), "zzzz: no such file, nor a stored session")
    _refused(gpuws("replay", sid, "--run", "nope", env=env),
             f"--run nope: no such run in session {sid}", f"gpuws history {sid}")


async def test_esc_leaves_a_replay() -> None:
    app = replay_app(RECORDING)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, RunScreen)
                    and bool(app.screen.query("RunPanes"))
                    and app.screen.panes.model.finished is not None)
        await pilot.press("escape")
        await until(pilot, lambda: app.return_code is not None)
    assert app.return_code == 0


def _many_runs(path: Path, runs: int) -> int:
    now = time.time() - 3600
    lines = []
    for r in range(runs):
        run_id = f"r{r:04d}"
        base = {"run_id": run_id, "ts": now + r}
        lines += [
            {"type": "run_started", "seq": 0, "spec": {"workload": "cmd:true"},
             "run_dir": f"/p/{run_id}", "pid": 1, **base},
            {"type": "run_finished", "seq": 1, "status": "ok", "wall_s": 0.1, **base}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path.stat().st_size


async def test_a_recording_of_300_run_ids_keeps_the_screens_bounded(tmp_path: Path) -> None:
    source = tmp_path / "many.ndjson"
    size = _many_runs(source, 300)
    app = replay_app(source)
    most = 0

    def done() -> bool:
        nonlocal most
        screens = [s for s in app.screen_stack if isinstance(s, RunScreen)]
        most = max(most, len(screens), sum(len(v) for v in app.run_screens.values()))
        return any("finished:" in str(n.message) for n in app._notifications)

    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, done, timeout=300)
        await until(pilot, lambda: app.feed.backlog == 0)
        stored = await app.store.call(lambda s: sum(len(s.runs(row.id))
                                                    for row in s.sessions()))
        keyed = len(app.run_screens)
        notes = " ".join(str(n.message) for n in app._notifications)
    assert app._exception is None
    assert most <= MAX_REPLAY_SCREENS
    assert keyed <= MAX_REPLAY_SCREENS  # no map entry per id either
    assert stored == MAX_RUNS  # runs past the bound are skipped, and said
    assert f"{(300 - MAX_RUNS) * 2:,} events of runs past the first {MAX_RUNS}" in notes
    assert f"{MAX_RUNS - MAX_REPLAY_SCREENS:,} more runs were stored without panes" in notes
    record("test_a_recording_of_300_run_ids_keeps_the_screens_bounded", run_ids=300,
           file_bytes=size, screens_open_max=most, runs_stored=stored)


def _store_in_child(tmp: Path, then: str) -> Path:
    """A throwaway store made by another process, which then ``then``s (dies or waits)."""
    code = ("import os, sys, signal, time; from gpuws.live.storeio import StoreHandle; "
            "h = StoreHandle.throwaway(); h.call_blocking(lambda s: s.open_session("
            "'x', 'replay', None, None)); print(h.path.parent, flush=True); "
            + ("os.kill(os.getpid(), signal.SIGKILL)" if then == "die"
               else "sys.stdin.read(); h.close_blocking()"))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             stdin=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(SRC), "TMPDIR": str(tmp)})
    assert child.stdout is not None
    scratch = Path(child.stdout.readline().strip())
    if then == "die":
        assert child.wait(60) == -signal.SIGKILL
    else:
        _LIVE.append(child)
    return scratch


_LIVE: list[subprocess.Popen[str]] = []


def test_killed_replays_leave_no_store_behind(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    running = _store_in_child(tmp_path, "wait")
    try:
        first = _store_in_child(tmp_path, "die")
        assert (first / "sessions.db").exists()  # what SIGKILL left
        second = _store_in_child(tmp_path, "die")  # its start swept the first
        assert not first.exists() and (second / "sessions.db").exists()
        handle = StoreHandle.throwaway()  # and this one's start the second
        assert not second.exists()
        assert (running / "sessions.db").exists()  # a replay running now keeps its store
        handle.close_blocking()
        assert handle.path is not None and not handle.path.parent.exists()
        killed = [first, second]
    finally:
        for child in _LIVE:
            child.communicate("", timeout=60)
        _LIVE.clear()
    assert storeio.remove_stale_scratch(tmp_path) == []  # the waiting one removed its own
    left = list(tmp_path.glob(storeio.SCRATCH_PREFIX + "*"))
    assert left == []
    record("test_killed_replays_leave_no_store_behind", killed=len(killed),
           left_behind=len(left))


def test_a_recording_is_read_as_it_plays_not_whole(tmp_path: Path) -> None:
    # 100,000 output events (about 20 MB): playing them holds a batch at a time; the old
    # reader held the whole file and every decoded event at once.
    source = tmp_path / "long.ndjson"
    now = time.time() - 3600
    line = {"type": "output", "run_id": "r-long", "stream": "stdout", "text": "x" * 150}
    with source.open("w") as f:
        for seq in range(100_000):
            f.write(json.dumps({**line, "seq": seq, "ts": now + seq * 1e-4}) + "\n")
    size = source.stat().st_size
    pushed = [0]

    def push(_: object) -> None:
        pushed[0] += 1

    tracemalloc.start()
    try:
        count = asyncio.run(play(stream(RecordingFile(source).open()), push, speed=None))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == pushed[0] == 100_000
    assert peak < size / 4, (peak, size)
    record("test_a_recording_is_read_as_it_plays_not_whole", events=count, file_bytes=size,
           peak_bytes=peak)


def test_a_replay_ended_by_sigterm_or_sighup_removes_its_store(tmp_path: Path) -> None:
    # A real `gpuws replay` in a real pseudo-terminal (it refuses to start without one).
    removed = 0
    for sig in (signal.SIGTERM, signal.SIGHUP):
        master, slave = os.openpty()
        child = subprocess.Popen(
            [sys.executable, "-c", "import sys; from gpuws.cli import main; sys.exit(main())",
             "replay", str(RECORDING), "--speed", "0.01"],
            stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(SRC), "TMPDIR": str(tmp_path),
                 "TERM": "xterm-256color"})
        os.close(slave)
        screen: list[bytes] = []
        drained = threading.Thread(target=_drain, args=(master, screen), daemon=True)
        drained.start()
        try:
            deadline = time.monotonic() + 120
            # Ended once its panes are up (the footer drawn) and its store is written.
            while not (list(tmp_path.glob(storeio.SCRATCH_PREFIX + "*/sessions.db"))
                       and b"Leave replay" in b"".join(screen)):
                assert time.monotonic() < deadline and child.poll() is None, b"".join(screen)
                time.sleep(0.05)
            child.send_signal(sig)
            assert child.wait(60) == 130, b"".join(screen)[-2000:]
        finally:
            if child.poll() is None:
                child.kill()
            os.close(master)
        left = list(tmp_path.glob(storeio.SCRATCH_PREFIX + "*"))
        assert left == [], sig
        removed += 1
    record("test_a_replay_ended_by_sigterm_or_sighup_removes_its_store", signals=2,
           stores_removed=removed)


def _drain(fd: int, screen: list[bytes]) -> None:
    """Read the child's screen so its writes never block on a full terminal buffer."""
    try:
        while chunk := os.read(fd, 65536):
            screen[:] = [b"".join(screen)[-4000:] + chunk]
    except OSError:
        pass
