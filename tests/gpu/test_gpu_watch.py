"""gpuws watch on a real GPU, over a real SSH server (issue 25): three edits, three verdicts.

A project (its own package ``kern`` with a Triton vector add, ``bench/attn.py`` importing
it) watched with ``gpuws watch pod -W PROJECT -w file:bench/attn.py``: the first line is
the baseline; then a comment (no difference expected), a kernel that does 512 more
multiply-adds per element (compute-bound now: slower), and the original back (faster
than the second, as fast as the first). Each line's verdict is checked against what was done, and
the save-to-line latency and the overhead beyond the pod's own work are recorded.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu
if shutil.which("nvidia-smi") is None:
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)

OUT = Path(os.environ["GPUWS_GPU_OUT"]) if os.environ.get("GPUWS_GPU_OUT") else None
KERNEL = (Path(__file__).parents[2] / "bench" / "workloads" / "triton_add.py").read_text()
BENCH = "from kern.triton_add import BYTES, FLOPS, KERNEL_REGEX, run, setup  # noqa: F401\n"
LOAD = "        x = tl.load(x_ptr + offs, mask=mask)\n"


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    from sshd import SshServer, find_sshd  # type: ignore[import-not-found]

    root = tmp_path_factory.mktemp("pod")
    if find_sshd():
        server: Any = SshServer(root / "sshd").start()
    else:
        from sshserver import AsyncSSHServer  # type: ignore[import-not-found]

        server = AsyncSSHServer(root / "srv").start()
    yield server.client_files(root / "client")
    server.stop()


def test_three_edits_three_honest_verdicts(pod: Path, tmp_path: Path) -> None:
    root = tmp_path / "proj"
    (root / "kern").mkdir(parents=True)
    (root / "kern" / "__init__.py").write_text("")
    src = root / "kern" / "triton_add.py"
    src.write_text(KERNEL)
    assert LOAD in KERNEL
    (root / "bench").mkdir()
    (root / "bench" / "attn.py").write_text(BENCH)
    env = {**os.environ, "GPUWS_HOME": str(tmp_path / "home"), "COLUMNS": "250"}
    proc = subprocess.Popen([sys.executable, "-m", "gpuws", "watch", "pod", "-F", str(pod),
                             "-W", str(root), "-w", "file:bench/attn.py", "--debounce-ms",
                             "200", "--max-seconds", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            stdin=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    out = proc.stdout
    reader = threading.Thread(target=lambda: [lines.put(x) for x in out], daemon=True)
    reader.start()
    seen: list[str] = []

    def until(prefix: str, timeout: float = 240.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                got = lines.get(timeout=0.5)
            except queue.Empty:
                continue
            seen.append(got)
            if got.startswith(prefix):
                return got
        raise AssertionError(f"no {prefix} line in {timeout} s: {seen}")

    saved: dict[int, float] = {}
    try:
        first = until("#1 ")
        text = KERNEL
        edits = [text.replace("BLOCK = 1024", "BLOCK = 1024  # a comment"),
                 text.replace(LOAD, LOAD + "        for _ in range(512):\n"
                                           "            x = x * 0.999 + 0.001\n"),
                 text]
        got = [first]
        for n, new in enumerate(edits, start=2):
            saved[n] = time.monotonic()
            src.write_text(new)
            got.append(until(f"#{n} "))
            saved[n] = time.monotonic() - saved[n]
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=30)
    while not lines.empty():
        seen.append(lines.get_nowait())
    figures: dict[str, Any] = {"lines": got, "save_to_line_s": saved, "all": seen}
    # The fork server (issue 25, point 4): every iteration's Tier-1 child was forked from
    # the pod's pre-imported parent, which never initialised CUDA (it refuses to serve
    # when an import did); what Tier 1 took beyond its samples, per iteration.
    os.environ["GPUWS_HOME"] = env["GPUWS_HOME"]
    from gpuws import protocol
    from gpuws.sessions.store import Store

    with Store() as store:
        (session,) = store.sessions()
        forked, tier1 = [], []
        for run in store.runs(session.id):
            events = store.run_events(run.run_id, ["log", "tier_finished"])
            forked.append(any(isinstance(e, protocol.Log) and "forked from this watch's "
                              "pre-imported parent" in e.message for e in events))
            tier1 += [e.wall_s for e in events
                      if isinstance(e, protocol.TierFinished) and e.tier == 1]
    figures.update(forked=forked, tier1_wall_s=tier1)
    if OUT:
        (OUT / "watch.json").write_text(json.dumps(figures, indent=2))
    print("".join(got))
    assert proc.returncode == 0
    medians = [float(m.group(1)) for m in (re.search(r"  ([\d.]+) µs", g) for g in got) if m]
    assert len(medians) == 4, got
    # The comment changes nothing the GPU does: within 2% of the baseline.
    assert abs(medians[1] / medians[0] - 1) < 0.02, medians
    # 512 more multiply-adds per element: slower, and said so.
    assert medians[2] > medians[1] * 1.1 and "vs prev +" in got[2] and "slower" in got[2]
    # The original back: faster than the doubled store, as fast as the first.
    assert "faster" in got[3].split("vs base")[0] and abs(medians[3] / medians[0] - 1) < 0.02
    assert "watch: the iterations" in "".join(seen)
    assert forked == [True] * 4, figures  # each child forked, none started afresh
    # A comment's edit is no change: no difference against the first, at 95% and past the
    # run-to-run floor.
    assert "no difference" in got[1].split("vs base")[1], got[1]

    # A second measurement of the two versions, each by its own `gpuws run` (a fresh
    # Tier-1 child, no fork server): the same medians within 2% and the same verdict.
    def measure(text: str) -> list[float]:
        src.write_text(text)
        res = subprocess.run([sys.executable, "-m", "gpuws", "run", "pod", "-F", str(pod),
                              "-W", str(root), "-w", "file:bench/attn.py", "--tiers", "1",
                              "--max-seconds", "3", "--json"], capture_output=True,
                             text=True, env=env, stdin=subprocess.DEVNULL, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        values: list[float] = []
        for raw in res.stdout.splitlines():
            event = json.loads(raw) if raw.startswith("{") else {}
            if event.get("type") == "samples":
                values += event["values_ms"]
        assert values, res.stdout[-2000:]
        return values

    from gpuws.sessions.compare import compare_samples, verdict_word

    again_base, again_slow = measure(KERNEL), measure(edits[1])
    again = [statistics.median(again_base) * 1e3, statistics.median(again_slow) * 1e3]
    figures.update(second_measurement_us=again)
    if OUT:
        (OUT / "watch.json").write_text(json.dumps(figures, indent=2))
    print(f"second measurement: {again[0]:.1f} µs, {again[1]:.1f} µs "
          f"(watch: {medians[0]:.1f}, {medians[2]:.1f})")
    assert abs(again[0] / medians[0] - 1) < 0.02 and abs(again[1] / medians[2] - 1) < 0.02
    assert verdict_word(compare_samples(again_base, again_slow)) == "slower"
