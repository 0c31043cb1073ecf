"""A kept connection (``persist``), as a person meets it: whole processes, interleaved.

On the tests' real sshd (``bench/_sshd.py``; with ``--rtt MS`` through its delay proxy),
each round runs, in turn: ``ssh pod true`` (OpenSSH, a new connection each time), warm
``gpuws doctor pod`` and ``gpuws run pod -w cmd:true`` with ``--no-persist`` (their own
connection) and with the host's ``persist = "10m"`` (through the master the warm-up
left), and ``python -c pass`` (the interpreter's start, the floor of any Python
command). The figure is each command's median wall time over ``--runs`` rounds (at least
5), and its ratio to ``ssh pod true``; the master's own counters show that the kept
commands made no new SSH connection::

    python3 bench/persist.py --runs 7
    python3 bench/persist.py --runs 7 --rtt 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _sshd import compile_gpuws, machine, running_pod


def _wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def _hello(config: Path) -> dict[str, object]:
    from gpuws.transport.persist.client import PersistTransport

    async def ask() -> dict[str, object]:
        t = PersistTransport("pod", config_file=str(config), idle_s=600)
        await t.connect()
        assert t.master is not None and t.reused, "the warm-up left no master"
        return t.master

    return asyncio.run(ask())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--rtt", type=float, default=0.0, help="round-trip time to add (ms)")
    args = ap.parse_args()
    if args.runs < 5:
        ap.error("--runs: at least 5 (the figures are medians)")
    compile_gpuws()
    runtime = tempfile.mkdtemp(prefix="gpb", dir="/tmp")  # short: a socket path's limit
    os.environ["XDG_RUNTIME_DIR"] = runtime
    with running_pod(rtt_ms=args.rtt) as pod:
        Path(os.environ["GPUWS_CONFIG"]).write_text('[hosts.pod]\npersist = "10m"\n')
        gpuws = [sys.executable, "-m", "gpuws"]
        cfg = ["-F", str(pod.config)]
        commands = {
            "ssh pod true": pod.ssh("true"),
            # The floor under any Python command: the interpreter's own start.
            "python -c pass": [sys.executable, "-c", "pass"],
            "gpuws doctor pod --no-persist": [*gpuws, "doctor", "pod", *cfg, "--no-persist"],
            "gpuws doctor pod (kept)": [*gpuws, "doctor", "pod", *cfg],
            "gpuws run pod -w cmd:true --no-persist": [*gpuws, "run", "pod", *cfg, "-w",
                                                       "cmd:true", "--no-persist"],
            "gpuws run pod -w cmd:true (kept)": [*gpuws, "run", "pod", *cfg, "-w", "cmd:true"],
        }
        # Warm: the agent cached on the pod, the master started, every module compiled.
        for argv in commands.values():
            _wall(argv)
        before = _hello(pod.config)
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, argv in commands.items():
                times[name].append(_wall(argv))
        after = _hello(pod.config)
        os.kill(int(str(after["pid"])), signal.SIGTERM)
        shutil.rmtree(runtime, ignore_errors=True)
        ssh = statistics.median(times["ssh pod true"])
        where = machine()
        print(f"`python3 bench/persist.py --runs {args.runs}"
              + (f" --rtt {args.rtt:g}`" if args.rtt else "`")
              + f" — {where['cpu']} ×{where['nproc']}, load {where['loadavg_at_end']}, "
              f"python {where['python']}, {where['openssh']}, asyncssh {where['asyncssh']}; "
              f"round-trip time added: {args.rtt:g} ms")
        print()
        print("| command | median (s) | × `ssh pod true` |")
        print("|---|---:|---:|")
        for name, values in times.items():
            med = statistics.median(values)
            print(f"| `{name}` | {med:.3f} | {med / ssh:.2f} |")
        print()
        kept = args.runs * 2  # the kept doctor and run of every round
        print(f"The master: pid {before['pid']} before the rounds and {after['pid']} after, "
              f"SSH connections made {after['dials']}, exec channels "
              f"{before['streams']} → {after['streams']} over {kept} kept commands.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
