"""The provider's tool run by ``gpuws start`` (issue 31): bounded however it behaves.

Each test is a way a real provider CLI misbehaved: one stuck retrying floods stderr (it
took gpuws to 4.33 GB, and ``--timeout`` did not end it); one exits at once but leaves a
child holding stderr (gpuws waited the whole timeout, then called the start a failure);
one ignores SIGTERM with children of its own (they outlived the timeout). The tool is a
real ``/bin/sh`` script run through the real CLI; the process groups and the memory are
read from the kernel (``/proc``, ``getrusage``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuws.cli import main
from gpuws.sessions.store import Store
from lease.leasekit import (  # type: ignore[import-not-found]
    group_members,
    kill_group,
    script,
    wait_until,
)
from sshd import SshServer  # type: ignore[import-not-found]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads process groups from /proc")

#: The gpuws process's peak RSS, generous: it is ~70 MiB here, and the flood took GBs.
RSS_BOUND_MIB = 200
#: Address-space cap for the child gpuws, so that a gpuws that hoards the flood fails
#: with MemoryError instead of taking the (shared) test machine's memory.
AS_LIMIT = 2 << 30

#: ``gpuws start`` in a child process, its peak RSS printed as JSON on stdout.
CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
from gpuws.cli import main
rc = main(sys.argv[1:])
# VmHWM, not getrusage's ru_maxrss: Linux carries the forking parent's peak across exec
# into ru_maxrss, so under a long pytest session it read the test runner's 200+ MiB.
hwm = next(int(line.split()[1]) for line in open("/proc/self/status")
           if line.startswith("VmHWM:"))
print(json.dumps({{"rc": rc, "maxrss_kib": hwm}}))
"""


def _config(tmp_path: Path, start: str) -> None:
    Path(os.environ["GPUWS_CONFIG"]).write_text(
        f"[hosts.pod]\nstart = [\"{start}\"]\nstop = [\"true\"]\n")


def _pgid(path: Path) -> int:
    """The tool's process group: its script wrote ``$$`` (it leads its own group)."""
    wait_until(lambda: path.exists() and path.read_text().strip(), "the tool wrote its pid")
    return int(path.read_text())


def test_a_tool_flooding_stderr_ends_at_the_timeout_with_bounded_memory(
        tmp_path: Path) -> None:
    pidfile = tmp_path / "pgid"
    _config(tmp_path, script(tmp_path / "start.sh", f"echo $$ > {pidfile}\nyes err >&2\n"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD.format(limit=AS_LIMIT), "start", "pod",
             "--timeout", "3"],
            env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=100)
    finally:
        if pidfile.exists():
            kill_group(int(pidfile.read_text()))
    assert "start command for pod ran past 3 s" in done.stderr, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"gpuws start, its tool flooding stderr for 3 s: peak RSS "
          f"{result['maxrss_kib'] / 1024:.1f} MiB")
    assert result["rc"] == 1
    assert result["maxrss_kib"] < RSS_BOUND_MIB * 1024, result
    assert group_members(_pgid(pidfile)) == []  # `yes` ended with its group


def test_a_tool_that_exits_leaving_a_child_on_stderr_is_judged_by_its_exit(
        stopped_pod: SshServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pidfile = tmp_path / "pgid"
    # Starts the pod, then leaves a child that holds stderr (a helper it forked, a
    # `nohup … &` in a wrapper script) and exits 0.
    _config(tmp_path, script(tmp_path / "start.sh",
                             f"echo $$ > {pidfile}\n{stopped_pod.boot_command()}\n"
                             "sleep 600 &\nexit 0\n"))
    ssh = str(stopped_pod.client_files(tmp_path / "ssh"))
    try:
        # The timeout is far above the wait: a gpuws that waited for the child to close
        # stderr would fail with "ran past" (and did, after the whole timeout).
        assert main(["start", "pod", "-F", ssh, "--wait", "30", "--timeout", "90"]) == 0
    finally:
        kill_group(_pgid(pidfile))
    assert "pod answers" in capsys.readouterr().err
    with Store() as store:
        (row,) = store.host_actions("pod")
    assert (row.action, row.ok) == ("start", True)


def test_a_tool_killed_at_its_timeout_leaves_nothing_of_its_group(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pidfile = tmp_path / "pgid"
    # It and its children ignore SIGTERM: only the SIGKILL after the grace ends them.
    _config(tmp_path, script(tmp_path / "start.sh",
                             f"echo $$ > {pidfile}\ntrap '' TERM\nsleep 600 &\n"
                             "sleep 600 &\nwait\n"))
    try:
        assert main(["start", "pod", "--timeout", "2"]) == 1
        assert "start command for pod ran past 2 s" in capsys.readouterr().err
        pgid = _pgid(pidfile)
        wait_until(lambda: group_members(pgid) == [], "the tool's group ended", 30)
    finally:
        if pidfile.exists():
            kill_group(int(pidfile.read_text()))
    with Store() as store:
        (row,) = store.host_actions("pod")
    assert (row.action, row.ok) == ("start", False) and "ran past 2 s" in row.detail


def test_a_tool_cancelled_by_the_person_is_ended_with_its_group(tmp_path: Path) -> None:
    """The TUI's Back cancels the start: the tool and its children must not go on."""
    import asyncio

    from gpuws.live.uptime import power

    pidfile = tmp_path / "pgid"
    tool = script(tmp_path / "start.sh", f"echo $$ > {pidfile}\ntrap '' TERM\n"
                                         "sleep 600 &\nsleep 600\n")

    async def start_then_back() -> None:
        task = asyncio.create_task(power.run_command([tool], "start", "pod", timeout_s=300))
        while not (pidfile.exists() and pidfile.read_text().strip()):
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(start_then_back())
        pgid = _pgid(pidfile)
        wait_until(lambda: group_members(pgid) == [], "the cancelled tool's group ended", 30)
    finally:
        if pidfile.exists():
            kill_group(int(pidfile.read_text()))
