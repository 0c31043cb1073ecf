"""History at 20,000 runs (issue 36, point 4): the indexes the listings need, present
(migrated into an older store) and used by SQLite's own plan; ``gpuws history`` printing
its first screenful before it reads the last run, inside one session of 20,000 runs; and
``history --json`` holding the same memory at 2,000 runs as at 20,000.

Everything runs on real SQLite stores filled through ``Store.ingest_many`` with the
recorded cancelled-run stream (tests/sessions/recorded.py), re-stamped per run."""

from __future__ import annotations

import io
import json
import sqlite3
import sys
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest

import gpuws.sessions.store as store_mod
from gpuws.cli import main
from gpuws.locations import DB_NAME
from gpuws.sessions.runlist import CHUNK, iter_runs
from gpuws.sessions.store import Store
from gpuws.tui.hosts import home_hosts, summarize_sessions

#: The runs of the large store: one `watch` session of them all, the hardest case for a
#: listing that streamed a session at a time.
LARGE = 20_000
SMALL = 2_000
SCREEN = 50


def _template(rec: ModuleType) -> list[dict[str, object]]:
    return [json.loads(line) for line in rec.cancelled_run("TEMPLATE")]


def _grow(path: Path, rec: ModuleType, start: int, stop: int, sessions: int = 1) -> list[str]:
    """Runs ``start`` .. ``stop`` (ids in the order they ran) in ``sessions`` new sessions."""
    template = _template(rec)
    ids = []
    per = (stop - start) // sessions
    with Store(path) as store:
        for k in range(sessions):
            first = start + k * per
            sid = store.open_session("pod0", "ssh+sftp", None, 2.0,
                                     started=rec.T0 + first * 10)
            batch = []
            for i in range(first, first + per):
                rid = f"20261128-{i:06d}"
                ids.append(rid)
                batch += [json.dumps(dict(ev, run_id=rid, ts=float(ev["ts"]) + i * 10),  # type: ignore[arg-type]
                                     separators=(",", ":")).encode() for ev in template]
            store.ingest_many(sid, batch)
            store.end_session(sid, rec.T0 + (first + per) * 10)
    return ids


def _recorded() -> ModuleType:
    # The conftest's helper module, loaded by path as it does (a module-scoped fixture
    # cannot take its function-scoped `recorded`).
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpuws_history_scale_recorded",
                                                  Path(__file__).with_name("recorded.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, list[str]]]:
    """GPUWS_HOMEs of 2,000 and 20,000 runs, each one session; with their run ids."""
    rec = _recorded()
    out = {}
    for n in (SMALL, LARGE):
        home = tmp_path_factory.mktemp(f"runs{n}")
        home.chmod(0o700)
        out[n] = (home, _grow(home / DB_NAME, rec, 0, n))
    return out


@pytest.fixture
def large(stores: dict[int, tuple[Path, list[str]]], monkeypatch: pytest.MonkeyPatch,
          tmp_path: Path) -> tuple[Path, list[str]]:
    home, ids = stores[LARGE]
    monkeypatch.setenv("GPUWS_HOME", str(home))
    monkeypatch.setenv("GPUWS_CONFIG", str(tmp_path / "no-config.toml"))
    return home, ids


@contextmanager
def _statements(store: Store) -> Iterator[list[str]]:
    """The SQL statements the store runs meanwhile, values filled in (SQLite's trace)."""
    seen: list[str] = []
    # The store's connection is private to it; the trace is the one honest way to see
    # what a reader asked of SQLite, and it changes nothing the store does.
    store._conn.set_trace_callback(seen.append)
    try:
        yield seen
    finally:
        store._conn.set_trace_callback(None)


def _plan(store: Store, sql: str) -> list[str]:
    return [str(row[3]) for row in store._conn.execute("EXPLAIN QUERY PLAN " + sql)]


def test_the_listings_use_an_index_not_a_scan_or_a_sort(
        large: tuple[Path, list[str]]) -> None:
    """What ``history``, ``history --limit`` and Home ask of SQLite, each statement's
    plan by EXPLAIN QUERY PLAN: no table of sessions, runs or events is read whole, and
    nothing is sorted but Home's one row per host."""
    with Store() as store, _statements(store) as seen:
        first = next(iter_runs(store))
        store.newest_runs(10)
        list(iter_runs(store, limit=10))
        summarize_sessions(store, 10)
        hosts = home_hosts(store, None)
    assert first.run_id == "20261128-000000"  # the session's runs in the order they ran
    assert [h.name for h in hosts if not h.in_config] == ["pod0", "local"]
    queries = sorted({sql for sql in seen if sql.lstrip().upper().startswith(("SELECT", "WITH"))})
    assert len(queries) >= 6, seen
    with Store() as store:
        for sql in queries:
            plan = _plan(store, sql)
            scans = [step for step in plan if step.startswith("SCAN")
                     and not step.startswith("SCAN hosts") and "INDEX" not in step]
            assert not scans, (sql, plan)
            sorts = [step for step in plan if "TEMP B-TREE" in step]
            # Home's hosts: one row per host is sorted, newest first.
            assert not sorts or sql.startswith("WITH RECURSIVE hosts"), (sql, plan)
        # The indexes the plans name are this migration's.
        plans = " ".join(" ".join(_plan(store, sql)) for sql in queries)
    for index in ("sessions_by_started", "sessions_by_host", "runs_by_started"):
        assert index in plans, plans


def test_an_older_store_gains_the_indexes_and_keeps_its_runs(
        tmp_path: Path, recorded: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store of schema 5 (before the indexes) is migrated on open, its runs kept; one
    where a person already made an index of the same name migrates all the same."""
    for made_by_hand in (False, True):
        path = tmp_path / f"v5-{made_by_hand}.db"
        with monkeypatch.context() as m:
            m.setattr(store_mod, "_MIGRATIONS", store_mod._MIGRATIONS[:5])
            m.setattr(store_mod, "SCHEMA_VERSION", 5)
            ids = _grow(path, recorded, 0, 30, sessions=3)
            if made_by_hand:
                conn = sqlite3.connect(path)
                conn.execute("CREATE INDEX sessions_by_started ON sessions(started)")
                conn.close()
        with Store(path) as store:
            version = store._conn.execute("PRAGMA user_version").fetchone()[0]
            indexes = {row[0] for row in store._conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index'")}
            listed = [r.run_id for r in iter_runs(store)]
        assert version == store_mod.SCHEMA_VERSION
        assert {"sessions_by_started", "sessions_by_host", "runs_by_started"} <= indexes
        # Newest session first, each session's runs in the order they ran.
        assert listed == [*ids[20:], *ids[10:20], *ids[:10]]


class _Screen(io.StringIO):
    """stdout that notes which runs had been read when the first screenful arrived."""

    def __init__(self, read: list[str]) -> None:
        super().__init__()
        self.read = read
        self.read_at_first_screen: list[str] | None = None

    def write(self, s: str) -> int:
        n = super().write(s)
        if self.read_at_first_screen is None and self.getvalue().count("\n") >= SCREEN:
            self.read_at_first_screen = list(self.read)
        return n


def test_the_first_screenful_is_out_before_the_last_run_is_read(
        large: tuple[Path, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """One session of 20,000 runs: ``gpuws history`` prints its first 50 lines having
    read one chunk of runs (it read the whole session before, and before that the whole
    store). Which runs were read is seen at the store's own door (``listing_events``,
    wrapped to note its arguments and then doing its work)."""
    _, ids = large
    read: list[str] = []
    real = Store.listing_events

    def noting(self: Store, run_ids: list[str], types: object) -> object:
        read.extend(run_ids)
        return real(self, run_ids, types)  # type: ignore[arg-type]

    monkeypatch.setattr(Store, "listing_events", noting)
    screen = _Screen(read)
    monkeypatch.setattr("sys.stdout", screen)
    monkeypatch.setenv("COLUMNS", "120")
    assert main(["history"]) == 0
    assert screen.read_at_first_screen is not None
    assert ids[0] in screen.read_at_first_screen
    assert ids[-1] not in screen.read_at_first_screen
    assert len(screen.read_at_first_screen) <= CHUNK
    # And everything was printed in the end, in the order the runs ran.
    out = screen.getvalue()
    assert len(read) == LARGE and out.count("\n 20261128-") == LARGE
    assert out.index(ids[0]) < out.index(ids[CHUNK]) < out.index(ids[-1])


class _Sink(io.TextIOBase):
    """stdout that counts what it is given and keeps none of it."""

    def __init__(self) -> None:
        self.chars = 0
        self.items = 0

    def write(self, s: str) -> int:
        self.chars += len(s)
        self.items += s.count('"run_id"')
        return len(s)


def _json_peak(home: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """(peak bytes Python allocated, items written) for ``history --json`` on ``home``."""
    monkeypatch.setenv("GPUWS_HOME", str(home))
    sink = _Sink()
    monkeypatch.setattr("sys.stdout", sink)
    main(["history", "--limit", "1", "--json"])  # imports and caches outside the count
    sink.items = 0
    tracemalloc.start()
    try:
        assert main(["history", "--json"]) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, sink.items


def test_history_json_holds_the_same_memory_at_any_size(
        stores: dict[int, tuple[Path, list[str]]], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """``history --json`` of 20,000 runs peaks within a small factor of 2,000 runs' peak
    (122 MiB of JSON was built whole before the first byte went out)."""
    monkeypatch.setenv("GPUWS_CONFIG", str(tmp_path / "no-config.toml"))
    small, n_small = _json_peak(stores[SMALL][0], monkeypatch)
    large, n_large = _json_peak(stores[LARGE][0], monkeypatch)
    assert (n_small, n_large) == (SMALL, LARGE)
    print(f"history --json peak: {small} B at {SMALL} runs, {large} B at {LARGE}",
          file=sys.stderr)
    assert large < 1.5 * small, (small, large)
