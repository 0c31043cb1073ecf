"""Where the time of one ``gpuws sync`` process goes, beside what ``ssh`` and ``rsync`` pay.

The incremental case of bench/workspace_sync.py (a tree of ~5,000 files, one file edited,
then synced), as a whole process, cut into phases. Each repetition starts a fresh Python
that does what ``gpuws sync -F CONFIG pod -W TREE`` does (commands/sync.py), step by step,
with a clock read between the steps:

- ``start``: the interpreter up to the first line of the script (Python's own start);
- ``imports``: the modules the command imports before it connects (asyncssh among them);
- ``scan``: the manifest (walk, hash cache, hashing what changed);
- ``ssh config``: ``ssh -G`` (OpenSSH's own rules for the host);
- ``handshake``: TCP, key exchange, host key, authentication (asyncssh);
- ``agent start``: the exec channel, the pod's login shell, its ``python3``, the bootstrap
  (the cached bundle verified by sha256, its modules compiled) until the agent's Hello;
- ``sync``: the requests (one put and one apply for one changed file);
- ``close`` and ``print`` (Rich imported, the line printed).

The command itself does the scan beside the imports and ``ssh -G``, and asks git and
imports Rich while the pod starts the agent; its own wall time is measured beside.

Beside it, OpenSSH: ``ssh pod true`` with ``-v``, whose timestamps split into the
handshake (until ``Sending command``) and the pod's side (the shell running ``true``, until
the exit status): the shell's start is paid by every exec, gpuws's agent and rsync's
``rsync --server`` alike. And ``rsync -a`` of the same edit. Medians of ``--reps``::

    python3 bench/workspace_sync_phases.py --json workspace_sync_phases.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _sshd import Pod, compile_gpuws, machine, median, running_pod
from workspace_sync import make_tree

#: One ``gpuws sync`` as commands/sync.py does it, with a clock read between the steps.
CHILD = r"""
import time
T = [("start", time.perf_counter())]
import asyncio, sys
from gpuws.cli import make_parser
from gpuws.client import AgentClient
from gpuws.commands.sync import console, sync_line
from gpuws.deploy import start_agent
from gpuws.transport.ssh import SSHTransport
from gpuws.workspace.sync import WorkspaceSync
T.append(("imports", time.perf_counter()))

async def main():
    args = make_parser().parse_args(["sync", "-F", sys.argv[1], "pod", "-W", sys.argv[2]])
    ws = WorkspaceSync(args.workspace)
    manifest = await asyncio.to_thread(ws.scan)
    T.append(("scan", time.perf_counter()))
    transport = SSHTransport("pod", config_file=args.ssh_config)
    T.append(("ssh config", time.perf_counter()))
    await transport.connect()
    T.append(("handshake", time.perf_counter()))
    proc, deploy, rest = await start_agent(transport)
    client = AgentClient(transport, proc, deploy, rest, "python3")
    T.append(("agent start", time.perf_counter()))
    synced = await ws.sync(client, manifest)
    T.append(("sync", time.perf_counter()))
    await client.close()
    T.append(("close", time.perf_counter()))
    code = ws.code(manifest)  # not a git tree here: no git process
    console(markup=False).print(sync_line(synced, code))
    T.append(("print", time.perf_counter()))
    assert synced.blobs_sent == 1 and synced.written == 1, synced

asyncio.run(main())
import json
sys.stderr.write("PHASES " + json.dumps([(n, t - T[0][1]) for n, t in T]) + "\n")
"""


def child_phases(pod: Pod, tree: Path) -> tuple[float, dict[str, float]]:
    """One process: its wall time and the seconds of each phase."""
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", CHILD, str(pod.config), str(tree)],
                         capture_output=True)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(res.stderr.decode("utf-8", "replace")[-2000:])
    line = next(ln for ln in res.stderr.decode().splitlines() if ln.startswith("PHASES "))
    marks: list[tuple[str, float]] = json.loads(line[len("PHASES "):])
    # What the process spent before its first line and after its last (Python's start
    # and exit, and starting the process).
    phases = {"start, exit": wall - marks[-1][1]}
    prev = 0.0
    for name, at in marks[1:]:
        phases[name] = at - prev
        prev = at
    return wall, phases


def ssh_v(pod: Pod, *command: str) -> tuple[float, float, float]:
    """``ssh -v pod COMMAND``: (wall, handshake until the command is sent, the pod's side:
    its shell running the command, until the exit status)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(["ssh", "-T", "-v", "-F", str(pod.config), "-o", "BatchMode=yes",
                          "pod", *command], stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    sent = done = 0.0
    for line in p.stderr:
        if "Sending command" in line:
            sent = time.perf_counter() - t0
        elif "exit-status" in line:
            done = time.perf_counter() - t0
    p.wait()
    return time.perf_counter() - t0, sent, done - sent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    compile_gpuws()
    with running_pod("default") as pod:
        tree = pod.config.parent.parent / "bench-tree" / "tree"
        make_tree(tree, args.files)
        dest = pod.cache.parent / "rsync-dest"
        env = dict(os.environ)
        gpuws = [sys.executable, "-c", "import sys; from gpuws.cli import main; "
                 "sys.exit(main())", "sync", "-F", str(pod.config), "pod", "-W", str(tree)]
        rsync = ["rsync", "-a", "-e", f"ssh -F {pod.config} -o BatchMode=yes", f"{tree}/",
                 f"pod:{dest}/"]
        for argv in (gpuws, rsync):  # untimed: deploy, first copies, the hash cache
            subprocess.run(argv, check=True, capture_output=True, env=env)
        time.sleep(3.5)  # the hash cache trusts files left alone for RACY_NS (3 s)
        subprocess.run(gpuws, check=True, capture_output=True, env=env)
        edited = next(tree.rglob("*.py"))
        walls: list[float] = []
        phases: dict[str, list[float]] = {}
        rs: list[float] = []
        whole: list[float] = []
        ssh: list[tuple[float, float, float]] = []
        py: list[tuple[float, float, float]] = []
        for rep in range(args.reps):
            with edited.open("a") as f:
                f.write(f"# phases edit {rep}\n")
            wall, one = child_phases(pod, tree)
            walls.append(wall)
            with edited.open("a") as f:
                f.write(f"# command edit {rep}\n")
            t0 = time.perf_counter()
            subprocess.run(gpuws, check=True, capture_output=True, env=env)
            whole.append(time.perf_counter() - t0)
            for k, v in one.items():
                phases.setdefault(k, []).append(v)
            t0 = time.perf_counter()
            subprocess.run(rsync, check=True, capture_output=True, env=env)
            rs.append(time.perf_counter() - t0)
            ssh.append(ssh_v(pod, "true"))
            py.append(ssh_v(pod, "python3", "-S", "-c", "pass"))
    med = {k: median(v) for k, v in phases.items()}
    result: dict[str, Any] = {
        "files": args.files, "reps": args.reps, "gpuws_wall_s": walls, "phases_s": phases,
        "median_phase_s": med, "command_s": whole, "rsync_s": rs, "ssh_true": ssh,
        "ssh_python3": py, "machine": machine()}
    print(f"gpuws sync, one changed file, {args.files} files: {median(walls) * 1000:.0f} ms")
    for k, v in med.items():
        print(f"  {k:12s} {v * 1000:7.1f} ms")
    print(f"the command itself (the scan beside the imports, git and Rich beside the agent "
          f"start): {median(whole) * 1000:.0f} ms")
    print(f"rsync -a, one changed file: {median(rs) * 1000:.0f} ms")
    print(f"ssh pod true: {median([s[0] for s in ssh]) * 1000:.0f} ms (handshake "
          f"{median([s[1] for s in ssh]) * 1000:.0f} ms, the pod running `true` "
          f"{median([s[2] for s in ssh]) * 1000:.0f} ms); the pod running `python3 -S -c "
          f"pass`: {median([s[2] for s in py]) * 1000:.0f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
