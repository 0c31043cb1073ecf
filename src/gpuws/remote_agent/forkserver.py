"""The fork server: watch's Tier-1 children start from a pre-imported parent (issue 25).

A fresh ``python agent.pyz child tier1 RUN`` spends seconds importing torch, Triton and
CuPy before it touches the GPU (5.0-7.6 s for ``import torch`` alone on the H100
machine), every iteration of ``gpuws watch``. The fork server is a parent that imports
them once, under the same interpreter, environment and workspace, **never initialises
CUDA** (a CUDA context does not survive a fork), and forks one fresh child per
iteration. The child then does exactly what ``agent child MODE RUN_ID`` does (the same
``__main__.main``, the same environment, working directory and pipes), so one version's
CUDA state, imported user modules and globals never reach the next: each is its own
process, and the user's own code is imported by the child, never by the parent.

Bounds, so it is safe on a shared pod:

- **Per user and per session.** It listens on a Unix socket in a 0700 directory of the
  person's own cache that ``serve`` made for its connection, refuses any peer whose uid
  is not its own (``SO_PEERCRED``), and serves only the ``serve`` that made it.
- **Dies with the watch.** ``serve`` holds the write end of a pipe (the lifeline) whose
  read end the server watches: when ``serve`` ends (the connection closed, or it was
  killed), the server stops accepting, lets running children finish, and exits. It also
  exits after :data:`IDLE_S` without a request.
- **Confined to the run's workspace.** One server per interpreter, workspace and
  environment; it runs only ``child`` modes, for run directories that exist, in the
  working directory it was started for.
- **A child's crash is the child's.** Each child is its own process (and process
  group); the server only reaps it and reports its exit status (a signal as Popen says
  it, negative). A worker that goes away (cancelled, killed) takes its child with it:
  its connection closing kills the child's group.

The worker talks to it through :class:`ForkedProc`, which looks like the
``subprocess.Popen`` that :func:`procs.run_streaming` otherwise makes, so everything that
streams output, events, timeouts and cancellation is the same code for both launchers.

Standard library only, Python 3.8: torch and friends are imported by the server process
at run time, only if the pod has them.
"""

from __future__ import annotations

import array
import errno
import fcntl
import hashlib
import importlib
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback
from typing import Any, Dict, List, MutableMapping, Optional, Sequence, Tuple

from .procs import Spawn

#: ``FD:DIR`` given by ``serve`` to the workers of runs that asked for the fork server:
#: the lifeline's read end and the session's socket directory.
SESSION_ENV = "GPUWS_FORKSERVER"
#: What the parent imports once, if the pod has it (in this order: CuPy first, as the
#: Tier-1 child imports it first).
PRELOAD = ("cupy", "torch", "triton")
#: Environment keys that differ from run to run and are read only by the child: one
#: server serves runs whose environments differ only in these (the child gets the run's
#: whole environment, these included, before anything reads it).
PER_RUN_ENV = frozenset(("GPUWS_RUN_ID", "GPUWS_RUN_DIR", "GPUWS_ARTIFACT_DIR",
                         "GPUWS_EVENT_FD", "CUDA_VISIBLE_DEVICES"))
#: Seconds a worker waits for a new server to import and answer (torch from a cold disk
#: has been seen near a minute); past it, the run's child starts the ordinary way.
READY_TIMEOUT_S = 300.0
#: Seconds without a request after which a server ends on its own.
IDLE_S = 1800.0
#: Longest request (the run's environment is most of it).
MAX_REQUEST = 1 << 20
#: Pipes a request carries: the child's stdout, stderr and (optionally) event pipe.
MAX_FDS = 3
#: ``sockaddr_un`` holds 108 bytes; a longer path is reached through its directory's fd.
MAX_SOCK_PATH = 100

_SESSION: Dict[str, Any] = {"fd": None, "dir": None}


# ----------------------------------------------------------------------------- serve's side
class Lifeline:
    """What ``serve`` keeps for its connection: the pipe and the socket directory."""

    def __init__(self) -> None:
        from .runs import cache_root, ensure_private_dir

        parent = os.path.join(cache_root(), "fork")
        ensure_private_dir(cache_root())
        ensure_private_dir(parent)
        _prune(parent)
        # One directory per serve: no two connections (or users) ever share a server.
        self.dir = os.path.join(parent, "%d-%s" % (os.getpid(), os.urandom(4).hex()))
        os.mkdir(self.dir, 0o700)
        self.read_fd, self.write_fd = os.pipe()  # both close-on-exec: only the read end
        # travels, to the workers started with it (pass_fds).

    def env_value(self) -> str:
        return "%d:%s" % (self.read_fd, self.dir)

    def close(self) -> None:
        """serve is ending: its servers drain and go; the directory goes once empty."""
        for fd in (self.write_fd, self.read_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        import shutil

        # A server still draining there has already stopped listening: what it leaves
        # (its lock and log) it only ever unlinks, ignoring a file already gone.
        shutil.rmtree(self.dir, ignore_errors=True)


def _prune(parent: str) -> None:
    """Remove what the sessions of serves that are gone left (a killed serve cannot)."""
    import shutil

    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        pid = name.split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # that serve lives (or its pid was reused: left alone either way)
        except ProcessLookupError:
            pass
        except OSError:
            continue
        shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def take_session(environ: "MutableMapping[str, str]") -> None:
    """In the worker: take (and remove) what serve passed, so no child inherits it."""
    value = environ.pop(SESSION_ENV, None)
    if not value or ":" not in value:
        return
    fd, _, path = value.partition(":")
    try:
        _SESSION["fd"] = int(fd)
        os.fstat(int(fd))
    except (ValueError, OSError):
        _SESSION["fd"] = None
        return
    _SESSION["dir"] = path


# ----------------------------------------------------------------------------- worker's side
def session_probe() -> Optional[Dict[str, Any]]:
    """The pod's probe for this session's runs: taken by its first run, read by the next.

    The probe (the workloads' interpreter and its packages, the GPUs' architecture, the
    profilers) took 0.18 s of each 0.5 s iteration of ``gpuws watch`` on the test
    machine; none of it changes between two saves. None outside a session (probe anew).
    """
    from .pod.probe import probe
    from .safefiles import read_json_dict, write_json_best_effort

    if _SESSION["dir"] is None:
        return None
    path = os.path.join(str(_SESSION["dir"]), "probe.json")
    facts = read_json_dict(path)
    if not facts:
        facts = probe()
        write_json_best_effort(path, facts)
    return facts


def launcher_for(ctx: Any) -> Optional[Spawn]:
    """A spawn function for ``ctx``'s children through the session's fork server (started
    now if this is the first run that needs it), or None: start them the ordinary way.
    Never raises: whatever stops the server, the run still measures (a log line says why).
    """
    from . import wire
    from .pod import pythons
    from .runs import agent_entry

    if _SESSION["fd"] is None or _SESSION["dir"] is None:
        ctx.emit(wire.make("log", level="info", message=(
            "the Tier-1 child starts afresh: no fork server in this session (only the "
            "runs of `gpuws watch` keep one)")))
        return None
    interp = pythons.interpreter(ctx.python_choice)
    entry = agent_entry()
    sock = socket_path(str(_SESSION["dir"]), server_key(interp, entry, ctx.work_dir,
                                                         ctx.env))
    try:
        started = ensure_server(sock, interp, entry, ctx.work_dir, ctx.env,
                                int(_SESSION["fd"]))
    except ServerError as exc:
        ctx.emit(wire.make("log", level="warning", message=(
            "the fork server did not start (%s): the Tier-1 child starts afresh, "
            "importing everything again" % str(exc)[:500])))
        return None
    ctx.emit(wire.make("log", level="info", message=(
        "the Tier-1 child is forked from this watch's pre-imported parent (%s)"
        % (started or "already running"))))

    def spawn(argv: Sequence[str], cwd: str, env: Dict[str, str],
              pass_fds: Tuple[int, ...]) -> "ForkedProc":
        return ForkedProc.start(sock, argv, cwd, env, pass_fds)
    return spawn


def server_key(interp: str, entry: str, work_dir: str, env: Dict[str, str]) -> str:
    """Which server fits: same interpreter, agent, workspace and environment."""
    kept = sorted((k, v) for k, v in env.items() if k not in PER_RUN_ENV)
    raw = json.dumps([interp, entry, os.path.realpath(work_dir), kept])
    return hashlib.sha256(raw.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def socket_path(directory: str, key: str) -> str:
    return os.path.join(directory, key + ".s")


class ServerError(Exception):
    """The fork server could not be reached or started."""


def _address(path: str) -> Tuple[str, Optional[int]]:
    """A path ``bind``/``connect`` accept: the path itself, or (over the 108 bytes a Unix
    socket address holds) the same file through ``/proc/self/fd`` of its directory."""
    if len(path.encode("utf-8", "surrogateescape")) <= MAX_SOCK_PATH:
        return path, None
    dfd = os.open(os.path.dirname(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    return "/proc/self/fd/%d/%s" % (dfd, os.path.basename(path)), dfd


def connect(path: str) -> socket.socket:
    addr, dfd = _address(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(addr)
    except BaseException:
        sock.close()
        raise
    finally:
        if dfd is not None:
            os.close(dfd)
    return sock


def ensure_server(sock: str, interp: str, entry: str, work_dir: str, env: Dict[str, str],
                  lifeline_fd: int, timeout_s: float = READY_TIMEOUT_S) -> str:
    """Reach the server at ``sock``, or start it and wait until it has imported.

    Returns:
        "" when it was running, else what the new server preloaded, in words.

    Raises:
        ServerError: it could not be started, or did not answer in ``timeout_s``.
    """
    lock = os.open(sock[:-2] + ".lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two workers never start the same server twice
        try:
            connect(sock).close()
            return ""
        except (FileNotFoundError, ConnectionRefusedError):
            pass  # none yet, or one that ended (its socket file left): start one
        except OSError as exc:
            raise ServerError("cannot reach it at %s: %s" % (sock, exc)) from exc
        return _start(sock, interp, entry, work_dir, env, lifeline_fd, timeout_s)
    finally:
        os.close(lock)


def _start(sock: str, interp: str, entry: str, work_dir: str, env: Dict[str, str],
           lifeline_fd: int, timeout_s: float) -> str:
    from . import procs

    try:
        os.unlink(sock)
    except FileNotFoundError:
        pass
    log_path = sock[:-2] + ".log"
    ready_r, ready_w = os.pipe()
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    server_env = {k: v for k, v in env.items() if k not in PER_RUN_ENV}
    try:
        # Its own session: a signal to the worker's process group (cancel) is not one
        # to the server, which serves the next iteration.
        subprocess.Popen([interp, entry, "forkserver", sock, work_dir, str(lifeline_fd),
                          str(ready_w)], cwd=work_dir, env=server_env,
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         pass_fds=(lifeline_fd, ready_w), start_new_session=True)
    except OSError as exc:
        os.close(ready_r)
        raise ServerError("%s: %s" % (interp, exc)) from exc
    finally:
        os.close(ready_w)
        os.close(log)
    deadline = time.monotonic() + timeout_s
    got = b""
    try:
        sel = selectors.DefaultSelector()
        sel.register(ready_r, selectors.EVENT_READ)
        while b"\n" not in got:
            if time.monotonic() > deadline:
                raise ServerError("no answer in %.0f s" % timeout_s)
            if procs.CANCELLED["flag"]:
                raise ServerError("the run was cancelled")
            if sel.select(timeout=0.2):
                data = os.read(ready_r, 65536)
                if not data:
                    break
                got += data
        sel.close()
    finally:
        os.close(ready_r)
    try:
        answer = json.loads(got.decode("utf-8").splitlines()[0])
    except (ValueError, IndexError, UnicodeDecodeError):
        answer = None
    if not isinstance(answer, dict) or not answer.get("ready"):
        why = answer.get("error") if isinstance(answer, dict) else None
        raise ServerError(str(why or _log_tail(log_path) or "it exited without a word"))
    loaded = answer.get("preloaded") or {}
    names = [str(k) for k, v in sorted(loaded.items()) if v == "imported"]
    return "imported once: %s" % (", ".join(names) or "none of %s" % ", ".join(PRELOAD))


def _log_tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            lines = f.read()[-4000:].decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


class ForkedProc:
    """A child the fork server forked, as ``procs.run_streaming`` uses a Popen: its
    stdout/stderr pipes, ``poll``/``wait``/``kill``/``send_signal`` and ``returncode``.

    Signals go through the server, which alone knows whether the child has been reaped
    (a pid signalled after that could be someone else's).
    """

    def __init__(self, conn: socket.socket, pid: int, stdout: Any, stderr: Any) -> None:
        self.conn = conn
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: Optional[int] = None

    @classmethod
    def start(cls, sock: str, argv: Sequence[str], cwd: str, env: Dict[str, str],
              pass_fds: Tuple[int, ...]) -> "ForkedProc":
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        fds = [out_w, err_w, *pass_fds]
        conn: Optional[socket.socket] = None
        try:
            conn = connect(sock)
            body = json.dumps({"argv": list(argv), "cwd": cwd, "env": env,
                               "event_fd": env.get("GPUWS_EVENT_FD")}).encode("utf-8")
            conn.sendmsg([body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                   array.array("i", fds))])
            answer = _recv_json(conn, None)
            if answer is None or "pid" not in answer:
                raise OSError(errno.EPROTO, "the fork server refused: %s"
                              % (answer or {}).get("error", "no answer"))
            pid = int(answer["pid"])
        except BaseException:
            for fd in (out_r, err_r):
                os.close(fd)
            if conn is not None:
                conn.close()
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        return cls(conn, pid, open(out_r, "rb", buffering=0), open(err_r, "rb", buffering=0))

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            self._read(0.0)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired("forked child", timeout or 0.0)
            self._read(left)
        self._close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                self.conn.send(json.dumps({"signal": int(sig)}).encode("ascii"))
            except OSError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def _read(self, timeout: Optional[float]) -> None:
        try:
            answer = _recv_json(self.conn, timeout)
        except socket.timeout:
            return
        except OSError:
            answer = None
        if answer is None:
            # The server went away without an exit status: the child's fate is unknown.
            self.returncode = 255
        elif "exit" in answer:
            self.returncode = int(answer["exit"])

    def _close(self) -> None:
        for f in (self.stdout, self.stderr):
            try:
                f.close()
            except OSError:
                pass
        self.conn.close()


def _recv_json(conn: socket.socket, timeout: Optional[float]) -> Optional[Dict[str, Any]]:
    """One message as a dict; None at the end of the connection."""
    conn.settimeout(timeout)
    data = conn.recv(65536)
    if not data:
        return None
    obj = json.loads(data.decode("utf-8"))
    return obj if isinstance(obj, dict) else {}


# ----------------------------------------------------------------------------- the server
def preload() -> Dict[str, str]:
    """Import what the Tier-1 child will (CuPy, torch, Triton where present, and the
    agent's own child code); the user's workload is never imported here."""
    loaded: Dict[str, str] = {}
    for name in PRELOAD:
        try:
            importlib.import_module(name)
            loaded[name] = "imported"
        except ImportError:
            loaded[name] = "not installed"
        except Exception as exc:  # a broken install: the child will say so itself
            loaded[name] = ("%s: %s" % (type(exc).__name__, exc))[:300]
    # The child's own imports, once.
    from ..kernels import registry, workload  # noqa: F401
    from . import child  # noqa: F401
    from .measure import stats, tier1  # noqa: F401
    return loaded


def cuda_initialised() -> Optional[str]:
    """Why this process must not fork CUDA children (CUDA is initialised here), or None.

    Asks torch (``torch.cuda.is_initialized``) and the driver itself: ``cuDeviceGetCount``
    answers CUDA_ERROR_NOT_INITIALIZED (3) before ``cuInit`` and never initialises.
    """
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        return "torch initialised CUDA when imported"
    try:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None  # no driver here: nothing to initialise
    count = ctypes.c_int(0)
    rc = lib.cuDeviceGetCount(ctypes.byref(count))
    if rc == 0:
        return "CUDA was initialised by an import (cuDeviceGetCount answered)"
    return None


def _peer_uid(conn: socket.socket) -> Optional[int]:
    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, getattr(socket, "SO_PEERCRED", 17),
                              struct.calcsize("3i"))
    except OSError:
        return None
    return int(struct.unpack("3i", raw)[1])


class Server:
    def __init__(self, sock_path: str, work_dir: str, lifeline_fd: int) -> None:
        self.sock_path = sock_path
        self.work_dir = os.path.realpath(work_dir)
        self.lifeline_fd = lifeline_fd
        self.entry = ""
        self.sel = selectors.DefaultSelector()
        self.listener: Optional[socket.socket] = None
        self.conns: Dict[int, socket.socket] = {}
        self.pid_of: Dict[int, int] = {}  # conn fd -> child pid
        self.conn_of: Dict[int, int] = {}  # child pid -> conn fd
        self.draining = False
        self.last_request = time.monotonic()
        self.wake_r = self.wake_w = -1

    def listen(self) -> None:
        addr, dfd = _address(self.sock_path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            old = os.umask(0o177)  # the socket file itself: the person's alone
            try:
                sock.bind(addr)
            finally:
                os.umask(old)
            sock.listen(8)
        finally:
            if dfd is not None:
                os.close(dfd)
        sock.setblocking(False)
        self.listener = sock

    def run(self) -> int:
        from .runs import agent_entry

        self.entry = agent_entry()
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        signal.signal(signal.SIGCHLD, lambda _s, _f: None)
        signal.set_wakeup_fd(self.wake_w)
        assert self.listener is not None
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.lifeline_fd, selectors.EVENT_READ, "lifeline")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        while True:
            if self.draining and not self.conn_of:
                break
            if not self.conn_of and time.monotonic() - self.last_request > IDLE_S:
                break
            for key, _ in self.sel.select(timeout=1.0):
                if key.data == "accept":
                    self._accept()
                elif key.data == "lifeline":
                    self._lifeline()
                elif key.data == "wake":
                    try:
                        os.read(self.wake_r, 4096)
                    except BlockingIOError:
                        pass
                else:
                    self._message(int(key.data))
            self._reap()
        self._stop_listening()
        try:
            os.rmdir(os.path.dirname(self.sock_path))  # the session's dir, if now empty
        except OSError:
            pass
        return 0

    def _stop_listening(self) -> None:
        if self.listener is None:
            return
        self.sel.unregister(self.listener)
        self.listener.close()
        self.listener = None
        for path in (self.sock_path, self.sock_path[:-2] + ".lock",
                     self.sock_path[:-2] + ".log"):
            try:
                os.unlink(path)
            except OSError:
                pass

    def _lifeline(self) -> None:
        try:
            data = os.read(self.lifeline_fd, 4096)
        except OSError:
            data = b""
        if not data:
            # serve is gone: the watch is over. No new children; running ones finish.
            self.sel.unregister(self.lifeline_fd)
            self.draining = True
            self._stop_listening()

    def _accept(self) -> None:
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        if _peer_uid(conn) != os.getuid():
            conn.close()  # another user: never served, not even answered
            return
        conn.setblocking(False)
        self.conns[conn.fileno()] = conn
        self.sel.register(conn, selectors.EVENT_READ, str(conn.fileno()))

    def _message(self, fd: int) -> None:
        conn = self.conns[fd]
        fds: List[int] = []
        try:
            data, anc, flags, _ = conn.recvmsg(MAX_REQUEST, socket.CMSG_LEN(MAX_FDS * 4))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, anc, flags = b"", [], 0
        for level, kind, raw in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                arr = array.array("i")
                arr.frombytes(raw[:len(raw) - len(raw) % arr.itemsize])
                fds.extend(arr)
        pid = self.pid_of.get(fd)
        if not data:
            self._drop(fd, kill=True)  # the worker is gone: its child goes too
            self._close_all(fds)
            return
        try:
            msg = json.loads(data.decode("utf-8"))
            if not isinstance(msg, dict):
                raise ValueError("not an object")
        except (ValueError, UnicodeDecodeError, RecursionError):
            msg = {}
        if pid is not None:
            self._close_all(fds)
            sig = msg.get("signal")
            if isinstance(sig, int) and 0 < sig < 65:
                _signal_child(pid, sig)
            return
        if flags & getattr(socket, "MSG_CTRUNC", 8) or flags & getattr(socket, "MSG_TRUNC",
                                                                        0x20):
            self._refuse(fd, fds, "the request was cut short")
            return
        problem = self._check(msg, fds)
        if problem is not None:
            self._refuse(fd, fds, problem)
            return
        self.last_request = time.monotonic()
        self._fork(fd, msg, fds)

    def _check(self, msg: Dict[str, Any], fds: List[int]) -> Optional[str]:
        from . import child
        from .runs import RUN_ID_RE, run_dir

        if self.draining:
            return "this fork server is ending (its session is over)"
        argv, env, cwd = msg.get("argv"), msg.get("env"), msg.get("cwd")
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv) \
                or len(argv) < 5:
            return "argv must be a list of strings: INTERPRETER AGENT child MODE RUN_ID"
        if argv[1] != self.entry or argv[2] != "child" or argv[3] not in child.MODES:
            return "only this agent's child modes are forked here"
        if not RUN_ID_RE.match(argv[4]) or not os.path.isdir(run_dir(argv[4])):
            return "no such run on this pod: %r" % argv[4][:80]
        if not isinstance(cwd, str) or os.path.realpath(cwd) != self.work_dir:
            return "this fork server serves only %s" % self.work_dir
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in env.items()):
            return "env must map strings to strings"
        want = 3 if msg.get("event_fd") is not None else 2
        if len(fds) != want:
            return "expected %d pipes, got %d" % (want, len(fds))
        return None

    def _refuse(self, fd: int, fds: List[int], why: str) -> None:
        self._close_all(fds)
        conn = self.conns[fd]
        try:
            conn.send(json.dumps({"error": why}).encode("utf-8"))
        except OSError:
            pass
        self._drop(fd, kill=False)

    def _fork(self, fd: int, msg: Dict[str, Any], fds: List[int]) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()  # nothing buffered here is written twice by the child
            except (OSError, ValueError):
                pass
        pid = os.fork()
        if pid == 0:
            self._child(msg, fds)  # never returns
        self._close_all(fds)
        self.pid_of[fd] = pid
        self.conn_of[pid] = fd
        try:
            self.conns[fd].send(json.dumps({"pid": pid}).encode("ascii"))
        except OSError:
            self._drop(fd, kill=True)

    def _child(self, msg: Dict[str, Any], fds: List[int]) -> None:
        code = 1
        try:
            os.setsid()  # its own group: cancel and timeouts reach what it starts, too
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self.sel.close()
            for fd in (self.lifeline_fd, self.wake_r, self.wake_w):
                try:
                    os.close(fd)
                except OSError:
                    pass
            if self.listener is not None:
                self.listener.close()
            for conn in self.conns.values():
                conn.close()
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(fds[0], 1)
            os.dup2(fds[1], 2)
            for fd in {null, fds[0], fds[1]} - {0, 1, 2}:
                os.close(fd)
            env = dict(msg["env"])
            if len(fds) == 3:
                env["GPUWS_EVENT_FD"] = str(fds[2])  # the pipe's number in this process
            os.environ.clear()
            os.environ.update(env)
            os.chdir(str(msg["cwd"]))
            sys.argv = list(msg["argv"][1:])
            _reseed()
            from .__main__ import main as agent_main

            code = _exit_code(agent_main(list(msg["argv"][2:])))
        except SystemExit as exc:
            code = _system_exit(exc)
        except BaseException:
            try:
                traceback.print_exc()
            except BaseException:
                pass
            code = 1
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except BaseException:
                    pass
            # As multiprocessing's forked children do: the parent's atexit handlers and
            # finalisers (torch's, CuPy's) are the parent's, not this child's.
            os._exit(code)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else \
                os.WEXITSTATUS(status)
            fd = self.conn_of.pop(pid, None)
            if fd is None:
                continue
            self.pid_of.pop(fd, None)
            conn = self.conns.get(fd)
            if conn is not None:
                try:
                    conn.send(json.dumps({"exit": code}).encode("ascii"))
                except OSError:
                    pass
            self._drop(fd, kill=False)

    def _drop(self, fd: int, kill: bool) -> None:
        pid = self.pid_of.pop(fd, None)
        if pid is not None:
            if kill:
                _signal_child(pid, signal.SIGKILL)
            # Still reaped by _reap (it stays in conn_of, reported to nobody).
            self.conn_of[pid] = -1
        conn = self.conns.pop(fd, None)
        if conn is not None:
            try:
                self.sel.unregister(conn)
            except (KeyError, ValueError):
                pass
            conn.close()

    @staticmethod
    def _close_all(fds: List[int]) -> None:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass


def _signal_child(pid: int, sig: int) -> None:
    """Signal the child's process group (it made one right after the fork), else the
    child alone (it has not yet). Only ever called for a child not yet reaped."""
    try:
        os.killpg(pid, sig)
    except OSError:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _reseed() -> None:
    """A fresh interpreter seeds Python's and NumPy's global generators from the OS; a
    forked child would repeat its parent's sequence (torch's default seed is fixed in a
    fresh process too, so it is left as it is)."""
    import random

    random.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            np.random.seed()
        except Exception:
            pass


def _exit_code(value: Any) -> int:
    return value if isinstance(value, int) else 0 if value is None else 1


def _system_exit(exc: SystemExit) -> int:
    if exc.code is None or isinstance(exc.code, int):
        return int(exc.code or 0)
    try:
        sys.stderr.write("%s\n" % (exc.code,))
    except BaseException:
        pass
    return 1


def main(args: List[str]) -> int:
    """``agent forkserver SOCKET WORK_DIR LIFELINE_FD READY_FD``."""
    sock_path, work_dir, lifeline, ready = args[0], args[1], int(args[2]), int(args[3])
    os.umask(0o077)

    def answer(obj: Dict[str, Any]) -> None:
        try:
            os.write(ready, (json.dumps(obj) + "\n").encode("utf-8"))
            os.close(ready)
        except OSError:
            pass

    try:
        os.chdir(work_dir)
        loaded = preload()
        why = cuda_initialised()
        if why is not None:
            answer({"ready": False, "error": "cannot fork CUDA children: " + why})
            return 1
        server = Server(sock_path, work_dir, lifeline)
        server.listen()
    except Exception as exc:
        answer({"ready": False, "error": "%s: %s" % (type(exc).__name__, exc)})
        return 1
    answer({"ready": True, "preloaded": loaded, "pid": os.getpid()})
    return server.run()
