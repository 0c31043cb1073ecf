"""The session store: ingest, idempotence, replay, derived rows, ids, schema, artifacts."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import msgspec
import pytest

from gpuws import locations, protocol
from gpuws.errors import StoreError, TransferError
from gpuws.sessions import store as store_mod
from gpuws.sessions.store import Store


def _session(store: Store, recorded: ModuleType, **kw: object) -> str:
    sid = store.open_session("pod", "local", None, 3.99, started=recorded.T0 - 10, **kw)
    assert store.ingest(sid, recorded.probe_line())
    return sid


# ----------------------------------------------------------------------------- locations
def test_locations_follow_the_environment_and_are_private(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWS_HOME", str(tmp_path / "a" / "b"))
    home = locations.gpuws_home()
    assert home == tmp_path / "a" / "b"
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
    assert locations.db_path() == home / "sessions.db"
    art = locations.artifacts_dir("s1", "run-7")
    assert art == home / "artifacts" / "s1" / "run-7" and art.is_dir()
    assert stat.S_IMODE(art.stat().st_mode) == 0o700
    for bad in ("..", "a/b", "", "x\x00"):
        with pytest.raises(StoreError):
            locations.artifacts_dir("s1", bad)

    monkeypatch.setenv("GPUWS_CONFIG", str(tmp_path / "c.toml"))
    assert locations.config_path() == tmp_path / "c.toml"
    monkeypatch.delenv("GPUWS_CONFIG")
    monkeypatch.delenv("GPUWS_HOME")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    assert locations.config_path() == tmp_path / "xdg-config" / "gpuws" / "config.toml"
    assert not (tmp_path / "xdg-config").exists()  # reading the path creates nothing
    assert locations.gpuws_home() == tmp_path / "xdg-data" / "gpuws"


# ----------------------------------------------------------------------------- ingest
def test_full_run_is_stored_with_derived_rows(store: Store, recorded: ModuleType) -> None:
    sid = _session(store, recorded)
    lines = recorded.saxpy_run("r1")
    assert store.ingest_many(sid, lines) == len(lines)

    run = store.run("r1")
    assert (run.status, run.exit_code, run.workload, run.session_id) == (
        "ok", 0, "builtin:saxpy", sid)
    assert run.spec is not None and run.spec.kernel_regex == "saxpy"
    assert run.started == recorded.T0 and run.wall_s == pytest.approx(16.26)

    tier1 = store.tier1("r1")
    assert tier1 is not None and tier1.stats.n == 200
    assert tier1.stats.median_ms == pytest.approx(0.240, rel=0.01)
    samples = store.samples("r1")
    assert len(samples) == 200 and samples == recorded.make_samples(200, 0.240, 1)

    (km,) = store.metrics("r1")
    assert (km.kernel, km.launch) == ("saxpy", 0)
    # The numbers of saxpy_raw.csv, as saxpy_human.txt shows them.
    assert km.metrics["duration_ns"] == 246_528
    assert km.metrics["l2_hit_pct"] == 33.64
    assert km.metrics["achieved_occupancy_pct"] == 74.29
    assert km.metrics["registers_per_thread"] == 16
    assert km.metrics["flops"] is None
    assert km.stalls[0] == protocol.Stall(reason="long_scoreboard", pct=81.28)

    rules = store.rules("r1")
    assert [r.rule for r in rules] == ["SOLBottleneck", "HighPipeUtilization", "CPIStall",
                                       "CPIStall", "CPIStall", "AchievedOccupancy"]
    assert [r.est_speedup_pct for r in rules if r.est_speedup_pct] == [93.53, 80.58, 25.62]

    (diag,) = store.diagnoses("r1")
    assert diag.code == "nsys_unusable" and "GPU idle gaps" in diag.unmeasured

    (art,) = store.artifacts("r1")
    assert art.status == "remote" and art.local_path is None
    assert art.sha256 == hashlib.sha256(recorded.REPORT_BYTES).hexdigest()

    phases = store.phases(sid)
    assert [(p.tier, p.phase) for p in phases] == [
        (1, "tier 1 (CUDA events)"), (2, "tier 2 (timeline)"), (3, "tier 3 (Nsight Compute)")]
    assert all(p.ended is not None and p.ended > p.started for p in phases)
    assert phases[0].gpu_s == pytest.approx(sum(samples) / 1000, abs=1e-6)

    probe = store.session(sid).probe
    assert probe is not None and probe.gpus[0].name == "NVIDIA H200"
    assert store.session(sid).run_count == 1


def test_resent_events_are_stored_once(store: Store, recorded: ModuleType) -> None:
    sid = _session(store, recorded)
    lines = recorded.saxpy_run("r1")
    assert store.ingest_many(sid, lines[:10]) == 10
    assert store.last_seq("r1") == 9
    # Attach(from_seq=...) overlapping what we have: only the missing part is new.
    assert store.ingest_many(sid, lines[5:]) == len(lines) - 10
    assert store.ingest_many(sid, lines) == 0
    assert not store.ingest(sid, lines[3])
    assert len(store.rules("r1")) == 6  # derived rows were not duplicated either
    assert len(store.phases(sid)) == 3
    assert [e.seq for e in store.events("r1")] == list(range(len(lines)))


def test_replay_is_the_exact_stream(store: Store, recorded: ModuleType) -> None:
    sid = _session(store, recorded)
    lines = recorded.saxpy_run("r1")
    store.ingest_many(sid, lines)
    replay = store.events("r1")
    assert [protocol.to_builtins(e) for e in replay] == [
        protocol.to_builtins(protocol.decode_event(line)) for line in lines]
    raw = sqlite3.connect(store.path).execute(
        "SELECT body FROM events WHERE run_id = 'r1' ORDER BY seq").fetchall()
    assert [r[0] for r in raw] == [line.rstrip(b"\n") for line in lines]
    kinds = store.run_events("r1", ["tier_started"])
    assert [e.tier for e in kinds if isinstance(e, protocol.TierStarted)] == [1, 2, 3]


def test_decoded_events_ingest_like_lines(store: Store, recorded: ModuleType) -> None:
    sid = _session(store, recorded)
    events = [protocol.decode_event(line) for line in recorded.saxpy_run("r1")]
    assert store.ingest_many(sid, events) == len(events)  # type: ignore[arg-type]
    assert store.run("r1").status == "ok"
    assert len(store.samples("r1")) == 200
    assert store.ingest_many(sid, events) == 0  # type: ignore[arg-type]


def test_last_seq_stops_at_the_first_gap(store: Store, recorded: ModuleType) -> None:
    sid = _session(store, recorded)
    lines = recorded.saxpy_run("r1")
    assert store.last_seq("r1") == -1
    store.ingest_many(sid, lines[:4] + lines[7:12])
    assert store.last_seq("r1") == 3  # re-attach from 4 gets 4..6 back
    store.ingest_many(sid, lines[4:])
    assert store.last_seq("r1") == len(lines) - 1


def test_session_events_and_bad_lines(store: Store, recorded: ModuleType) -> None:
    sid = _session(store, recorded)
    telemetry = {"type": "telemetry", "ts": 1.0, "gpus": [{"index": 0, "util_pct": 97.0}]}
    assert not store.ingest(sid, json.dumps(telemetry).encode())
    assert not store.ingest(sid, b'{"type": "samples", "run_id": "r1", "seq": 0}')  # no values
    assert not store.ingest(sid, b"not json at all")
    blocked = {"type": "diagnosis", "ts": 2.0, "code": "counters_blocked",
               "severity": "error", "title": "GPU counters are blocked",
               "cause": "RmProfilingAdminOnly: 1 and no CAP_SYS_ADMIN",
               "unmeasured": ["ncu metrics"]}
    assert store.ingest(sid, json.dumps(blocked).encode())
    (d,) = store.session_diagnoses(sid)
    assert d.code == "counters_blocked" and d.run_id is None
    assert store.last_seq("r1") == -1
    assert store.runs(sid) == []


def test_unknown_session_rolls_back_the_batch(store: Store, recorded: ModuleType) -> None:
    with pytest.raises(StoreError, match="no session 'nope'"):
        store.ingest_many("nope", recorded.saxpy_run("r1"))
    with pytest.raises(StoreError, match="'nope'"):
        store.session("nope")
    with pytest.raises(StoreError, match="'r404'"):
        store.run("r404")
    with pytest.raises(StoreError, match="no session"):
        store.end_session("nope")
    sid = _session(store, recorded)
    assert store.ingest_many(sid, recorded.saxpy_run("r1")) > 0  # the cache was not poisoned


def test_ids_resolve_by_unique_prefix(store: Store, recorded: ModuleType) -> None:
    sid = _session(store, recorded)
    store.ingest_many(sid, recorded.saxpy_run("abc-1"))
    store.ingest_many(sid, recorded.saxpy_run("abc-2", t0=recorded.T0 + 60))
    store.ingest_many(sid, recorded.saxpy_run("a_%", t0=recorded.T0 + 120))
    assert store.run("abc-2").run_id == "abc-2"
    assert store.run("a_").run_id == "a_%"  # '_' and '%' are not wildcards
    with pytest.raises(StoreError, match="ambiguous: abc-1, abc-2"):
        store.run("abc")
    with pytest.raises(StoreError):
        store.run("")
    assert store.session(sid[:4]).id == sid
    assert [r.run_id for r in store.runs(sid[:6])] == ["abc-1", "abc-2", "a_%"]
    other = store.open_session("pod2", "sftp", None, None)
    assert [s.id for s in store.sessions()] == [other, sid]  # newest first


def test_baseline_links_later_runs_of_the_workload(store: Store, recorded: ModuleType) -> None:
    sid = _session(store, recorded)
    store.ingest_many(sid, recorded.saxpy_run("base"))
    store.set_baseline("base")
    store.ingest_many(sid, recorded.saxpy_run("new", t0=recorded.T0 + 60))
    store.ingest_many(sid, recorded.saxpy_run("other", t0=recorded.T0 + 120,
                                              workload="builtin:copy"))
    assert store.run("base").is_baseline
    assert store.run("new").baseline_of == "base"
    assert store.run("other").baseline_of is None
    assert store.run("base").baseline_of is None
    store.set_baseline_of("other", "new")
    assert store.run("other").baseline_of == "new"
    with pytest.raises(StoreError, match="own baseline"):
        store.set_baseline_of("new", "new")
    store.set_baseline("base", on=False)
    assert not store.run("base").is_baseline


# ----------------------------------------------------------------------------- schema
def test_newer_schema_is_refused_and_left_unchanged(tmp_path: Path,
                                                    recorded: ModuleType) -> None:
    path = tmp_path / "s.db"
    with Store(path) as s:
        sid = s.open_session("pod", "local", None, 1.0)
        s.ingest_many(sid, recorded.saxpy_run("r1"))
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {store_mod.SCHEMA_VERSION + 1}")
    conn.execute("PRAGMA journal_mode=DELETE")  # fold the WAL in: the file is the whole db
    conn.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="newer than this gpuws") as info:
        Store(path)
    assert "upgrade gpuws" in info.value.remedy
    assert path.read_bytes() == before
    assert not (tmp_path / "s.db-wal").exists()


def test_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a usable gpuws store"):
        Store(path)
    assert path.read_bytes() == b"this is not sqlite" * 100


def test_a_new_migration_keeps_old_data(tmp_path: Path, recorded: ModuleType,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.db"
    with Store(path) as s:
        sid = s.open_session("pod", "local", None, 1.0)
        s.ingest_many(sid, recorded.saxpy_run("r1"))
        assert s._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    def migration_2(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE runs ADD COLUMN note TEXT NOT NULL DEFAULT ''")

    newer = store_mod.SCHEMA_VERSION + 1
    monkeypatch.setattr(store_mod, "_MIGRATIONS", [*store_mod._MIGRATIONS, migration_2])
    monkeypatch.setattr(store_mod, "SCHEMA_VERSION", newer)
    with Store(path) as s:
        assert s._conn.execute("PRAGMA user_version").fetchone()[0] == newer
        assert s._conn.execute("SELECT note FROM runs").fetchall() == [("",)]
        assert s.run("r1").status == "ok" and len(s.samples("r1")) == 200


# ----------------------------------------------------------------------------- artifacts
def test_artifact_pull_is_checked_against_the_pods_sha256(
        store: Store, recorded: ModuleType, tmp_path: Path) -> None:
    sid = _session(store, recorded)
    store.ingest_many(sid, recorded.saxpy_run("r1"))
    good = tmp_path / "saxpy.ncu-rep"
    good.write_bytes(recorded.REPORT_BYTES)
    bad = tmp_path / "bad.ncu-rep"
    bad.write_bytes(recorded.REPORT_BYTES[:-1] + b"X")  # same size, one byte differs

    with pytest.raises(TransferError, match="sha256"):
        store.mark_pulled("r1", "saxpy.ncu-rep", bad)
    (art,) = store.artifacts("r1")
    assert art.status == "sha256_mismatch" and art.local_path is None and art.pulled_at is None
    with pytest.raises(TransferError, match="cannot read"):
        store.mark_pulled("r1", "saxpy.ncu-rep", tmp_path / "missing")
    with pytest.raises(StoreError, match="no artifact"):
        store.mark_pulled("r1", "other.ncu-rep", good)

    store.mark_pulled("r1", "saxpy.ncu-rep", good, pulled_at=123.0)
    (art,) = store.artifacts("r1")
    assert (art.status, art.local_path, art.pulled_at) == ("pulled", str(good), 123.0)

    # The same file announced again keeps its pulled copy; a changed one must be pulled again.
    store.record_artifact("r1", "saxpy.ncu-rep", art.remote_path, art.size, art.sha256)
    assert store.artifacts("r1")[0].status == "pulled"
    store.record_artifact("r1", "saxpy.ncu-rep", art.remote_path, art.size, "0" * 64)
    assert store.artifacts("r1")[0].status == "remote"
    assert store.artifacts("r1")[0].local_path is None
    with pytest.raises(StoreError, match="no run"):
        store.record_artifact("r404", "x", "/x", 1, "0" * 64)


def test_rows_are_structs(store: Store, recorded: ModuleType) -> None:
    sid = _session(store, recorded)
    store.ingest_many(sid, recorded.saxpy_run("r1"))
    for row in (store.session(sid), store.run("r1"), *store.metrics("r1"),
                *store.artifacts("r1"), *store.phases(sid)):
        assert isinstance(row, msgspec.Struct)
        msgspec.json.encode(row)  # and plain data all the way down


def test_session_modules_never_import_textual() -> None:
    # The headless commands (export, sessions, compare in CI) must not pay for the TUI.
    code = ("import sys, gpuws.locations, gpuws.config, gpuws.sessions.store, "
            "gpuws.sessions.cost, gpuws.sessions.compare, gpuws.sessions.export; "
            "sys.exit('textual' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
