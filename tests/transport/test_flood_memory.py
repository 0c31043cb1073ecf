"""The laptop's memory under an output flood is bounded whatever the flood's length (issue
31): `gpuws run POD -w 'cmd:yes'` through a real OpenSSH sshd, the laptop's gpuws process
sampled from /proc while the flood lasts.

Before the fix its RSS grew ~5 MB/s for as long as the flood lasted (53 MiB at 2 s, 287 MiB
at 40 s on the 2-core CI box): asyncssh reopened the channel's whole receive window at each
resume while the last window's data still sat in its buffer. Stored bytes were bounded;
the process was not.

A timed test by nature (it samples a flood over ~30 s, the bound is on growth between two
moments, not on wall time); Linux only (/proc).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sshd import SshServer  # type: ignore[import-not-found]

pytestmark = pytest.mark.skipif(not Path("/proc/self/statm").exists(),
                                reason="samples memory from /proc (Linux)")

#: When the first sample is taken, after the run began on the pod: the output cap, the
#: channel window and the store's caches have filled by then.
FIRST_S = 10.0
#: When the last is.
LAST_S = 25.0
#: Most the process may grow between the two. Measured here (2 shared cores, under
#: pytest): 0.3-2.2 MiB with the fix; 25 MiB (83 -> 108) without it.
MAX_GROWTH_MIB = 10.0


@pytest.fixture
def pod(tmp_path: Path, need_sshd: None) -> Iterator[SshServer]:
    server = SshServer(tmp_path / "pod", "default").start()
    try:
        yield server
    finally:
        # The run's worker leads its own process group with the workload (`yes`) in it.
        for pidfile in (server.pod_cache / "runs").glob("*/worker.pid"):
            try:
                os.killpg(int(pidfile.read_text().split()[0]), signal.SIGKILL)
            except (ValueError, ProcessLookupError, PermissionError):
                pass
        server.stop()


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _flooding(pod: SshServer) -> bool:
    """The run is on the pod and its output is arriving (events past the first MiB)."""
    return any(p.stat().st_size > 1 << 20
               for p in (pod.pod_cache / "runs").glob("*/events.ndjson"))


def test_rss_stops_growing_while_yes_floods_the_link(pod: SshServer, tmp_path: Path) -> None:
    ssh = pod.client_files(tmp_path / "ssh")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuws", "run", "pod", "-F", str(ssh), "-w", "cmd:yes"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        env=os.environ.copy())
    try:
        deadline = time.monotonic() + 60
        while not _flooding(pod):
            assert proc.poll() is None, proc.communicate()[1].decode()
            assert time.monotonic() < deadline, "the flood never started"
            time.sleep(0.1)
        began = time.monotonic()
        samples: list[tuple[float, float]] = []
        while (at := time.monotonic() - began) < LAST_S:
            assert proc.poll() is None, proc.communicate()[1].decode()
            samples.append((at, _rss_mib(proc.pid)))
            time.sleep(0.5)
    finally:
        proc.kill()
        proc.wait(30)
    first = next(rss for at, rss in samples if at >= FIRST_S)
    peak = max(rss for at, rss in samples if at >= FIRST_S)
    print(f"RSS {first:.1f} MiB at {FIRST_S:g} s into the flood, peak {peak:.1f} MiB by "
          f"{LAST_S:g} s")
    assert peak - first < MAX_GROWTH_MIB, [(round(a, 1), round(r, 1)) for a, r in samples]
