"""Session store throughput: ingest 100,000 events, then export that session.

The events are a realistic stream (tests/sessions/recorded.py: two saxpy runs of 50,000
events each, mostly Tier-1 sample batches, the second compared with the first as its
baseline), ingested the way the laptop receives them: raw JSON lines in batches, each
batch one transaction. Every figure is the median of 5 runs on a fresh store::

    python3 bench/store.py
"""

from __future__ import annotations

import importlib.util
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

from gpuws import protocol
from gpuws.sessions.export import export_session
from gpuws.sessions.store import Ingestible, Store

RUNS = 5
EVENTS_PER_RUN = 50_000


def _recorded() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "tests" / "sessions" / "recorded.py"
    spec = importlib.util.spec_from_file_location("gpuws_bench_recorded", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fill(store: Store, rec: ModuleType, streams: Sequence[Sequence[Ingestible]],
          batch: int) -> tuple[str, float]:
    """Ingest both runs (baseline first); return the session id and seconds spent ingesting."""
    sid = store.open_session("pod", "local", None, 3.99, started=rec.T0)
    store.ingest(sid, rec.probe_line())
    elapsed = 0.0
    for i, stream in enumerate(streams):
        start = time.perf_counter()
        for j in range(0, len(stream), batch):
            store.ingest_many(sid, stream[j:j + batch])
        elapsed += time.perf_counter() - start
        if i == 0:
            store.set_baseline("a")
    return sid, elapsed


def _median_of(runs: int, once: Callable[[Path], float]) -> tuple[float, list[float]]:
    values = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            values.append(once(Path(tmp) / "bench.db"))
    return statistics.median(values), values


def main() -> int:
    rec = _recorded()
    # 19 non-sample events per run: n samples in batches of 1 make 50,000 events per run.
    lines = [rec.saxpy_run("a", n_samples=EVENTS_PER_RUN - 19, batch=1),
             rec.saxpy_run("b", t0=rec.T0 + 100, n_samples=EVENTS_PER_RUN - 19, batch=1,
                           seed=2)]
    total = sum(len(s) for s in lines)
    decoded: list[list[Ingestible]] = []
    for stream in lines:
        events = [protocol.decode_event(line) for line in stream]
        decoded.append([e for e in events if isinstance(e, protocol.Event)])

    rows: list[tuple[str, str]] = []
    for label, streams, batch in (("raw lines, batches of 1,000", lines, 1000),
                                  ("raw lines, batches of 100", lines, 100),
                                  ("decoded events, batches of 1,000", decoded, 1000)):
        def ingest(path: Path, streams: Sequence[Sequence[Ingestible]] = streams,
                   batch: int = batch) -> float:
            with Store(path) as store:
                return _fill(store, rec, streams, batch)[1]
        med, values = _median_of(RUNS, ingest)
        rows.append((f"ingest {total:,} events ({label})",
                     f"{total / med:,.0f} events/s (median {med:.3f} s; "
                     f"runs {', '.join(f'{v:.3f}' for v in values)})"))

    def export(path: Path) -> float:
        with Store(path) as store:
            sid, _ = _fill(store, rec, lines, 1000)
            start = time.perf_counter()
            export_session(store, sid, now=rec.T0 + 200)
            return time.perf_counter() - start
    med, values = _median_of(RUNS, export)
    rows.append((f"export the {total:,}-event session (with baseline comparison)",
                 f"{med * 1000:.0f} ms (runs {', '.join(f'{v * 1000:.0f}' for v in values)})"))

    width = max(len(r[0]) for r in rows)
    print(f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, "
          f"median of {RUNS}")
    print(f"{'measure':<{width}}  result")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
