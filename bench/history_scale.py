"""History at any size: ``gpuws history``, ``history --json`` and Home's load at 2,000 and
20,000 stored runs, as whole processes, beside ``sqlite3`` reading the same rows.

The stores hold sessions of 10 runs each (8 Tier-1 saxpy runs of 50 samples, one failed
blocked-counters run, one cancelled run: tests/sessions/recorded.py's streams, ids and
times shifted per run). Each figure is the median of ``--runs`` runs (default 5)::

    python3 bench/history_scale.py                    # this checkout's src/
    python3 bench/history_scale.py --src OTHER/src    # another checkout (before/after)

Measured: the time to the first screenful (50 lines of ``gpuws history`` on a pipe) and
to its end; ``history --json``'s time and peak RSS; Home's data load (its hosts and ten
recent sessions, in a fresh process, the import excluded); ``sqlite3`` printing the runs'
rows (id, session, workload, status), the floor under any listing. The sizes are
interleaved (each repetition runs every measure on each store) and ``--write-docs`` puts
the medians and the ratios over ``sqlite3`` into docs/performance.md, with the command::

    python3 bench/history_scale.py --runs 5 --keep /tmp/stores --write-docs
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

from _docs import put_block, shown_argv

ROOT = Path(__file__).resolve().parent.parent
SCREEN = 50  # lines: a tall terminal's first screenful
HOME_LOAD = """
import sys, time
from gpuws.sessions.store import Store
from gpuws.tui.hosts import home_hosts, summarize_sessions
start = time.perf_counter()
with Store() as s:
    home_hosts(s, None), summarize_sessions(s, 10)
print(time.perf_counter() - start)
"""


def _recorded() -> ModuleType:
    path = ROOT / "tests" / "sessions" / "recorded.py"
    spec = importlib.util.spec_from_file_location("gpuws_bench_history_recorded", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(home: Path, runs: int) -> None:
    """A store of ``runs`` runs, 10 per session, under ``home`` (GPUWS_HOME)."""
    from gpuws.locations import DB_NAME
    from gpuws.sessions.store import Store

    rec = _recorded()
    # The streams are made once (a saxpy stream parses a real ncu CSV) and re-stamped.
    templates = []
    for j in range(10):
        rid = f"TEMPLATE{j}"
        lines = (rec.blocked_run(rid, t0=rec.T0 + j * 60) if j == 3
                 else rec.cancelled_run(rid, t0=rec.T0 + j * 60) if j == 7
                 else rec.saxpy_run(rid, t0=rec.T0 + j * 60, tiers=(1,), n_samples=50,
                                    batch=50))
        templates.append([json.loads(line) for line in lines])
    home.mkdir(parents=True, mode=0o700, exist_ok=True)
    with Store(home / DB_NAME) as store:
        for i in range(runs // 10):
            t0 = rec.T0 + i * 1000
            sid = store.open_session(f"pod{i % 7}", "ssh+sftp", None, 3.99, started=t0 - 5)
            batch = [json.dumps(dict(ev, run_id=f"2026{i:06d}-{j:02d}", ts=ev["ts"] + i * 1000),
                                separators=(",", ":")).encode()
                     for j, events in enumerate(templates) for ev in events]
            store.ingest_many(sid, batch)
            store.end_session(sid, t0 + 700)


def _env(home: Path, src: Path) -> dict[str, str]:
    return {**os.environ, "GPUWS_HOME": str(home), "PYTHONPATH": str(src), "COLUMNS": "160"}


def _timed(argv: list[str], env: dict[str, str], first_lines: int | None = None
           ) -> tuple[float | None, float, float]:
    """(seconds to the first ``first_lines`` lines, seconds to the end, peak RSS MiB)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    first = None
    lines = 0
    for _ in proc.stdout:
        lines += 1
        if first_lines is not None and first is None and lines >= first_lines:
            first = time.perf_counter() - start
    _, status, usage = os.wait4(proc.pid, 0)
    end = time.perf_counter() - start
    if first_lines is not None and first is None:
        first = end  # a listing shorter than a screen: all of it is the first screenful
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}")
    return first, end, usage.ru_maxrss / 1024


#: The rows ``gpuws history`` lists, as sqlite3 reads them: the floor under any listing.
QUERY = ("SELECT run_id, session_id, workload, status FROM runs r JOIN sessions s"
         " ON s.id = r.session_id ORDER BY s.started DESC, r.started")


def measure_once(home: Path, src: Path) -> dict[str, float]:
    """One repetition of every measure on one store (seconds; Home's load in ms)."""
    env = _env(home, src)
    gpuws = [sys.executable, "-m", "gpuws"]
    db = next(home.glob("*.db"))
    first, whole, _ = _timed([*gpuws, "history"], env, SCREEN)
    assert first is not None
    _, jtime, jrss = _timed([*gpuws, "history", "--json"], env)
    out = subprocess.run([sys.executable, "-c", HOME_LOAD], env=env, check=True,
                         capture_output=True, text=True).stdout
    sql = _timed(["sqlite3", str(db), QUERY], env)[1]
    return {"history: first screenful (s)": first, "history: whole (s)": whole,
            "history --json (s)": jtime, "history --json peak RSS (MiB)": jrss,
            "Home's data load (ms)": float(out) * 1000, "sqlite3, the same rows (s)": sql}


def table(figures: dict[str, dict[str, list[float]]]) -> str:
    """Medians per store size, and the ratios a person meets: gpuws over sqlite3."""
    med = {size: {name: statistics.median(v) for name, v in col.items()}
           for size, col in figures.items()}
    names = list(next(iter(med.values())))
    lines = ["| measure | " + " | ".join(med) + " |", "|---|" + "---:|" * len(med)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(f"{col[name]:.2f}" for col in med.values())
                     + " |")
    for name in ("history: first screenful (s)", "history: whole (s)", "history --json (s)"):
        lines.append(f"| {name.split(' (')[0]} / sqlite3 | "
                     + " | ".join(f"{col[name] / col['sqlite3, the same rows (s)']:.1f}×"
                                  for col in med.values()) + " |")
    return "\n".join(lines)


def write_docs(text: str, command: str, runs: int, docs: Path, label: str = "") -> None:
    """Replace this bench's block (of ``label``: a second source's, say) in ``docs``
    (generated, never typed)."""
    tag = f"history_scale {label}".strip()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    block = (f"<!-- {tag} begin: generated by bench/history_scale.py, not typed -->\n"
             + (f"**{label}**: " if label else "")
             + f"Medians of {runs}, sizes interleaved, {when}, Python "
             f"{sys.version.split()[0]}, {os.cpu_count()} cores, load at the end {load}:\n\n"
             f"    {command}\n\n{text}\n<!-- {tag} end -->")
    put_block(docs, tag, block, "<!-- history_scale table -->")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=ROOT / "src", help="the gpuws source to time")
    ap.add_argument("--runs", type=int, default=5, help="runs per figure (median)")
    ap.add_argument("--sizes", default="2000,20000", help="stored runs, comma-separated")
    ap.add_argument("--keep", type=Path, help="build (or reuse) the stores under this folder")
    ap.add_argument("--write-docs", action="store_true",
                    help="put the table into docs/performance.md (section 15)")
    ap.add_argument("--label", default="",
                    help="names this run's block in the docs (e.g. before: another --src)")
    ap.add_argument("--docs", type=Path, default=ROOT / "docs" / "performance.md",
                    help="the file --write-docs writes")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep or Path(tmp)
        homes = {}
        for n in sizes:
            homes[f"{n:,} runs"] = home = base / f"runs-{n}"
            if not any(home.glob("*.db")):
                build(home, n)  # with this checkout's store, whatever --src is
        figures: dict[str, dict[str, list[float]]] = {size: {} for size in homes}
        for _ in range(args.runs):  # the sizes interleaved: a busy spell hurts both
            for size, home in homes.items():
                for name, value in measure_once(home, args.src.resolve()).items():
                    figures[size].setdefault(name, []).append(value)
    text = table(figures)
    print(f"python {sys.version.split()[0]}, src {args.src}, median of {args.runs}")
    print(text)
    if args.write_docs:
        if args.runs < 5:
            raise SystemExit("the docs take medians of 5 or more (--runs 5)")
        argv = shown_argv()
        write_docs(text, shlex.join(["python3", "bench/history_scale.py", *argv]), args.runs,
                   args.docs, args.label)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
