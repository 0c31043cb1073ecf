"""The session store: every session, run and run event, in one SQLite file.

The ``events`` table is the record: each run event exactly as it came off the wire,
keyed by ``(run_id, seq)`` so a resent event (after ``Attach(from_seq)``) is stored once.
The other run tables (``runs``, ``metrics``, ``rules``, ``diagnoses``, ``artifacts``,
``phases``) are projections of those events for queries, written in the same
transaction as the events they come from, so they can never disagree with them.

Schema changes are migrations: ``_MIGRATIONS[i]`` takes the schema from version ``i`` to
``i + 1`` and keeps the data. A store written by a newer gpuws is refused untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sqlite3
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, get_args

import msgspec

from gpuws import protocol
from gpuws.errors import StoreError, TransferError, UsageError
from gpuws.live.boundary import REFUSAL_MARK
from gpuws.locations import db_path, ensure_private_dir
from gpuws.workspace.code import CodeRecord

#: Anything ``ingest`` takes: a decoded event, or the raw JSON line it came from (stored
#: byte for byte, which is cheaper than re-encoding and keeps the record exact).
Ingestible = protocol.Event | bytes


class SessionRow(msgspec.Struct, frozen=True, kw_only=True):
    """One session: a connection-lifetime on one pod."""

    id: str
    host: str
    transport: str
    probe: protocol.Probe | None
    rate_usd_per_hour: float | None
    budget_usd: float | None
    started: float
    ended: float | None
    run_count: int = 0


class RunRow(msgspec.Struct, frozen=True, kw_only=True):
    """One run. ``baseline_of`` names the baseline run this run is compared with."""

    run_id: str
    session_id: str
    workload: str
    spec: protocol.RunSpec | None
    status: str
    started: float | None
    finished: float | None
    wall_s: float | None
    exit_code: int | None
    is_baseline: bool
    baseline_of: str | None


class KernelMetricsRow(msgspec.Struct, frozen=True, kw_only=True):
    """Canonical metrics of one profiled launch, as stored (``None`` = not measured)."""

    kernel: str
    launch: int
    metrics: dict[str, float | None]
    stalls: list[protocol.Stall]


class ArtifactRow(msgspec.Struct, frozen=True, kw_only=True):
    """A file a run produced on the pod; ``status`` is ``remote``, ``pulled`` or
    ``sha256_mismatch`` (a copy arrived whose hash differs from the pod's)."""

    run_id: str
    name: str
    remote_path: str
    size: int
    sha256: str
    local_path: str | None
    pulled_at: float | None
    status: str


class FleetPodRow(msgspec.Struct, frozen=True, kw_only=True):
    """One pod of a fleet.

    ``status`` is ``pending`` (not connected yet), ``connected``, ``running``, ``ok``,
    ``failed`` (the run failed or its artifacts could not be pulled), ``unreachable``
    (connecting failed), ``lost`` (the link dropped and reconnecting gave up; the run
    goes on on the pod) or ``interrupted`` (the laptop stopped following it). ``error``
    says why, in one line with its remedy, when the pod gave no result.
    """

    position: int
    pod: str
    session_id: str | None
    run_id: str | None
    status: str
    error: str


class FleetRow(msgspec.Struct, frozen=True, kw_only=True):
    """A fleet: one workload started on several pods at once, each its own session."""

    id: str
    workload: str
    spec: protocol.RunSpec | None
    started: float
    ended: float | None
    pods: list[FleetPodRow]


class PhaseRow(msgspec.Struct, frozen=True, kw_only=True):
    """A stretch of session time spent on something (a tier, a transfer, provisioning).

    ``ended`` is ``None`` while the phase is still going (or if it never reported its end).
    """

    id: int
    session_id: str
    run_id: str | None
    phase: str
    tier: int | None
    started: float
    ended: float | None
    gpu_s: float | None


class HostActionRow(msgspec.Struct, frozen=True, kw_only=True):
    """A start or stop gpuws performed on a host (issue 22), outside any session: what the
    provider bills runs from a start to a stop, whoever was connected.

    ``ok`` says whether it had its effect (a start the host answered after, a stop it
    stopped answering after); ``detail`` is the failure's line otherwise, or how a stop
    gpuws did not perform was learnt.

    ``by`` says who acted: ``gpuws`` (``gpuws start/stop``, ``--start``, a budget), ``lease``
    (the pod's lease stopped it; the times are its log's, on the laptop's clock), or
    ``estimated`` (the host no longer answered after its lease's deadline and the log was
    not read back: ``started`` is the earliest the lease could fire, ``ended`` when the
    host was found not answering).
    """

    id: int
    host: str
    action: str
    started: float
    ended: float
    ok: bool
    detail: str
    by: str = "gpuws"


class PodLeaseRow(msgspec.Struct, frozen=True, kw_only=True):
    """A pod's lease as the laptop last saw it armed: stops after ``idle_s`` with nobody
    there, counted from ``last_contact`` (the laptop's last known contact) at the
    earliest."""

    host: str
    idle_s: float
    last_contact: float


# ----------------------------------------------------------------------------- schema
def _migration_1(conn: sqlite3.Connection) -> None:
    statements = [
        """CREATE TABLE sessions(
            id TEXT PRIMARY KEY,
            host TEXT NOT NULL,
            transport TEXT NOT NULL,
            probe_json TEXT,
            rate_usd_per_hour REAL,
            budget_usd REAL,
            started REAL NOT NULL,
            ended REAL)""",
        """CREATE TABLE runs(
            run_id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(id),
            workload TEXT NOT NULL DEFAULT '',
            spec_json TEXT,
            status TEXT NOT NULL,
            started REAL,
            finished REAL,
            wall_s REAL,
            exit_code INTEGER,
            is_baseline INTEGER NOT NULL DEFAULT 0,
            baseline_of TEXT)""",
        "CREATE INDEX runs_by_session ON runs(session_id, started)",
        "CREATE INDEX runs_by_workload ON runs(workload, is_baseline)",
        # Not WITHOUT ROWID: bodies (sample batches) can be KBs, which rowid tables store better.
        # No foreign key here: the hot path checks the run once per run instead of per event.
        """CREATE TABLE events(
            run_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            type TEXT NOT NULL,
            ts REAL NOT NULL,
            body BLOB NOT NULL,
            PRIMARY KEY(run_id, seq))""",
        """CREATE TABLE metrics(
            run_id TEXT NOT NULL REFERENCES runs(run_id),
            kernel TEXT NOT NULL,
            launch INTEGER NOT NULL,
            key TEXT NOT NULL,
            value REAL,
            PRIMARY KEY(run_id, kernel, launch, key))""",
        """CREATE TABLE rules(
            run_id TEXT NOT NULL REFERENCES runs(run_id),
            seq INTEGER NOT NULL,
            idx INTEGER NOT NULL,
            kernel TEXT NOT NULL,
            rule TEXT NOT NULL,
            kind TEXT NOT NULL,
            message TEXT NOT NULL,
            est_speedup_pct REAL,
            speedup_type TEXT,
            PRIMARY KEY(run_id, seq, idx))""",
        # run_id is NULL for a diagnosis about the session (e.g. counters blocked at probe).
        """CREATE TABLE diagnoses(
            session_id TEXT NOT NULL REFERENCES sessions(id),
            run_id TEXT REFERENCES runs(run_id),
            seq INTEGER,
            ts REAL NOT NULL,
            code TEXT NOT NULL,
            severity TEXT NOT NULL,
            title TEXT NOT NULL,
            cause TEXT NOT NULL,
            meaning TEXT NOT NULL,
            remedies_json TEXT NOT NULL,
            unmeasured_json TEXT NOT NULL,
            details_json TEXT NOT NULL)""",
        "CREATE INDEX diagnoses_by_run ON diagnoses(run_id, seq)",
        "CREATE INDEX diagnoses_by_session ON diagnoses(session_id)",
        """CREATE TABLE artifacts(
            run_id TEXT NOT NULL REFERENCES runs(run_id),
            name TEXT NOT NULL,
            remote_path TEXT NOT NULL,
            size INTEGER NOT NULL,
            sha256 TEXT NOT NULL,
            local_path TEXT,
            pulled_at REAL,
            status TEXT NOT NULL,
            PRIMARY KEY(run_id, name))""",
        """CREATE TABLE phases(
            id INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(id),
            run_id TEXT,
            phase TEXT NOT NULL,
            tier INTEGER,
            started REAL NOT NULL,
            ended REAL,
            gpu_s REAL)""",
        "CREATE INDEX phases_by_session ON phases(session_id, started)",
        "CREATE INDEX phases_by_run ON phases(run_id, tier)",
    ]
    for statement in statements:
        conn.execute(statement)


def _migration_2(conn: sqlite3.Connection) -> None:
    """Fleets: one workload run on several pods at once (``gpuws run POD POD ... -w W``).

    Each pod of a fleet is its own session as usual; ``fleet_pods`` only says which
    session and run stand at which position (position 0 is the reference the others are
    compared with), and, for a pod that gave no result, why.
    """
    statements = [
        """CREATE TABLE fleets(
            id TEXT PRIMARY KEY,
            workload TEXT NOT NULL,
            spec_json TEXT NOT NULL,
            started REAL NOT NULL,
            ended REAL)""",
        # No foreign key on run_id: the run's row appears with its first stored event,
        # which may be after the pod's answer to start_run.
        """CREATE TABLE fleet_pods(
            fleet_id TEXT NOT NULL REFERENCES fleets(id),
            position INTEGER NOT NULL,
            pod TEXT NOT NULL,
            session_id TEXT REFERENCES sessions(id),
            run_id TEXT,
            status TEXT NOT NULL,
            error TEXT NOT NULL DEFAULT '',
            PRIMARY KEY(fleet_id, position))""",
        "CREATE INDEX fleet_pods_by_session ON fleet_pods(session_id)",
    ]
    for statement in statements:
        conn.execute(statement)


def _migration_3(conn: sqlite3.Connection) -> None:
    """Workspaces: the code each run measured, as the laptop knew it when it started the
    run (never what the pod says), and the manifests, so two runs' trees can be diffed.
    A manifest is zlib-compressed JSON of its ``WsEntry`` list, stored once per tree."""
    statements = [
        """CREATE TABLE manifests(
            tree_sha TEXT PRIMARY KEY,
            entries BLOB NOT NULL)""",
        # No foreign key on run_id: the run's row appears with its first stored event,
        # after this is recorded.
        """CREATE TABLE run_code(
            run_id TEXT PRIMARY KEY,
            directory TEXT NOT NULL,
            name TEXT NOT NULL,
            tree_sha TEXT NOT NULL,
            files INTEGER NOT NULL,
            total_bytes INTEGER NOT NULL,
            git_commit TEXT,
            git_dirty INTEGER,
            git_changed_json TEXT NOT NULL)""",
    ]
    for statement in statements:
        conn.execute(statement)


def _migration_4(conn: sqlite3.Connection) -> None:
    """The lease: the starts and stops gpuws performed per host, so billed time (start to
    stop) can be shown beside connected time. Not tied to a session: a pod is started
    before any session on it and may be stopped after the last."""
    conn.execute("""CREATE TABLE host_actions(
        id INTEGER PRIMARY KEY,
        host TEXT NOT NULL,
        action TEXT NOT NULL CHECK (action IN ('start', 'stop')),
        started REAL NOT NULL,
        ended REAL NOT NULL,
        ok INTEGER NOT NULL,
        detail TEXT NOT NULL)""")
    conn.execute("CREATE INDEX host_actions_by_host ON host_actions(host, started)")


def _migration_5(conn: sqlite3.Connection) -> None:
    """Stops gpuws did not perform but learnt of (issue 22, point 4): who acted (the rows
    before it are gpuws's own), and the pod's lease as last seen armed, for the stop a
    host's silence implies."""
    conn.execute("ALTER TABLE host_actions ADD COLUMN by TEXT NOT NULL DEFAULT 'gpuws'"
                 " CHECK (by IN ('gpuws', 'lease', 'estimated'))")
    conn.execute("""CREATE TABLE pod_leases(
        host TEXT PRIMARY KEY,
        idle_s REAL NOT NULL,
        last_contact REAL NOT NULL)""")


def _migration_6(conn: sqlite3.Connection) -> None:
    """History at any size (issue 36): the listings and Home take the newest sessions,
    runs, and each host's newest session, which sorted or scanned the whole table on
    every call without these (``IF NOT
    EXISTS``: a store that already has one, made by hand, is migrated all the same)."""
    conn.execute("CREATE INDEX IF NOT EXISTS sessions_by_started ON sessions(started)")
    conn.execute("CREATE INDEX IF NOT EXISTS sessions_by_host ON sessions(host, started)")
    conn.execute("CREATE INDEX IF NOT EXISTS runs_by_started ON runs(started)")


#: Ordered migrations; version N is reached by running the first N. Add one by appending.
_MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_migration_1, _migration_2,
                                                           _migration_3, _migration_4,
                                                           _migration_5, _migration_6]
SCHEMA_VERSION = len(_MIGRATIONS)
#: Two stops of one host this close are one: the pod's log read back twice, converted to the
#: laptop's clock by two slightly different offsets (the request's round trip).
LEASE_STOP_SLACK_S = 5.0

_TAGS: dict[type, str] = {cls: str(cls.__struct_config__.tag) for cls in get_args(protocol.Events)}
_samples_decoder = msgspec.json.Decoder(protocol.Samples)
_probe_decoder = msgspec.json.Decoder(protocol.Probe)
_spec_decoder = msgspec.json.Decoder(protocol.RunSpec)
_manifest_decoder = msgspec.json.Decoder(list[protocol.WsEntry])
_encoder = msgspec.json.Encoder()
_STALL = "stall:"


class Store:
    """The session store.

    Args:
        path: the SQLite file; defaults to :func:`gpuws.locations.db_path`.

    Raises:
        StoreError: the file is not a gpuws store, cannot be opened, or was written by a
            newer gpuws (it is then left exactly as it was).
    """

    def __init__(self, path: Path | None = None) -> None:
        if path is None:
            path = db_path()
        else:
            ensure_private_dir(path.parent)
        self.path = path
        self._known_runs: set[str] = set()
        try:
            # The store holds hostnames, commands and results: create it 0600 ourselves
            # (sqlite would follow the umask), and SQLite gives its -wal/-shm the same mode.
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            pass  # an existing store is opened as it is
        except OSError as exc:
            raise StoreError(f"cannot open {path}: {exc.strerror or exc}",
                             remedy="set GPUWS_HOME to a writable directory") from exc
        try:
            # isolation_level=None: we issue BEGIN/COMMIT ourselves, so a batch is exactly
            # one transaction and nothing is committed behind our back.
            self._conn = sqlite3.connect(str(path), isolation_level=None, timeout=10.0)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open {path}: {exc}") from exc
        try:
            self._open()
        except BaseException:
            self._conn.close()
            raise

    def _open(self) -> None:
        conn = self._conn
        try:
            # Read the version before anything that writes (journal_mode=WAL rewrites the
            # header): a store from a newer gpuws must stay byte-identical.
            self._refuse_newer(self._user_version())
            conn.execute("PRAGMA journal_mode=WAL")
            # WAL + synchronous=NORMAL: a commit is atomic and survives the process being
            # killed (the WAL is in the OS page cache once write() returns); only a power
            # loss or OS crash can drop the last few commits, and even that never corrupts.
            # FULL would fsync every batch and halve the ingest rate for no gain on a laptop.
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path} is not a usable gpuws store: {exc}",
                             remedy="move it aside (gpuws starts a new one) or set GPUWS_HOME"
                             ) from exc

    def _user_version(self) -> int:
        row = self._conn.execute("PRAGMA user_version").fetchone()
        return int(row[0])

    def _refuse_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has schema version {version}, newer than this gpuws understands "
                f"({SCHEMA_VERSION}); it was left unchanged",
                remedy="upgrade gpuws, or set GPUWS_HOME to use a separate store",
            )

    def _migrate(self) -> None:
        if self._user_version() == SCHEMA_VERSION:
            return
        with self._transaction():
            # Re-read under the write lock: another gpuws may have migrated meanwhile.
            version = self._user_version()
            self._refuse_newer(version)
            for number in range(version + 1, SCHEMA_VERSION + 1):
                _MIGRATIONS[number - 1](self._conn)
                self._conn.execute(f"PRAGMA user_version = {number}")

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Cursor]:
        cur = self._conn.cursor()
        # IMMEDIATE takes the write lock up front, so a concurrent writer waits at BEGIN
        # instead of failing half-way through a batch.
        cur.execute("BEGIN IMMEDIATE")
        try:
            yield cur
        except BaseException:
            if self._conn.in_transaction:
                cur.execute("ROLLBACK")
            self._known_runs.clear()  # runs inserted by the failed batch are gone again
            raise
        else:
            cur.execute("COMMIT")

    def close(self) -> None:
        """Close the database (idempotent)."""
        self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------- sessions
    def open_session(self, host: str, transport: str, probe: protocol.Probe | None,
                     rate_usd_per_hour: float | None, budget_usd: float | None = None,
                     started: float | None = None) -> str:
        """Start a session and return its id.

        Args:
            host: what the person typed (ssh alias or ``user@host[:port]``).
            transport: how the pod is reached (``sftp``, ``exec``, ``pty``, ``local``).
            probe: the pod's probe, if already known (see :meth:`set_probe`).
            rate_usd_per_hour: the pod's price, ``None`` if unknown.
            budget_usd: warn when the session's cost reaches this.
            started: the start time (unix seconds); now if omitted.
        """
        session_id = secrets.token_hex(6)
        with self._transaction() as cur:
            cur.execute(
                "INSERT INTO sessions(id, host, transport, probe_json, rate_usd_per_hour,"
                " budget_usd, started) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (session_id, host, transport, _json(probe) if probe is not None else None,
                 rate_usd_per_hour, budget_usd, time.time() if started is None else started),
            )
        return session_id

    def set_probe(self, session_id: str, probe: protocol.Probe) -> None:
        """Record (or replace) the pod's probe for a session."""
        with self._transaction() as cur:
            cur.execute("UPDATE sessions SET probe_json = ? WHERE id = ?",
                        (_json(probe), self._require_session(cur, session_id)))

    def end_session(self, session_id: str, ended: float | None = None) -> None:
        """Mark the session disconnected (its connected time, and cost, stop here)."""
        with self._transaction() as cur:
            cur.execute("UPDATE sessions SET ended = ? WHERE id = ?",
                        (time.time() if ended is None else ended,
                         self._require_session(cur, session_id)))

    def discard_if_empty(self, session_id: str) -> bool:
        """Remove a session that holds no run (a connection that did nothing, such as an
        attach to an id the pod does not have), so it does not clutter the listings.

        Returns:
            Whether the session was removed.
        """
        with self._transaction() as cur:
            if cur.execute("SELECT 1 FROM runs WHERE session_id = ? LIMIT 1",
                           (session_id,)).fetchone() is not None:
                return False
            if cur.execute("SELECT 1 FROM fleet_pods WHERE session_id = ? LIMIT 1",
                           (session_id,)).fetchone() is not None:
                return False
            cur.execute("DELETE FROM phases WHERE session_id = ?", (session_id,))
            cur.execute("DELETE FROM diagnoses WHERE session_id = ?", (session_id,))
            return cur.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount > 0

    def open_sessions(self) -> list[str]:
        """Ids of the sessions not ended yet (live, or left open by a killed process)."""
        return [str(r[0]) for r in self._conn.execute(
            "SELECT id FROM sessions WHERE ended IS NULL ORDER BY started")]

    def last_activity(self, session_id: str) -> float:
        """When the session last did anything: its newest event or phase, else its start."""
        row = self._conn.execute(
            "SELECT MAX(t) FROM (SELECT started AS t FROM sessions WHERE id = ?"
            " UNION ALL SELECT MAX(e.ts) FROM events e JOIN runs r ON r.run_id = e.run_id"
            "  WHERE r.session_id = ?"
            " UNION ALL SELECT MAX(COALESCE(ended, started)) FROM phases WHERE session_id = ?)",
            (session_id, session_id, session_id)).fetchone()
        return float(row[0])

    def sessions(self) -> list[SessionRow]:
        """Every session, newest first."""
        rows = self._conn.execute(_SESSION_SELECT + " ORDER BY s.started DESC").fetchall()
        return [_session_row(row) for row in rows]

    def session_spans(self, host: str) -> list[tuple[float, float | None]]:
        """When gpuws was connected to ``host``: each session's (started, ended), oldest
        first (``ended`` None: not ended yet). The lease's stops are checked against it."""
        return [(float(a), None if b is None else float(b)) for a, b in self._conn.execute(
            "SELECT started, ended FROM sessions WHERE host = ? ORDER BY started", (host,))]

    def session(self, id_or_prefix: str) -> SessionRow:
        """One session by id or unique id prefix.

        Raises:
            StoreError: no session (or more than one) matches.
        """
        session_id = self._resolve("sessions", "id", "session", id_or_prefix)
        row = self._conn.execute(_SESSION_SELECT + " WHERE s.id = ?", (session_id,)).fetchone()
        return _session_row(row)

    # ------------------------------------------------------------------------- ingest
    def newest_sessions(self, limit: int | None = None) -> Iterator[SessionRow]:
        """Sessions newest first, at most ``limit``, decoded one at a time as they are taken.

        The listings stream from this: memory stays that of one session whatever the
        store's size, and the first one arrives before the last is read.
        """
        # Walked down the index on `started`: SQLite neither sorts the sessions nor counts
        # the runs of any it does not give (Home's ten took 9 ms at 20,000 runs, 1 ms at
        # 2,000, when it counted them all before sorting and cutting).
        cur = self._conn.execute(_SESSION_SELECT + " ORDER BY s.started DESC, s.rowid DESC"
                                 " LIMIT ?", (-1 if limit is None else limit,))
        for row in cur:
            yield _session_row(row)

    def last_session_per_host(self) -> list[SessionRow]:
        """Each host's newest session that was not a replay, newest first.

        Home's hosts list, read in time flat in the store's size: the hosts are walked
        one index step each (``MIN(host) WHERE host > ?``, a loose index scan), and each
        host's newest session is the top of its part of ``sessions_by_host``. (A window
        function over every session took 1 ms at 2,000 runs, 7 ms at 20,000.)
        """
        rows = self._conn.execute(
            "WITH RECURSIVE hosts(host) AS ("
            "  SELECT MIN(host) FROM sessions"
            "  UNION ALL SELECT (SELECT MIN(host) FROM sessions WHERE host > hosts.host)"
            "   FROM hosts WHERE hosts.host IS NOT NULL)"
            " SELECT s.id, s.host, s.transport, s.probe_json, s.rate_usd_per_hour,"
            " s.budget_usd, s.started, s.ended,"
            " (SELECT COUNT(*) FROM runs r WHERE r.session_id = s.id)"
            " FROM hosts JOIN sessions s ON s.rowid = ("
            "  SELECT rowid FROM sessions WHERE host = hosts.host AND transport != 'replay'"
            "  ORDER BY started DESC, rowid DESC LIMIT 1)"
            " ORDER BY s.started DESC").fetchall()
        return [_session_row(row) for row in rows]

    def ingest(self, session_id: str, event: Ingestible) -> bool:
        """Store one event (see :meth:`ingest_many`). Returns True if it was new."""
        return self.ingest_many(session_id, (event,)) == 1

    def ingest_many(self, session_id: str, events: Iterable[Ingestible],
                    conflicts: list[tuple[str, int]] | None = None) -> int:
        """Store a batch of events in one transaction (committed when this returns).

        Run events (``run_id`` and ``seq`` set, a type in ``protocol.RUN_EVENT_TYPES``) go
        into ``events`` once each, and update the derived tables. A ``probe_result``
        sets the session's probe; a diagnosis without a run is kept for the session.
        Other events (telemetry, pongs, …) are not stored. A raw line that does not
        decode is not stored either: the transport reports bad lines where it frames them.

        A repeat of a stored ``(run_id, seq)`` with the same body is a resend (after an
        attach) and is ignored; with a different body it is a forgery or a corrupt log,
        also not stored, and named in ``conflicts`` when a list is given.

        Returns:
            How many events were recorded that had not been before.

        Raises:
            StoreError: the session does not exist; nothing of the batch is kept.
        """
        new = 0
        with self._transaction() as cur:
            self._require_session(cur, session_id)
            for item in events:
                if self._ingest_one(cur, session_id, item, conflicts):
                    new += 1
        return new

    def _ingest_one(self, cur: sqlite3.Cursor, session_id: str, item: Ingestible,
                    conflicts: list[tuple[str, int]] | None = None) -> bool:
        if isinstance(item, bytes):
            body = item.rstrip(b"\r\n")
            decoded = protocol.decode_event(body)
            if isinstance(decoded, protocol.BadLine):
                return False
            event: protocol.Event = decoded
        else:
            event = item
            body = _encoder.encode(event)
        tag = _TAGS[type(event)]
        run_id, seq = event.run_id, event.seq
        if run_id is None or seq is None or tag not in protocol.RUN_EVENT_TYPES:
            return self._ingest_session_event(cur, session_id, event)
        cur.execute("INSERT OR IGNORE INTO events(run_id, seq, type, ts, body)"
                    " VALUES (?, ?, ?, ?, ?)", (run_id, seq, tag, event.ts, body))
        if cur.rowcount != 1:
            # Already stored: a resend after Attach, unless the body differs.
            row = cur.execute("SELECT type, body FROM events WHERE run_id = ? AND seq = ?",
                              (run_id, seq)).fetchone()
            if row is None or bytes(row[1]) == body:
                return False
            if (row[0] == "log" and REFUSAL_MARK in bytes(row[1])
                    and REFUSAL_MARK not in body):
                # The stored one only stands in for a refused forgery that claimed this
                # seq first; the event the pod really numbered so takes its place.
                cur.execute("UPDATE events SET type = ?, ts = ?, body = ? WHERE run_id = ?"
                            " AND seq = ?", (tag, event.ts, body, run_id, seq))
            else:
                if conflicts is not None:
                    conflicts.append((run_id, seq))
                return False
        if run_id not in self._known_runs:
            cur.execute("INSERT OR IGNORE INTO runs(run_id, session_id, status, started)"
                        " VALUES (?, ?, 'running', ?)", (run_id, session_id, event.ts))
            self._known_runs.add(run_id)
        derive = _DERIVE.get(tag)
        if derive is not None:
            derive(cur, session_id, run_id, event)
        return True

    def _ingest_session_event(self, cur: sqlite3.Cursor, session_id: str,
                              event: protocol.Event) -> bool:
        if isinstance(event, protocol.ProbeResult):
            cur.execute("UPDATE sessions SET probe_json = ? WHERE id = ?",
                        (_json(event.probe), session_id))
            return True
        if isinstance(event, protocol.Diagnosis) and event.run_id is None:
            _insert_diagnosis(cur, session_id, None, event)
            return True
        return False

    def last_seq(self, run_id: str) -> int:
        """The last ``seq`` stored without a gap before it, or -1 if none.

        Resume with ``Attach(from_seq=last_seq + 1)``: if a gap ever appeared, the
        events after it are asked for again (and their duplicates are ignored).
        """
        low, high, count = self._conn.execute(
            "SELECT MIN(seq), MAX(seq), COUNT(*) FROM events WHERE run_id = ?", (run_id,)
        ).fetchone()
        if count == 0:
            return -1
        if high - low + 1 == count:
            return int(high)
        row = self._conn.execute(
            "SELECT MIN(e.seq) FROM events e WHERE e.run_id = ? AND NOT EXISTS"
            " (SELECT 1 FROM events n WHERE n.run_id = e.run_id AND n.seq = e.seq + 1)",
            (run_id,),
        ).fetchone()
        return int(row[0])

    # ------------------------------------------------------------------------- replay
    def events(self, run_id: str) -> list[protocol.Events]:
        """Every stored event of a run, in ``seq`` order, decoded."""
        rows = self._conn.execute("SELECT body FROM events WHERE run_id = ? ORDER BY seq",
                                  (run_id,))
        return [_decode(body) for (body,) in rows]

    def run_events(self, run_id: str, types: Iterable[str]) -> list[protocol.Events]:
        """A run's events of the given types (``protocol`` tags), in ``seq`` order."""
        wanted = sorted(set(types))
        marks = ",".join("?" * len(wanted))
        rows = self._conn.execute(
            f"SELECT body FROM events WHERE run_id = ? AND type IN ({marks}) ORDER BY seq",
            (run_id, *wanted))
        return [_decode(body) for (body,) in rows]

    def samples(self, run_id: str) -> list[float]:
        """Every Tier-1 sample of a run (milliseconds per call), in arrival order: those of
        the figure the run reports (CUPTI's where a short call was timed again from its
        records, which replace the CUDA-event samples; see ``protocol.Samples.source``)."""
        events: list[float] = []
        device: list[float] = []
        rows = self._conn.execute(
            "SELECT body FROM events WHERE run_id = ? AND type = 'samples' ORDER BY seq",
            (run_id,))
        for (body,) in rows:
            batch = _samples_decoder.decode(body)
            (events if batch.source is None else device).extend(batch.values_ms)
        return device or events

    def tier1(self, run_id: str) -> protocol.Tier1Result | None:
        """The run's (last) Tier-1 result, or ``None`` if Tier 1 did not finish."""
        row = self._conn.execute(
            "SELECT body FROM events WHERE run_id = ? AND type = 'tier1_result'"
            " ORDER BY seq DESC LIMIT 1", (run_id,)).fetchone()
        if row is None:
            return None
        event = _decode(row[0])
        assert isinstance(event, protocol.Tier1Result)
        return event

    # ------------------------------------------------------------------------- runs
    def runs(self, session_id: str) -> list[RunRow]:
        """The runs of a session, in the order they started."""
        sid = self.session(session_id).id
        rows = self._conn.execute(
            _RUN_SELECT + " WHERE session_id = ? ORDER BY started, rowid", (sid,)).fetchall()
        return [_run_row(row) for row in rows]

    def iter_session_runs(self, session_id: str) -> Iterator[RunRow]:
        """:meth:`runs` decoded one at a time as SQLite gives them (a ``watch`` session may
        hold thousands: the first comes before the last is read)."""
        sid = self.session(session_id).id
        cur = self._conn.execute(_RUN_SELECT + " WHERE session_id = ? ORDER BY started, rowid",
                                 (sid,))
        for row in cur:
            yield _run_row(row)

    def listing_events(self, run_ids: list[str], types: Iterable[str]
                       ) -> dict[str, list[protocol.Events]]:
        """Several runs' events of the given types in one statement, each run's in ``seq``
        order (a listing's few events per run: one query per run was most of its reads).

        Args:
            run_ids: the runs (at most a few hundred: each is one SQL parameter).
            types: the ``protocol`` tags wanted.
        """
        wanted = sorted(set(types))
        out: dict[str, list[protocol.Events]] = {rid: [] for rid in run_ids}
        rows = self._conn.execute(
            f"SELECT run_id, body FROM events WHERE run_id IN ({','.join('?' * len(run_ids))})"
            f" AND type IN ({','.join('?' * len(wanted))}) ORDER BY run_id, seq",
            (*run_ids, *wanted))
        for run_id, body in rows:
            out[run_id].append(_decode(body))
        return out

    def codes(self, run_ids: list[str]) -> dict[str, CodeRecord]:
        """:meth:`code` of several runs in one statement; runs without a workspace are
        left out."""
        rows = self._conn.execute(
            "SELECT run_id, directory, name, tree_sha, files, total_bytes, git_commit,"
            " git_dirty, git_changed_json FROM run_code"
            f" WHERE run_id IN ({','.join('?' * len(run_ids))})", run_ids)
        return {row[0]: _code_record(row[1:]) for row in rows}

    def newest_runs(self, limit: int, session_id: str | None = None) -> list[RunRow]:
        """The ``limit`` newest runs (of one session, or all), newest first."""
        where = ""
        params: tuple[str, ...] = ()
        if session_id is not None:
            where, params = " WHERE session_id = ?", (self.session(session_id).id,)
        rows = self._conn.execute(_RUN_SELECT + where + " ORDER BY started DESC, rowid DESC"
                                  " LIMIT ?", (*params, limit)).fetchall()
        return [_run_row(row) for row in rows]

    def last_workload_on(self, host: str) -> str | None:
        """The workload of the newest run on ``host`` outside replays, or None."""
        row = self._conn.execute(
            "SELECT r.workload FROM runs r JOIN sessions s ON s.id = r.session_id"
            " WHERE s.host = ? AND s.transport != 'replay'"
            " ORDER BY s.started DESC, s.rowid DESC, r.started DESC, r.rowid DESC LIMIT 1",
            (host,)).fetchone()
        return None if row is None else str(row[0])

    def run(self, run_id_or_prefix: str) -> RunRow:
        """One run by id or unique id prefix.

        Raises:
            StoreError: no run (or more than one) matches.
        """
        run_id = self._resolve("runs", "run_id", "run", run_id_or_prefix)
        return _run_row(self._conn.execute(_RUN_SELECT + " WHERE run_id = ?",
                                           (run_id,)).fetchone())

    def set_baseline(self, run_id: str, on: bool = True) -> None:
        """Mark (or unmark) a run as the baseline for its workload.

        Runs of the same workload that start later are compared with the latest baseline.

        Raises:
            UsageError: marking a run that did not finish ok: later runs would be judged
                against a figure that is missing or wrong.
        """
        row = self.run(run_id)
        rid = row.run_id
        if on and row.status != "ok":
            raise UsageError(f"{rid} {row.status} and cannot be a baseline",
                             remedy="mark a run that finished ok (`gpuws history` shows each "
                                    "run's status)")
        with self._transaction() as cur:
            cur.execute("UPDATE runs SET is_baseline = ? WHERE run_id = ?", (int(on), rid))

    def set_baseline_of(self, run_id: str, baseline_run_id: str | None) -> None:
        """Choose which run ``run_id`` is compared with (``None``: no comparison)."""
        rid = self.run(run_id).run_id
        base = self.run(baseline_run_id).run_id if baseline_run_id is not None else None
        if base == rid:
            raise StoreError(f"run {rid} cannot be its own baseline")
        with self._transaction() as cur:
            cur.execute("UPDATE runs SET baseline_of = ? WHERE run_id = ?", (base, rid))

    # -- the code runs measured (workspaces)
    def record_code(self, run_id: str, code: CodeRecord,
                    entries: list[protocol.WsEntry]) -> None:
        """Record which tree ``run_id`` runs (before it starts: nothing depends on the pod)."""
        body = zlib.compress(_encoder.encode(entries), 6)
        with self._transaction() as cur:
            cur.execute("INSERT OR IGNORE INTO manifests(tree_sha, entries) VALUES (?, ?)",
                        (code.tree_sha256, body))
            cur.execute(
                "INSERT OR REPLACE INTO run_code(run_id, directory, name, tree_sha, files, "
                "total_bytes, git_commit, git_dirty, git_changed_json) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, code.directory, code.name, code.tree_sha256, code.files,
                 code.total_bytes, code.git_commit,
                 None if code.git_dirty is None else int(code.git_dirty),
                 _json(code.git_changed)))

    def code(self, run_id: str) -> CodeRecord | None:
        """The code ``run_id`` measured; None for a run without a workspace."""
        row = self._conn.execute(
            "SELECT directory, name, tree_sha, files, total_bytes, git_commit, git_dirty, "
            "git_changed_json FROM run_code WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else _code_record(row)

    def manifest(self, tree_sha: str) -> list[protocol.WsEntry] | None:
        """A stored tree's files, or None when it was never recorded."""
        row = self._conn.execute("SELECT entries FROM manifests WHERE tree_sha = ?",
                                 (tree_sha,)).fetchone()
        return None if row is None else _manifest_decoder.decode(zlib.decompress(row[0]))

    def metrics(self, run_id: str) -> list[KernelMetricsRow]:
        """Canonical metrics and top stalls per profiled launch, in the order recorded."""
        rows = self._conn.execute(
            "SELECT kernel, launch, key, value FROM metrics WHERE run_id = ? ORDER BY rowid",
            (run_id,))
        grouped: dict[tuple[str, int], tuple[dict[str, float | None], list[protocol.Stall]]]
        grouped = {}
        for kernel, launch, key, value in rows:
            metrics, stalls = grouped.setdefault((kernel, launch), ({}, []))
            if key.startswith(_STALL):
                stalls.append(protocol.Stall(reason=key[len(_STALL):], pct=value))
            else:
                metrics[key] = value
        return [KernelMetricsRow(kernel=k, launch=launch, metrics=m, stalls=s)
                for (k, launch), (m, s) in grouped.items()]

    def rules(self, run_id: str) -> list[protocol.Rule]:
        """Nsight Compute's rule findings for a run, in the order reported."""
        rows = self._conn.execute(
            "SELECT kernel, rule, kind, message, est_speedup_pct, speedup_type FROM rules"
            " WHERE run_id = ? ORDER BY seq, idx", (run_id,))
        return [protocol.Rule(kernel=k, rule=r, kind=kind, message=m, est_speedup_pct=est,
                              speedup_type=st) for k, r, kind, m, est, st in rows]

    def diagnoses(self, run_id: str) -> list[protocol.Diagnosis]:
        """The diagnoses a run produced, in order."""
        rows = self._conn.execute(_DIAGNOSIS_SELECT + " WHERE run_id = ? ORDER BY seq",
                                  (run_id,))
        return [_diagnosis(row) for row in rows]

    def session_diagnoses(self, session_id: str) -> list[protocol.Diagnosis]:
        """Diagnoses about the session itself (not tied to a run), in order."""
        rows = self._conn.execute(
            _DIAGNOSIS_SELECT + " WHERE session_id = ? AND run_id IS NULL ORDER BY rowid",
            (session_id,))
        return [_diagnosis(row) for row in rows]

    # ------------------------------------------------------------------------- phases
    def add_phase(self, session_id: str, run_id: str | None, phase: str, started: float,
                  ended: float | None, gpu_s: float | None = None) -> int:
        """Record a phase (a transfer, provisioning, …) and return its id.

        Tier phases are recorded by ingest from ``TierStarted``/``TierFinished``.
        """
        if ended is not None and ended < started:
            raise StoreError(f"phase {phase!r} ends ({ended}) before it starts ({started})")
        with self._transaction() as cur:
            cur.execute(
                "INSERT INTO phases(session_id, run_id, phase, started, ended, gpu_s)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (self._require_session(cur, session_id), run_id, phase, started, ended, gpu_s))
            return int(cur.lastrowid or 0)

    def phases(self, session_id: str) -> list[PhaseRow]:
        """Every phase of a session, in start order."""
        rows = self._conn.execute(
            "SELECT id, session_id, run_id, phase, tier, started, ended, gpu_s FROM phases"
            " WHERE session_id = ? ORDER BY started, id", (session_id,))
        return [PhaseRow(id=i, session_id=s, run_id=r, phase=p, tier=t, started=st, ended=e,
                         gpu_s=g) for i, s, r, p, t, st, e, g in rows]

    # ------------------------------------------------------------------------- host actions
    def add_host_action(self, host: str, action: str, started: float, ended: float, *,
                        ok: bool, detail: str = "", by: str = "gpuws") -> int:
        """Record a start or stop of ``host`` (by gpuws, unless ``by`` says it was learnt)
        and return its id."""
        if action not in ("start", "stop"):
            raise StoreError(f"unknown host action {action!r} (start or stop)")
        if by not in ("gpuws", "lease", "estimated"):
            raise StoreError(f"unknown actor {by!r} (gpuws, lease or estimated)")
        if ended < started:
            raise StoreError(f"{action} of {host} ends ({ended}) before it starts ({started})")
        with self._transaction() as cur:
            cur.execute("INSERT INTO host_actions(host, action, started, ended, ok, detail, by)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (host, action, started, ended, int(ok), detail, by))
            return int(cur.lastrowid or 0)

    def host_actions(self, host: str | None = None) -> list[HostActionRow]:
        """The starts and stops recorded (on ``host``, or on every host), oldest first."""
        sql = "SELECT id, host, action, started, ended, ok, detail, by FROM host_actions"
        params: tuple[str, ...] = ()
        if host is not None:
            sql += " WHERE host = ?"
            params = (host,)
        rows = self._conn.execute(sql + " ORDER BY started, id", params)
        return [HostActionRow(id=i, host=h, action=a, started=st, ended=e, ok=bool(k),
                              detail=d, by=b) for i, h, a, st, e, k, d, b in rows]

    def host_spend(self, host: str, since: float, until: float) -> tuple[float, int]:
        """What ``host``'s sessions cost between ``since`` and ``until`` (the budget's
        window, :func:`gpuws.sessions.cost.budget_window`), and how many sessions that was.

        A session's cost is its connected time inside the window × its rate; one still
        open counts up to ``until``; time two sessions were connected at once (two
        ``gpuws`` commands on one pod) is counted once, at the earlier session's rate, as
        the pod bills it once. A session without a rate costs nothing known.

        Args:
            host: the host as the sessions recorded it.
            since: the window's start (epoch seconds).
            until: its end.

        Returns:
            ``(dollars, sessions)``; sessions counts those with connected time in it.
        """
        rows = self._conn.execute(
            "SELECT started, COALESCE(ended, ?), rate_usd_per_hour FROM sessions"
            " WHERE host = ? AND started < ? AND COALESCE(ended, ?) > ? ORDER BY started",
            (until, host, until, until, since)).fetchall()
        spent, count, covered = 0.0, 0, since
        for started, ended, rate in rows:
            lo, hi = max(float(started), covered), min(float(ended), until)
            count += 1
            if hi > lo and rate is not None:
                spent += (hi - lo) * float(rate) / 3600.0
            covered = max(covered, hi)
        return spent, count

    def add_lease_stop(self, host: str, started: float, ended: float, *, ok: bool,
                       detail: str) -> bool:
        """Record a stop the pod's lease logged, once: one already recorded within
        ``LEASE_STOP_SLACK_S`` is the same stop. An estimate it settles (its window holds
        this stop) is replaced. Returns whether it was new."""
        slack = LEASE_STOP_SLACK_S
        with self._transaction() as cur:
            if cur.execute("SELECT 1 FROM host_actions WHERE host = ? AND by = 'lease' AND"
                           " ABS(started - ?) <= ?", (host, started, slack)).fetchone():
                return False
            if ok:
                cur.execute("DELETE FROM host_actions WHERE host = ? AND by = 'estimated' AND"
                            " started - ? <= ? AND ? <= ended + ?",
                            (host, slack, started, started, slack))
            cur.execute("INSERT INTO host_actions(host, action, started, ended, ok, detail, by)"
                        " VALUES (?, 'stop', ?, ?, ?, ?, 'lease')",
                        (host, started, max(started, ended), int(ok), detail))
            return True

    def set_pod_lease(self, host: str, idle_s: float, last_contact: float) -> None:
        """The host's lease was seen armed at ``last_contact`` (a later contact moves it)."""
        with self._transaction() as cur:
            cur.execute("INSERT INTO pod_leases(host, idle_s, last_contact) VALUES (?, ?, ?)"
                        " ON CONFLICT(host) DO UPDATE SET idle_s = excluded.idle_s,"
                        " last_contact = MAX(last_contact, excluded.last_contact)",
                        (host, idle_s, last_contact))

    def touch_pod_lease(self, host: str, last_contact: float) -> None:
        """A later contact with the host (a disconnect, a lost link), if its lease is armed."""
        with self._transaction() as cur:
            cur.execute("UPDATE pod_leases SET last_contact = MAX(last_contact, ?)"
                        " WHERE host = ?", (last_contact, host))

    def clear_pod_lease(self, host: str) -> None:
        """The host's lease is no longer armed (released, fired, or seen unarmed)."""
        with self._transaction() as cur:
            cur.execute("DELETE FROM pod_leases WHERE host = ?", (host,))

    def pod_lease(self, host: str) -> PodLeaseRow | None:
        """The host's lease as last seen armed, if it was. Its ``last_contact`` is also
        no earlier than the end of the host's last ended session: a ``gpuws`` killed with
        kill -9 recorded no disconnect, and its session ends at its last activity."""
        row = self._conn.execute(
            "SELECT host, idle_s, MAX(last_contact, COALESCE((SELECT MAX(ended) FROM sessions"
            " WHERE sessions.host = pod_leases.host), 0)) FROM pod_leases WHERE host = ?",
            (host,)).fetchone()
        return None if row is None else PodLeaseRow(host=row[0], idle_s=row[1],
                                                    last_contact=row[2])

    # ------------------------------------------------------------------------- fleets
    def open_fleet(self, spec: protocol.RunSpec, pods: list[str],
                   started: float | None = None) -> str:
        """Record a fleet about to start: its spec and its pods (``pending``) in order.

        Returns:
            The fleet's id.
        """
        fleet_id = secrets.token_hex(6)
        with self._transaction() as cur:
            cur.execute("INSERT INTO fleets(id, workload, spec_json, started) VALUES (?, ?, ?, ?)",
                        (fleet_id, spec.workload, _json(spec),
                         time.time() if started is None else started))
            cur.executemany("INSERT INTO fleet_pods(fleet_id, position, pod, status)"
                            " VALUES (?, ?, ?, 'pending')",
                            [(fleet_id, i, pod) for i, pod in enumerate(pods)])
        return fleet_id

    def set_fleet_pod(self, fleet_id: str, position: int, *, status: str,
                      session_id: str | None = None, run_id: str | None = None,
                      error: str = "") -> None:
        """Update one pod of a fleet; a ``session_id``/``run_id`` given once is kept.

        Raises:
            StoreError: no such fleet pod.
        """
        with self._transaction() as cur:
            cur.execute("UPDATE fleet_pods SET status = ?, error = ?,"
                        " session_id = COALESCE(?, session_id), run_id = COALESCE(?, run_id)"
                        " WHERE fleet_id = ? AND position = ?",
                        (status, error, session_id, run_id, fleet_id, position))
            if cur.rowcount != 1:
                raise StoreError(f"fleet {fleet_id!r} has no pod at position {position}")

    def end_fleet(self, fleet_id: str, ended: float | None = None) -> None:
        """Mark the fleet finished (every pod gave a result or a reason)."""
        with self._transaction() as cur:
            cur.execute("UPDATE fleets SET ended = ? WHERE id = ?",
                        (time.time() if ended is None else ended, fleet_id))

    def fleets(self) -> list[FleetRow]:
        """Every fleet, newest first."""
        ids = [str(r[0]) for r in self._conn.execute(
            "SELECT id FROM fleets ORDER BY started DESC, rowid DESC")]
        return [self._fleet_row(i) for i in ids]

    def fleet(self, id_or_prefix: str) -> FleetRow:
        """One fleet by id or unique id prefix.

        Raises:
            StoreError: no fleet (or more than one) matches.
        """
        return self._fleet_row(self._resolve("fleets", "id", "fleet", id_or_prefix))

    def fleet_of_session(self, session_id: str) -> str | None:
        """The fleet a session ran in, if it was one pod of a fleet."""
        row = self._conn.execute("SELECT fleet_id FROM fleet_pods WHERE session_id = ?",
                                 (session_id,)).fetchone()
        return None if row is None else str(row[0])

    def _fleet_row(self, fleet_id: str) -> FleetRow:
        fid, workload, spec_json, started, ended = self._conn.execute(
            "SELECT id, workload, spec_json, started, ended FROM fleets WHERE id = ?",
            (fleet_id,)).fetchone()
        pods = [FleetPodRow(position=p, pod=pod, session_id=sid, run_id=rid, status=st,
                            error=err)
                for p, pod, sid, rid, st, err in self._conn.execute(
                    "SELECT position, pod, session_id, run_id, status, error FROM fleet_pods"
                    " WHERE fleet_id = ? ORDER BY position", (fid,))]
        return FleetRow(id=fid, workload=workload,
                        spec=_spec_decoder.decode(spec_json) if spec_json else None,
                        started=started, ended=ended, pods=pods)

    # ------------------------------------------------------------------------- artifacts
    def record_artifact(self, run_id: str, name: str, remote_path: str, size: int,
                        sha256: str) -> None:
        """Record a file the pod holds for a run (status ``remote`` until pulled)."""
        with self._transaction() as cur:
            if cur.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
                raise StoreError(f"no run {run_id!r} in the store")
            _upsert_artifact(cur, run_id, name, remote_path, size, sha256)

    def mark_pulled(self, run_id: str, name: str, local_path: Path | str,
                    pulled_at: float | None = None, move_to: Path | None = None, *,
                    sha256: str | None = None, size: int | None = None) -> None:
        """Record that an artifact's copy is at ``local_path``, after checking its sha256.

        With ``move_to``, the checked file (a ``.part``) is renamed there first and that is
        the path recorded: the rename happens only after the sha256 matched.

        Args:
            run_id: the artifact's run.
            name: the artifact's name.
            local_path: the copy on the laptop.
            pulled_at: when it arrived (default: now).
            move_to: rename the checked copy here and record that path.
            sha256: the copy's digest, computed by the caller as its bytes were written
                (with ``size``); the file is then not read again. Without them the file
                is read and hashed here.
            size: the copy's size in bytes (with ``sha256``).

        Raises:
            StoreError: the artifact is unknown.
            TransferError: the copy is missing or its sha256/size differs from the pod's;
                the artifact is then marked ``sha256_mismatch``, never ``pulled``.
            ValueError: only one of ``sha256`` and ``size`` was given.
        """
        if (sha256 is None) != (size is None):
            raise ValueError("mark_pulled: give both sha256 and size, or neither")
        row = self._conn.execute("SELECT size, sha256 FROM artifacts WHERE run_id = ? AND name = ?",
                                 (run_id, name)).fetchone()
        if row is None:
            raise StoreError(f"run {run_id!r} has no artifact named {name!r}")
        expected_size, expected = row
        local = Path(local_path)
        if sha256 is not None and size is not None:
            actual, actual_size = sha256, size
        else:
            try:
                actual, actual_size = _sha256_file(local)
            except OSError as exc:
                raise TransferError(f"{name}: cannot read the pulled copy {local}: "
                                    f"{exc.strerror or exc}") from exc
        if actual != expected or actual_size != expected_size:
            with self._transaction() as cur:
                cur.execute("UPDATE artifacts SET status = 'sha256_mismatch', local_path = NULL,"
                            " pulled_at = NULL WHERE run_id = ? AND name = ?", (run_id, name))
            raise TransferError(
                f"{name}: the pulled copy {local} has sha256 {actual} ({actual_size} bytes) but "
                f"the pod reported {expected} ({expected_size} bytes)",
                remedy="pull it again; if it keeps differing the file changed on the pod")
        if move_to is not None:
            os.replace(local, move_to)
            local = move_to
        with self._transaction() as cur:
            cur.execute("UPDATE artifacts SET status = 'pulled', local_path = ?, pulled_at = ?"
                        " WHERE run_id = ? AND name = ?",
                        (str(local), time.time() if pulled_at is None else pulled_at,
                         run_id, name))

    def artifacts(self, run_id: str) -> list[ArtifactRow]:
        """A run's artifacts, by name."""
        rows = self._conn.execute(
            "SELECT run_id, name, remote_path, size, sha256, local_path, pulled_at, status"
            " FROM artifacts WHERE run_id = ? ORDER BY name", (run_id,))
        return [ArtifactRow(run_id=r, name=n, remote_path=rp, size=sz, sha256=sh, local_path=lp,
                            pulled_at=pa, status=st) for r, n, rp, sz, sh, lp, pa, st in rows]

    # ------------------------------------------------------------------------- helpers
    def _require_session(self, cur: sqlite3.Cursor, session_id: str) -> str:
        if cur.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
            raise StoreError(f"no session {session_id!r} in the store",
                             remedy="`gpuws sessions` lists them")
        return session_id

    def _resolve(self, table: str, column: str, what: str, id_or_prefix: str) -> str:
        if not id_or_prefix:
            raise StoreError(f"an empty {what} id matches nothing")
        exact = self._conn.execute(f"SELECT {column} FROM {table} WHERE {column} = ?",
                                   (id_or_prefix,)).fetchone()
        if exact is not None:
            return str(exact[0])
        # substr() instead of LIKE: ids may contain '_' or '%', which LIKE would treat as wildcards.
        matches = [str(r[0]) for r in self._conn.execute(
            f"SELECT {column} FROM {table} WHERE substr({column}, 1, ?) = ? ORDER BY {column}"
            " LIMIT 6", (len(id_or_prefix), id_or_prefix))]
        listing = "`gpuws fleets`" if what == "fleet" else "`gpuws sessions`"
        remedy = f"{listing} lists the {what}s in the store"
        if what == "run":
            # Imported here: runlist imports this module. Runs are listed by `gpuws history`.
            from .runlist import RUN_LISTING_REMEDY
            remedy = RUN_LISTING_REMEDY
        if not matches:
            raise StoreError(f"no {what} matches {id_or_prefix!r}", remedy=remedy)
        if len(matches) > 1:
            shown = ", ".join(matches[:5]) + (", …" if len(matches) > 5 else "")
            raise StoreError(f"{what} id {id_or_prefix!r} is ambiguous: {shown}",
                             remedy="give more characters of the id"
                             + ("; " + remedy if what == "run" else ""))
        return matches[0]


# ----------------------------------------------------------------------------- derived rows
def _derive_run_started(cur: sqlite3.Cursor, session_id: str, run_id: str,
                        event: protocol.Event) -> None:
    assert isinstance(event, protocol.RunStarted)
    workload = event.spec.workload
    cur.execute("UPDATE runs SET workload = ?, spec_json = ?, started = ? WHERE run_id = ?",
                (workload, _json(event.spec), event.ts, run_id))
    # Compare with the latest baseline of the same workload, unless one was chosen already.
    cur.execute(
        "UPDATE runs SET baseline_of = (SELECT b.run_id FROM runs b WHERE b.is_baseline = 1"
        " AND b.workload = ? AND b.run_id != ? ORDER BY b.started DESC LIMIT 1)"
        " WHERE run_id = ? AND baseline_of IS NULL", (workload, run_id, run_id))


def _derive_tier_started(cur: sqlite3.Cursor, session_id: str, run_id: str,
                         event: protocol.Event) -> None:
    assert isinstance(event, protocol.TierStarted)
    phase = f"tier {event.tier} ({event.name})" if event.name else f"tier {event.tier}"
    cur.execute("INSERT INTO phases(session_id, run_id, phase, tier, started)"
                " VALUES (?, ?, ?, ?, ?)", (session_id, run_id, phase, event.tier, event.ts))


def _derive_tier_finished(cur: sqlite3.Cursor, session_id: str, run_id: str,
                          event: protocol.Event) -> None:
    assert isinstance(event, protocol.TierFinished)
    cur.execute(
        "UPDATE phases SET ended = ?, gpu_s = ? WHERE id = (SELECT id FROM phases"
        " WHERE run_id = ? AND tier = ? AND ended IS NULL ORDER BY id DESC LIMIT 1)",
        (event.ts, event.gpu_s, run_id, event.tier))
    if cur.rowcount == 0:  # its TierStarted was never seen: the wall time says when it began
        cur.execute(
            "INSERT INTO phases(session_id, run_id, phase, tier, started, ended, gpu_s)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (session_id, run_id, f"tier {event.tier}", event.tier, event.ts - event.wall_s,
             event.ts, event.gpu_s))


def _derive_kernel_metrics(cur: sqlite3.Cursor, session_id: str, run_id: str,
                           event: protocol.Event) -> None:
    assert isinstance(event, protocol.KernelMetrics)
    rows: list[tuple[str, str, int, str, float | None]] = [
        (run_id, event.kernel, event.launch, key, value) for key, value in event.metrics.items()]
    rows.extend((run_id, event.kernel, event.launch, _STALL + s.reason, s.pct)
                for s in event.stalls)
    cur.executemany("INSERT OR REPLACE INTO metrics(run_id, kernel, launch, key, value)"
                    " VALUES (?, ?, ?, ?, ?)", rows)


def _derive_rule_findings(cur: sqlite3.Cursor, session_id: str, run_id: str,
                          event: protocol.Event) -> None:
    assert isinstance(event, protocol.RuleFindings)
    cur.executemany(
        "INSERT INTO rules(run_id, seq, idx, kernel, rule, kind, message, est_speedup_pct,"
        " speedup_type) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(run_id, event.seq, i, r.kernel, r.rule, r.kind, r.message, r.est_speedup_pct,
          r.speedup_type) for i, r in enumerate(event.rules)])


def _derive_diagnosis(cur: sqlite3.Cursor, session_id: str, run_id: str,
                      event: protocol.Event) -> None:
    assert isinstance(event, protocol.Diagnosis)
    _insert_diagnosis(cur, session_id, run_id, event)


def _derive_artifact(cur: sqlite3.Cursor, session_id: str, run_id: str,
                     event: protocol.Event) -> None:
    assert isinstance(event, protocol.Artifact)
    _upsert_artifact(cur, run_id, event.name, event.path, event.size, event.sha256)


def _derive_run_finished(cur: sqlite3.Cursor, session_id: str, run_id: str,
                         event: protocol.Event) -> None:
    assert isinstance(event, protocol.RunFinished)
    cur.execute("UPDATE runs SET status = ?, finished = ?, wall_s = ?, exit_code = ?"
                " WHERE run_id = ?", (event.status, event.ts, event.wall_s, event.exit_code,
                                      run_id))
    # A tier cut short (cancel, crash) never sends TierFinished: its phase ends with the run.
    cur.execute("UPDATE phases SET ended = ? WHERE run_id = ? AND ended IS NULL",
                (event.ts, run_id))


_DERIVE: dict[str, Callable[[sqlite3.Cursor, str, str, protocol.Event], None]] = {
    "run_started": _derive_run_started,
    "tier_started": _derive_tier_started,
    "tier_finished": _derive_tier_finished,
    "kernel_metrics": _derive_kernel_metrics,
    "rule_findings": _derive_rule_findings,
    "diagnosis": _derive_diagnosis,
    "artifact": _derive_artifact,
    "run_finished": _derive_run_finished,
}


def _insert_diagnosis(cur: sqlite3.Cursor, session_id: str, run_id: str | None,
                      d: protocol.Diagnosis) -> None:
    cur.execute(
        "INSERT INTO diagnoses(session_id, run_id, seq, ts, code, severity, title, cause,"
        " meaning, remedies_json, unmeasured_json, details_json)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (session_id, run_id, d.seq, d.ts, d.code, d.severity, d.title, d.cause, d.meaning,
         _json(d.remedies), _json(d.unmeasured), _json(d.details)))


def _upsert_artifact(cur: sqlite3.Cursor, run_id: str, name: str, remote_path: str, size: int,
                     sha256: str) -> None:
    # A re-announced artifact with the same content keeps its pulled copy; a changed one
    # (new sha256) must be pulled again.
    cur.execute(
        "INSERT INTO artifacts(run_id, name, remote_path, size, sha256, status)"
        " VALUES (?, ?, ?, ?, ?, 'remote') ON CONFLICT(run_id, name) DO UPDATE SET"
        " remote_path = excluded.remote_path,"
        " status = CASE WHEN sha256 = excluded.sha256 AND size = excluded.size"
        "   THEN status ELSE 'remote' END,"
        " local_path = CASE WHEN sha256 = excluded.sha256 AND size = excluded.size"
        "   THEN local_path ELSE NULL END,"
        " pulled_at = CASE WHEN sha256 = excluded.sha256 AND size = excluded.size"
        "   THEN pulled_at ELSE NULL END,"
        " size = excluded.size, sha256 = excluded.sha256",
        (run_id, name, remote_path, size, sha256))


# ----------------------------------------------------------------------------- row decoding
_SESSION_SELECT = (
    "SELECT s.id, s.host, s.transport, s.probe_json, s.rate_usd_per_hour, s.budget_usd,"
    " s.started, s.ended, (SELECT COUNT(*) FROM runs r WHERE r.session_id = s.id)"
    " FROM sessions s")
_RUN_SELECT = (
    "SELECT run_id, session_id, workload, spec_json, status, started, finished, wall_s,"
    " exit_code, is_baseline, baseline_of FROM runs")
_DIAGNOSIS_SELECT = (
    "SELECT run_id, seq, ts, code, severity, title, cause, meaning, remedies_json,"
    " unmeasured_json, details_json FROM diagnoses")


def _session_row(row: Any) -> SessionRow:
    sid, host, transport, probe_json, rate, budget, started, ended, run_count = row
    return SessionRow(id=sid, host=host, transport=transport,
                      probe=_probe_decoder.decode(probe_json) if probe_json else None,
                      rate_usd_per_hour=rate, budget_usd=budget, started=started, ended=ended,
                      run_count=run_count)


def _run_row(row: Any) -> RunRow:
    rid, sid, workload, spec_json, status, started, finished, wall_s, code, base, base_of = row
    return RunRow(run_id=rid, session_id=sid, workload=workload,
                  spec=_spec_decoder.decode(spec_json) if spec_json else None, status=status,
                  started=started, finished=finished, wall_s=wall_s, exit_code=code,
                  is_baseline=bool(base), baseline_of=base_of)


def _code_record(row: Any) -> CodeRecord:
    return CodeRecord(row[0], row[1], row[2], row[3], row[4], row[5],
                      None if row[6] is None else bool(row[6]), json.loads(row[7]))


def _diagnosis(row: Any) -> protocol.Diagnosis:
    run_id, seq, ts, code, severity, title, cause, meaning, remedies, unmeasured, details = row
    return protocol.Diagnosis(
        run_id=run_id, seq=seq, ts=ts, code=code, severity=severity, title=title, cause=cause,
        meaning=meaning, remedies=msgspec.json.decode(remedies, type=list[str]),
        unmeasured=msgspec.json.decode(unmeasured, type=list[str]),
        details=msgspec.json.decode(details, type=dict[str, Any]))


def _decode(body: bytes) -> protocol.Events:
    event = protocol.decode_event(body)
    if isinstance(event, protocol.BadLine):
        raise StoreError(f"a stored event no longer decodes ({event.reason}): {event.preview}")
    return event


def _json(value: Any) -> str:
    return _encoder.encode(value).decode("utf-8")


def _sha256_file(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size
