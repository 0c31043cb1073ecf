"""Pulls that cannot hang: a workload announcing a FIFO, an endless file or a link to one.

The workload is an ordinary ``cmd:`` run over a real OpenSSH sshd (with and without an
SFTP subsystem). It leaves a FIFO (or a link to ``/dev/zero``) in its artifact directory
and appends one ``artifact`` line with the right ``seq`` and the right pod path to its own
``events.ndjson`` (``$GPUWS_RUN_DIR`` is in its environment), so the laptop's boundary
takes it. Before the fix the pull blocked in the pod's sftp-server's ``open`` of the FIFO,
``gpuws run`` printed "run ok" and never returned, and Ctrl+C was ignored.

Asserted, with the real ``gpuws run`` as a subprocess: the pull of the FIFO is refused as
not a regular file, the command ends by itself with one ``gpuws: …`` line and a non-zero
exit, and the run stays recorded; a stalled transfer ends after the stall timeout with
one line; SIGINT during a stalled pull ends the command promptly with a clean line.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuws.config import PullConfig, load_config
from gpuws.errors import TransferError
from gpuws.locations import artifacts_dir
from gpuws.sessions.artifacts import pull_run
from gpuws.sessions.store import Store
from gpuws.transport.ssh import SSHTransport
from security.test_security_pull import connect, produce  # type: ignore[import-not-found]
from sshd import SshServer  # type: ignore[import-not-found]

pytestmark = pytest.mark.ssh

#: Appends an ``artifact`` line for NAME (a FIFO, or a link to TARGET) with the next seq.
ANNOUNCE = r'''
import json, os, sys, time
name, target, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
run_dir = os.environ["GPUWS_RUN_DIR"]
dest = os.path.join(run_dir, "artifacts", name)
if target == "fifo":
    os.mkfifo(dest)
elif target != "-":
    os.symlink(target, dest)
log = os.path.join(run_dir, "events.ndjson")
with open(log) as f:
    last = [json.loads(line) for line in f if line.strip()][-1]
line = {"type": "artifact", "run_id": os.environ["GPUWS_RUN_ID"], "seq": last["seq"] + 1,
        "ts": time.time(), "name": name, "path": dest, "size": size, "sha256": "0" * 64}
with open(log, "a") as f:
    f.write(json.dumps(line) + "\n")
'''


class Lines:
    """A pipe read line by line on a thread."""

    def __init__(self, stream: object) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: object) -> None:
        for raw in stream:  # type: ignore[attr-defined]
            with self._cond:
                self.lines.append(raw.rstrip("\n"))
                self._cond.notify_all()

    def wait_for(self, pattern: str, timeout: float) -> str:
        rx = re.compile(pattern)
        with self._cond:
            found = self._cond.wait_for(
                lambda: next((x for x in self.lines if rx.search(x)), None), timeout)
        assert found is not None, f"no line matching {pattern!r} within {timeout} s: " \
                                  f"{self.lines[-20:]}"
        return found

    def text(self) -> list[str]:
        self._thread.join(10)
        return list(self.lines)


def gpuws_run(cfg: Path, workload: str, *extra: str) -> tuple[subprocess.Popen[str], Lines,
                                                                Lines]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "2000"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuws.cli", "run", "pod", "-F", str(cfg), "-w", workload,
         *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        text=True, env=env)
    return proc, Lines(proc.stdout), Lines(proc.stderr)


def announcing(tmp_path: Path, name: str, target: str, size: int) -> str:
    script = tmp_path / "announce.py"
    script.write_text(ANNOUNCE)
    return f"cmd:python3 {script} {name} {target} {size}"


def stored_run_ok() -> bool:
    with Store() as store:
        runs = [r for s in store.sessions() for r in store.runs(s.id)]
    return len(runs) == 1 and runs[0].status == "ok"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("server,target", [("sshd", "fifo"), ("sshd", "/dev/zero"),
                                           ("sshd_nosftp", "fifo")])
def test_gpuws_run_refuses_a_fifo_or_device_artifact_and_returns(
        server: str, target: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    pod: SshServer = request.getfixturevalue(server)
    pod.reset_pod()
    cfg = pod.client_files(tmp_path / "client")
    proc, _out, err = gpuws_run(cfg, announcing(tmp_path, "trap.bin", target, 16))
    try:
        code = proc.wait(200)  # generous: the point is that it returns at all
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    stderr = err.text()
    assert code != 0, stderr
    assert all(line.startswith("gpuws: ") for line in stderr if line.strip()), stderr
    refused = [line for line in stderr if "trap.bin" in line]
    assert refused and "not a regular file" in refused[0], stderr
    assert stored_run_ok()


def sftp_servers(listener: int) -> list[int]:
    """The processes serving SFTP sessions under the sshd ``listener`` (from /proc)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_bytes().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue

    def under(pid: int) -> bool:
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid == listener:
                return True
        return False

    out = []
    for pid in parent:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"sftp" in cmd and under(pid):
            out.append(pid)
    return out


def wait_for_sftp(pod: SshServer, before: set[int], timeout: float = 60) -> list[int]:
    assert pod.proc is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [pid for pid in sftp_servers(pod.proc.pid) if pid not in before]
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("no SFTP session appeared")


def test_a_stalled_sftp_read_ends_with_one_line(sshd: SshServer, tmp_path: Path) -> None:
    """The pod's file server stops answering mid-pull (here: its sftp process is stopped,
    as a FIFO swapped in after the check would block it): the read ends after the stall
    timeout with one line, and the next read opens a fresh SFTP session."""
    sshd.reset_pod()
    cfg = sshd.client_files(tmp_path / "client")
    plain = tmp_path / "plain.bin"
    plain.write_bytes(b"x" * 100)
    assert sshd.proc is not None
    before = set(sftp_servers(sshd.proc.pid))
    stopped: list[int] = []

    async def go() -> tuple[str, bytes]:
        t = SSHTransport("pod", config_file=str(cfg))
        await t.connect()
        try:
            await t.settled()
            stopped.extend(await asyncio.to_thread(wait_for_sftp, sshd, before))
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
            with pytest.raises(TransferError) as exc:
                async for _ in t.read_file(str(plain), 0, [], stall_s=2):
                    pass
            got = b"".join([c async for c in t.read_file(str(plain), 0, [], stall_s=30)])
            return exc.value.one_line(), got
        finally:
            await asyncio.wait_for(t.close(), 30)

    try:
        line, got = asyncio.run(asyncio.wait_for(go(), 120))
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert "no bytes for 2 s" in line and "\n" not in line, line
    assert got == b"x" * 100


@pytest.mark.timeout(300)
def test_sigint_during_a_stalled_pull_ends_gpuws_run(sshd: SshServer, tmp_path: Path) -> None:
    """Ctrl+C while the pull waits on a pod file server that stopped answering (with a
    stall timeout of an hour, so only SIGINT can end it): ``gpuws run`` ends promptly with
    one line, and the run stays recorded."""
    sshd.reset_pod()
    cfg = sshd.client_files(tmp_path / "client")
    go_file = tmp_path / "go"
    config = tmp_path / "config.toml"
    config.write_text("[pull]\nstall_s = 3600\n")
    workload = (f"cmd:while [ ! -e {go_file} ]; do sleep 0.05; done; "
                f"head -c 1000 /dev/urandom > \"$GPUWS_ARTIFACT_DIR/short.bin\"")
    assert sshd.proc is not None
    before = set(sftp_servers(sshd.proc.pid))
    os.environ["GPUWS_CONFIG"] = str(config)
    try:
        proc, out, err = gpuws_run(cfg, workload)
    finally:
        del os.environ["GPUWS_CONFIG"]
    stopped: list[int] = []
    try:
        out.wait_for(r"^run ", 120)
        stopped = wait_for_sftp(sshd, before)
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        go_file.touch()
        out.wait_for(r"^run ok in", 120)
        # The pull has begun once it holds the run's pull lock; it then waits on the
        # stopped server (its stall timeout is an hour): only SIGINT can end it now.
        home = Path(os.environ["GPUWS_HOME"])
        deadline = time.monotonic() + 120
        while not list(home.rglob(".gpuws-pull.lock")):
            assert time.monotonic() < deadline, "the pull never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(60)
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    stderr = [line for line in err.text() if line.strip()]
    assert code != 0, stderr
    assert stderr and all(line.startswith("gpuws: ") for line in stderr), stderr
    assert stored_run_ok()


@pytest.mark.timeout(300)
def test_artifact_caps_per_run_name_keys_the_config_accepts(sshd: SshServer,
                                                            tmp_path: Path) -> None:
    """30 announced artifacts of 1 MiB (the 3 GiB attack, scaled down 100 times) against
    caps of 8 artifacts and 4 MiB per run: no more is written than the caps allow, each
    refusal names a key, and the config loader accepts that very key."""
    sshd.reset_pod()
    cfg = sshd.client_files(tmp_path / "client")
    big = os.urandom(1 << 20)
    digest = hashlib.sha256(big).hexdigest()
    config = tmp_path / "config.toml"
    for key, value in (("max_artifacts", 8), ("max_run_bytes", 4 << 20)):
        config.write_text(f"[pull]\n{key} = {value}\n")
        limits = load_config(config).pull  # the key the refusal names is accepted
        store = Store()
        sid = store.open_session("pod", "sftp", None, 1.0)
        run_id = asyncio.run(produce(cfg, store, sid))
        pod_dir = Path(store.artifacts(run_id)[0].remote_path).parent
        for i in range(30):
            (pod_dir / f"a{i:02d}.bin").write_bytes(big)
            store.record_artifact(run_id, f"a{i:02d}.bin", str(pod_dir / f"a{i:02d}.bin"),
                                  len(big), digest)

        async def go(limits: PullConfig = limits, store: Store = store, sid: str = sid,
                     run_id: str = run_id) -> TransferError:
            client = await connect(cfg)
            try:
                with pytest.raises(TransferError) as exc:
                    await asyncio.wait_for(pull_run(client, store, sid, run_id,
                                                    limits=limits), 120)
                return exc.value
            finally:
                await client.close()

        err = asyncio.run(go())
        assert f"raise {key} in the [pull] table" in err.remedy, err.remedy
        rows = store.artifacts(run_id)
        pulled = [a for a in rows if a.status == "pulled"]
        on_disk = sum(f.stat().st_size for f in artifacts_dir(sid, run_id).rglob("*")
                      if f.is_file() and not f.name.startswith(".gpuws"))
        if key == "max_artifacts":
            assert len(pulled) == 8, len(pulled)
        else:
            assert sum(a.size for a in pulled) == 4 << 20 == on_disk
        store.close()
