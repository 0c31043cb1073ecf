"""A real OpenSSH sshd on 127.0.0.1 for the tests: own host key, client key, config.

The tests never touch the user's ~/.ssh: every client-side file (config, key,
known_hosts) lives in a temporary directory, and the pod side's gpuws cache is pointed
at another one through sshd's ``SetEnv GPUWS_POD_CACHE``.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


def find_sshd() -> str | None:
    for cand in (shutil.which("sshd"), "/usr/sbin/sshd", "/usr/local/sbin/sshd"):
        if cand and os.path.exists(cand):
            return cand
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuws-test",
                    "-f", str(path)], check=True)


@dataclass
class SshServer:
    """One sshd process. ``variant`` changes its config (no SFTP, no python3 on PATH...)."""

    root: Path
    variant: str = "default"
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    extra: list[str] = field(default_factory=list)

    @property
    def pod_cache(self) -> Path:
        return self.root / "podcache"

    @property
    def host_key(self) -> Path:
        return self.root / "host_ed25519"

    @property
    def client_key(self) -> Path:
        return self.root / "id_ed25519"

    def start(self) -> SshServer:
        self.root.mkdir(parents=True, exist_ok=True)
        keygen(self.host_key)
        keygen(self.client_key)
        (self.root / "authorized_keys").write_text(
            (self.root / "id_ed25519.pub").read_text())
        self.pod_cache.mkdir(mode=0o700)
        lines = [
            "ListenAddress 127.0.0.1",
            f"HostKey {self.host_key}",
            f"PidFile {self.root / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}",
            # The key files live in a pytest tmp dir whose parents' modes we do not control.
            "StrictModes no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "UsePAM no",
            "PermitRootLogin prohibit-password",
            "LogLevel ERROR",
            "MaxStartups 100",
            "MaxSessions 100",
        ]
        env = [f"GPUWS_POD_CACHE={self.pod_cache}"]
        if self.variant != "nosftp":
            lines.append("Subsystem sftp internal-sftp")
        if self.variant == "nopython":
            env.append("PATH=/nonexistent-gpuws-test-bin")
        lines.append("SetEnv " + " ".join(env))
        lines += self.extra
        for _ in range(5):
            self.port = free_port()
            cfg = self.root / "sshd_config"
            cfg.write_text("\n".join([f"Port {self.port}", *lines]) + "\n")
            os.makedirs("/run/sshd", exist_ok=True) if os.geteuid() == 0 else None
            self.proc = subprocess.Popen([find_sshd() or "sshd", "-D", "-e", "-f", str(cfg)],
                                         stderr=open(self.root / "sshd.log", "wb"))
            if self._wait_listening():
                return self
            self.stop()
        raise RuntimeError("sshd did not start: " + (self.root / "sshd.log").read_text())

    def _wait_listening(self) -> bool:
        deadline = time.time() + 10
        while time.time() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return True
            except OSError:
                time.sleep(0.05)
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None

    def known_hosts_line(self) -> str:
        pub = (self.root / "host_ed25519.pub").read_text().split()
        return f"[127.0.0.1]:{self.port} {pub[0]} {pub[1]}\n"

    def client_files(self, where: Path, *, known: bool = True, alias: str = "pod",
                     extra: str = "") -> Path:
        """Write an ssh config (and known_hosts) naming this server; returns the config."""
        where.mkdir(parents=True, exist_ok=True)
        kh = where / "known_hosts"
        kh.write_text(self.known_hosts_line() if known else "")
        cfg = where / "ssh_config"
        cfg.write_text(
            f"Host {alias}\n"
            f"  HostName 127.0.0.1\n  Port {self.port}\n  User {getpass.getuser()}\n"
            f"  IdentityFile {self.client_key}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {kh}\n  StrictHostKeyChecking yes\n{extra}")
        return cfg

    def reset_pod(self) -> None:
        shutil.rmtree(self.pod_cache, ignore_errors=True)
        self.pod_cache.mkdir(mode=0o700)
