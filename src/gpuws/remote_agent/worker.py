"""The detached run worker: executes one run's tiers and writes its durable event log."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import sys
import time
import traceback
from typing import Any, Dict, Optional, Set

from . import procs, runs, wire

Emit = procs.Emit


class RunContext:
    """Everything a tier needs: the spec, where to write, how to emit, the environment."""

    def __init__(self, run_id: str, spec: Dict[str, Any], emit: Emit) -> None:
        self.run_id = run_id
        self.spec = spec
        self.emit = emit
        self.run_dir = runs.run_dir(run_id)
        self.artifact_dir = os.path.join(self.run_dir, "artifacts")
        self.env = dict(os.environ)
        self.env.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
        self.env["GPUWS_ARTIFACT_DIR"] = self.artifact_dir
        self.env["GPUWS_RUN_ID"] = run_id
        self.env["GPUWS_RUN_DIR"] = self.run_dir
        self.announced: Set[str] = set()
        self.exit_code: Optional[int] = None

    def announce_artifacts(self) -> None:
        """Emit an ``artifact`` event for every new file under the artifact dir."""
        for root, _dirs, files in os.walk(self.artifact_dir):
            for name in sorted(files):
                path = os.path.join(root, name)
                rel = os.path.relpath(path, self.artifact_dir)
                if rel in self.announced or rel.endswith((".part", ".tmp")):
                    continue
                try:
                    size, digest = sha256_file(path)
                except OSError:
                    continue
                self.announced.add(rel)
                self.emit(wire.make("artifact", name=rel, path=path, size=size, sha256=digest,
                                    kind=artifact_kind(rel)))


def artifact_kind(name: str) -> str:
    for suffix, kind in ((".ncu-rep", "ncu-rep"), (".nsys-rep", "nsys-rep"),
                         (".sqlite", "sqlite"), (".csv", "csv"), (".log", "log")):
        if name.endswith(suffix):
            return kind
    return "file"


def sha256_file(path: str) -> "tuple[int, str]":
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


#: Disk set aside when a run starts, so its final event still fits when the disk fills up.
RESERVE_BYTES = 64 * 1024


def main(run_id: str) -> int:
    # Everything the run writes (reports, the workload's own files) is the user's data on
    # a possibly shared pod: private, whatever umask sshd handed down.
    os.umask(0o077)
    rdir = runs.run_dir(run_id)
    with open(os.path.join(rdir, "spec.json")) as f:
        spec = json.load(f)
    log = runs.EventLog(run_id, os.path.join(rdir, "events.ndjson"), reserve=RESERVE_BYTES)
    emit = log.append

    def on_term(_sig: int, _frame: Any) -> None:
        procs.CANCELLED["flag"] = True
        procs.terminate_children()

    signal.signal(signal.SIGTERM, on_term)
    ctx = RunContext(run_id, spec, emit)
    start = time.time()
    emit(wire.make("run_started", spec=spec, run_dir=rdir, pid=os.getpid(),
                   hostname=socket.gethostname()))
    status, error = "ok", None
    # Tracebacks go to worker.log only after the final event: on a full disk that log
    # competes for the same space, and the final event matters more.
    failure = ""
    try:
        from . import tiers  # the tiers pull in more modules; keep startup of `serve` light

        tiers.execute(ctx)
        if procs.CANCELLED["flag"]:
            status, error = "cancelled", "cancelled by request"
        elif ctx.exit_code not in (None, 0):
            status, error = "failed", "the workload exited with code %s" % ctx.exit_code
    except Exception as exc:
        status = "cancelled" if procs.CANCELLED["flag"] else "failed"
        # A WorkloadError is already a sentence for people; anything else keeps its type.
        error = str(exc) if getattr(exc, "for_people", False) else "%s: %s" % (
            type(exc).__name__, exc)
        failure = traceback.format_exc()
    if log.write_error is None:
        try:
            ctx.announce_artifacts()
        except OSError:
            failure += traceback.format_exc()
    if log.write_error is not None:
        # The log stopped taking events (disk full, quota, file size limit). The space
        # reserved at start holds this last event, so the laptop learns why the run ended.
        log.release_reserve()
        status = "failed"
        error = ("the pod could not write the run's event log (%s); every event before "
                 "this one is kept. Free disk space on the pod and run again"
                 % log.write_error)
    try:
        emit(wire.make("run_finished", status=status, wall_s=time.time() - start,
                       exit_code=ctx.exit_code, error=error))
    except OSError as exc:
        # Nothing more fits: serve writes the final event once this process is gone, and
        # quotes worker.log's last line, so leave the reason there.
        failure += "gpuws worker: cannot write the run's event log: %s\n" % (
            log.write_error or exc)
        status = "failed"
    log.close()
    _log(failure)
    return 0 if status == "ok" else 1


def _log(text: str) -> None:
    """Append to worker.log (stderr), which may itself be on the full disk."""
    if not text:
        return
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
