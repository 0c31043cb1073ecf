"""History at any size (issue 36): ``history --limit``, streamed listings, and Home reading
only what it shows. Everything runs on a real SQLite store under a private GPUWS_HOME;
how much was read is counted with SQLite's own statement trace."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

import pytest

from gpuws.cli import main
from gpuws.commands.common import print_json
from gpuws.sessions.runlist import iter_runs, list_runs
from gpuws.sessions.store import Store
from gpuws.tui.hosts import home_hosts, last_workload, summarize_sessions


def _fill(store: Store, rec: ModuleType, sessions: int, runs: int = 3,
          hosts: int = 2) -> list[list[str]]:
    """``sessions`` sessions of ``runs`` cancelled runs each, on ``hosts`` pods in turn;
    the run ids per session, oldest session first."""
    out = []
    start = len(store.sessions())  # a second fill goes on after the first
    for i in range(start, start + sessions):
        t0 = rec.T0 + i * 1000
        sid = store.open_session(f"pod{i % hosts}", "ssh+sftp", None, 2.0, started=t0)
        ids = [f"2026112{i:04d}-{j}" for j in range(runs)]
        for j, rid in enumerate(ids):
            store.ingest_many(sid, rec.cancelled_run(rid, t0=t0 + 10 + j * 60))
        store.end_session(sid, t0 + 500)
        out.append(ids)
    return out


@contextmanager
def _statements(store: Store) -> Iterator[list[str]]:
    """The SQL statements the store runs meanwhile (SQLite's trace callback)."""
    seen: list[str] = []
    # The store's connection is private to it; the trace is the one honest way to see
    # what a reader asked of SQLite, and it changes nothing the store does.
    conn = store._conn
    conn.set_trace_callback(seen.append)
    try:
        yield seen
    finally:
        conn.set_trace_callback(None)


def test_limit_gives_the_newest_runs_in_the_listings_order(
        store: Store, recorded: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    ids = _fill(store, recorded, sessions=3)
    assert main(["history", "--json", "--limit", "4"]) == 0
    got = [r["run_id"] for r in json.loads(capsys.readouterr().out)]
    # The 4 newest: all of the newest session, then the newest of the one before, each
    # session's runs in the order they ran, as the whole listing shows them.
    assert got == [*ids[2], ids[1][2]]
    assert main(["history", "--json", "--limit", "100"]) == 0
    everything = [r["run_id"] for r in json.loads(capsys.readouterr().out)]
    assert everything == [*ids[2], *ids[1], *ids[0]]
    # One session's newest runs.
    sid = store.run(ids[0][0]).session_id
    assert main(["history", sid[:8], "--json", "--limit", "2"]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == ids[0][1:]
    # For people: only those runs, under their session's title.
    assert main(["history", "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert ids[2][2] in out and ids[2][1] not in out and ids[1][0] not in out
    assert out.count("session ") == 1 and "run ids (or prefixes)" in out


@pytest.mark.parametrize("bad", ["0", "-3", "many", "1e3"])
def test_a_bad_limit_is_a_usage_error(bad: str, store: Store,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["history", "--limit", bad])
    assert exit_.value.code == 2
    assert "--limit" in capsys.readouterr().err


def test_streamed_json_is_the_text_print_json_wrote(
        store: Store, recorded: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    """Scripts read ``history --json`` as before: the same array, byte for byte."""
    assert main(["history", "--json"]) == 0
    assert capsys.readouterr().out == "[]\n"
    _fill(store, recorded, sessions=2)
    store.ingest_many(store.open_session("h200", "ssh+sftp", None, 3.99,
                                         started=recorded.T0 + 5000),
                      recorded.saxpy_run("20261130-000000-saxpy0", t0=recorded.T0 + 5010,
                                         tiers=(1,)))
    assert main(["history", "--json"]) == 0
    streamed = capsys.readouterr().out
    import msgspec

    # What main's whole-array path wrote, the `by` mark of mcp's merge included.
    print_json([dict(msgspec.to_builtins(r), by="person") for r in list_runs(store)])
    assert streamed == capsys.readouterr().out
    assert json.loads(streamed)[0]["tier1_n"] == 200


def test_the_listing_reads_one_session_before_giving_its_first_run(
        store: Store, recorded: ModuleType) -> None:
    """Memory and time to the first line do not grow with the store: the first run is
    given after the same few statements whether the store holds 4 sessions or 40."""
    _fill(store, recorded, sessions=4)
    with _statements(store) as small:
        first_small = next(iter_runs(store))
    _fill(store, recorded, sessions=36)
    with _statements(store) as large:
        first_large = next(iter_runs(store))
    assert first_small.run_id != first_large.run_id  # the newest session is a later one
    assert len(large) == len(small) <= 12, large
    assert len(list(iter_runs(store))) == 40 * 3


def test_homes_loader_asks_only_for_what_it_shows(store: Store,
                                                  recorded: ModuleType) -> None:
    """Home's recent sessions and hosts: the same statements at 12 sessions and at 60,
    each bounded (a LIMIT, or one row per host)."""
    _fill(store, recorded, sessions=12, hosts=2)
    with _statements(store) as small:
        summarize_sessions(store, 10)
        home_hosts(store, None)
    _fill(store, recorded, sessions=48, hosts=2)
    with _statements(store) as large:
        recent = summarize_sessions(store, 10)
        hosts = home_hosts(store, None)
    assert len(large) == len(small), large
    assert any("LIMIT" in sql for sql in large)
    assert len(recent) == 10
    assert [s.row.started for s in recent] == sorted((s.row.started for s in recent),
                                                     reverse=True)
    newest = store.sessions()[:10]
    assert len(store.sessions()) == 60
    assert [s.row.id for s in recent] == [s.id for s in newest]
    # One host row per pod used, newest first, holding that pod's newest session.
    used = [h for h in hosts if not h.in_config and h.name != "local"]
    assert [h.name for h in used] == ["pod1", "pod0"]
    assert used[0].last_used == newest[0].started
    assert used[1].last_used == newest[1].started


def test_a_replay_is_not_a_hosts_last_use(store: Store, recorded: ModuleType) -> None:
    _fill(store, recorded, sessions=2, hosts=1)
    replay = store.open_session("pod0", "replay", None, None, started=recorded.T0 + 9000)
    store.ingest_many(replay, recorded.saxpy_run("20261130-replayed-run", t0=recorded.T0 + 9010,
                                                 tiers=(1,), workload="builtin:replayed"))
    (pod0,) = [h for h in home_hosts(store, None) if h.name == "pod0"]
    assert pod0.last_used == recorded.T0 + 1000  # the newest session that was not a replay
    assert last_workload(store, "pod0") == "builtin:saxpy"
    assert last_workload(store, "nowhere") is None


def test_sessions_limit_gives_the_newest_sessions(
        store: Store, recorded: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    _fill(store, recorded, sessions=4, runs=1)
    everyone = [s.id for s in store.sessions()]
    assert main(["sessions", "--json", "--limit", "2"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows] == everyone[:2]
    assert rows[0]["runs"] == 1 and rows[0]["cost_usd"] == pytest.approx(500 * 2.0 / 3600)
    assert main(["sessions", "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert everyone[0] in out and everyone[1] not in out
