"""gpuws watch: every save of the project is a stored run and one line; Ctrl+C a summary.

The real CLI as a subprocess on the embedded pod (``local``), in a real project folder
changed by real writes; the lines are read as they come. No GPU here: the workload is a
``cmd:`` (Tier 1 times only a Python workload's ``run()``, so these lines carry no
median); the verdict arithmetic is checked on sample sets below, and the GPU check
(tests/gpu/test_gpu_watch.py) sees real medians and verdicts.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuws.commands.watch import Iteration, change_text, line, verdict_word
from gpuws.sessions.compare import compare_samples
from gpuws.sessions.store import Store

PROG = 'cmd:python3 -c "import mykern; print(mykern.V)"'


class Lines:
    """A process's stdout, line by line, read on a thread so waits can time out."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.q: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        assert proc.stdout is not None
        out = proc.stdout
        self.reader = threading.Thread(target=lambda: [self.q.put(x) for x in out],
                                       daemon=True)
        self.reader.start()

    def rest(self) -> str:
        """Everything printed until the end of the stream (after the process ended)."""
        self.reader.join(timeout=60)
        while not self.q.empty():
            self.seen.append(self.q.get_nowait())
        return "".join(self.seen)

    def until(self, pred: object, what: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                got = self.q.get(timeout=0.2)
            except queue.Empty:
                continue
            self.seen.append(got)
            if callable(pred) and pred(got):
                return got
        raise AssertionError(f"no {what} within {timeout} s; saw: {self.seen}")


def target(how: str, request: pytest.FixtureRequest) -> list[str]:
    """The pod on the command line: the embedded one, or the real sshd fixture."""
    if how == "local":
        return ["local"]
    return ["pod", "-F", str(request.getfixturevalue("ssh_config"))]


@pytest.mark.parametrize("how", ["local", "ssh"])
def test_each_save_is_a_run_and_a_line_and_ctrl_c_ends_with_the_table(
        tmp_path: Path, how: str, request: pytest.FixtureRequest) -> None:
    root = tmp_path / "proj"
    (root / "mykern").mkdir(parents=True)
    init = root / "mykern" / "__init__.py"
    init.write_text("V = 1\n")
    argv = [sys.executable, "-m", "gpuws", "watch", *target(how, request), "-W", str(root),
            "-w", PROG, "--debounce-ms", "100", "--yes"]  # a command: no Tier 1
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ), stdin=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = Lines(proc)
    try:
        first = lines.until(lambda s: s.startswith("#1"), "the first iteration")
        assert "start" in first
        init.write_text("V = 2\n")
        second = lines.until(lambda s: s.startswith("#2"), "the iteration of the save")
        assert "mykern/__init__.py" in second
        init.write_text("V = (\n")  # a broken save: its error, then the loop goes on
        third = lines.until(lambda s: s.startswith("#3"), "the broken iteration")
        assert "failed" in third and "exited with code 1" in third
        init.write_text("V = 3\n")
        lines.until(lambda s: s.startswith("#4"), "the fixed iteration")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    rest = lines.rest()
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert "watch: the iterations" in rest and "Traceback" not in err
    with Store() as store:
        (session,) = store.sessions()  # one connection held open for every iteration
        runs = store.runs(session.id)
        assert [r.status for r in sorted(runs, key=lambda r: r.started or 0)] == [
            "ok", "ok", "failed", "ok"]
        codes = [store.code(r.run_id) for r in runs]
        assert len({c.tree_sha256 for c in codes if c is not None}) == 4  # each its code
        # Every iteration is one of the held session's (its pod probed once).
        assert all(r.spec is not None and r.spec.fork_server for r in runs)


def test_a_file_workload_is_watched_in_its_folder_and_forks_its_tier1_child(
        tmp_path: Path) -> None:
    """Without -W: the file's folder is watched, the file travels in each run's spec, and
    each run asks the pod for the fork server (--no-fork-server opts out). No GPU here:
    each iteration prints the pod's one-line refusal and the loop waits for the next
    save (tests/gpu/test_gpu_watch.py measures the same loop on a GPU)."""
    bench = tmp_path / "bench.py"
    bench.write_text("def run():\n    pass\n")
    for fork in (True, False):
        argv = [sys.executable, "-m", "gpuws", "watch", "local", "-w", f"file:{bench}",
                "--debounce-ms", "100", *([] if fork else ["--no-fork-server"]),
                "--yes"]  # watched on a pod without a GPU all the same
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, stdin=subprocess.DEVNULL,
                                preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                 signal.SIG_DFL))
        lines = Lines(proc)
        try:
            first = lines.until(lambda s: s.startswith("#1"), "the first iteration")
            assert "failed" in first and "GPU" in first
            bench.write_text("def run():\n    return 1\n")
            second = lines.until(lambda s: s.startswith("#2"), "the save's iteration")
            assert "bench.py" in second
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0
        assert "watch: the iterations" in lines.rest()
    with Store() as store:
        sessions = sorted(store.sessions(), key=lambda s: s.started)
        forks = [[r.spec is not None and r.spec.fork_server for r in store.runs(s.id)]
                 for s in sessions]
    assert forks == [[True, True], [False, False]]


def test_watch_refuses_what_it_cannot_watch(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "gpuws", "watch", "local", "-w",
                          "builtin:saxpy"], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    assert res.returncode == 2 and res.stderr.startswith("gpuws: ")
    assert "-W DIR" in res.stderr and "Traceback" not in res.stderr


def _samples(median: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [median * (1 + rng.gauss(0, 0.004)) for _ in range(n)]


def test_verdicts_respect_noise() -> None:
    base = _samples(0.100, 200, 1)
    faster = compare_samples(base, _samples(0.095, 200, 2))
    same = compare_samples(base, list(reversed(base)))  # the same calls, other order
    slower = compare_samples(base, _samples(0.103, 200, 4))
    assert [verdict_word(c) for c in (faster, same, slower)] == [
        "faster", "no difference", "slower"]
    assert change_text(faster).startswith("-5.0% [")
    it = Iteration(2, ["kern.py"], run_id="r2", status="ok", samples=[0.095],
                   median_ms=0.095, ci_pct=0.1, vs_prev=faster, vs_base=faster, wall_s=1.2,
                   overhead_s=0.3)
    text = line(it).plain
    assert text.startswith("#2   kern.py  95.0 µs ±0.1%  vs prev -5.0%")
    assert "faster" in text and "overhead" in text
