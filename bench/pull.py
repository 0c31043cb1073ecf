"""Pulling a 256 MiB artifact from a real OpenSSH sshd, beside OpenSSH's ``scp``.

Two servers run on 127.0.0.1: one with an SFTP subsystem (the normal case) and one
without (files then move through the agent's ``cat`` on an exec channel). The same file
(a hard link) sits in both pods' run directories. Each repetition pulls it every way, in
a rotating order so a noisy neighbour hurts every method alike:

- ``gpuws pull`` (process): the whole command as a person types it
  (``gpuws pull -F CONFIG pod RUN``): Python start, imports, SSH handshake, the pull, the
  store update (over SFTP no agent is started; without SFTP it is, for its ``cat``);
  compared with ``scp``'s whole process, as the goal is stated;
- ``gpuws pull_run``: the product's path (``sessions.artifacts.pull_run``, as the engine
  calls it after a run) over a link already open, for a run whose one artifact is this
  file: lock, the local copy checked, ``.part`` file written and hashed as the bytes
  arrive in a writer thread, fsync, store update, rename, the transfer phase recorded;
- ``gpuws read_file + sha256``: the transport alone, streamed into a file and hashed as
  it arrives (what scp does, plus the hash);
- ``scp`` (OpenSSH >= 9 speaks SFTP underneath), ``scp -O`` (the old scp protocol), and on
  the server without SFTP ``scp -O`` and ``ssh pod cat FILE > copy``;
- ``ssh pod cat FILE | tee COPY | openssl dgst -sha256``: OpenSSH and OpenSSL hashing the
  bytes as they arrive, no Python anywhere: what ``gpuws pull`` promises (a copy verified
  as it lands), done with C tools; scp itself hashes nothing.

``pull_run`` and ``read_file`` pull over a connection that is already open (as after a
run); scp's wall time includes its own handshake, so ``ssh pod true`` is measured too and
the table shows scp with that subtracted as well. The ``gpuws pull`` process is timed
after one untimed call (on the server without SFTP it deploys the agent; scp has nothing
to deploy). Each
process pull starts with the local copy deleted, so it also takes the path that notices a
missing copy. ``--rtt-ms`` puts a delay proxy (bench/_sshd.py) between every client and
the servers. Run it from the repository root::

    python3 bench/pull.py --json pull.json
    python3 bench/pull.py --rtt-ms 20 --json pull-20ms.json
    python3 bench/pull.py --variants [--rtt-ms 20]   # each change of issue 13 undone alone
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _sshd import Pod, compile_gpuws, machine, median, running_pod

from gpuws import protocol
from gpuws.client import AgentClient
from gpuws.locations import artifacts_dir
from gpuws.sessions.artifacts import pull_run
from gpuws.sessions.store import Store
from gpuws.transport.ssh import SSHTransport

MB = 1000 * 1000
NAME = "blob.bin"


def make_blob(path: Path, size: int) -> str:
    """``size`` random bytes at ``path``; returns their sha256."""
    path.parent.mkdir(parents=True, mode=0o700)
    h = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            chunk = os.urandom(min(left, 1 << 24))
            h.update(chunk)
            f.write(chunk)
            left -= len(chunk)
    return h.hexdigest()


def artifact_path(pod: Pod, run_id: str) -> Path:
    return pod.cache / "runs" / run_id / "artifacts" / NAME


class Side:
    """One pod as the product sees it: an open agent link and the artifact in the store."""

    def __init__(self, pod: Pod, run_id: str, client: AgentClient, store: Store,
                 size: int, sha: str) -> None:
        self.pod, self.run_id, self.client, self.store = pod, run_id, client, store
        self.remote = str(artifact_path(pod, run_id))
        self.session = store.open_session("pod", "sftp" if client.transport.info.sftp
                                          else "exec", None, None)
        store.ingest(self.session, protocol.RunStarted(
            run_id=run_id, seq=0, ts=time.time(), run_dir=str(Path(self.remote).parent.parent),
            pid=1, spec=protocol.RunSpec(workload="builtin:saxpy", tiers=[1])))
        store.ingest(self.session, protocol.Artifact(
            run_id=run_id, seq=1, ts=time.time(), name=NAME, path=self.remote, size=size,
            sha256=sha))
        self.size, self.sha = size, sha

    async def pull_run(self) -> float:
        t0 = time.perf_counter()
        (result,) = await pull_run(self.client, self.store, self.session, self.run_id)
        elapsed = time.perf_counter() - t0
        if self.store.artifacts(self.run_id)[0].status != "pulled":
            raise SystemExit("pull_run did not record the artifact as pulled")
        # The next pull finds the copy missing and fetches it again (refetched).
        result.local_path.unlink()
        return elapsed

    def process(self) -> float:
        """The whole ``gpuws pull`` command in its own process; wall seconds."""
        local = artifacts_dir(self.session, self.run_id) / NAME
        local.unlink(missing_ok=True)
        argv = [sys.executable, "-c", "import sys; from gpuws.cli import main; sys.exit(main())",
                "pull", "-F", str(self.pod.config), "pod", self.run_id, "--json"]
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        elapsed = time.perf_counter() - t0
        if local.stat().st_size != self.size:
            raise SystemExit(f"gpuws pull left {local.stat().st_size} of {self.size} bytes")
        local.unlink()
        return elapsed

    async def read_file(self, dest: Path, digest: bool = True) -> float:
        h = hashlib.sha256() if digest else None
        t0 = time.perf_counter()
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            async for chunk in self.client.transport.read_file(self.remote, 0,
                                                               self.client.agent_argv()):
                os.write(fd, chunk)
                if h is not None:
                    h.update(chunk)
        finally:
            os.close(fd)
        elapsed = time.perf_counter() - t0
        if (h.hexdigest() if h is not None else _sha256(dest)) != self.sha:
            raise SystemExit("read_file delivered different bytes")
        dest.unlink()
        return elapsed


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def timed(argv: list[str], dest: Path, size: int, *, stdout: bool = False) -> float:
    """Run an OpenSSH command that copies the file to ``dest``; wall seconds."""
    t0 = time.perf_counter()
    if stdout:
        with open(dest, "wb") as out:
            subprocess.run(argv, check=True, stdout=out, stdin=subprocess.DEVNULL)
    else:
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - t0
    if dest.stat().st_size != size:
        raise SystemExit(f"{argv[0]} copied {dest.stat().st_size} of {size} bytes")
    dest.unlink()
    return elapsed


def timed_hashing_pipeline(pod: Pod, remote: str, dest: Path, sha: str) -> float:
    """OpenSSH's own client and OpenSSL hashing the bytes as they arrive, with no Python
    anywhere: ``ssh pod cat FILE | tee COPY | openssl dgst -sha256``, wall seconds. The
    fastest way to do what ``gpuws pull`` promises (a copy verified as it lands) with the
    tools a person has; scp alone does not hash."""
    line = (f"{shlex.join(pod.ssh('cat', remote))} | tee {shlex.quote(str(dest))} | "
            "openssl dgst -sha256 -r")
    t0 = time.perf_counter()
    out = subprocess.run(["sh", "-c", line], check=True, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True).stdout
    elapsed = time.perf_counter() - t0
    if out.split()[0] != sha:
        raise SystemExit("the ssh | tee | openssl pipeline hashed different bytes")
    dest.unlink()
    return elapsed


def handshake(pod: Pod, n: int = 5) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(pod.ssh("true"), check=True, stdin=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return median(times)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    size = args.mib << 20
    with running_pod(rtt_ms=args.rtt_ms) as sftp_pod, \
            running_pod("nosftp", rtt_ms=args.rtt_ms) as exec_pod:
        sha = make_blob(artifact_path(sftp_pod, "bench-pull"), size)
        other = artifact_path(exec_pod, "bench-pull-x")
        other.parent.mkdir(parents=True, mode=0o700)
        os.link(artifact_path(sftp_pod, "bench-pull"), other)  # same bytes, no second copy
        dest = Path(os.environ["GPUWS_HOME"]).parent / NAME

        store = Store()
        c1 = await AgentClient.connect(SSHTransport("pod", config_file=str(sftp_pod.config)))
        c2 = await AgentClient.connect(SSHTransport("pod", config_file=str(exec_pod.config)))
        if not c1.transport.info.sftp or c2.transport.info.sftp:
            raise SystemExit("expected one pod with SFTP and one without")
        a = Side(sftp_pod, "bench-pull", c1, store, size, sha)
        b = Side(exec_pod, "bench-pull-x", c2, store, size, sha)
        methods: dict[str, Callable[[], Awaitable[float]]] = {}

        def add(name: str, fn: Callable[[], float]) -> None:
            async def call() -> float:
                return fn()
            methods[name] = call

        a.process()  # untimed: deploys the agent into the pod's cache
        b.process()
        add("sftp: gpuws pull (process)", a.process)
        methods["sftp: gpuws pull_run"] = a.pull_run
        methods["sftp: gpuws read_file + sha256"] = lambda: a.read_file(dest)
        methods["sftp: gpuws read_file"] = lambda: a.read_file(dest, digest=False)
        add("sftp: scp", lambda: timed(sftp_pod.scp_from(a.remote, str(dest)), dest, size))
        add("sftp: scp -O", lambda: timed(sftp_pod.scp_from(a.remote, str(dest), "-O"), dest,
                                          size))
        if shutil.which("openssl"):
            add("sftp: ssh cat | tee | openssl sha256",
                lambda: timed_hashing_pipeline(sftp_pod, a.remote, dest, sha))
        add("exec: gpuws pull (process)", b.process)
        methods["exec: gpuws pull_run"] = b.pull_run
        methods["exec: gpuws read_file + sha256"] = lambda: b.read_file(dest)
        add("exec: scp -O", lambda: timed(exec_pod.scp_from(b.remote, str(dest), "-O"), dest,
                                          size))
        add("exec: ssh pod cat > file", lambda: timed(exec_pod.ssh("cat", b.remote), dest, size,
                                                       stdout=True))
        times: dict[str, list[float]] = {name: [] for name in methods}
        names = list(methods)
        try:
            for rep in range(args.reps):
                shift = rep % len(names)
                for name in names[shift:] + names[:shift]:
                    times[name].append(await methods[name]())
            shakes = {"sftp": handshake(sftp_pod), "exec": handshake(exec_pod)}
        finally:
            await c1.close()
            await c2.close()
            store.close()
    med = {name: median(v) for name, v in times.items()}
    # Issue 13's goals for the whole process: 0.9x scp on loopback, 1.5x at 20 ms RTT.
    goal = 1.5 if args.rtt_ms >= 20 else 0.9

    def ratio(ours: str, theirs: str, shake: float = 0.0) -> float:
        return (med[theirs] - shake) / med[ours]

    ratios = {
        "sftp gpuws pull process / scp process": ratio("sftp: gpuws pull (process)",
                                                       "sftp: scp"),
        "exec gpuws pull process / scp -O process": ratio("exec: gpuws pull (process)",
                                                          "exec: scp -O"),
        "sftp read_file / scp (minus handshake)": ratio("sftp: gpuws read_file", "sftp: scp",
                                                        shakes["sftp"]),
        "sftp read_file+sha256 / scp": ratio("sftp: gpuws read_file + sha256", "sftp: scp"),
        "sftp read_file+sha256 / scp (minus handshake)": ratio(
            "sftp: gpuws read_file + sha256", "sftp: scp", shakes["sftp"]),
        "sftp pull_run / scp": ratio("sftp: gpuws pull_run", "sftp: scp"),
        "sftp pull_run / scp (minus handshake)": ratio("sftp: gpuws pull_run", "sftp: scp",
                                                       shakes["sftp"]),
        "exec read_file+sha256 / scp -O": ratio("exec: gpuws read_file + sha256",
                                                "exec: scp -O"),
        "exec read_file+sha256 / scp -O (minus handshake)": ratio(
            "exec: gpuws read_file + sha256", "exec: scp -O", shakes["exec"]),
        "exec pull_run / scp -O": ratio("exec: gpuws pull_run", "exec: scp -O"),
        "exec read_file+sha256 / sftp read_file+sha256": ratio(
            "exec: gpuws read_file + sha256", "sftp: gpuws read_file + sha256"),
    }
    if "sftp: ssh cat | tee | openssl sha256" in med:
        # What hashing as the bytes arrive costs even in C: the floor under the goal.
        ratios["ssh | tee | openssl process / scp process"] = ratio(
            "sftp: ssh cat | tee | openssl sha256", "sftp: scp")
        ratios["gpuws pull process / ssh | tee | openssl process"] = ratio(
            "sftp: gpuws pull (process)", "sftp: ssh cat | tee | openssl sha256")
    return {"machine": machine(), "rtt_ms": args.rtt_ms, "bytes": size, "reps": args.reps,
            "median_s": med, "mb_per_s": {k: size / v / MB for k, v in med.items()},
            "all_s": times, "handshake_s": shakes, "ratios": ratios,
            "goal_ratio_min": goal,
            "met": ratios["sftp gpuws pull process / scp process"] >= goal}


def table(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [f"{m['cpu']} × {m['nproc']}, Python {m['python']}, "
             f"{m['openssh'].split(',')[0]}, asyncssh {m['asyncssh']}, "
             f"load {m['loadavg_at_end']}; "
             f"RTT {r['rtt_ms']:g} ms added; {r['bytes'] >> 20} MiB, medians of {r['reps']}"
]
    w = max(len(k) for k in r["median_s"])
    for name, sec in r["median_s"].items():
        lines.append(f"{name:<{w}}  {sec * 1000:7.0f} ms  {r['mb_per_s'][name]:7.1f} MB/s")
    lines.append(f"{'ssh pod true (handshake), sftp / exec server':<{w}}  "
                 f"{r['handshake_s']['sftp'] * 1000:7.0f} ms / "
                 f"{r['handshake_s']['exec'] * 1000:.0f} ms")
    w = max(len(k) for k in r["ratios"])
    for name, value in r["ratios"].items():
        lines.append(f"{name:<{w}}  {value:5.2f}×")
    lines.append(f"goal ≥ {r['goal_ratio_min']:g}× scp (gpuws pull process vs scp process): "
                 f"{'met' if r['met'] else 'NOT met'}")
    return "\n".join(lines)


#: ``--variants``: the ``gpuws pull`` process with issue 13's two changes undone, one at a
#: time, run as scripts of their own. "with the agent" pulls as the command did before:
#: ``AgentClient.connect`` (which deploys and starts the agent) and ``pull_run`` over it;
#: "chacha20 first" also offers chacha20-poly1305 first, as asyncssh does by default.
_WITH_AGENT = """
import asyncio, os, sys
if os.environ.get("GPUWS_BENCH_CHACHA"):
    import asyncssh
    _connect = asyncssh.connect
    async def _chacha(host, **options):
        options["encryption_algs"] = ["chacha20-poly1305@openssh.com", "aes256-gcm@openssh.com",
                                      "aes128-gcm@openssh.com", "aes256-ctr", "aes192-ctr",
                                      "aes128-ctr"]
        return await _connect(host, **options)
    asyncssh.connect = _chacha
from gpuws.cli import make_parser
from gpuws.commands.common import connect
from gpuws.commands.history import find_run
from gpuws.sessions.artifacts import pull_run
from gpuws.sessions.store import Store
async def pull(args):
    with Store() as store:
        run = find_run(store, args.run_id)
        client = await connect(args)
        try:
            await pull_run(client, store, run.session_id, run.run_id)
        finally:
            await client.close()
asyncio.run(pull(make_parser().parse_args(sys.argv[1:])))
"""


async def variants(args: argparse.Namespace) -> dict[str, Any]:
    """The whole ``gpuws pull`` process as it is and with each change undone, and scp."""
    size = args.mib << 20
    with running_pod(rtt_ms=args.rtt_ms) as pod:
        sha = make_blob(artifact_path(pod, "bench-pull"), size)
        store = Store()
        client = await AgentClient.connect(SSHTransport("pod", config_file=str(pod.config)))
        side = Side(pod, "bench-pull", client, store, size, sha)
        await client.close()
        local = artifacts_dir(side.session, side.run_id) / NAME
        dest = Path(os.environ["GPUWS_HOME"]).parent / NAME

        def process(code: str, env: dict[str, str]) -> Callable[[], float]:
            def call() -> float:
                local.unlink(missing_ok=True)
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-c", code, "pull", "-F", str(pod.config), "pod",
                                side.run_id], check=True, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, env=dict(os.environ, **env))
                elapsed = time.perf_counter() - t0
                if local.stat().st_size != size:
                    raise SystemExit("a pull variant left a short copy")
                return elapsed
            return call

        now = "import sys; from gpuws.cli import main; sys.exit(main())"
        methods: dict[str, Callable[[], float]] = {
            "gpuws pull (SFTP only, AES-GCM first)": process(now, {}),
            "with the agent started": process(_WITH_AGENT, {}),
            "with the agent, chacha20 first (before)": process(
                _WITH_AGENT, {"GPUWS_BENCH_CHACHA": "1"}),
            "scp": lambda: timed(pod.scp_from(side.remote, str(dest)), dest, size),
        }
        for method in methods.values():
            method()  # untimed: deploys the agent, warms the page cache
        times: dict[str, list[float]] = {name: [] for name in methods}
        names = list(methods)
        for rep in range(args.reps):
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:
                times[name].append(methods[name]())
        store.close()
    med = {name: median(v) for name, v in times.items()}
    return {"machine": machine(), "rtt_ms": args.rtt_ms, "bytes": size, "reps": args.reps,
            "median_s": med, "all_s": times,
            "scp_over": {name: med["scp"] / v for name, v in med.items()}}


def variants_table(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [f"{m['cpu']} × {m['nproc']}, load {m['loadavg_at_end']}; RTT {r['rtt_ms']:g} ms "
             f"added; {r['bytes'] >> 20} MiB, whole processes, medians of {r['reps']}"]
    w = max(len(k) for k in r["median_s"])
    for name, sec in r["median_s"].items():
        lines.append(f"{name:<{w}}  {sec * 1000:7.0f} ms  "
                     f"{r['bytes'] / sec / MB:7.1f} MB/s  {r['scp_over'][name]:5.2f}× scp")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--reps", type=int, default=5, help="repetitions of every method")
    ap.add_argument("--mib", type=int, default=256, help="artifact size in MiB")
    ap.add_argument("--rtt-ms", type=float, default=0.0,
                    help="reach the servers through a proxy adding this round-trip time")
    ap.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    ap.add_argument("--variants", action="store_true",
                    help="only the whole gpuws pull process, as it is and with issue 13's "
                         "changes undone one at a time (agent started; chacha20 first), "
                         "beside scp")
    args = ap.parse_args(argv)
    compile_gpuws()
    if args.variants:
        results = asyncio.run(variants(args))
        print(variants_table(results))
    else:
        results = asyncio.run(run(args))
        print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
