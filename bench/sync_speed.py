"""``gpuws sync`` beside ``rsync -a`` as whole processes: wall time and the laptop's CPU.

Issue 36, point 3. A tree of 2,000 source-like files (bench/workspace_sync.py's
``make_tree``) goes to a real OpenSSH sshd on 127.0.0.1 (bench/_sshd.py, the tests' own
server), optionally through the delay proxy (``--rtt-ms 20``). Three cases, each
repetition interleaved in a rotating order, medians of ``--reps`` (at least 5):

- **first**: the pod holds nothing (gpuws's workspaces and blob store and rsync's
  destination deleted; gpuws's agent bundle stays cached, as after any connect; the
  laptop's hash cache kept, as when a project goes to a second pod);
- **one changed file**: one file edited, then each tool syncs it;
- **nothing changed**: each tool syncs again.

For each: the wall time of the process, the laptop's CPU (user + system of the process
and its children, from ``wait4``: gpuws's Python and its ``ssh -G``; rsync and its
``ssh`` client; the pod's side of either runs under the sshd and is not counted), and for
gpuws the sync's own time as it reports it (``--json``'s ``seconds``: the requests, after
the connection and the agent are up), so the part that is the connection's (persistent
connections are issue 36's point 1) shows apart from the sync's own work.

``--write-docs`` puts the table into docs/performance.md between this bench's markers,
with the command that made it::

    python3 bench/sync_speed.py --reps 5 --write-docs
    python3 bench/sync_speed.py --reps 5 --rtt-ms 20 --write-docs
    python3 bench/sync_speed.py --profile OUT_DIR    # cProfile of one gpuws process per case
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _docs import put_block, shown_argv
from _sshd import Pod, compile_gpuws, machine, median, running_pod
from workspace_sync import make_tree

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "performance.md"
GPUWS = "import sys; from gpuws.cli import main; sys.exit(main())"
CASES = ("first", "one changed file", "nothing changed")
#: The kept connection's tool (``--kept``): ``gpuws sync`` through the master a host's
#: ``persist`` leaves (docs/performance.md section 16), beside its own connection.
KEPT = "gpuws sync (kept)"


def _children_cpu() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def measure(argv: list[str], env: dict[str, str]) -> tuple[float, float, bytes]:
    """(wall seconds, laptop CPU seconds of the process and its children, its stdout)."""
    # A first sync writes megabytes on the pod: flushed before the clock starts, so no
    # run pays for the writeback of the one before it.
    os.sync()
    before = _children_cpu()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate()
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]}… failed ({proc.returncode}): "
                         f"{err.decode('utf-8', 'replace')[-1000:]}")
    # communicate() reaped it: its CPU and its children's (reaped by it) are the growth
    # of this process's RUSAGE_CHILDREN, which nothing else adds to meanwhile.
    return took, _children_cpu() - before, out


def run(pod: Pod, args: argparse.Namespace) -> dict[str, Any]:
    work = pod.config.parent.parent / "bench-tree"
    tree = work / "tree"
    total = make_tree(tree, args.files)
    dest = pod.cache.parent / "rsync-dest"
    env = dict(os.environ)
    ssh = f"ssh -F {pod.config} -o BatchMode=yes"
    # Each gpuws tool has its own copy of the tree (the same files), so its own workspace
    # on the pod: one's sync never finds the other's work done.
    trees = {"gpuws sync": tree, "rsync -a": tree}
    if args.kept:
        trees[KEPT] = work / "tree-kept"
        make_tree(trees[KEPT], args.files)
    argv = {"gpuws sync": [sys.executable, "-c", GPUWS, "sync", "-F", str(pod.config), "pod",
                           "-W", str(tree), "--json", "--no-persist"],
            "rsync -a": ["rsync", "-a", "-e", ssh, f"{tree}/", f"pod:{dest}/"]}
    if args.kept:
        argv[KEPT] = [sys.executable, "-c", GPUWS, "sync", "-F", str(pod.config), "pod",
                      "-W", str(trees[KEPT]), "--json"]
    tools = list(argv)

    def fresh(tool: str) -> None:
        if tool.startswith("gpuws sync"):
            from gpuws.workspace.sync import workspace_name

            name = workspace_name(trees[tool].resolve())
            shutil.rmtree(pod.cache / "workspaces" / name, ignore_errors=True)
            (pod.cache / "workspaces" / ".state" / f"{name}.json").unlink(missing_ok=True)
            # The blob store is shared: emptied, so this tool's first sync sends it all.
            shutil.rmtree(pod.cache / "wsblobs", ignore_errors=True)
        else:
            shutil.rmtree(dest, ignore_errors=True)

    for tool in tools:  # untimed: gpuws deploys its agent (and starts the master), the
        fresh(tool)     # page cache is filled for both
        measure(argv[tool], env)
    wall: dict[str, list[float]] = {f"{c}: {t}": [] for c in CASES for t in tools}
    cpu: dict[str, list[float]] = {k: [] for k in wall}
    own: dict[str, list[float]] = {f"{c}: {t}": [] for c in CASES for t in tools
                                   if t.startswith("gpuws")}
    edited = next(tree.rglob("*.py"))
    rel = edited.relative_to(tree)
    order = list(tools)
    for rep in range(args.reps):
        order = order[1:] + order[:1]  # rotate who goes first
        for case in CASES:
            if case == "one changed file":
                for copy in set(trees.values()):
                    with (copy / rel).open("a") as f:
                        f.write(f"# edit {rep}\n")
            for tool in order:
                if case == "first":
                    fresh(tool)
                w, c, out = measure(argv[tool], env)
                wall[f"{case}: {tool}"].append(w)
                cpu[f"{case}: {tool}"].append(c)
                if tool.startswith("gpuws sync"):
                    reply = json.loads(out)
                    own[f"{case}: {tool}"].append(reply["seconds"])
                    sent = reply["blobs_sent"]
                    want = {"first": args.files, "one changed file": 1, "nothing changed": 0}
                    assert sent == want[case], (case, reply)
    # Every copy must be its tree, byte for byte (else the race was not a fair one).
    from gpuws.workspace.sync import workspace_name

    copies = [(pod.cache / "workspaces" / workspace_name(trees[t].resolve()), trees[t])
              for t in tools if t.startswith("gpuws")] + [(dest, tree)]
    for copy, source in copies:
        assert (copy / rel).read_bytes() == (source / rel).read_bytes()
        assert sum(1 for p in copy.rglob("*") if p.is_file()) == args.files
    med_wall = {k: median(v) for k, v in wall.items()}
    med_cpu = {k: median(v) for k, v in cpu.items()}
    return {"tools": tools, "files": args.files, "tree_bytes": total, "reps": args.reps,
            "rtt_ms": args.rtt_ms,
            "wall_s": wall, "cpu_s": cpu, "sync_own_s": own, "median_wall_s": med_wall,
            "median_cpu_s": med_cpu, "median_sync_own_s": {k: median(v) for k, v in own.items()},
            "machine": machine()}


def table(res: dict[str, Any]) -> str:
    """The figures as docs/performance.md shows them: each gpuws tool against rsync."""
    w, c, own = res["median_wall_s"], res["median_cpu_s"], res["median_sync_own_s"]
    lines = ["| case | tool | wall | × rsync's | laptop CPU | × rsync's | the sync's own part |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for case in CASES:
        r = f"{case}: rsync -a"
        for tool in res.get("tools", ["gpuws sync", "rsync -a"]):
            k = f"{case}: {tool}"
            mine = own.get(k)
            lines.append(f"| {case} | {tool} | {w[k]:.3f} s | {w[k] / w[r]:.2f}× "
                         f"| {c[k]:.3f} s | {c[k] / c[r]:.2f}× "
                         f"| {'' if mine is None else f'{mine:.3f} s'} |")
    return "\n".join(lines)


def write_docs(res: dict[str, Any], command: str, docs: Path) -> None:
    """Replace this bench's block for this round trip in ``docs``."""
    tag = f"sync_speed rtt={res['rtt_ms']:g}" + (" kept" if KEPT in res.get("tools", []) else "")
    m = res["machine"]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    block = (f"<!-- {tag} begin: generated by bench/sync_speed.py, not typed -->\n"
             f"{res['files']:,} files ({res['tree_bytes'] / 1e6:.1f} MB), round trip "
             f"{res['rtt_ms']:g} ms, medians of {res['reps']}, {when}; {m['cpu']} × "
             f"{m['nproc']}, load at the end {m['loadavg_at_end']}, Python {m['python']}, "
             f"{m['openssh']}, asyncssh {m['asyncssh']}:\n\n"
             f"    {command}\n\n{table(res)}\n<!-- {tag} end -->")
    put_block(docs, tag, block, "<!-- sync_speed tables -->")


def profile(pod: Pod, args: argparse.Namespace) -> None:
    """One ``gpuws sync`` process per case under cProfile, its stats in ``args.profile``."""
    out = Path(args.profile).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tree = pod.config.parent.parent / "bench-tree" / "tree"
    make_tree(tree, args.files)
    base = [sys.executable, "-m", "cProfile", "-o"]
    cmd = ["-m", "gpuws", "sync", "-F", str(pod.config), "pod", "-W", str(tree), "--json"]
    env = dict(os.environ)
    measure([sys.executable, *cmd], env)  # deploys the agent
    edited = next(tree.rglob("*.py"))
    for case in CASES:
        if case == "first":
            for sub in ("workspaces", "wsblobs"):
                shutil.rmtree(pod.cache / sub, ignore_errors=True)
        elif case == "one changed file":
            with edited.open("a") as f:
                f.write("# edit\n")
        stats = out / f"{case.replace(' ', '_')}.prof"
        wall, cpu, reply = measure([*base, str(stats), *cmd], env)
        print(f"{case}: {wall:.3f} s wall, {cpu:.3f} s CPU, the sync "
              f"{json.loads(reply)['seconds']:.3f} s; {stats}")


def _stop_master(pod: Pod) -> None:
    """End the kept connection's master, if the run left one (it would idle for 10 min)."""
    import asyncio
    import signal

    from gpuws.transport.persist.client import PersistTransport

    async def ask() -> object:
        t = PersistTransport("pod", config_file=str(pod.config), idle_s=600)
        await t.connect()
        return t.master["pid"] if t.master is not None and t.reused else None

    pid = asyncio.run(ask())
    if pid is not None:
        os.kill(int(str(pid)), signal.SIGTERM)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rtt-ms", type=float, default=0.0)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--write-docs", action="store_true",
                    help="put the table into docs/performance.md")
    ap.add_argument("--kept", action="store_true",
                    help="also gpuws sync through a kept connection (the host's persist)")
    ap.add_argument("--docs", type=Path, default=DOCS, help="the file --write-docs writes")
    ap.add_argument("--profile", help="instead: cProfile one gpuws process per case here")
    args = ap.parse_args()
    if shutil.which("rsync") is None:
        raise SystemExit("rsync is not installed (apt-get install rsync)")
    if args.reps < 5 and args.write_docs:
        raise SystemExit("the docs take medians of 5 or more (--reps 5)")
    compile_gpuws()
    runtime = tempfile.mkdtemp(prefix="gps", dir="/tmp")  # short: a socket path's limit
    os.environ["XDG_RUNTIME_DIR"] = runtime  # the kept connection's socket, ours alone
    try:
        with running_pod("default", args.rtt_ms) as pod:
            if args.profile:
                profile(pod, args)
                return 0
            if args.kept:
                Path(os.environ["GPUWS_CONFIG"]).write_text('[hosts.pod]\npersist = "10m"\n')
            try:
                res = run(pod, args)
            finally:
                if args.kept:
                    _stop_master(pod)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    print(table(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    if args.write_docs:
        command = "python3 bench/sync_speed.py " + shlex.join(shown_argv())
        write_docs(res, command.strip(), args.docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
