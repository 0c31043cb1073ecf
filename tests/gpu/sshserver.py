"""A real SSH server on loopback for machines without OpenSSH's sshd (the GPU machine).

asyncssh's server, with exec channels that run each command through ``sh -c`` as this
user and an SFTP subsystem: the same protocol paths gpuws takes against a real pod.
OpenSSH's sshd is preferred wherever it exists (tests/sshd.py).
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from pathlib import Path

import asyncssh


class AsyncSSHServer:
    """Runs in a thread with its own loop, so in-process gpuws CLI calls can use it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = 0
        self.pod_cache = root / "podcache"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncssh.SSHAcceptor | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> AsyncSSHServer:
        self.root.mkdir(parents=True, exist_ok=True)
        self.pod_cache.mkdir(mode=0o700, exist_ok=True)
        host = asyncssh.generate_private_key("ssh-ed25519")
        host.write_private_key(str(self.root / "host_key"))
        self.host_public = host.export_public_key().decode().strip()
        client = asyncssh.generate_private_key("ssh-ed25519")
        client.write_private_key(str(self.root / "id_ed25519"))
        os.chmod(self.root / "id_ed25519", 0o600)
        (self.root / "authorized_keys").write_text(client.export_public_key().decode())
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("asyncssh server did not start")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncssh.listen(
            "127.0.0.1", self.port, server_host_keys=[str(self.root / "host_key")],
            authorized_client_keys=str(self.root / "authorized_keys"),
            process_factory=self._handle, sftp_factory=True, encoding=None,
            allow_pty=False, x11_forwarding=False, agent_forwarding=False))
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        env = dict(os.environ, GPUWS_POD_CACHE=str(self.pod_cache))
        local = await asyncio.create_subprocess_shell(
            process.command or "sh", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
            cwd=str(Path.home()), start_new_session=True)
        await process.redirect(stdin=local.stdin, stdout=local.stdout, stderr=local.stderr)
        code = await local.wait()
        # Let the redirected output reach the channel before the exit status does.
        await asyncio.sleep(0.05)
        process.exit(code)

    def client_files(self, where: Path) -> Path:
        where.mkdir(parents=True, exist_ok=True)
        (where / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {self.host_public}\n")
        cfg = where / "ssh_config"
        cfg.write_text(f"Host pod\n  HostName 127.0.0.1\n  Port {self.port}\n"
                       f"  User {os.environ.get('USER', 'root')}\n"
                       f"  IdentityFile {self.root / 'id_ed25519'}\n  IdentitiesOnly yes\n"
                       f"  UserKnownHostsFile {where / 'known_hosts'}\n"
                       "  StrictHostKeyChecking yes\n")
        return cfg

    def stop(self) -> None:
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
