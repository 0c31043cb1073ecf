"""``serve``: the agent's request loop over stdin/stdout.

Requests arrive one JSON object per line on stdin; every answer and event goes out as
one line on stdout through a single locked writer. Slow requests (probe, cancel,
following a run) run on their own threads so a Ping is always answered promptly.
Runs are never executed here: ``serve`` starts detached workers and tails their logs,
so a dropped connection only ends this process, never a run.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, FrozenSet, Optional

from . import AGENT_VERSION, lease, runs, wire

Handler = Callable[[Dict[str, Any], "Server"], None]


class Server:
    def __init__(self, writer: wire.Writer) -> None:
        self.writer = writer
        self.stop = threading.Event()
        self._telemetry_interval = 0.0
        self._telemetry_thread: Optional[threading.Thread] = None
        self._followers: Dict[str, threading.Event] = {}
        #: The fork servers' lifeline (``forkserver.Lifeline``), made by the first run
        #: that asks for one; it ends when this process does.
        self._lifeline: Optional[Any] = None
        self._lifeline_lock = threading.Lock()

    def lifeline(self) -> str:
        """``FD:DIR`` for a worker whose run uses a fork server (made on first use)."""
        with self._lifeline_lock:
            if self._lifeline is None:
                from .forkserver import Lifeline

                self._lifeline = Lifeline()
            return str(self._lifeline.env_value())

    # -- plumbing
    def send(self, event: Dict[str, Any]) -> None:
        self.writer.send(event)

    def reply(self, req: Optional[int], type_: str, **fields: Any) -> None:
        event = wire.make(type_, **fields)
        if req is not None:
            event["req"] = req
        self.send(event)

    def fail(self, req: Optional[int], code: str, title: str, message: str,
             remedy: str = "") -> None:
        self.send(wire.error(code, title, message, remedy, req))

    def spawn(self, fn: Callable[[], None], req: Optional[int] = None) -> None:
        """Run ``fn`` on a thread; a failure is answered to ``req`` so no caller hangs."""

        def run() -> None:
            try:
                fn()
            except Exception as exc:
                self.fail(req, "internal", "Agent error", "%s: %s" % (type(exc).__name__, exc))
        threading.Thread(target=run, daemon=True).start()

    # -- requests
    def handle(self, line: bytes) -> None:
        try:
            msg = json.loads(line.decode("utf-8"))
            if not isinstance(msg, dict):
                raise ValueError("not an object")
        except (ValueError, RecursionError) as exc:
            # RecursionError: json refuses to nest thousands deep, and must not end serve.
            self.fail(None, "bad_request", "Bad request",
                      "unreadable request line: %s" % ("%s" % exc)[:200])
            return
        req = msg.get("req") if isinstance(msg.get("req"), int) else None
        type_ = msg.get("type")
        handler = HANDLERS.get(type_) if isinstance(type_, str) else None
        if handler is None:
            # Never guess what an unknown request meant: refuse it.
            self.fail(req, "unknown_request", "Unknown request",
                      "this agent (%s) does not understand %r" % (AGENT_VERSION, type_),
                      "update gpuws on the laptop and reconnect")
            return
        # The laptop deploys this very agent, so both sides know the same fields; a field
        # we do not know means a request we do not understand, which is refused, not
        # half-done.
        unknown = sorted(set(msg) - REQUEST_FIELDS[str(type_)])
        if unknown:
            self.fail(req, "bad_request", "Bad request",
                      "a %s request with fields this agent does not know: %s"
                      % (type_, ", ".join(repr(k) for k in unknown)[:300]))
            return
        try:
            lease.renew()  # every contact of a laptop renews the pod's lease
        except OSError:
            pass
        try:
            handler(msg, self)
        except (KeyError, TypeError, ValueError) as exc:
            self.fail(req, "bad_request", "Bad request", "%s: %s" % (type(exc).__name__, exc))
        except OSError as exc:
            # A full disk or a run directory we refuse to use (ensure_private_dir): the
            # request fails, serve and the runs it follows go on.
            self.fail(req, "pod_error", "The pod refused", "%s: %s" % (type(exc).__name__, exc),
                      "check free disk space and that ~/.cache/gpuws on the pod is yours "
                      "and not writable by others")

    def follow(self, run_id: str, from_seq: int, live: bool) -> None:
        old = self._followers.get(run_id)
        if old is not None:
            old.set()  # one follower per run: a re-attach replaces the old one
        stop = threading.Event()
        self._followers[run_id] = stop

        def go() -> None:
            try:
                runs.follow(run_id, from_seq, self.writer.send_raw, stop, follow_live=live)
            finally:
                if self._followers.get(run_id) is stop:
                    del self._followers[run_id]
        self.spawn(go)

    def set_telemetry(self, interval: float) -> None:
        self._telemetry_interval = interval
        if interval > 0 and (self._telemetry_thread is None
                             or not self._telemetry_thread.is_alive()):
            self._telemetry_thread = threading.Thread(target=self._telemetry_loop, daemon=True)
            self._telemetry_thread.start()

    def _telemetry_loop(self) -> None:
        from .pod.gpuinfo import telemetry

        while not self.stop.is_set() and self._telemetry_interval > 0:
            t0 = time.time()
            try:
                self.send(wire.make("telemetry", gpus=telemetry()))
            except Exception as exc:
                self.send(wire.make("log", level="warning",
                                    message="telemetry stopped: %s" % exc))
                return
            self.stop.wait(max(0.0, self._telemetry_interval - (time.time() - t0)))


def _ping(msg: Dict[str, Any], srv: Server) -> None:
    srv.reply(msg.get("req"), "pong")


def _probe(msg: Dict[str, Any], srv: Server) -> None:
    def go() -> None:
        from .pod.probe import probe

        srv.reply(msg.get("req"), "probe_result", probe=probe())
    srv.spawn(go, msg.get("req"))


def _run_info(status: Dict[str, Any]) -> Dict[str, Any]:
    keys = ("run_id", "workload", "status", "started", "last_seq", "pid")
    return {k: status[k] for k in keys}


def _start_run(msg: Dict[str, Any], srv: Server) -> None:
    spec = msg["spec"]
    if not isinstance(spec, dict) or not isinstance(spec.get("workload"), str):
        raise ValueError("spec.workload is required")
    unknown = sorted(set(spec) - SPEC_FIELDS)
    if unknown:
        raise ValueError("spec fields this agent does not know: %s"
                         % ", ".join(repr(k) for k in unknown)[:300])
    if spec.get("timing") not in (None, "auto", "cold", "hot"):
        raise ValueError("spec.timing must be 'auto', 'cold' or 'hot'")
    if spec.get("workspace") is not None:
        from .workspace import check_name

        check_name(spec["workspace"])
    run_id = msg.get("run_id")
    if run_id is not None:
        if not isinstance(run_id, str):
            raise ValueError("run_id must be a string")
        runs.run_dir(run_id)  # a malformed id ("" included) is refused, never replaced
    fork_server = spec.get("fork_server", False)
    if not isinstance(fork_server, bool):
        raise ValueError("spec.fork_server must be true or false")
    started = runs.start_worker(spec, run_id, srv.lifeline() if fork_server else None)
    srv.reply(msg.get("req"), "run_list", runs=[_run_info(runs.run_status(started["run_id"]))])
    srv.follow(started["run_id"], 0, live=True)


def _attach(msg: Dict[str, Any], srv: Server) -> None:
    run_id = str(msg["run_id"])
    if not os.path.isdir(runs.run_dir(run_id)):
        srv.fail(msg.get("req"), "no_such_run", "No such run",
                 "run %s does not exist on this pod (deleted, or the pod was replaced)" % run_id,
                 "list the pod's runs with `gpuws runs HOST`")
        return
    srv.reply(msg.get("req"), "run_list", runs=[_run_info(runs.run_status(run_id))])
    srv.follow(run_id, int(msg.get("from_seq") or 0), live=bool(msg.get("follow", True)))


def _cancel(msg: Dict[str, Any], srv: Server) -> None:
    run_id = str(msg["run_id"])
    runs.run_dir(run_id)  # a malformed id is a bad request, answered now, not "internal"

    def go() -> None:
        try:
            status = runs.cancel_run(run_id)
        except FileNotFoundError as exc:
            srv.fail(msg.get("req"), "no_such_run", "No such run", str(exc))
            return
        srv.reply(msg.get("req"), "run_list", runs=[_run_info(status)])
    srv.spawn(go, msg.get("req"))


def _list_runs(msg: Dict[str, Any], srv: Server) -> None:
    srv.reply(msg.get("req"), "run_list", runs=[_run_info(r) for r in runs.list_runs()])


def _telemetry(msg: Dict[str, Any], srv: Server) -> None:
    srv.set_telemetry(float(msg.get("interval_s", 1.0)))
    srv.reply(msg.get("req"), "pong")


def _stat_file(msg: Dict[str, Any], srv: Server) -> None:
    path = safe_path(str(msg["path"]))

    def go() -> None:
        # On its own thread: hashing a large report must not hold up a Ping.
        from .safefiles import NotRegular, sha256_regular

        try:
            size, digest = sha256_regular(path)
        except NotRegular as exc:
            # A FIFO or device in a run directory is the workload's doing: refused, never
            # opened in a way that could block or read forever.
            srv.fail(msg.get("req"), "not_a_file", "Not a regular file",
                     "refusing %s: %s" % (path, exc.strerror))
            return
        except OSError as exc:
            srv.fail(msg.get("req"), "pod_error", "The pod refused",
                     "%s: %s" % (path, exc.strerror or exc))
            return
        srv.reply(msg.get("req"), "stat_result", path=path, size=size, sha256=digest)
    srv.spawn(go, msg.get("req"))


def _ncu_plan(msg: Dict[str, Any], srv: Server) -> None:
    def go() -> None:
        from .profilers.ncu_provision import plan_event

        srv.send(plan_event(bool(msg.get("install")), msg.get("req"), srv.send))
    srv.spawn(go, msg.get("req"))


def _nsys_plan(msg: Dict[str, Any], srv: Server) -> None:
    def go() -> None:
        from .profilers.nsys_provision import plan_event

        srv.send(plan_event(bool(msg.get("install")), msg.get("req"), srv.send))
    srv.spawn(go, msg.get("req"))


def _workspace_put(msg: Dict[str, Any], srv: Server) -> None:
    # Inline, not on a thread: puts are answered in the order they came, and an apply
    # (which waits for every put's answer on the laptop) never overtakes one.
    from .workspace import put

    stored, refused = put(msg["pieces"], msg["data"], bool(msg.get("zlib")))
    srv.reply(msg.get("req"), "workspace_stored", stored=stored, refused=refused)


def _workspace_apply(msg: Dict[str, Any], srv: Server) -> None:
    from .workspace import WorkspaceError, apply, check_name

    name = check_name(msg["name"])

    def go() -> None:
        # On its own thread: writing thousands of files must not hold up a Ping.
        try:
            answer = apply(name, msg["entries"], msg["tree_sha256"])
        except WorkspaceError as exc:
            srv.fail(msg.get("req"), "bad_request", "Bad request", str(exc)[:500])
            return
        except OSError as exc:
            srv.fail(msg.get("req"), "pod_error", "The pod refused",
                     "workspace %s: %s: %s" % (name, type(exc).__name__, exc),
                     "check free disk space and that ~/.cache/gpuws on the pod is yours")
            return
        srv.reply(msg.get("req"), "workspace_state", **answer)
    srv.spawn(go, msg.get("req"))


def _lease(msg: Dict[str, Any], srv: Server) -> None:
    if msg.get("release"):
        state = lease.release()
    elif msg.get("idle_s") is None:
        state = lease.status()
    else:
        state = lease.configure(msg.get("idle_s"), msg.get("stop_argv"),
                                bool(msg.get("stop_running")))
    srv.reply(msg.get("req"), "lease_status", **state)


def _shutdown(msg: Dict[str, Any], srv: Server) -> None:
    srv.reply(msg.get("req"), "pong")
    srv.stop.set()


#: Every field each request may carry (protocol.py's Request structs; a contract test
#: keeps the two in step). ``nsys_plan`` answers with an ``nsys_plan`` event, which the
#: laptop can ask for once protocol.py has its NsysPlanReq/NsysPlan structs.
REQUEST_FIELDS: Dict[str, FrozenSet[str]] = {
    name: frozenset(("type", "req", *extra)) for name, extra in (
        ("ping", ()), ("probe", ()), ("start_run", ("spec", "run_id")),
        ("attach", ("run_id", "from_seq", "follow")), ("cancel", ("run_id",)),
        ("list_runs", ()), ("telemetry", ("interval_s",)), ("ncu_plan", ("install",)),
        ("stat_file", ("path",)), ("shutdown", ()), ("nsys_plan", ("install",)),
        ("workspace_put", ("pieces", "data", "zlib")),
        ("workspace_apply", ("name", "entries", "tree_sha256")),
        ("lease", ("idle_s", "stop_argv", "stop_running", "release")),
    )
}
#: The fields of protocol.RunSpec.
SPEC_FIELDS: FrozenSet[str] = frozenset((
    "workload", "tiers", "target_ci", "max_seconds", "min_samples", "warmup", "timing",
    "cold", "kernel_regex", "launch_skip", "launch_count", "ncu_set", "ncu_sections",
    "replay_mode", "clock_control", "cache_control", "ncu_path", "file_name", "file_b64", "env",
    "timeout_s", "install_cupy", "profile_iters", "gpu", "workspace", "max_tier3_s",
    "fork_server", "rank",
))

HANDLERS: Dict[str, Handler] = {
    "ping": _ping, "probe": _probe, "start_run": _start_run, "attach": _attach,
    "cancel": _cancel, "list_runs": _list_runs, "telemetry": _telemetry,
    "stat_file": _stat_file, "ncu_plan": _ncu_plan, "shutdown": _shutdown,
    "nsys_plan": _nsys_plan, "workspace_put": _workspace_put,
    "workspace_apply": _workspace_apply, "lease": _lease,
}


def safe_path(path: str) -> str:
    """Resolve ``path`` and refuse anything outside gpuws's own run directories."""
    real = os.path.realpath(os.path.expanduser(path))
    root = os.path.realpath(runs.runs_root())
    if not real.startswith(root + os.sep):
        raise ValueError("refusing to read %s: only files under %s are served" % (path, root))
    return real


def self_sha256() -> str:
    try:
        with open(sys.argv[0], "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return "unbundled"


def main() -> int:
    # Run dirs, specs and logs hold the user's commands and results on a possibly shared
    # pod: whatever umask sshd handed down, what serve and its workers create is private.
    os.umask(0o077)
    writer = wire.Writer()
    srv = Server(writer)
    # Held for this process's life: the pod's lease sees a laptop connected (lease.py).
    connection = lease.hold_connection()
    writer.send(wire.make("hello", agent_version=AGENT_VERSION, agent_sha256=self_sha256(),
                          protocol_version=wire.PROTOCOL_VERSION,
                          python="%d.%d.%d" % sys.version_info[:3], pid=os.getpid()))
    stdin = sys.stdin.buffer
    while not srv.stop.is_set():
        line = stdin.readline(wire.MAX_LINE + 1)
        if not line:
            break  # the laptop closed the channel; runs go on without us
        if len(line) > wire.MAX_LINE and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):  # skip the rest of the oversized line
                line = stdin.readline(wire.MAX_LINE)
            srv.fail(None, "bad_request", "Bad request", "request line over %d bytes dropped"
                     % wire.MAX_LINE)
            continue
        if line.strip():
            srv.handle(line)
    srv.stop.set()
    if srv._lifeline is not None:
        srv._lifeline.close()  # the connection's fork servers end with it
    if connection is not None:
        os.close(connection)
    return 0
