"""The tests' real OpenSSH sshd (tests/sshd.py), started outside pytest for the benchmarks.

Also what the transport benchmarks share: a delay proxy that puts a round-trip time
between client and server (loopback has none, a rented pod always has some), the
machine's description, medians.

The server and every client-side file live in one temporary directory; nothing touches
the user's ~/.ssh. The pod side's gpuws cache is the server's own ``podcache`` (sshd
hands it to every session through ``SetEnv GPUWS_POD_CACHE``).

``python3 bench/_sshd.py proxy LISTEN_PORT TARGET_PORT RTT_MS`` runs the delay proxy
alone (``running_pod`` starts it that way, in its own process, so its work never shares
the benchmark's event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_TESTS = Path(__file__).resolve().parent.parent / "tests"
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

from sshd import SshServer, find_sshd, free_port  # type: ignore[import-not-found]  # noqa: E402


@dataclass
class Pod:
    """One running sshd and the ssh config (alias ``pod``) that reaches it."""

    server: SshServer
    config: Path
    rtt_ms: float = 0.0

    @property
    def cache(self) -> Path:
        """The pod-side gpuws cache (``GPUWS_POD_CACHE`` of every session)."""
        path: Path = self.server.pod_cache
        return path

    def ssh(self, *argv: str) -> list[str]:
        """The OpenSSH client command that runs ``argv`` on this pod (batch mode)."""
        return ["ssh", "-F", str(self.config), "-o", "BatchMode=yes", "pod", *argv]

    def scp_from(self, remote: str, local: str, *options: str) -> list[str]:
        """The OpenSSH ``scp`` command that copies ``remote`` from this pod to ``local``."""
        return ["scp", "-q", *options, "-F", str(self.config), "-o", "BatchMode=yes",
                f"pod:{remote}", local]


@contextlib.contextmanager
def running_pod(variant: str = "default", rtt_ms: float = 0.0) -> Iterator[Pod]:
    """Start a real sshd on 127.0.0.1 (``variant``: ``default`` or ``nosftp``); stop it after.

    With ``rtt_ms`` the client config reaches the server through the delay proxy, so
    gpuws and OpenSSH's client both see that round-trip time. Also points
    ``GPUWS_HOME``/``GPUWS_CONFIG`` at the temporary directory, as the tests' autouse
    fixture does, so a benchmark never writes to the person's own gpuws data.
    """
    if find_sshd() is None:
        raise SystemExit("OpenSSH sshd is not installed (apt-get install openssh-server)")
    with tempfile.TemporaryDirectory(prefix=f"gpuws-bench-{variant}-") as tmp:
        root = Path(tmp)
        os.environ["GPUWS_HOME"] = str(root / "gpuws-home")
        os.environ["GPUWS_CONFIG"] = str(root / "gpuws-config.toml")
        os.environ.pop("SSH_AUTH_SOCK", None)
        server = SshServer(root / "sshd", variant).start()
        proxy: subprocess.Popen[bytes] | None = None
        try:
            config = server.client_files(root / "client")
            if rtt_ms:
                port = free_port()
                proxy = subprocess.Popen([sys.executable, __file__, "proxy", str(port),
                                          str(server.port), str(rtt_ms)])
                _wait_port(port)
                # Same server, reached through the proxy's port: its known_hosts entry
                # names that port, as it would for a pod behind a forwarded port.
                (root / "client" / "known_hosts").write_text(
                    server.known_hosts_line().replace(f":{server.port} ", f":{port} "))
                config.write_text(config.read_text().replace(f"Port {server.port}\n",
                                                             f"Port {port}\n"))
            yield Pod(server, config, rtt_ms)
        finally:
            if proxy is not None:
                proxy.terminate()
                proxy.wait(5)
            server.stop()


def _wait_port(port: int) -> None:
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"the delay proxy did not listen on {port}")


# ----------------------------------------------------------------------------- delay proxy
async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                delay_s: float) -> None:
    """Forward bytes, each read delivered ``delay_s`` after it arrived (no rate limit)."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    task = asyncio.create_task(deliver())
    try:
        while True:
            data = await reader.read(1 << 18)
            queue.put_nowait((time.monotonic() + delay_s, data))
            if not data:
                break
        await task
    finally:
        task.cancel()


async def _proxy(listen: int, target: int, rtt_ms: float) -> None:
    one_way = rtt_ms / 2000.0
    # asyncio holds connection handlers weakly; a handler collected mid-flight would
    # drop its connection (and complain that a pending task was destroyed).
    live: set[asyncio.Task[None] | None] = set()

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        live.add(me)
        try:
            await forward(cr, cw)
        finally:
            live.discard(me)

    async def forward(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            sr, sw = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            cw.close()
            return
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await asyncio.gather(_pump(cr, sw, one_way), _pump(sr, cw, one_way))
        for w in (cw, sw):
            w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


def compile_gpuws() -> None:
    """Byte-compile gpuws as an installed package is (pip compiles at install), so a
    timed ``gpuws`` process does not compile stale modules on every start: a shell with
    ``PYTHONDONTWRITEBYTECODE`` set (ours has) never writes the ``.pyc`` files, and
    compiling ~45 changed modules cost ~0.1 s of each 1.5 s ``gpuws pull``."""
    import compileall

    import gpuws

    compileall.compile_dir(str(Path(gpuws.__file__).parent), quiet=1)


# ----------------------------------------------------------------------------- reporting
def machine() -> dict[str, str]:
    """Where a figure was measured: CPU model and count, load, Python, OpenSSH, asyncssh,
    msgspec (the load average says how busy the shared machine was)."""
    import asyncssh
    import msgspec

    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    ssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return {"cpu": model, "nproc": str(os.cpu_count()), "loadavg_at_end": load,
            "python": platform.python_version(), "platform": platform.platform(),
            "openssh": (ssh.stderr or ssh.stdout).strip(),
            "asyncssh": asyncssh.__version__, "msgspec": msgspec.__version__}


def median(values: list[float]) -> float:
    return float(statistics.median(values))


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "proxy":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_proxy(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])))
