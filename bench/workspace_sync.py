"""Workspace sync (``gpuws sync``) beside ``rsync -a`` over the same ssh, to the real sshd.

A tree of ~5,000 source-like files (sizes 200 B – 24 KiB, seeded, in nested directories)
goes to a pod that is a real OpenSSH sshd on 127.0.0.1 (bench/_sshd.py, the tests' own
server). Both tools run as whole processes, as a person types them:

- ``gpuws sync -F CONFIG pod -W TREE``: Python start, imports, SSH handshake, the cached
  agent started, manifest (``git ls-files`` does not apply: the tree is not a git
  checkout, so the walk with .gitignore rules), hashing, the requests;
- ``rsync -a -e 'ssh -F CONFIG' TREE/ pod:DEST/``.

Two cases, each repetition interleaved and in a rotating order so a noisy neighbour hurts
both alike: **first** (the pod holds nothing: gpuws's workspaces and blob store and
rsync's destination deleted; gpuws's agent bundle stays cached, as after any connect) and
**one changed file** (one file edited, then each tool syncs it). One untimed call of each
comes first (gpuws deploys its agent then). Medians of ``--reps`` (5) and the ratios
gpuws/rsync. Run it from the repository root::

    python3 bench/workspace_sync.py --json workspace_sync.json
    python3 bench/workspace_sync.py --files 200 --reps 1     # what tests/bench runs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _sshd import Pod, compile_gpuws, machine, median, running_pod

GPUWS = "import sys; from gpuws.cli import main; sys.exit(main())"


def make_tree(root: Path, files: int, seed: int = 25) -> int:
    """``files`` text files in directories of ~25, two levels deep; returns total bytes."""
    rng = random.Random(seed)
    total = 0
    words = [f"tok{i}" for i in range(200)]
    for i in range(files):
        d = root / f"pkg{i // 500}" / f"mod{(i // 25) % 20}"
        d.mkdir(parents=True, exist_ok=True)
        size = int(rng.choice([200, 800, 2000, 4000, 8000, 24000]) * rng.uniform(0.5, 1.0))
        text = " ".join(rng.choice(words) for _ in range(size // 5))[:size] + "\n"
        (d / f"f{i}.py").write_text(text)
        total += len(text)
    return total


def timed(argv: list[str], env: dict[str, str]) -> float:
    # The previous case wrote tens of MB (a first sync writes the tree twice on the pod,
    # rsync's once): flushed before the clock starts, so no run pays for the writeback
    # of the one before it.
    os.sync()
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, env=env)
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{argv[:4]}… failed ({res.returncode}): "
                         f"{res.stderr.decode('utf-8', 'replace')[-1000:]}")
    return took


async def open_link(pod: Pod, tree: Path, edited: Path, reps: int) -> list[float]:
    from gpuws.client import AgentClient
    from gpuws.transport import make_transport
    from gpuws.workspace.sync import WorkspaceSync

    client = await AgentClient.connect(make_transport("pod", config_file=str(pod.config)))
    try:
        ws = WorkspaceSync(tree)
        await ws.sync(client)  # untimed: brings the pod up to date, fills the hash cache
        out = []
        for rep in range(reps):
            with edited.open("a") as f:
                f.write(f"# open-link edit {rep}\n")
            os.sync()
            t0 = time.perf_counter()
            result = await ws.sync(client)
            out.append(time.perf_counter() - t0)
            assert result.blobs_sent == 1 and result.written == 1
        return out
    finally:
        await client.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rtt-ms", type=float, default=0.0)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    if shutil.which("rsync") is None:
        raise SystemExit("rsync is not installed (apt-get install rsync)")
    compile_gpuws()
    with running_pod("default", args.rtt_ms) as pod:
        return run(pod, args)


def run(pod: Pod, args: argparse.Namespace) -> int:
    work = pod.config.parent.parent / "bench-tree"
    tree = work / "tree"
    total = make_tree(tree, args.files)
    dest = pod.cache.parent / "rsync-dest"
    env = dict(os.environ)
    ssh = f"ssh -F {pod.config} -o BatchMode=yes"
    methods = {
        "gpuws sync": [sys.executable, "-c", GPUWS, "sync", "-F", str(pod.config), "pod",
                       "-W", str(tree)],
        "rsync -a": ["rsync", "-a", "-e", ssh, f"{tree}/", f"pod:{dest}/"],
    }

    def fresh(name: str) -> None:
        if name == "gpuws sync":
            for sub in ("workspaces", "wsblobs"):
                shutil.rmtree(pod.cache / sub, ignore_errors=True)
        else:
            shutil.rmtree(dest, ignore_errors=True)

    for name, argv in methods.items():  # untimed: gpuws deploys its agent here
        fresh(name)
        timed(argv, env)
    times: dict[str, list[float]] = {f"{case}: {m}": [] for case in ("first", "one changed file")
                                     for m in methods}
    edited = next(tree.rglob("*.py"))
    order = list(methods)
    for rep in range(args.reps):
        order = order[1:] + order[:1]  # rotate who goes first
        for name in order:
            fresh(name)
            times[f"first: {name}"].append(timed(methods[name], env))
        with edited.open("a") as f:
            f.write(f"# edit {rep}\n")
        for name in order:
            times[f"one changed file: {name}"].append(timed(methods[name], env))
    # The path `watch` takes: one connection held open, the sync object kept (hashes
    # cached), one file edited before each sync; timed in this process.
    times["one changed file: gpuws sync, connection open (watch)"] = asyncio.run(
        open_link(pod, tree, edited, args.reps))
    # Both copies must be the tree, byte for byte (else the race was not a fair one).
    timed(methods["rsync -a"], env)  # rsync's copy catches up with the open-link edits
    ws = next(p for p in (pod.cache / "workspaces").iterdir() if not p.name.startswith("."))
    for copy in (ws, dest):
        assert (copy / edited.relative_to(tree)).read_bytes() == edited.read_bytes()
        assert sum(1 for p in copy.rglob("*") if p.is_file()) == args.files
    med = {k: median(v) for k, v in times.items()}
    ratios = {case: med[f"{case}: gpuws sync"] / med[f"{case}: rsync -a"]
              for case in ("first", "one changed file")}
    ratios["one changed file, connection open (watch)"] = (
        med["one changed file: gpuws sync, connection open (watch)"]
        / med["one changed file: rsync -a"])
    result: dict[str, Any] = {"files": args.files, "tree_bytes": total, "reps": args.reps,
                              "rtt_ms": args.rtt_ms, "times_s": times, "median_s": med,
                              "ratios_gpuws_over_rsync": ratios, "machine": machine()}
    print(f"{args.files} files, {total / 1e6:.1f} MB, {args.reps} reps, RTT {args.rtt_ms} ms")
    for k, v in med.items():
        print(f"  {k:56s} {v * 1000:8.1f} ms")
    for case, r in ratios.items():
        print(f"  {case:56s} gpuws/rsync {r:.2f}x")
    print("goal ≤ 1.0× rsync for one changed file: "
          + ("met" if ratios["one changed file"] <= 1.0 else "not met") + " by the process, "
          + ("met" if ratios["one changed file, connection open (watch)"] <= 1.0 else "not met")
          + " with the connection open")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
