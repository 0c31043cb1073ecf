"""The pod's lease process (issue 22): its CPU over a minute on a pod holding many runs.

The lease is one detached process per pod (``python3 AGENT lease``,
``remote_agent/lease.py``) that looks every ``min(max(idle_s / 20, 0.2), 5)`` seconds
whether a laptop is connected, a run is going, or the lease was renewed. This measures
what that costs the pod: the process's own CPU time (``utime + stime`` from
``/proc/PID/stat``) over a window of wall time, as CPU seconds per minute and as a
percentage of one core.

Each pod cache holds ``--runs`` run directories as a worker leaves them (``spec.json``,
``events.ndjson`` ending in ``run_finished``, ``worker.pid`` of a process long gone); every
``--lost-every``-th has no ``run_finished`` (a worker that died), every ``--big-every``-th
has an ``events.ndjson`` of ``--big-mib`` MiB (a long watch); one run is going (a live
process whose command line names its run, as a worker's does), so the lease stays busy and
never stops the "pod". The lease is armed through ``lease.configure`` from the agent bundle
the pod would run (``deploy.build_bundle``), one cache per ``--idle-s`` value; in each
repetition all of them run at once over the same window (CPU time is per process, so they
do not inflate each other's figures much on a machine with a core to spare). Figures are
medians over ``--reps``. Run it from the repository root::

    PYTHONPATH=src python3 bench/lease_cpu.py --json lease_cpu.json
    PYTHONPATH=src python3 bench/lease_cpu.py --seconds 10 --reps 1   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _sshd import machine, median

from gpuws import deploy
from gpuws.remote_agent import lease, runs

TICK = os.sysconf("SC_CLK_TCK")


def poll_s(idle_s: float) -> float:
    """How often the lease looks (``lease.main``)."""
    return min(max(idle_s / 20.0, 0.2), 5.0)


def make_runs(root: Path, n: int, big_every: int, big_mib: float, lost_every: int
              ) -> tuple[str, int]:
    """``n`` ended runs under ``root`` (a ``runs`` directory) and one going; returns the
    going run's id and the pid of the process that stands for its worker."""
    root.mkdir(parents=True, mode=0o700)
    dead = []
    for _ in range(4):  # pids of processes that have ended, as old runs' workers have
        p = subprocess.Popen(["true"])
        p.wait()
        dead.append(p.pid)
    line = ('{"type":"tier_sample","run_id":"%s","seq":0,"ts":1700000000.0,'
            '"values":[1.0,2.0,3.0,4.0]}\n')
    for i in range(n):
        run_id = f"20261125-000000-{i:06x}"
        rdir = root / run_id
        (rdir / "artifacts").mkdir(parents=True, mode=0o700)
        (rdir / "spec.json").write_text(json.dumps({"workload": "cmd:true"}))
        (rdir / "worker.pid").write_text(str(dead[i % len(dead)]))
        one = (line % run_id).encode()
        count = 50
        if big_every and i % big_every == big_every // 2:
            count = max(1, int(big_mib * (1 << 20)) // len(one))
        body = one * count
        if not (lost_every and i % lost_every == lost_every - 1):
            body += (f'{{"type":"run_finished","run_id":"{run_id}","seq":{count},'
                     f'"status":"ok"}}\n').encode()
        (rdir / "events.ndjson").write_bytes(body)
    run_id = "20261125-000001-going"
    rdir = root / run_id
    (rdir / "artifacts").mkdir(parents=True, mode=0o700)
    (rdir / "spec.json").write_text(json.dumps({"workload": "cmd:sleep"}))
    (rdir / "events.ndjson").write_bytes((line % run_id).encode() * 50)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1e9)", run_id],
                              stdin=subprocess.DEVNULL)
    (rdir / "worker.pid").write_text(str(worker.pid))
    return run_id, worker.pid


def lease_pid(pyz: Path, cache: Path) -> int | None:
    """The lease process of ``cache`` (its command line names the bundle and ``lease``;
    its working directory is the cache's ``lease/``), or None."""
    want = [os.fsencode(str(pyz)), b"lease"]
    where = str(cache / "lease")
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")[:-1]
            if argv[1:] != want or os.readlink(f"/proc/{name}/cwd") != where:
                continue
            if stat_fields(int(name))[0] == "Z":
                continue
        except OSError:
            continue
        return int(name)
    return None


def stat_fields(pid: int) -> list[str]:
    """``/proc/PID/stat`` after the command name: [state, ppid, ...]; utime is [11],
    stime [12] (fields 14 and 15 of proc(5)), in clock ticks."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].decode().split()


def cpu_s(pid: int) -> float:
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / TICK


def arm(pyz: Path, cache: Path, idle_s: float) -> int:
    """Arm a lease on ``cache`` as a serve would; returns its process's pid."""
    os.environ["GPUWS_POD_CACHE"] = str(cache)
    st = lease.configure(idle_s, ["true"], False)
    if not st["armed"]:
        raise SystemExit(f"the lease on {cache} did not arm: {st}")
    pid = lease_pid(pyz, cache)
    if pid is None:
        raise SystemExit(f"no lease process found for {cache}")
    return pid


def disarm(cache: Path, pid: int) -> None:
    os.environ["GPUWS_POD_CACHE"] = str(cache)
    lease.release()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if stat_fields(pid)[0] == "Z":
                break
        except OSError:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)


def one_rep(pyz: Path, work: Path, shared_runs: Path, idles: list[float], seconds: float,
            warmup_s: float) -> list[dict[str, Any]]:
    caches = []
    for k, idle in enumerate(idles):
        cache = work / f"cache-{k}"
        if cache.exists():
            shutil.rmtree(cache)
        cache.mkdir(mode=0o700)
        (cache / "runs").symlink_to(shared_runs)  # the same runs for every lease
        caches.append((idle, cache))
    pids = [arm(pyz, cache, idle) for idle, cache in caches]
    try:
        time.sleep(warmup_s)  # past the interpreter's start and the first look
        t0 = time.monotonic()
        c0 = [cpu_s(pid) for pid in pids]
        time.sleep(seconds)
        wall = time.monotonic() - t0
        c1 = [cpu_s(pid) for pid in pids]
        alive = [lease_pid(pyz, cache) == pid
                 for pid, (_i, cache) in zip(pids, caches, strict=True)]
    finally:
        for pid, (_idle, cache) in zip(pids, caches, strict=True):
            disarm(cache, pid)
    out = []
    for (idle, _cache), a, b, ok in zip(caches, c0, c1, alive, strict=True):
        if not ok:
            raise SystemExit(f"the lease with idle {idle} s ended during the window")
        used = b - a
        out.append({"idle_s": idle, "poll_s": poll_s(idle), "wall_s": wall, "cpu_s": used,
                    "cpu_s_per_min": used * 60.0 / wall, "core_pct": 100.0 * used / wall})
    return out


def look_costs(cache: Path) -> dict[str, float]:
    """CPU ms of the run check alone, in this process (median of a few): the old look
    (every run's ``run_status``: spec.json read, events.ndjson's lines counted), the new
    one's first look (every run's pid) and its later looks (only runs that may still go)."""
    os.environ["GPUWS_POD_CACHE"] = str(cache)

    def ms(fn: Any, n: int) -> float:
        times = []
        for _ in range(n):
            t = time.process_time()
            fn()
            times.append(1000.0 * (time.process_time() - t))
        return median(times)

    ended: set[str] = set()
    runs.running_ids(ended)
    out = {"list_runs_ms": ms(lambda: sum(1 for r in runs.list_runs()
                                          if r["status"] == "running"), 3),
           "running_ids_first_ms": ms(lambda: runs.running_ids(set()), 5),
           "running_ids_later_ms": ms(lambda: runs.running_ids(ended), 50)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="the measured window")
    ap.add_argument("--runs", type=int, default=2000, help="ended run directories")
    ap.add_argument("--idle-s", type=float, nargs="+", default=[2.0, 600.0],
                    help="lease idle times (2 s: a look every 0.2 s, the worst case; "
                         "600 s: every 5 s)")
    ap.add_argument("--big-every", type=int, default=100,
                    help="every Nth run has a big events.ndjson (0: none)")
    ap.add_argument("--big-mib", type=float, default=4.0, help="its size")
    ap.add_argument("--lost-every", type=int, default=10,
                    help="every Nth run has no run_finished (its worker died)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup-s", type=float, default=3.0)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="gpuws-lease-cpu-"))
    os.environ["GPUWS_HOME"] = str(work / "home")  # the bundle cache stays in here
    worker = None
    try:
        pyz = work / "agent.pyz"
        pyz.write_bytes(deploy.build_bundle().data)
        # As the pod runs it: the lease process is the bundle, started by configure.
        runs.agent_entry = lambda: str(pyz)  # type: ignore[assignment]
        t = time.monotonic()
        _going, worker = make_runs(work / "runs", args.runs, args.big_every, args.big_mib,
                                   args.lost_every)
        size = sum(p.stat().st_size for p in (work / "runs").glob("*/events.ndjson"))
        print(f"{args.runs} ended runs + 1 going, events.ndjson {size / 1e6:.1f} MB in all "
              f"(made in {time.monotonic() - t:.1f} s)", flush=True)
        cache = work / "cache-looks"
        cache.mkdir(mode=0o700)
        (cache / "runs").symlink_to(work / "runs")
        looks = look_costs(cache)
        print("the run check alone, CPU ms per look: " + ", ".join(
            f"{k[:-3]} {v:.1f}" for k, v in looks.items()), flush=True)
        reps = []
        for r in range(args.reps):
            rows = one_rep(pyz, work, work / "runs", args.idle_s, args.seconds,
                           args.warmup_s)
            reps.append(rows)
            print(f"rep {r + 1}: " + ", ".join(
                f"idle {row['idle_s']:g} s: {row['cpu_s']:.2f} CPU s" for row in rows),
                flush=True)
    finally:
        if worker is not None:
            os.kill(worker, 9)
            os.waitpid(worker, 0)
        shutil.rmtree(work, ignore_errors=True)

    print(f"\n{args.seconds:g} s window, medians of {args.reps}:")
    print(f"{'idle_s':>8} {'poll_s':>7} {'CPU s/min':>10} {'% core':>8}")
    summary = []
    for k, idle in enumerate(args.idle_s):
        rows = [rep[k] for rep in reps]
        s = {"idle_s": idle, "poll_s": poll_s(idle),
             "cpu_s_per_min": median([r["cpu_s_per_min"] for r in rows]),
             "core_pct": median([r["core_pct"] for r in rows]),
             "core_pct_all": [r["core_pct"] for r in rows]}
        summary.append(s)
        print(f"{idle:>8g} {s['poll_s']:>7.2f} {s['cpu_s_per_min']:>10.3f} "
              f"{s['core_pct']:>7.2f}%")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"args": vars(args), "events_bytes": size, "summary": summary, "reps": reps,
             "look_ms": looks,
             "machine": machine()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
