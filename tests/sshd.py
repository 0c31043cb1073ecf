"""A real OpenSSH sshd on 127.0.0.1 for the tests: own host key, client key, config.

The tests never touch the user's ~/.ssh: every client-side file (config, key,
known_hosts) lives in a temporary directory, and the pod side's gpuws cache is pointed
at another one through sshd's ``SetEnv GPUWS_POD_CACHE``.

A machine without sshd (the GPU machine) can run a carried one: ``GPUWS_CARRIED_SSHD``
names a folder made by ``tests/gpu/make_carry.sh`` (``bin/`` sshd, sftp-server,
ssh-keygen; ``lib/`` their shared libraries). sshd and ssh-keygen then run with
``LD_LIBRARY_PATH`` pointing there, set for those processes alone: sshd builds each
session's environment afresh (USER, HOME, PATH, SetEnv...; session.c ``do_setup_env``),
so the sessions' shells, and the agent, never see it.
"""

from __future__ import annotations

import getpass
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

#: sshd's ForceCommand for the ``ptyproxy`` variant.
PTY_PROXY = Path(__file__).resolve().parent / "transport" / "pty_proxy.sh"


#: Where sshd must be there (CI, scripts/test, which installs it), a test that needs it
#: fails when it is missing instead of skipping: hundreds of green skips hide a broken set-up.
REQUIRE_SSHD = bool(os.environ.get("CI") or os.environ.get("GPUWS_REQUIRE_SSHD"))

#: A folder made by tests/gpu/make_carry.sh: run that sshd instead of the system's.
CARRIED_ENV = "GPUWS_CARRIED_SSHD"


def carried_sshd() -> Path | None:
    """The carried OpenSSH folder named by :data:`CARRIED_ENV` (None: not asked for).

    Raises:
        RuntimeError: the variable is set but the folder is not usable here (not made, or
            this machine's glibc is older than the carried files need), in one line.
    """
    where = os.environ.get(CARRIED_ENV)
    if not where:
        return None
    root = Path(where).resolve()
    if not (root / "bin" / "sshd").is_file():
        raise RuntimeError(f"{CARRIED_ENV}={where}: no bin/sshd there; make it with "
                           "tests/gpu/make_carry.sh and carry .carry/ to this machine")
    need = (root / "GLIBC").read_text().strip() if (root / "GLIBC").exists() else ""
    have = os.confstr("CS_GNU_LIBC_VERSION") or ""  # "glibc 2.39"
    if need and have.startswith("glibc ") and _version(have.split()[1]) < _version(need):
        raise RuntimeError(f"the carried sshd needs glibc >= {need}, this machine has "
                           f"{have}: make the carry on a machine with an older glibc")
    for prog in (root / "bin").iterdir():
        if not os.access(prog, os.X_OK):
            prog.chmod(0o755)  # a copy that lost its modes on the way
    return root


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(".") if x.isdigit())


def carried_env(root: Path) -> dict[str, str]:
    """The environment of a carried OpenSSH program: its libraries, a plain PATH, no more."""
    return {"LD_LIBRARY_PATH": str(root / "lib"), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def ensure_privsep() -> None:
    """What a root sshd needs and a machine without OpenSSH lacks: the ``sshd`` user
    (privilege separation) and the empty ``/run/sshd`` it chroots into."""
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    try:
        pwd.getpwnam("sshd")
    except KeyError:
        shell = "/usr/sbin/nologin" if os.path.exists("/usr/sbin/nologin") else "/bin/false"
        subprocess.run(["useradd", "-r", "-M", "-d", "/run/sshd", "-s", shell, "sshd"],
                       check=True, capture_output=True)


def find_sshd() -> str | None:
    carried = carried_sshd()
    if carried is not None:
        return str(carried / "bin" / "sshd")
    for cand in (shutil.which("sshd"), "/usr/sbin/sshd", "/usr/local/sbin/sshd"):
        if cand and os.path.exists(cand):
            return cand
    return None


def sshd_missing_may_skip() -> bool:
    """Whether a test needing sshd may skip: sshd is missing and not required here."""
    return find_sshd() is None and not REQUIRE_SSHD


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keygen(path: Path) -> None:
    carried = carried_sshd()
    prog = str(carried / "bin" / "ssh-keygen") if carried else "ssh-keygen"
    subprocess.run([prog, "-q", "-t", "ed25519", "-N", "", "-C", "gpuws-test", "-f", str(path)],
                   check=True, env=carried_env(carried) if carried else None)


@dataclass
class SshServer:
    """One sshd process. ``variant`` changes its config (no SFTP, no python3 on PATH...).

    ``ptyproxy`` is configured like RunPod's basic SSH proxy: no SFTP subsystem and a
    ``ForceCommand`` (tests/transport/pty_proxy.sh) that refuses exec requests and sessions
    without a TTY and starts a login shell (``pty_shell``: bash or sh) behind a banner.
    ``pty_noise`` makes a background job write a line to the terminal every that many
    seconds; ``pty_path`` replaces the login shell's PATH.

    ``shells`` also accepts users made by :meth:`login_user` (each with its own login
    shell, home and authorized_keys; the pod cache is then each user's own
    ``~/.cache/gpuws``, since the bootstrap refuses a cache owned by someone else).
    """

    root: Path
    variant: str = "default"
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    extra: list[str] = field(default_factory=list)
    max_sessions: int = 100
    pty_shell: str = "bash"
    pty_noise: float | None = None
    pty_path: str | None = None
    users: list[str] = field(default_factory=list)
    homes: Path | None = None

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
            f"AuthorizedKeysFile {self.root / 'authorized_keys'} .ssh/authorized_keys",
            # The key files live in a pytest tmp dir whose parents' modes we do not control.
            "StrictModes no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "UsePAM no",
            "PermitRootLogin prohibit-password",
            "LogLevel ERROR",
            "MaxStartups 100",
            f"MaxSessions {self.max_sessions}",
        ]
        env = [f"GPUWS_POD_CACHE={self.pod_cache}"]
        if self.variant not in ("nosftp", "ptyproxy"):
            lines.append("Subsystem sftp internal-sftp")
        if self.variant == "nopython":
            env.append("PATH=/nonexistent-gpuws-test-bin")
        if self.variant == "ptyproxy":
            lines.append(f"ForceCommand /bin/sh {PTY_PROXY}")
            env += [f"GPUWS_PTY_HOME={self._pty_home()}", f"GPUWS_PTY_SHELL={self.pty_shell}"]
            if self.pty_noise:
                env.append(f"GPUWS_PTY_NOISE={self.pty_noise}")
            if self.pty_path:
                env.append(f"GPUWS_PTY_PATH={self.pty_path}")
        if self.variant == "shells":
            env.remove(f"GPUWS_POD_CACHE={self.pod_cache}")
        if env:
            lines.append("SetEnv " + " ".join(env))
        lines += self.extra
        carried = carried_sshd()
        if carried is not None and os.geteuid() == 0:
            ensure_privsep()
        for _ in range(5):
            self.port = free_port()
            cfg = self.root / "sshd_config"
            cfg.write_text("\n".join([f"Port {self.port}", *lines]) + "\n")
            os.makedirs("/run/sshd", exist_ok=True) if os.geteuid() == 0 else None
            # A carried sshd gets its libraries (and nothing else) through its own
            # environment; the sessions it starts do not inherit it (see the docstring).
            self.proc = subprocess.Popen([find_sshd() or "sshd", "-D", "-e", "-f", str(cfg)],
                                         stderr=open(self.root / "sshd.log", "wb"),
                                         env=carried_env(carried) if carried else None)
            if self._wait_listening():
                return self
            self.stop()
        raise RuntimeError("sshd did not start: " + (self.root / "sshd.log").read_text())

    def boot_command(self) -> str:
        """The shell line that starts this server again as a booting pod's init would:
        without ``-D`` sshd daemonises once it listens, its pid in ``sshd.pid``."""
        carried = carried_sshd()
        env = " ".join(f"{k}={v}" for k, v in (carried_env(carried) if carried else {}).items())
        return f"env {env} {find_sshd()} -f {self.root / 'sshd_config'}"

    def daemon_pid(self) -> int | None:
        """The pid of this server started by :meth:`boot_command`, while it lives."""
        try:
            pid = int((self.root / "sshd.pid").read_text().split()[0])
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            return None
        return pid

    def _pty_home(self) -> Path:
        """The login shell's home: a profile with a coloured prompt and a chatty MOTD."""
        home = self.root / "pty-home"
        home.mkdir(exist_ok=True)
        (home / ".bash_profile").write_text(
            'echo "Last login: Mon Mar  3 09:14:07 2025 from 10.0.0.1"\n'
            'echo "You have new mail."\n'
            '[ -n "$GPUWS_PTY_PATH" ] && PATH=$GPUWS_PTY_PATH\n'
            "PS1='\\[\\e[01;32m\\]root@pod-7f3a\\[\\e[00m\\]:\\[\\e[01;34m\\]\\w\\[\\e[00m\\]# '\n")
        return home

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
        for user in self.users:
            # -f: even if a session of it is still being torn down.
            subprocess.run(["userdel", "-f", user], check=False, capture_output=True)
        self.users = []
        if self.homes is not None:
            shutil.rmtree(self.homes, ignore_errors=True)
            self.homes = None

    def login_user(self, shell: str) -> str:
        """A user whose login shell is ``shell`` and who logs in with ``client_key``.

        Needs root (``useradd``); the user is removed by :meth:`stop`. Its home lies in a
        directory others may enter (pytest's tmp dirs are private to root).
        """
        if self.homes is None:
            self.homes = Path(tempfile.mkdtemp(prefix="gpuws-shells-"))
            self.homes.chmod(0o755)
        name = f"gpuws{os.path.basename(shell)[:6]}{self.port}"
        home = self.homes / name
        # -p '*': no password, but not a locked account (sshd refuses those without PAM).
        subprocess.run(["useradd", "-M", "-d", str(home), "-s", shell, "-p", "*", name],
                       check=True, capture_output=True)
        self.users.append(name)
        (home / ".ssh").mkdir(parents=True)
        (home / ".ssh" / "authorized_keys").write_text(
            (self.root / "id_ed25519.pub").read_text())
        subprocess.run(["chown", "-R", f"{name}:", str(home)], check=True)
        home.chmod(0o700)
        return name

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
