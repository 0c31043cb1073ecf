"""A fleet run's wall time beside the slowest of its pods run alone (issue 14: ≤ 1.2×).

Three real OpenSSH sshd "pods" run on 127.0.0.1, each with its own pod-side cache, named
pod0, pod1, pod2 in one ssh config. Each repetition times, as whole processes the way a
person types them (Python start, imports, connect, deploy check, probe, the run, the
store, the table):

- ``gpuws run podI -w W`` for each pod alone; the slowest of them is the bar;
- ``gpuws run pod0 pod1 -w W`` and ``gpuws run pod0 pod1 pod2 -w W`` (fleets of 2 and 3).

The ratio of each fleet's wall time to the slowest single pod of the same repetition is
reported as the median over the repetitions (and its range). The order of the
measurements rotates between repetitions so a noisy neighbour hurts each alike. One
untimed run per pod deploys the agent first (a fleet is measured with warm pod caches,
as the singles are). The workload is a ``cmd:`` command (this machine has no GPU)::

    python3 bench/fleet.py --json fleet.json
    python3 bench/fleet.py --repeat 7 --workload 'cmd:sleep 2'
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _sshd import machine, median

from sshd import SshServer, find_sshd  # type: ignore[import-not-found]


def gpuws(config: Path, pods: list[str], workload: str, env: dict[str, str]) -> float:
    """Wall seconds of one ``gpuws run`` process (it must succeed)."""
    argv = [sys.executable, "-m", "gpuws.cli", "run", *pods, "-F", str(config), "-w",
            workload, "--no-pull"]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(pods)}: exit {proc.returncode}\n{proc.stdout}\n"
                         f"{proc.stderr}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="repetitions (default 5)")
    ap.add_argument("--workload", default="cmd:sleep 1; echo done",
                    help="the workload every run runs (default: one second of sleep)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    if find_sshd() is None:
        raise SystemExit("OpenSSH sshd is not installed (apt-get install openssh-server)")
    with tempfile.TemporaryDirectory(prefix="gpuws-bench-fleet-") as tmp:
        root = Path(tmp)
        env = dict(os.environ, GPUWS_HOME=str(root / "home"),
                   GPUWS_CONFIG=str(root / "config.toml"))
        env.pop("SSH_AUTH_SOCK", None)
        servers = [SshServer(root / f"sshd{i}").start() for i in range(3)]
        try:
            config = root / "ssh_config"
            config.write_text("".join(
                s.client_files(root / f"client{i}", alias=f"pod{i}").read_text()
                for i, s in enumerate(servers)))
            pods = [f"pod{i}" for i in range(3)]
            for pod in pods:  # deploy the agent into each pod's cache (untimed)
                gpuws(config, [pod], args.workload, env)
            jobs: list[tuple[str, list[str]]] = [(p, [p]) for p in pods]
            jobs += [("fleet of 2", pods[:2]), ("fleet of 3", pods)]
            walls: dict[str, list[float]] = {name: [] for name, _ in jobs}
            ratios: dict[str, list[float]] = {"fleet of 2": [], "fleet of 3": []}
            for rep in range(args.repeat):
                shift = rep % len(jobs)
                this: dict[str, float] = {}
                for name, members in jobs[shift:] + jobs[:shift]:
                    this[name] = gpuws(config, members, args.workload, env)
                    walls[name].append(this[name])
                ratios["fleet of 2"].append(this["fleet of 2"] / max(this[p] for p in pods[:2]))
                ratios["fleet of 3"].append(this["fleet of 3"] / max(this[p] for p in pods))
                print(f"repetition {rep + 1}: " + ", ".join(f"{k} {v:.3f} s"
                                                            for k, v in this.items()),
                      flush=True)
        finally:
            for s in servers:
                s.stop()
    result: dict[str, Any] = {
        "workload": args.workload, "repeat": args.repeat,
        "median_wall_s": {k: round(median(v), 4) for k, v in walls.items()},
        "ratio_to_slowest_single": {
            k: {"median": round(median(v), 4), "min": round(min(v), 4),
                "max": round(max(v), 4)} for k, v in ratios.items()},
        "machine": machine(),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
