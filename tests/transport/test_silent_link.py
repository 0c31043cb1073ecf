"""A link that goes silent is declared dead within the stated bound, with the reason.

The pod's sshd processes serving the connection are stopped (SIGSTOP), as a NAT that
forgot the flow, a sleeping laptop or a frozen pod look from the laptop: no reset, no
FIN, nothing. OpenSSH's ``ssh`` with the same config is stopped the same way beside
gpuws; both times (gpuws's and ssh's, from the freeze) are recorded figures, not asserted
bounds: the test waits for each on its condition, with a generous timeout, and asserts
that gpuws gave up through its keepalives (the reason names them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from faults.figures import record  # type: ignore[import-not-found]
from faults.helpers import child_pids  # type: ignore[import-not-found]
from gpuws.client import AgentClient
from gpuws.errors import ConnectError
from gpuws.transport.ssh import DEFAULT_ALIVE_INTERVAL, SSHTransport, keepalive_for
from gpuws.transport.sshconfig import SSHTarget
from sshd import SshServer, sshd_missing_may_skip  # type: ignore[import-not-found]

pytestmark = pytest.mark.skipif(sshd_missing_may_skip(), reason="OpenSSH sshd is not installed")


def descendants(pid: int) -> list[int]:
    out = []
    for child in child_pids(pid):
        out += [child, *descendants(child)]
    return out


def test_default_bound_is_45_s_and_follows_server_alive() -> None:
    unset = keepalive_for(SSHTarget(alias="p", hostname="p"))
    assert (unset.interval_s, unset.count_max, unset.bound_s) == (DEFAULT_ALIVE_INTERVAL, 3, 45)
    set_ = keepalive_for(SSHTarget(alias="p", hostname="p", server_alive_interval=5,
                                   server_alive_count_max=4))
    assert set_.bound_s == 20 and set_.asyncssh_count_max == 3
    # One keepalive is always sent before giving up: an idle link is not a dead one.
    one = keepalive_for(SSHTarget(alias="p", hostname="p", server_alive_interval=2,
                                  server_alive_count_max=1))
    assert one.asyncssh_count_max == 1 and one.bound_s == 4


def test_frozen_pod_is_declared_dead_within_the_bound(tmp_path: Path) -> None:
    server = SshServer(tmp_path / "sshd").start()
    try:
        cfg = server.client_files(tmp_path / "c", extra="  ServerAliveInterval 1\n"
                                                         "  ServerAliveCountMax 2\n")
        assert server.proc is not None
        ssh = subprocess.Popen(["ssh", "-F", str(cfg), "-o", "BatchMode=yes", "pod",
                                "sleep 60"], stdin=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)

        async def go() -> tuple[float, float, str | None]:
            client = await AgentClient.connect(SSHTransport("pod", config_file=str(cfg)))
            transport = client.transport
            bound = transport.info.dead_link_bound_s
            assert bound == 2.0
            await client.ping()
            deadline = time.monotonic() + 60
            while len(child_pids(server.proc.pid)) < 2:  # ssh's session and ours
                assert time.monotonic() < deadline, "the ssh client did not connect"
                await asyncio.sleep(0.05)
            frozen = descendants(server.proc.pid)
            for pid in frozen:
                with contextlib.suppress(ProcessLookupError):  # a session just ending
                    os.kill(pid, signal.SIGSTOP)
            t0 = time.monotonic()
            try:
                await asyncio.wait_for(client.wait_closed(), bound + 60)
                ours = time.monotonic() - t0
                await asyncio.to_thread(ssh.wait, 90)
                theirs = time.monotonic() - t0
                assert transport.lost_reason is not None
                with pytest.raises(ConnectError, match="closed"):
                    await client.ping()
            finally:
                for pid in frozen:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
                reason = transport.lost_reason
                await client.close()
            # The same transport connects again (what a reconnect does): a fresh link,
            # the old reason cleared.
            await transport.connect()
            try:
                assert transport.lost_reason is None
                assert (await transport.run(["echo", "back"])).stdout == b"back\n"
            finally:
                await transport.close()
            return ours, theirs, reason

        ours, theirs, reason = asyncio.run(go())
    finally:
        server.stop()
    record("silent_link_transport", bound_s=2.0, gpuws_declared_dead_s=round(ours, 2),
           ssh_declared_dead_s=round(theirs, 2))
    assert ssh.returncode == 255
    assert reason is not None and "stopped answering" in reason
    assert "ServerAliveInterval 1 x ServerAliveCountMax 2" in reason and "2 s" in reason
