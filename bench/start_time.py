"""A fast start: whole-process time of ``gpuws --help`` and the store-only listings, and
how many modules each imports, for one or more source trees, interleaved.

Each command runs ``--runs`` times (default 15) per tree, the trees taking turns so a
busy machine weighs on both alike; the figure is the median wall time of the process
(``python -m gpuws ...``, interpreter start included), beside ``python -c pass``::

    python3 bench/start_time.py                           # this checkout's src/
    python3 bench/start_time.py before=/work/main/src after=src

The store holds one session of ten runs (bench/history_scale.py's streams).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = (["--help"], ["sessions", "--json"], ["sessions"], ["history", "--json"],
            ["history"])
COUNT = "import sys, runpy; sys.argv = ['gpuws', *{argv!r}]\n" \
        "try:\n    runpy.run_module('gpuws', run_name='__main__')\nexcept SystemExit:\n    pass\n" \
        "sys.stderr.write(f'modules={{len(sys.modules)}}\\n')"


def _wall(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def _modules(argv: list[str], env: dict[str, str]) -> int:
    done = subprocess.run([sys.executable, "-c", COUNT.format(argv=argv)], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          check=True)
    return int(done.stderr.strip().rsplit("modules=", 1)[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="*", metavar="NAME=SRC",
                    help="source trees to time (default: this checkout's src)")
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.trees) or {"this": str(ROOT / "src")}
    sys.path.insert(0, str(ROOT / "bench"))
    from history_scale import build  # the bench's own store filler

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        build(home, 10)
        envs = {name: {**os.environ, "GPUWS_HOME": str(home), "COLUMNS": "160",
                       "PYTHONPATH": str(Path(src).resolve())} for name, src in trees.items()}
        times: dict[tuple[str, str], list[float]] = {}
        floor: list[float] = []
        for _ in range(args.runs):
            floor.append(_wall([sys.executable, "-c", "pass"], os.environ.copy()))
            for cmd in COMMANDS:
                for name, env in envs.items():
                    times.setdefault((" ".join(cmd), name), []).append(
                        _wall([sys.executable, "-m", "gpuws", *cmd], env))
        print(f"python {sys.version.split()[0]}, median of {args.runs}; "
              f"`python -c pass`: {statistics.median(floor) * 1000:.0f} ms")
        print("| command | " + " | ".join(f"{n}: ms (modules)" for n in trees) + " |")
        print("|---|" + "---:|" * len(trees))
        for cmd in COMMANDS:
            key = " ".join(cmd)
            cells = [f"{statistics.median(times[key, n]) * 1000:.0f} ({_modules(cmd, e)})"
                     for n, e in envs.items()]
            print(f"| `gpuws {key}` | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
