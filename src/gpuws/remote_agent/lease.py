"""The pod's lease (issue 22): the pod stops itself when nobody uses it, laptop or not.

A laptop whose host has ``idle_stop_minutes`` sends a ``lease`` request; the agent writes
the settings under its cache (``lease/settings.json``), touches ``lease/renewed`` and makes
sure one lease process runs (``python3 AGENT lease``: its own session, no terminal, holding
an exclusive ``flock`` on ``lease/lock`` for its life, so two serves never start two). The
process stops the pod by running the ``stop_on_pod`` argv (no shell) once, for the idle
time in a row:

- no laptop is connected: every ``serve`` holds an exclusive ``flock`` on its own
  ``lease/conn/PID`` for as long as it lives, which the kernel drops however it ends
  (``kill -9``, a lost link that sshd closes);
- no run is going (unless ``stop_running``): the runs' own status (``runs.running_ids``);
- no laptop renewed the lease: every request a serve answers touches ``lease/renewed``.

What it did goes to ``lease/log`` as JSON lines (``armed``, ``stop``, ``stopped``,
``stop_failed``, ``released``), which :func:`status` reads back for ``doctor`` and the
dashboard. ``gpuws stop`` releases it (the settings removed; the process exits at its next
look). Standard library only, Python 3.8.
"""

import errno
import fcntl
import json
import math
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from . import runs

#: The longest idle time a lease accepts (a week), and the shortest (tests use seconds).
MAX_IDLE_S = 7 * 24 * 3600.0
MIN_IDLE_S = 1.0
#: How long the pod's stop command may take before it counts as failed.
STOP_TIMEOUT_S = 120.0
#: What a lease's argv may be.
MAX_ARGV = 64
MAX_ARG_LEN = 4096
#: How many of its stops ``status`` reports (protocol.MAX_LEASE_STOPS).
MAX_STOPS = 8
#: How much of the stop command's output is kept (its end, for the log's line); the rest
#: is read and dropped. A provider CLI stuck retrying once took the lease to 764 MB in
#: 4 s and killed it with MemoryError: the pod was never stopped and billed on.
STOP_TAIL_BYTES = 4096
#: After the stop command exits, how long its last output may take: a child it left
#: holding the pipe does not hold the lease.
STOP_DRAIN_S = 1.0
#: Between SIGTERM to the stop command's process group and SIGKILL to what is left.
STOP_TERM_GRACE_S = 5.0
#: Times a pod's log may carry (a unix time; protocol's bound for a "time", year 3237),
#: and idle times (its bound for seconds, ~30 years): past these the laptop refuses them.
MAX_TS = 4e10
MAX_IDLE_FOR_S = 1e9


def lease_dir() -> str:
    return os.path.join(runs.cache_root(), "lease")


def _path(name: str) -> str:
    return os.path.join(lease_dir(), name)


def check_settings(idle_s: Any, stop_argv: Any, stop_running: Any) -> Dict[str, Any]:
    """The settings a ``lease`` request carries, checked (the laptop's word, but a forged
    one must not make the pod run something odd or never stop).

    Raises:
        ValueError: a value out of range or of the wrong type.
    """
    if isinstance(idle_s, bool) or not isinstance(idle_s, (int, float)) \
            or not math.isfinite(idle_s) or not MIN_IDLE_S <= idle_s <= MAX_IDLE_S:
        raise ValueError("idle_s must be a number of seconds from %g to %g"
                         % (MIN_IDLE_S, MAX_IDLE_S))
    if not isinstance(stop_argv, list) or not 1 <= len(stop_argv) <= MAX_ARGV \
            or not all(isinstance(a, str) and 0 < len(a) <= MAX_ARG_LEN and "\0" not in a
                       for a in stop_argv):
        raise ValueError("stop_argv must be a list of 1-%d non-empty strings" % MAX_ARGV)
    if not isinstance(stop_running, bool):
        raise ValueError("stop_running must be true or false")
    return {"idle_s": float(idle_s), "stop_argv": list(stop_argv),
            "stop_running": stop_running}


def configure(idle_s: Any, stop_argv: Any, stop_running: Any) -> Dict[str, Any]:
    """Arm (or re-arm) the lease with these settings and renew it; returns :func:`status`."""
    settings = check_settings(idle_s, stop_argv, stop_running)
    runs.ensure_private_dir(runs.cache_root())
    runs.ensure_private_dir(lease_dir())
    tmp = _path("settings.json.tmp.%d" % os.getpid())  # two serves may arm at once
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(settings, f)
    os.replace(tmp, _path("settings.json"))
    renew()
    if not _held(_path("lock")):
        _log("armed", idle_s=settings["idle_s"], stop_argv=settings["stop_argv"])
        _spawn()
        for _ in range(50):  # until the process holds its lock (or it failed to start)
            if _held(_path("lock")):
                break
            time.sleep(0.02)
    return status()


def release() -> Dict[str, Any]:
    """Disarm: the lease process exits at its next look; returns :func:`status`."""
    try:
        os.unlink(_path("settings.json"))
        _log("released")
    except FileNotFoundError:
        pass
    return status()


def renew() -> None:
    """A laptop's contact: the idle time starts again (nothing to do without a lease)."""
    try:
        os.utime(_path("renewed"))
    except FileNotFoundError:
        if os.path.exists(_path("settings.json")):
            os.close(os.open(_path("renewed"), os.O_WRONLY | os.O_CREAT, 0o600))


def hold_connection() -> Optional[int]:
    """For a serve: a file locked for this process's life, which the lease reads as a
    laptop connected. Returns its descriptor (kept open), or None where it cannot be made."""
    try:
        runs.ensure_private_dir(runs.cache_root())
        runs.ensure_private_dir(lease_dir())
        runs.ensure_private_dir(_path("conn"))
        fd = os.open(os.path.join(_path("conn"), str(os.getpid())),
                     os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError:
        return None


def _held(path: str) -> bool:
    """Whether another process holds ``path``'s flock (a missing file: nobody)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(fd)
    return False


def connections() -> int:
    """Serves alive now; the files of those that ended are removed."""
    n = 0
    try:
        names = os.listdir(_path("conn"))
    except FileNotFoundError:
        return 0
    for name in names:
        path = os.path.join(_path("conn"), name)
        if _held(path):
            n += 1
        else:
            try:
                os.unlink(path)
            except OSError:
                pass
    return n


def running_runs(ended: Optional[Set[str]] = None) -> int:
    """Runs going now (``runs.running_ids``: the lease's looks must stay cheap on a pod of
    thousands of runs); ``ended`` carries the runs known to have ended from look to look."""
    return len(runs.running_ids(ended))


def _settings() -> Optional[Dict[str, Any]]:
    try:
        with open(_path("settings.json")) as f:
            raw = json.load(f)
        return check_settings(raw.get("idle_s"), raw.get("stop_argv"), raw.get("stop_running"))
    except (OSError, ValueError, AttributeError):
        return None


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _renewed(now: float) -> float:
    """When a laptop last renewed the lease, never after ``now``: a ``renewed`` file
    dated ahead (the clock stepped back, or a touch -d) is set to ``now``, else it would
    put the stop off by as long as it is ahead."""
    mtime = _mtime(_path("renewed"))
    if mtime > now:
        try:
            os.utime(_path("renewed"), (now, now))
        except OSError:
            pass  # still clamped below, for this look
        return now
    return mtime


def _log(event: str, **fields: Any) -> None:
    line = json.dumps(dict(fields, ts=time.time(), event=event))
    try:
        fd = os.open(_path("log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with open(fd, "a") as f:
            f.write(line + "\n")
    except OSError:
        pass


def read_log(limit: int = 50) -> List[Dict[str, Any]]:
    """The lease's last ``limit`` entries (a bounded tail: the log only grows by a few
    lines per arming)."""
    try:
        with open(_path("log"), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().splitlines()[-limit:]
    except OSError:
        return []
    out = []
    for raw in lines:
        try:
            entry = json.loads(raw.decode("utf-8", "replace"))
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def stops(log: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The stops in ``log`` (oldest first, the last ``MAX_STOPS``): each ``stop`` entry
    with how its command ended (``stopped``/``stop_failed`` after it; None when the log
    ends first, as when the pod went down under the command)."""
    out = []  # type: List[Dict[str, Any]]
    for entry in log:
        event, ts = entry.get("event"), entry.get("ts")
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) \
                or not 0 <= ts <= MAX_TS:
            continue  # one bad line is left out; the others are still reported
        if event == "stop":
            idle = entry.get("idle_for_s")
            if isinstance(idle, bool) or not isinstance(idle, (int, float)) \
                    or not math.isfinite(idle) or not 0 <= idle <= MAX_IDLE_FOR_S:
                idle = 0.0
            out.append({"at": float(ts), "idle_for_s": float(idle), "ok": None,
                        "ended_at": None})
        elif event in ("stopped", "stop_failed") and out and out[-1]["ok"] is None:
            out[-1]["ok"] = event == "stopped"
            out[-1]["ended_at"] = max(float(ts), out[-1]["at"])
    return out[-MAX_STOPS:]


def status() -> Dict[str, Any]:
    """The ``lease_status`` event's fields: armed or not, until when, and its last stops."""
    settings = _settings()
    alive = _held(_path("lock"))
    conns, active = connections(), running_runs()
    log = read_log(200)
    out = {"armed": bool(settings) and alive,
           "idle_s": settings["idle_s"] if settings else None,
           "deadline_ts": None, "connections": conns, "runs": active,
           "last_event": str(log[-1].get("event")) if log else None,
           "reason": None, "now_ts": time.time(), "stops": stops(log)}  # type: Dict[str, Any]
    if settings is None:
        out["reason"] = "no lease: gpuws has not armed one on this pod, or it was released"
    elif not alive:
        out["reason"] = "the lease process is not running (see %s)" % _path("log")
    elif not conns and not (active and not settings["stop_running"]):
        out["deadline_ts"] = _renewed(out["now_ts"]) + settings["idle_s"]
    return out


def _spawn() -> None:
    """The lease process, detached from this serve and its SSH session."""
    err = os.open(_path("process.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        subprocess.Popen([sys.executable, runs.agent_entry(), "lease"],
                         stdin=subprocess.DEVNULL, stdout=err, stderr=err, close_fds=True,
                         start_new_session=True, cwd=lease_dir())
    finally:
        os.close(err)


def main() -> int:
    """The lease process: one per pod, until it stops the pod or is released."""
    fd = os.open(_path("lock"), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another lease process runs
    busy_until = time.time()
    ended = set()  # type: Set[str]
    while True:
        settings = _settings()
        if settings is None:
            return 0  # released
        now = time.time()
        conns, active = connections(), running_runs(ended)
        if conns or (active and not settings["stop_running"]):
            busy_until = now
        busy_until = min(busy_until, now)  # (a clock stepped back: not busy in the future)
        since = max(busy_until, _renewed(now))
        if now - since >= settings["idle_s"]:
            _log("stop", idle_since=since, idle_for_s=now - since, idle_s=settings["idle_s"],
                 runs=active, argv=settings["stop_argv"])
            try:
                code, line, seen = run_stop(settings["stop_argv"], STOP_TIMEOUT_S)
            except Exception as exc:  # (a read that failed): logged, never the lease's end
                code, line, seen = None, "%s: %s" % (type(exc).__name__, exc), 0
            if code == 0:
                _log("stopped", output_bytes=seen)
                try:
                    os.unlink(_path("settings.json"))
                except OSError:
                    pass
                return 0
            # Logged as what it was (the pod still bills): the lease stays armed and tries
            # again after another idle period.
            _log("stop_failed", code=code, line=line[:300], output_bytes=seen)
            busy_until = time.time()
        time.sleep(min(max(settings["idle_s"] / 20.0, 0.2), 5.0))


def run_stop(argv: List[str], timeout_s: float) -> Tuple[Optional[int], str, int]:
    """Run the pod's stop command, bounded in time and memory.

    It runs in a process group of its own; its stdout and stderr are read as they come and
    only the last :data:`STOP_TAIL_BYTES` kept. Past ``timeout_s`` the whole group gets
    SIGTERM, then SIGKILL. Once the command itself exits it is judged by its exit status,
    even if a child it left still holds the pipe.

    Returns:
        ``(exit status or None, the last line it wrote or why it failed, bytes it wrote)``.
    """
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, close_fds=True,
                                start_new_session=True)
    except (OSError, ValueError) as exc:
        return None, "%s: %s" % (type(exc).__name__, exc), 0
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    tail = bytearray()
    seen = 0
    deadline = time.monotonic() + timeout_s
    exited_at = None  # type: Optional[float]
    eof = False
    try:
        while True:
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and (eof or now - exited_at >= STOP_DRAIN_S):
                break
            if now >= deadline:
                _end_group(proc)
                return None, "timed out after %g s (%d bytes of output)" % (timeout_s, seen), \
                    seen
            if eof:  # the pipe closed, the command still runs: wait for its exit only
                try:
                    proc.wait(timeout=min(deadline - now, 0.2))
                except subprocess.TimeoutExpired:
                    pass
                continue
            ready, _, _ = select.select([fd], [], [], min(deadline - now, 0.2))
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    eof = True
                seen += len(chunk)
                tail += chunk
                del tail[:-STOP_TAIL_BYTES]
    finally:
        proc.stdout.close()
    lines = tail.decode("utf-8", "replace").strip().splitlines()
    return proc.returncode, (lines[-1] if lines else ""), seen


def _end_group(proc: "subprocess.Popen[bytes]") -> None:
    """SIGTERM the command's process group, then SIGKILL what is left of it after a grace
    (the command, or children of it that ignore SIGTERM)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except OSError:
            pass  # the group is gone already (or not ours to signal: a sudo)
        try:
            proc.wait(timeout=STOP_TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            pass  # (after SIGKILL: a process not ours to kill is left, the lease goes on)
