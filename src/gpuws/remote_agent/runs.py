"""Durable runs on the pod: run directories, the event log, starting/listing/cancelling workers.

A run lives in ``~/.cache/gpuws/runs/<run_id>/``:

- ``spec.json``      the RunSpec as sent
- ``events.ndjson``  every run event, one line each; line N has ``seq`` N (gap-free from 0)
- ``worker.pid``     the detached worker's pid (its own session and process group)
- ``worker.log``     the worker's own stderr (tracebacks land here, not in a pipe)
- ``artifacts/``     files the run produced (``$GPUWS_ARTIFACT_DIR`` for the workload)

Only the worker appends to ``events.ndjson``; ``serve`` only reads it. The one exception
is a worker that died without writing ``run_finished``: ``serve`` appends that event
itself once the worker is gone, so every run ends with a final status.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import stat
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from . import wire
from .safefiles import open_regular, read_regular, read_tail

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
FINISHED_MARK = b'"type":"run_finished"'


def cache_root() -> str:
    """The pod-side cache; ``GPUWS_POD_CACHE`` overrides (the bootstrap honours it too)."""
    return os.environ.get("GPUWS_POD_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                             "gpuws")


def runs_root() -> str:
    return os.path.join(cache_root(), "runs")


def ensure_private_dir(path: str) -> None:
    """Create ``path`` (0700) or check an existing one is ours and not writable by others.

    On a shared pod another user could pre-create our cache directory and swap files
    under us; refusing such a directory is the only safe answer.
    """
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise PermissionError("%s is not a plain directory" % path)
    if st.st_uid != os.getuid():
        raise PermissionError("%s is owned by uid %d, not by us (uid %d)"
                              % (path, st.st_uid, os.getuid()))
    if st.st_mode & 0o022:
        os.chmod(path, st.st_mode & ~0o077 & 0o7777)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def run_dir(run_id: str) -> str:
    if not RUN_ID_RE.match(run_id):
        raise ValueError("invalid run id %r" % run_id)
    return os.path.join(runs_root(), run_id)


class EventLog:
    """The worker's append-only event log; assigns ``seq`` and writes one line per event."""

    def __init__(self, run_id: str, path: str, reserve: int = 0) -> None:
        self.run_id = run_id
        self.path = path
        # Resume numbering if the file exists (a worker restarted on the same dir).
        self.seq = count_lines(path)
        # Never a FIFO or a link the workload put in the log's place: opening either
        # could block or write elsewhere.
        self._fd, _st = open_regular(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        self._lock = threading.Lock()
        #: The first write that failed (disk full, quota, file size limit), if any.
        self.write_error: Optional[OSError] = None
        self.reserve_path = path + ".reserve"
        if reserve > 0:
            make_reserve(self.reserve_path, reserve)

    def append(self, event: Dict[str, Any]) -> int:
        with self._lock:
            # run_id and seq first: readers find them without parsing the whole line.
            body: Dict[str, Any] = {"type": event["type"], "run_id": self.run_id,
                                    "seq": self.seq}
            for key, value in event.items():
                if key not in body:
                    body[key] = value
            if "ts" not in body:
                body["ts"] = time.time()
            line = wire.dumps(body)
            if len(line) > wire.MAX_LINE:
                # The laptop drops a line over its limit, and a seq would be missing for
                # good; say what was too big in its place.
                line = wire.dumps({
                    "type": "log", "run_id": self.run_id, "seq": self.seq,
                    "ts": body["ts"], "level": "warning",
                    "message": "a %s event of %d bytes was over the %d-byte line limit and "
                               "was dropped" % (str(event["type"])[:40], len(line),
                                                wire.MAX_LINE)})
            start = os.lseek(self._fd, 0, os.SEEK_END)
            if start and os.pread(self._fd, 1, start - 1) != b"\n":
                # Someone else (the workload: $GPUWS_RUN_DIR is in its environment) left
                # a line without its end; appended to it, this event would be dropped with
                # that line. A line end first keeps the event on a line of its own.
                line = b"\n" + line
            written = 0
            try:
                while written < len(line):
                    written += os.write(self._fd, line[written:])
            except OSError as exc:
                if self.write_error is None:
                    self.write_error = exc
                # A full disk takes part of a line and refuses the rest. The space set
                # aside at start finishes the line (a follower may already have read its
                # first half); without it, the torn line is cut off so the log stays whole
                # lines. Either way the caller learns the disk is full.
                if written and self.release_reserve():
                    written = self._finish_line(line, written)
                    if written == len(line):
                        self.seq += 1
                if 0 < written < len(line):
                    try:
                        os.ftruncate(self._fd, start)
                    except OSError:
                        pass
                raise
            self.seq += 1
            return self.seq - 1

    def _finish_line(self, line: bytes, written: int) -> int:
        try:
            while written < len(line):
                written += os.write(self._fd, line[written:])
        except OSError:
            pass
        return written

    def release_reserve(self) -> bool:
        """Free the space set aside at start, so the final event fits on a full disk."""
        try:
            os.unlink(self.reserve_path)
            return True
        except OSError:
            return False

    def sync(self) -> None:
        with self._lock:
            os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            try:
                os.fsync(self._fd)
            except OSError:
                pass
            os.close(self._fd)
        self.release_reserve()  # a finished run keeps no ballast


def make_reserve(path: str, size: int) -> None:
    """Set ``size`` bytes of disk aside in ``path`` (best effort: a full disk gets none).

    Written, not sparse: the blocks must really be taken, or freeing them frees nothing.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:
        return
    try:
        block = b"\0" * 65536
        left = size
        while left > 0:
            left -= os.write(fd, block[:left])
    except OSError:
        pass
    finally:
        os.close(fd)


def worker_log_tail(rdir: str) -> str:
    """The last line the worker wrote to its own log (its dying words), or ``""``."""
    try:
        lines = read_tail(os.path.join(rdir, "worker.log"), 4096).decode(
            "utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1].strip()[:300] if lines else ""


def count_lines(path: str) -> int:
    """Newlines in ``path`` up to its size when opened (0 when it does not exist).

    Raises:
        NotRegular: ``path`` is a FIFO, device or link (what a workload may put there).
    """
    try:
        fd, st = open_regular(path)
    except FileNotFoundError:
        return 0
    try:
        count, left = 0, st.st_size
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            count += chunk.count(b"\n")
            left -= len(chunk)
        return count
    finally:
        os.close(fd)


def read_pid(rdir: str) -> Optional[int]:
    try:
        return int(read_regular(os.path.join(rdir, "worker.pid"), 64).strip() or b"0") or None
    except (OSError, ValueError):
        return None


def pid_alive(pid: Optional[int], run_id: str) -> bool:
    """Whether ``pid`` is still our worker (guards against pid reuse through cmdline)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            cmdline = f.read()
        # Empty while the worker is still inside execve (Popen returns once exec is under
        # way, before the new argv is mapped): that is our worker starting, not pid reuse.
        if cmdline and run_id.encode() not in cmdline:
            return False
        with open("/proc/%d/stat" % pid, "rb") as f:
            # A zombie (our own unreaped child) is not alive.
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return True


def last_line(path: str) -> bytes:
    try:
        lines = read_tail(path, 65536).splitlines()
        return lines[-1] if lines else b""
    except OSError:
        return b""


def run_status(run_id: str) -> Dict[str, Any]:
    rdir = run_dir(run_id)
    events = os.path.join(rdir, "events.ndjson")
    try:
        spec = json.loads(read_regular(os.path.join(rdir, "spec.json"), wire.MAX_LINE))
        if not isinstance(spec, dict):
            spec = {}
    except (OSError, ValueError, RecursionError):
        spec = {}
    last = last_line(events)
    pid = read_pid(rdir)
    if FINISHED_MARK in last:
        try:
            status = str(json.loads(last.decode()).get("status", "finished"))
        except ValueError:
            status = "finished"
    elif pid_alive(pid, run_id):
        status = "running"
    else:
        status = "lost"
    try:
        started = os.stat(os.path.join(rdir, "spec.json")).st_mtime
    except OSError:
        started = 0.0
    try:
        last_seq = count_lines(events) - 1
    except OSError:
        last_seq = -1
    return {"run_id": run_id, "workload": str(spec.get("workload", "?"))[:4096],
            "status": status, "started": started, "last_seq": last_seq, "pid": pid}


def list_runs() -> List[Dict[str, Any]]:
    root = runs_root()
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if RUN_ID_RE.match(name) and os.path.isdir(os.path.join(root, name)):
            out.append(run_status(name))
    return out


def running_ids(ended: Optional[Set[str]] = None) -> List[str]:
    """The runs :func:`run_status` would call ``running`` now, read cheaply.

    The lease looks every 0.2-5 s; :func:`list_runs` reads every run's ``spec.json`` and
    counts every ``events.ndjson``'s lines, which on a pod of 2,000 runs with a few long
    logs kept a core busy. This reads only what decides "running": the worker's pid
    first (a dead worker is not running, whatever its log says), then, for a live one,
    the log's last line (``run_finished`` there: finished, as in :func:`run_status`).

    ``ended``: run ids known to have ended, skipped; ids found ended are added, so a
    caller that passes the same set on every call reads only the runs that may still
    go. A run that ended stays ended: ``worker.pid`` is written once, in one write, when
    the run starts (:func:`start_worker`), and its worker does not come back. A run
    without a pid yet (starting) is looked at again next time.
    """
    root = runs_root()
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if ended is not None and name in ended:
            continue
        if not RUN_ID_RE.match(name):
            continue
        rdir = os.path.join(root, name)
        pid = read_pid(rdir)
        if pid is None:
            if ended is not None and not os.path.isdir(rdir):
                ended.add(name)  # a stray file, never a run
            continue
        if pid_alive(pid, name) and FINISHED_MARK not in last_line(
                os.path.join(rdir, "events.ndjson")):
            out.append(name)
        elif ended is not None:
            ended.add(name)
    return sorted(out)


def start_worker(spec: Dict[str, Any], run_id: Optional[str] = None,
                 fork_session: Optional[str] = None) -> Dict[str, Any]:
    """Create the run dir and start a detached worker; returns the run's status dict.

    ``fork_session``: ``FD:DIR`` of serve's fork-server lifeline (``forkserver.Lifeline``)
    for a run that uses it: the worker inherits that pipe's read end, nothing else.
    """
    ensure_private_dir(cache_root())
    ensure_private_dir(runs_root())
    run_id = run_id or new_run_id()
    rdir = run_dir(run_id)
    os.mkdir(rdir, 0o700)  # fails if the id is taken: never mix two runs' events
    os.mkdir(os.path.join(rdir, "artifacts"), 0o700)
    tmp = os.path.join(rdir, "spec.json.tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(spec, f)
    os.replace(tmp, os.path.join(rdir, "spec.json"))
    log = os.open(os.path.join(rdir, "worker.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        # start_new_session: the worker gets its own session and process group, so a
        # dropped SSH link (SIGHUP to the session) does not reach it and Cancel can
        # kill the whole group (ncu, the workload) at once.
        env: Optional[Dict[str, str]] = None
        pass_fds: Tuple[int, ...] = ()
        if fork_session is not None:
            env = dict(os.environ, GPUWS_FORKSERVER=fork_session)
            pass_fds = (int(fork_session.split(":", 1)[0]),)
        proc = subprocess.Popen(
            [sys.executable, agent_entry(), "worker", run_id],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, close_fds=True,
            start_new_session=True, cwd=rdir, env=env, pass_fds=pass_fds,
        )
    finally:
        os.close(log)
    pid_fd = os.open(os.path.join(rdir, "worker.pid"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                     0o600)
    with open(pid_fd, "w") as f:
        f.write(str(proc.pid))
    _REAPER.add(proc)
    return {"run_id": run_id, "run_dir": rdir, "pid": proc.pid}


def agent_entry() -> str:
    """The path that starts this agent again (the cached .pyz, or the package in tests)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None) or sys.argv[0]
    if path.endswith("__main__.py"):
        path = os.path.dirname(path)
        if os.path.basename(path) == "remote_agent":
            return path
    return path


class _Reaper:
    """Reaps finished workers so they do not linger as zombies while ``serve`` lives."""

    def __init__(self) -> None:
        self._procs: List["subprocess.Popen[bytes]"] = []
        self._lock = threading.Lock()

    def add(self, proc: "subprocess.Popen[bytes]") -> None:
        with self._lock:
            self._procs = [p for p in self._procs if p.poll() is None]
            self._procs.append(proc)

    def poll(self) -> None:
        with self._lock:
            self._procs = [p for p in self._procs if p.poll() is None]


_REAPER = _Reaper()


def cancel_run(run_id: str, grace_s: float = 3.0) -> Dict[str, Any]:
    rdir = run_dir(run_id)
    if not os.path.isdir(rdir):
        raise FileNotFoundError("no run %s on this pod" % run_id)
    pid = read_pid(rdir)
    if pid_alive(pid, run_id):
        assert pid is not None
        _signal_group(pid, signal.SIGTERM)
        deadline = time.time() + grace_s
        while time.time() < deadline and pid_alive(pid, run_id):
            _REAPER.poll()
            time.sleep(0.05)
        if pid_alive(pid, run_id):
            _signal_group(pid, signal.SIGKILL)
            time.sleep(0.1)
            _REAPER.poll()
    finish_if_dead(run_id, "cancelled", "cancelled by request")
    return run_status(run_id)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def finish_if_dead(run_id: str, status: str, error: str) -> bool:
    """Append ``run_finished`` for a worker that died without writing one."""
    rdir = run_dir(run_id)
    path = os.path.join(rdir, "events.ndjson")
    _REAPER.poll()
    if FINISHED_MARK in last_line(path) or pid_alive(read_pid(rdir), run_id):
        return False
    log = EventLog(run_id, path)
    # A worker that died on a full disk leaves its reserve behind: free it for this event.
    log.release_reserve()
    tail = worker_log_tail(rdir)
    if tail and status == "failed":
        error = "%s; worker.log ends with: %s" % (error, tail)
    try:
        started = os.stat(os.path.join(rdir, "spec.json")).st_mtime
        log.append(wire.make("run_finished", status=status, wall_s=time.time() - started,
                             error=error))
    finally:
        log.close()
    return True


#: How much of the end of a dropped (oversized) line is kept to look for the worker's own
#: event in it (one appended to a line the workload left open, in the instant between the
#: worker's check and its write; ``EventLog.append``). An output event is at most ~100 KB.
SALVAGE_BYTES = 1 << 20


def salvage(tail: bytes, run_id: str) -> Optional[bytes]:
    """The worker's event at the end of a dropped line, if one is there whole (with its
    line end), else None. Its line begins as ``EventLog`` writes every line: the type, then
    this run's id and a seq."""
    start = tail.rfind(b'{"type":"')
    if start < 0:
        return None
    line = tail[start:]
    if b'"run_id":"%s","seq":' % run_id.encode("ascii") not in line[:200]:
        return None
    try:
        event = json.loads(line.decode("ascii"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(event, dict) or event.get("run_id") != run_id:
        return None
    return line + b"\n"


def _skip_lines(data: bytes, n: int) -> bytes:
    """``data`` without its first ``n`` lines (each ending in a newline)."""
    cut = 0
    for _ in range(n):
        cut = data.index(b"\n", cut) + 1
    return data[cut:]


def follow(run_id: str, from_seq: int, send_raw: Callable[[bytes], None],
           stop: threading.Event, follow_live: bool = True, poll_s: float = 0.05) -> int:
    """Forward lines ``from_seq``.. of a run's log; keep following until ``run_finished``.

    Returns the next seq to send. Only whole lines are forwarded (the worker may be in
    the middle of writing the last one), several at a time: each ``send_raw`` call gets
    the whole lines read so far, so it never splits a line.

    The workload can write its own run's log (``$GPUWS_RUN_DIR`` is in its environment):
    a log that is not a regular file (a FIFO, a link to ``/dev/zero``) ends the follow
    with an ``error`` event instead of blocking it, and a line over the wire's limit is
    dropped (counted as a line, reported once) instead of held in memory.
    """
    rdir = run_dir(run_id)
    path = os.path.join(rdir, "events.ndjson")
    seq = 0
    pending = b""
    skipping = False  # inside a line over the limit, dropped up to its newline
    tail = b""  # the last SALVAGE_BYTES of that line
    dropped = 0
    f = None
    idle_since = time.time()

    def refuse(why: str) -> None:
        send_raw(wire.dumps(wire.error(
            "run_log_unreadable", "The run's event log cannot be followed",
            "run %s: %s" % (run_id, why),
            "the workload replaced or damaged its own run's events.ndjson; the events "
            "already received are kept")))

    try:
        while not stop.is_set():
            if f is None:
                try:
                    fd, _st = open_regular(path)
                except FileNotFoundError:
                    if not follow_live:
                        return seq
                    time.sleep(poll_s)
                    continue
                except OSError as exc:
                    refuse("events.ndjson %s" % (exc.strerror or exc))
                    return seq
                f = os.fdopen(fd, "rb")
            chunk = f.read(1 << 20)
            if chunk:
                idle_since = time.time()
                pending += chunk
                rescued = b""
                if skipping:
                    nl = pending.find(b"\n")
                    if nl < 0:
                        tail, pending = (tail + pending)[-SALVAGE_BYTES:], b""
                        continue
                    rescued = salvage((tail + pending[:nl])[-SALVAGE_BYTES:], run_id) or b""
                    pending, skipping, tail = pending[nl + 1:], False, b""
                    if not rescued:
                        seq += 1  # the dropped line had a seq too; skipping it keeps count
                end = pending.rfind(b"\n") + 1
                whole, pending = rescued + pending[:end], pending[end:]
                if len(pending) > wire.MAX_LINE:
                    pending, skipping, tail = b"", True, pending[-SALVAGE_BYTES:]
                    dropped += 1
                    if dropped == 1:
                        refuse("a line over %d bytes was dropped (more are counted, not "
                               "reported)" % wire.MAX_LINE)
                count = whole.count(b"\n")
                if seq < from_seq:
                    whole = _skip_lines(whole, min(from_seq - seq, count))
                seq += count
                if len(whole) > wire.MAX_LINE:
                    # An oversized line whose end came in the read that took it over the
                    # limit: dropped here too, the worker's event at its end kept.
                    kept = []
                    for line in whole.split(b"\n")[:-1]:
                        if len(line) > wire.MAX_LINE:
                            dropped += 1
                            if dropped == 1:
                                refuse("a line over %d bytes was dropped (more are counted, "
                                       "not reported)" % wire.MAX_LINE)
                            kept.append(salvage(line[-SALVAGE_BYTES:], run_id) or b"")
                        else:
                            kept.append(line + b"\n")
                    whole = b"".join(kept)
                if whole:
                    # All whole lines of a chunk in one write: one line per write made
                    # sshd send one small SSH packet per event, and per-packet cost (not
                    # bytes) then bounded a replay to ~25 MB/s.
                    send_raw(whole)
                    if FINISHED_MARK in whole:
                        return seq
                continue
            if not follow_live:
                return seq
            if pending and os.fstat(f.fileno()).st_size < f.tell():
                # The worker cut off a line torn by a full disk (EventLog.append): what we
                # hold of it is gone from the file; read again from the last whole line.
                f.seek(f.tell() - len(pending))
                pending = b""
            if time.time() - idle_since > 1.0:
                # Quiet for a while: is the worker still there?
                idle_since = time.time()
                try:
                    if finish_if_dead(run_id, "failed",
                                      "the worker process died (killed, or the pod "
                                      "restarted); see worker.log in the run directory"):
                        continue
                except OSError as exc:
                    refuse("its final event cannot be written (%s)" % (exc.strerror or exc))
                    return seq
            time.sleep(poll_s)
        return seq
    finally:
        if f is not None:
            f.close()
