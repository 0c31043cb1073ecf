"""Stops gpuws did not perform but learnt of (issue 22, point 4): billed time ends there.

The story of the issue's "Done", with real parts: the pod is a real OpenSSH sshd whose
``start``/``stop`` are scripts that start and kill it (as a provider's tool would), whose
``stop_on_pod`` kills it and writes a marker with the time (as ``sudo shutdown`` would),
and whose cache (the agent's, with the lease's log) survives the stop, as a disk does. The
person starts the pod from gpuws, runs, walks away; the lease stops the pod; the next
command finds it silent and records the stop the lease's deadline implies; the pod started
again, its log replaces the estimate with the exact time. Times are seconds (fractions of
``idle_stop_minutes``); no assertion is a wall-clock bound on gpuws.

The parts below it take the worst a pod could say (a forged log, a skewed clock) and the
store's side (a stop recorded once, an estimate settled by the log, an old store migrated).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from pathlib import Path

import msgspec
import pytest

from gpuws import protocol
from gpuws.cli import main
from gpuws.live.uptime.observed import disbelief, host_silent, lease_seen, to_laptop_clock
from gpuws.remote_agent import lease as pod_lease
from gpuws.sessions import store as store_mod
from gpuws.sessions.store import Store
from lease.leasekit import script, stop_on_pod, wait_marker  # type: ignore[import-not-found]
from sshd import SshServer  # type: ignore[import-not-found]

IDLE_MIN = 0.05  # 3 s


@pytest.fixture
def pod(stopped_pod: SshServer) -> SshServer:
    """The pod is stopped (tests/conftest.py)."""
    return stopped_pod


def _config(tmp_path: Path, pod: SshServer, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The host's config: start, stop, and the lease. Returns the marker ``stop_on_pod``
    writes."""
    start = script(tmp_path / "start.sh", f"exec {pod.boot_command()}\n")
    stop = script(tmp_path / "stop.sh", f"kill $(cat {pod.root / 'sshd.pid'})\n")
    on_pod, marker = stop_on_pod(tmp_path, pod.root)
    lease = f"idle_stop_minutes = {IDLE_MIN}\nstop_on_pod = [\"{on_pod}\"]\n"
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"[hosts.pod]\nstart = [\"{start}\"]\nstop = [\"{stop}\"]\n{lease}")
    monkeypatch.setenv("GPUWS_CONFIG", str(cfg))
    monkeypatch.setenv("GPUWS_HOME", str(tmp_path / "home"))
    return marker


def _wait_down(pod: SshServer, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while pod.daemon_pid() is not None:
        assert time.monotonic() < deadline, "the pod's sshd outlived its stop"
        time.sleep(0.05)


def test_walk_away_the_lease_stops_the_pod_and_the_export_bills_to_its_stop(
        pod: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    marker = _config(tmp_path, pod, monkeypatch)
    ssh = str(pod.client_files(tmp_path / "ssh"))
    assert main(["start", "pod", "-F", ssh, "--wait", "30"]) == 0
    assert main(["run", "pod", "-F", ssh, "-w", "cmd:true", "--rate", "3.6"]) == 0
    left = time.time()
    with Store() as store:
        (session,) = store.sessions()
        assert store.pod_lease("pod") is not None  # seen armed, for the silence to come
    # The person walks away; nobody renews the lease.
    stopped = wait_marker(marker)
    _wait_down(pod)
    assert stopped >= left + IDLE_MIN * 60 - 1.0
    capsys.readouterr()

    # The next command finds the host silent after the lease's deadline: that is its stop.
    assert main(["run", "pod", "-F", ssh, "-w", "cmd:true"]) == 3
    err = capsys.readouterr().err
    assert "pod does not answer: its lease was due to stop it at" in err, err
    with Store() as store:
        start_row, estimate = store.host_actions("pod")
        assert store.pod_lease("pod") is None  # learnt once
    assert estimate.by == "estimated" and estimate.action == "stop" and estimate.ok
    # The window holds the real stop: no earlier than the lease could fire, and no later
    # than the silence was seen.
    assert estimate.started <= stopped + 1.0 and stopped <= estimate.ended
    assert main(["export", session.id]) == 0
    md = capsys.readouterr().out
    assert "Billed time: at least " in md and "the earliest its lease could stop it" in md, md
    assert "was billed with nobody connected" in md and "At most " in md

    # The pod started again (its disk kept the lease's log): the log replaces the estimate.
    cfg = Path(os.environ["GPUWS_CONFIG"])
    cfg.write_text("\n".join(line for line in cfg.read_text().splitlines()
                             if not line.startswith(("idle_stop", "stop_on_pod"))) + "\n")
    assert main(["start", "pod", "-F", ssh, "--wait", "30"]) == 0
    assert main(["doctor", "pod", "-F", ssh]) == 0
    out = capsys.readouterr().out
    assert "the lease stopped the pod 1 time(s) since gpuws last saw it" in out, out
    assert main(["doctor", "pod", "-F", ssh, "--json"]) == 0  # read again: nothing new
    assert json.loads(capsys.readouterr().out)["lease"]["stops_recorded"] == 0
    with Store() as store:
        rows = store.host_actions("pod")
    assert [(r.action, r.by) for r in rows] == [("start", "gpuws"), ("stop", "lease"),
                                                ("start", "gpuws")]
    exact = rows[1]
    assert abs(exact.started - stopped) < 1.0  # the pod's own time, on the laptop's clock
    assert "after 0:03 with no laptop and no run" in exact.detail
    assert main(["export", session.id]) == 0
    md = capsys.readouterr().out
    assert "the stop its lease performed" in md and "at least" not in md, md
    billed = exact.ended - start_row.started
    assert f"Billed time: {billed:.1f} s" in md or f"Billed time: {int(billed // 60)} min" in md


def test_a_silent_host_whose_lease_is_not_due_records_nothing(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        assert host_silent(store, "pod", now=1000.0) is None  # never seen armed
        store.set_pod_lease("pod", 600.0, 1000.0)
        assert host_silent(store, "pod", now=1500.0) is None  # down, but not the lease's doing
        assert store.host_actions("pod") == [] and store.pod_lease("pod") is not None
        store.add_host_action("pod", "stop", 1550.0, 1560.0, ok=True)  # gpuws stopped it
        assert host_silent(store, "pod", now=2000.0) is None
        assert [r.by for r in store.host_actions("pod")] == ["gpuws"]
        assert store.pod_lease("pod") is None


def _status(now_ts: float, *stops: protocol.LeaseStop, **kw: object) -> protocol.LeaseStatus:
    return protocol.LeaseStatus(armed=False, now_ts=now_ts, stops=list(stops), **kw)


def test_the_pods_times_are_read_against_its_own_clock() -> None:
    received = 1_800_000_000.0
    # The pod's clock runs an hour ahead: its stop 100 s ago reads 100 s ago here.
    ahead = _status(received + 3600.0,
                    protocol.LeaseStop(at=received + 3500.0, idle_for_s=1800.0, ok=True,
                                       ended_at=received + 3502.0),
                    deadline_ts=received + 3600.0 + 60.0)
    seen = to_laptop_clock(ahead, received)
    (stop,) = seen.stops
    assert math.isclose(stop.at, received - 100.0) and stop.ended_at is not None
    assert math.isclose(stop.ended_at, received - 98.0)
    assert seen.deadline_ts is not None and math.isclose(seen.deadline_ts, received + 60.0)


@pytest.mark.parametrize("stop", [
    protocol.LeaseStop(at=1_800_000_000.0 + 86_400.0, idle_for_s=1.0),  # tomorrow
    protocol.LeaseStop(at=0.0, idle_for_s=1.0),  # 1970
    protocol.LeaseStop(at=1_800_000_000.0 - 500 * 86_400.0, idle_for_s=1.0),  # ages ago
])
def test_a_stop_no_clock_allows_is_left_out(stop: protocol.LeaseStop) -> None:
    received = 1_800_000_000.0
    assert to_laptop_clock(_status(received, stop), received).stops == []


def test_a_flood_of_stops_is_cut_to_the_last_few_and_an_end_before_its_start_is_not_kept(
        tmp_path: Path) -> None:
    received = 1_800_000_000.0
    flood = [protocol.LeaseStop(at=received - 10_000.0 + i, idle_for_s=1.0, ok=True,
                                ended_at=received - 20_000.0) for i in range(5000)]
    seen = to_laptop_clock(_status(received, *flood), received)
    assert len(seen.stops) == protocol.MAX_LEASE_STOPS
    assert all(s.ended_at == s.at for s in seen.stops)  # ended before it began: clamped
    with Store(tmp_path / "s.db") as store:
        # 8 stops a second apart: those within 5 s of a recorded one are that one again.
        assert lease_seen(store, "pod", seen, received) == (2, 0)
        assert lease_seen(store, "pod", seen, received) == (0, 0)
        assert len(store.host_actions("pod")) == 2


def test_a_logged_stop_settles_the_estimate_it_falls_in_and_no_other(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        store.add_host_action("pod", "stop", 1000.0, 1600.0, ok=True, by="estimated")
        store.add_host_action("pod", "stop", 5000.0, 5100.0, ok=True, by="estimated")
        assert store.add_lease_stop("pod", 1200.0, 1201.0, ok=True, detail="d")
        assert not store.add_lease_stop("pod", 1203.0, 1204.0, ok=True, detail="d")
        assert [(r.by, r.started) for r in store.host_actions("pod")] == [
            ("lease", 1200.0), ("estimated", 5000.0)]
        # A failed stop is recorded (it may still bill) but settles nothing.
        assert store.add_lease_stop("pod", 5050.0, 5051.0, ok=False, detail="d")
        assert [r.by for r in store.host_actions("pod")] == ["lease", "estimated", "lease"]


def test_the_pods_log_is_read_without_trusting_it(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease's log lives in the pod user's cache: anything may be in it."""
    entries: list[dict[str, object]] = [
        {"event": "stop", "ts": True, "idle_for_s": 1.0},
        {"event": "stop", "ts": "yesterday"},
        {"event": "stopped", "ts": 5.0},  # no stop before it
        {"event": "stop", "ts": 10.0, "idle_for_s": float("nan")},
        {"event": "stop_failed", "ts": 12.0},
        {"event": "stop", "ts": 20.0, "idle_for_s": -3},
        {"event": "stopped", "ts": 15.0},  # before its stop: clamped
        {"event": "stop", "ts": 30.0, "idle_for_s": 60.0},  # the pod went down under it
    ] + [{"event": "stop", "ts": 100.0 + i, "idle_for_s": 1.0} for i in range(20)]
    got = pod_lease.stops(entries[:8])
    assert got == [
        {"at": 10.0, "idle_for_s": 0.0, "ok": False, "ended_at": 12.0},
        {"at": 20.0, "idle_for_s": 0.0, "ok": True, "ended_at": 20.0},
        {"at": 30.0, "idle_for_s": 60.0, "ok": None, "ended_at": None},
    ]
    assert len(pod_lease.stops(entries)) == pod_lease.MAX_STOPS == protocol.MAX_LEASE_STOPS
    # A time no clock gives is that line's loss alone (it refused the laptop every status).
    assert pod_lease.stops([{"event": "stop", "ts": 1e300, "idle_for_s": 1.0},
                            {"event": "stop", "ts": -5.0},
                            {"event": "stop", "ts": 40.0, "idle_for_s": 5e9},
                            {"event": "stopped", "ts": 1e300}]) == [
        {"at": 40.0, "idle_for_s": 0.0, "ok": None, "ended_at": None}]
    # And from a real file with junk lines, through the agent's own reader.
    monkeypatch.setattr(pod_lease, "lease_dir", lambda: str(tmp_path))
    (tmp_path / "log").write_bytes(b"\xff\xfe not json\n[1, 2]\n"
                                   + json.dumps({"event": "stop", "ts": 7.0,
                                                 "idle_for_s": 2.0}).encode() + b"\n")
    assert pod_lease.stops(pod_lease.read_log(200)) == [
        {"at": 7.0, "idle_for_s": 2.0, "ok": None, "ended_at": None}]


def test_a_version_4_store_keeps_its_starts_and_stops(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.db"
    with monkeypatch.context() as m:
        m.setattr(store_mod, "_MIGRATIONS", store_mod._MIGRATIONS[:4])
        m.setattr(store_mod, "SCHEMA_VERSION", 4)
        with Store(path) as s:
            s._conn.execute("INSERT INTO host_actions(host, action, started, ended, ok, "
                            "detail) VALUES ('pod', 'start', 1.0, 2.0, 1, '')")
    with Store(path) as s:
        assert s._conn.execute("PRAGMA user_version").fetchone()[0] == store_mod.SCHEMA_VERSION
        (row,) = s.host_actions("pod")
        assert (row.action, row.by, row.ok) == ("start", "gpuws", True)
        with pytest.raises(sqlite3.IntegrityError):
            s._conn.execute("INSERT INTO host_actions(host, action, started, ended, ok, "
                            "detail, by) VALUES ('pod', 'stop', 1, 2, 1, '', 'provider')")


def test_a_stop_dated_after_the_pods_own_now_is_left_out_and_counted() -> None:
    """A forged ``stop`` line dated ahead was billed as the lease's stop."""
    received = 1_800_000_000.0
    honest = protocol.LeaseStop(at=received - 600.0, idle_for_s=1800.0, ok=True,
                                ended_at=received - 598.0)
    forged = protocol.LeaseStop(at=received + 30.0, idle_for_s=1.0, ok=True)
    seen = to_laptop_clock(_status(received, honest, forged), received)
    assert [s.at for s in seen.stops] == [received - 600.0] and seen.left_out == 1


def test_a_stop_the_laptops_own_contacts_deny_is_not_recorded(tmp_path: Path) -> None:
    now = 1_800_000_000.0
    # (The first's end is dated inside the session after it: it ended before that.)
    stops = [protocol.LeaseStop(at=now - 5000.0, idle_for_s=600.0, ok=True,
                                ended_at=now - 3000.0),  # before
             protocol.LeaseStop(at=now - 3000.0, idle_for_s=600.0, ok=True),  # in a session
             protocol.LeaseStop(at=now - 1500.0, idle_for_s=600.0, ok=True),  # after it
             protocol.LeaseStop(at=now - 100.0, idle_for_s=600.0, ok=True),  # in this one
             protocol.LeaseStop(at=now + 20.0, idle_for_s=600.0, ok=True)]  # to come
    with Store(tmp_path / "s.db") as store:
        ended = store.open_session("pod", "sftp", None, None, started=now - 4000.0)
        store.end_session(ended, ended=now - 2000.0)
        store.open_session("other", "sftp", None, None, started=now - 1600.0)  # not pod
        store.open_session("pod", "sftp", None, None, started=now - 200.0)  # live now
        status = _status(now, *stops)
        assert lease_seen(store, "pod", status, now) == (2, 3)
        # Said, not only dropped: the person reading the bill learns the log claimed more.
        assert disbelief(status, 3) == (
            "3 stops in the pod's lease log not believed: 3 while gpuws had the pod "
            "answering; the billed time is not cut at them")
        assert disbelief(msgspec.structs.replace(status, left_out=1), 0) == (
            "1 stop in the pod's lease log not believed: 1 impossible (dated in the future, "
            "before the lease could exist, or malformed); the billed time is not cut at them")
        assert disbelief(status, 0) == ""
        assert [(r.started, r.ended) for r in store.host_actions("pod")] == [
            (now - 5000.0, now - 4000.0), (now - 1500.0, now - 1500.0)]


def test_one_out_of_range_number_from_the_pod_costs_that_entry_not_the_status() -> None:
    """One such number refused the whole status: "no auto-stop", and no stop recorded."""
    from gpuws.live.boundary import check_answer

    now = time.time()
    good = protocol.LeaseStop(at=now - 600.0, idle_for_s=1800.0, ok=True, ended_at=now - 599)
    status = protocol.LeaseStatus(
        ts=now, armed=True, idle_s=1800.0, now_ts=now, deadline_ts=1e300, left_out=-7,
        stops=[good, protocol.LeaseStop(at=1e300, idle_for_s=1.0),
               protocol.LeaseStop(at=now - 300.0, idle_for_s=1e300),
               protocol.LeaseStop(at=now - 200.0, idle_for_s=1.0, ended_at=-5.0)])
    seen = check_answer(status)
    assert seen.armed and seen.idle_s == 1800.0 and seen.stops == [good]
    assert seen.deadline_ts is None  # not a time: unknown, not refused with the rest
    assert seen.left_out == 4  # three stops and the deadline; the pod's -7 is not its say


def test_forged_lines_in_the_pods_lease_log_cost_only_themselves(
        pod: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Through the real CLI, on the real pod: the lease log (the pod user's to write)
    holds a stop dated ahead of the pod's clock, one dated inside a session gpuws had
    with it, one with a time no clock gives, and one honest stop."""
    _config(tmp_path, pod, monkeypatch)
    cfg = Path(os.environ["GPUWS_CONFIG"])  # a lease that will not fire during the test
    cfg.write_text(cfg.read_text().replace(f"idle_stop_minutes = {IDLE_MIN}",
                                           "idle_stop_minutes = 30"))
    ssh = str(pod.client_files(tmp_path / "ssh"))
    assert main(["start", "pod", "-F", ssh, "--wait", "30"]) == 0
    # A session long enough that a stop in its middle is clear of its ends' slack.
    assert main(["run", "pod", "-F", ssh, "-w", "cmd:sleep 6"]) == 0
    with Store() as store:
        (session,) = store.sessions()
        (start_row,) = store.host_actions("pod")
    assert session.ended is not None and session.ended - session.started > 6.0
    honest = start_row.started - 100.0  # (the same clock here: the pod is this machine)
    forged = [{"event": "stop", "ts": honest, "idle_for_s": 1800.0},
              {"event": "stopped", "ts": honest + 2.0},
              {"event": "stop", "ts": (session.started + session.ended) / 2,
               "idle_for_s": 1800.0},
              {"event": "stopped", "ts": session.ended},
              {"event": "stop", "ts": 1e300, "idle_for_s": 1.0},
              {"event": "stop", "ts": time.time() + 40.0, "idle_for_s": 1800.0},
              {"event": "stopped", "ts": time.time() + 41.0}]
    with open(pod.pod_cache / "lease" / "log", "a") as f:
        f.writelines(json.dumps(e) + "\n" for e in forged)
    capsys.readouterr()
    assert main(["doctor", "pod", "-F", ssh, "--json"]) == 0
    lease = json.loads(capsys.readouterr().out)["lease"]
    assert lease["armed"] and lease["said"].startswith("auto-stop "), lease
    assert lease["stops_recorded"] == 1 and lease["left_out"] == 1, lease
    with Store() as store:
        rows = store.host_actions("pod")
    assert [(r.action, r.by) for r in rows] == [("stop", "lease"), ("start", "gpuws")]
    assert abs(rows[0].started - honest) < 1.0 and abs(rows[0].ended - honest - 2.0) < 1.0
