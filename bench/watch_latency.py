"""Save → line of ``gpuws watch`` beside the by-hand loop, in the same run (issue 25, §4).

For each save (an edit of the benchmark file: a comment, so the kernel stays the same and
every verdict should read "no difference"), interleaved:

- **watch** (one ``gpuws watch`` process, held open): from the write to the printed
  line; with a GPU twice, two watch processes on two copies of the project, one forking
  the Tier-1 child from the pod's pre-imported parent (the default) and one with
  ``--no-fork-server`` (a fresh interpreter per child, as before the fork server);
- **by hand**: ``scp`` the file to the pod, then ``ssh pod python3 byhand.py``, which
  imports the file and times its ``run()`` as a person would (``triton.testing.do_bench``
  where Triton is, CUDA events otherwise), from the start of scp to ssh's exit.

From the session store it also reports, per watch iteration, Tier 1's wall on the pod
(the child's start, the workload's setup and the sampling) and the **overhead beyond it**
(save → line minus that: debounce, sync, request, result to the printed line), and for a
``cmd:`` workload, beyond the command's own run.

Usage (from the repository root)::

    # the GPU machine: the tests' real sshd on loopback, the ~95 µs Triton add
    python3 bench/watch_latency.py --saves 5 --json watch_latency.json
    # an existing host (an ssh config alias), another benchmark, another interpreter
    python3 bench/watch_latency.py --host pod -F ~/.ssh/config --pod-python /venv/bin/python
    # no GPU (this is what tests/bench runs): a CPU-only command, watch vs by hand
    python3 bench/watch_latency.py --cpu --saves 2

The pod side is whatever the host has; the laptop side is this checkout. Each watch runs
under a temporary GPUWS_HOME, so the person's own store is never touched.

``--launcher`` measures the pod's part alone, on this machine: the Tier-1 child's
``static`` pass of the workload (import CuPy, load the file, ``setup()``) started as a
fresh interpreter, then forked from the fork server, interleaved, through the worker's
own ``tiers.run_child``. Where CuPy is missing (no GPU), a stand-in ``cupy`` module takes
its place (it does nothing), so the figures are the launchers' own cost::

    python3 bench/watch_latency.py --launcher --cpu --saves 20
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _sshd import compile_gpuws, machine, median, running_pod

ROOT = Path(__file__).resolve().parent
GPU_WORKLOAD = ROOT / "workloads" / "triton_add.py"
#: The CPU-only benchmark: about 0.1 s of pure Python, its time printed.
CPU_BENCH = """\
import time
t = time.perf_counter()
sum(i * i for i in range(400000))
print("median %.3f ms" % ((time.perf_counter() - t) * 1e3))
"""
#: The by-hand runner for a gpuws workload file: import it, set up, warm up, time run().
BYHAND = """\
import importlib.util, statistics, sys
spec = importlib.util.spec_from_file_location("bench", "bench.py")
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
state = mod.setup() if hasattr(mod, "setup") else None
call = (lambda: mod.run(state)) if state is not None else mod.run
try:
    from triton.testing import do_bench
    ms = do_bench(call)
except ImportError:
    import torch
    for _ in range(10):
        call()
    times = []
    for _ in range(100):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); call(); b.record(); b.synchronize()
        times.append(a.elapsed_time(b))
    ms = statistics.median(times)
print("median %.4f ms" % ms)
"""
GPUWS = [sys.executable, "-c", "import sys; from gpuws.cli import main; sys.exit(main())"]


class Watch:
    """One ``gpuws watch`` process and its lines, each stamped when it arrived."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        self.seen: list[str] = []
        self.err = log.open("w")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.err,
                                     text=True, env=env, stdin=subprocess.DEVNULL,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                      signal.SIG_DFL))
        out = self.proc.stdout
        assert out is not None

        def read() -> None:
            for text in out:
                self.lines.put((time.monotonic(), text))
        threading.Thread(target=read, daemon=True).start()

    def line(self, n: int, timeout: float) -> tuple[float, str]:
        """When iteration ``n``'s line came, and the line."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                at, text = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            self.seen.append(text)
            if text.startswith(f"#{n} "):
                return at, text.rstrip("\n")
        raise SystemExit(f"{self.name}: no line #{n} within {timeout:.0f} s; saw "
                         f"{self.seen[-5:]} (stderr in {self.err.name})")

    def stop(self) -> str:
        """Ctrl+C, as a person ends it; what it printed after the last line (the table)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.err.close()
        rest = []
        while not self.lines.empty():
            rest.append(self.lines.get_nowait()[1])
        return "".join(rest)


def edit(path: Path, n: int) -> None:
    """A save that changes the file but not what it computes."""
    text = re.sub(r"\n# watch_latency edit \d+\n$", "\n", path.read_text())
    path.write_text(text + f"# watch_latency edit {n}\n")


def timed(argv: list[str]) -> float:
    t0 = time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - t0
    if res.returncode != 0:
        raise SystemExit(f"{shlex.join(argv)} failed ({res.returncode}): "
                         f"{(res.stderr or res.stdout)[-1500:]}")
    return took


def store_figures(home: Path, name: str) -> list[dict[str, Any]]:
    """Per run of the watch under ``home``: the tiers' wall time and Tier 1's."""
    os.environ["GPUWS_HOME"] = str(home)
    from gpuws import protocol
    from gpuws.sessions.store import Store

    out = []
    with Store() as store:
        (session,) = store.sessions()
        for run in store.runs(session.id):
            events = store.run_events(run.run_id, ["tier1_result",
                                                   "tier_finished"])
            result = [e for e in events if isinstance(e, protocol.Tier1Result)]
            tiers = [e for e in events if isinstance(e, protocol.TierFinished)]
            out.append({
                "run_id": run.run_id, "status": run.status,
                "fork_server": bool(run.spec and run.spec.fork_server),
                "tiers_wall_s": sum(t.wall_s for t in tiers),
                "tier1_wall_s": sum(t.wall_s for t in tiers if t.tier == 1),
                "median_ms": result[0].stats.median_ms if result else None})
    return out


@contextlib.contextmanager
def target(args: argparse.Namespace) -> Iterator[tuple[list[str], list[str]]]:
    """The pod as gpuws and as OpenSSH's clients name it: the given host, or the tests'
    real sshd on loopback."""
    if args.host:
        conf = ["-F", args.config] if args.config else []
        yield [args.host, *conf], [*conf, "-o", "BatchMode=yes", args.host]
        return
    with running_pod() as pod:
        yield ["pod", "-F", str(pod.config)], ["-F", str(pod.config), "-o", "BatchMode=yes",
                                               "pod"]


STAND_IN = {"cupy/__init__.py": "from . import cuda  # noqa\n",
            "cupy/cuda/__init__.py": "class runtime:\n    @staticmethod\n"
                                     "    def deviceSynchronize():\n        pass\n\n\n"
                                     "class Device:\n    compute_capability = '90'\n"}


def launcher(args: argparse.Namespace, tmp: Path) -> int:
    """The Tier-1 child's start, fresh against forked, through the worker's own code."""
    import base64

    os.environ["GPUWS_POD_CACHE"] = str(tmp / "podcache")
    from gpuws import deploy
    from gpuws.remote_agent import forkserver, runs
    from gpuws.remote_agent.measure import tiers
    from gpuws.remote_agent.worker import RunContext

    pyz = tmp / "agent.pyz"
    pyz.write_bytes(deploy.build_bundle().data)
    runs.agent_entry = lambda: str(pyz)  # the deployed bundle, as on a pod
    path = [str(tmp)]
    try:
        import cupy  # noqa: F401
        stand_in = False
    except ImportError:
        stand_in = True
        path.append(str(tmp / "stand-in"))
        for rel, text in STAND_IN.items():
            (tmp / "stand-in" / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / "stand-in" / rel).write_text(text)
    # --cpu: a workload with nothing of its own to do, so what is timed is the launch.
    bench = "def run():\n    pass\n" if args.cpu else args.workload.read_text()
    life = forkserver.Lifeline()
    forkserver.take_session({forkserver.SESSION_ENV: life.env_value()})
    times: dict[str, list[float]] = {"fresh": [], "forked": []}
    for n in range(args.saves + 1):
        for kind in ("fresh", "forked"):
            run_id = runs.new_run_id()
            rdir = Path(runs.run_dir(run_id))
            (rdir / "artifacts").mkdir(parents=True)
            spec = {"workload": "file:bench.py", "file_name": "bench.py",
                    "fork_server": kind == "forked",
                    "file_b64": base64.b64encode(bench.encode()).decode()}
            (rdir / "spec.json").write_text(json.dumps(spec))
            ctx = RunContext(run_id, spec, lambda _e: None)
            ctx.work_dir = str(tmp)
            ctx.env["PYTHONPATH"] = os.pathsep.join(path)
            t0 = time.monotonic()
            tiers.run_child(ctx, "static", tier=1)
            if n:  # the first of each starts the server / warms the caches: not counted
                times[kind].append(time.monotonic() - t0)
    os.close(life.write_fd)
    med = {k: median(v) for k, v in times.items()}
    print(f"the Tier-1 child's static pass ({'CuPy stand-in, ' if stand_in else ''}"
          f"{'an empty file: workload' if args.cpu else args.workload.name}), {args.saves} "
          f"each, "
          f"interleaved:")
    for kind, values in times.items():
        print(f"  {kind:<7} median {med[kind] * 1e3:7.1f} ms  (min {min(values) * 1e3:.1f}, "
              f"max {max(values) * 1e3:.1f})")
    print(f"  forked saves {(med['fresh'] - med['forked']) * 1e3:.1f} ms a child "
          f"({med['fresh'] / med['forked']:.1f}× faster)")
    if args.json:
        args.json.write_text(json.dumps({"launcher_s": times, "median_s": med,
                                         "stand_in_cupy": stand_in,
                                         "machine": machine()}, indent=2))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--host", help="an ssh host (default: the tests' sshd on loopback)")
    ap.add_argument("-F", dest="config", help="ssh config file for --host")
    ap.add_argument("--workload", type=Path, default=GPU_WORKLOAD,
                    help="the gpuws file: workload (default: bench/workloads/triton_add.py)")
    ap.add_argument("--cpu", action="store_true",
                    help="no GPU: a CPU-only `cmd:python3 bench.py` instead of a file: workload")
    ap.add_argument("--saves", type=int, default=5, help="saves measured (default 5)")
    ap.add_argument("--debounce-ms", type=int, default=200)
    ap.add_argument("--max-seconds", type=float, default=3.0,
                    help="Tier 1's time limit per iteration (default 3)")
    ap.add_argument("--pod-python", default="python3", help="the by-hand path's interpreter")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per line at most")
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--launcher", action="store_true",
                    help="the pod's part alone, here: the Tier-1 child fresh vs forked")
    args = ap.parse_args()
    compile_gpuws()
    tmp = Path(tempfile.mkdtemp(prefix="gpuws-watch-latency-"))
    try:
        if args.launcher:
            return launcher(args, tmp)
        with target(args) as (pod, ssh_args):
            return measure(args, tmp, pod, ssh_args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure(args: argparse.Namespace, tmp: Path, pod: list[str], ssh_args: list[str]) -> int:
    bench_text = CPU_BENCH if args.cpu else args.workload.read_text()
    kinds = ["watch"] if args.cpu else ["watch (fork server)", "watch (fresh child)"]
    workload = "cmd:python3 bench.py" if args.cpu else "file:bench.py"
    watches: list[tuple[Watch, Path, Path]] = []
    try:
        for i, name in enumerate(kinds):
            proj = tmp / f"proj{i}"
            proj.mkdir()
            (proj / "bench.py").write_text(bench_text)
            home = tmp / f"home{i}"
            env = {**os.environ, "GPUWS_HOME": str(home), "COLUMNS": "250"}
            argv = [*GPUWS, "watch", *pod, "-W", str(proj), "-w", workload,
                    "--debounce-ms", str(args.debounce_ms), "--max-seconds",
                    str(args.max_seconds), *(["--no-fork-server"] if "fresh" in name else []),
                    # A command has no Tier 1: watch refuses it unless told (issue 34).
                    *(["--yes"] if args.cpu else [])]
            watches.append((Watch(name, argv, env, tmp / f"watch{i}.err"), proj, home))
        for w, _, _ in watches:
            w.line(1, args.timeout)  # connected, deployed, the first (baseline) iteration
        hand_dir = f".gpuws-watch-latency-{os.getpid()}"
        byhand = tmp / "byhand"
        byhand.mkdir()
        (byhand / "bench.py").write_text(bench_text)
        (byhand / "byhand.py").write_text(BYHAND)
        runner = "bench.py" if args.cpu else "byhand.py"
        scp = ["scp", "-q", *ssh_args[:-1]]
        subprocess.run(["ssh", *ssh_args, f"mkdir -p {hand_dir}"], check=True, timeout=120)
        subprocess.run([*scp, str(byhand / runner), f"{ssh_args[-1]}:{hand_dir}/"],
                       check=True, timeout=120)
        times: dict[str, list[float]] = {k: [] for k in [*kinds, "by hand"]}
        lines: dict[str, list[str]] = {k: [] for k in kinds}
        for n in range(1, args.saves + 1):
            for w, proj, _ in watches:
                edit(proj / "bench.py", n)
                t0 = time.monotonic()  # the write's end: editors' saves end there too
                at, text = w.line(n + 1, args.timeout)
                times[w.name].append(at - t0)
                lines[w.name].append(text)
            edit(byhand / "bench.py", n)
            t0 = time.monotonic()
            timed([*scp, str(byhand / "bench.py"), f"{ssh_args[-1]}:{hand_dir}/"])
            timed(["ssh", *ssh_args, f"cd {hand_dir} && {args.pod_python} {runner}"])
            times["by hand"].append(time.monotonic() - t0)
        subprocess.run(["ssh", *ssh_args, f"rm -rf {hand_dir}"], timeout=120)
    finally:
        tables = {w.name: w.stop() for w, _, _ in watches}
    runs = {w.name: store_figures(home, w.name)[1:] for w, _, home in watches}
    report(args, kinds, times, lines, runs, tables)
    return 0


def report(args: argparse.Namespace, kinds: list[str], times: dict[str, list[float]],
           lines: dict[str, list[str]], runs: dict[str, list[dict[str, Any]]],
           tables: dict[str, str]) -> None:
    result: dict[str, Any] = {"saves": args.saves, "debounce_ms": args.debounce_ms,
                              "workload": "cpu command" if args.cpu else str(args.workload),
                              "host": args.host or "the tests' sshd on 127.0.0.1",
                              "save_to_line_s": times, "lines": lines, "runs": runs,
                              "machine": machine()}
    print(f"save → line, {args.saves} saves, debounce {args.debounce_ms} ms, "
          f"{result['workload']} on {result['host']}:")
    med = {k: median(v) for k, v in times.items()}
    for name, values in times.items():
        print(f"  {name:<22} median {med[name]:6.2f} s  (min {min(values):.2f}, "
              f"max {max(values):.2f})")
    result["median_s"] = med
    result["by_hand_over_watch"] = {k: med["by hand"] / med[k] for k in kinds}
    overhead: dict[str, list[float]] = {}
    for name in kinds:
        rows = runs[name]
        if len(rows) != len(times[name]):
            print(f"  {name}: {len(rows)} stored runs for {len(times[name])} saves")
            continue
        if args.cpu:
            # The command's own run (Tier 0, the workload) against the whole loop.
            own = [r["tiers_wall_s"] for r in rows]
            what = "beyond the command's own run"
        else:
            # Tier 1's whole wall on the pod: the child's start (forked or fresh), the
            # workload's setup and the sampling. The samples reach the laptop in one batch
            # at the end of a short window, so their timestamps cannot split it further.
            own = [r["tier1_wall_s"] for r in rows]
            what = "beyond Tier 1's wall (child start + setup + sampling)"
        overhead[name] = [t - o for t, o in zip(times[name], own, strict=True)]
        print(f"  {name:<22} overhead {what}: median {median(overhead[name]):.2f} s "
              f"(min {min(overhead[name]):.2f}, max {max(overhead[name]):.2f})")
        if not args.cpu:
            print(f"  {'':<22} Tier 1's wall: median {median(own):.2f} s")
    result["overhead_s"] = overhead
    print("  by hand ÷ watch: " + ", ".join(f"{k} {v:.2f}×" for k, v in
                                           result["by_hand_over_watch"].items()))
    for name in kinds:
        print(f"  {name}: last line: {lines[name][-1] if lines[name] else '—'}")
        if "watch: the iterations" not in tables[name]:
            print(f"  {name}: ended without its table")
    result["ended_with_table"] = {k: "watch: the iterations" in v for k, v in tables.items()}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.exit(main())
