"""The detached run worker: executes one run's tiers and writes its durable event log."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import stat
import sys
import time
import traceback
from typing import Any, Dict, List, Optional, Set, Tuple

from . import procs, runs, wire
from .pod import gpusel
from .safefiles import NotRegular, kind_of, sha256_regular

Emit = procs.Emit

#: Seconds and bytes one pass over the artifact dir may spend hashing, and the most
#: artifacts one run announces. A pass at the H200 pod's ~1 GB/s sha256 hashes ~100 GB
#: in that time; what is over is reported, never waited for.
HASH_BUDGET_S = 120.0
HASH_BUDGET_BYTES = 64 << 30
MAX_ARTIFACTS = 4096


class RunContext:
    """Everything a tier needs: the spec, where to write, how to emit, the environment."""

    def __init__(self, run_id: str, spec: Dict[str, Any], emit: Emit) -> None:
        self.run_id = run_id
        self.spec = spec
        #: How each measuring tier (1-3) ended: (status, reason), as its tier_finished said.
        self.tier_ends: Dict[int, Tuple[str, str]] = {}

        def emit_noting(event: Dict[str, Any]) -> None:
            if event.get("type") == "tier_finished" and event.get("tier") in (1, 2, 3):
                self.tier_ends[int(event["tier"])] = (str(event.get("status")),
                                                      str(event.get("reason") or ""))
            emit(event)

        self.emit = emit_noting
        self.run_dir = runs.run_dir(run_id)
        self.artifact_dir = os.path.join(self.run_dir, "artifacts")
        self.env = dict(os.environ)
        self.env.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
        self.env["GPUWS_ARTIFACT_DIR"] = self.artifact_dir
        self.env["GPUWS_RUN_ID"] = run_id
        self.env["GPUWS_RUN_DIR"] = self.run_dir
        #: Where the workload's processes start: the synced workspace (its root also first
        #: on PYTHONPATH, so a benchmark imports its own package), else the run directory.
        self.work_dir = self.run_dir
        workspace = spec.get("workspace")
        if workspace is not None:
            from .workspace import workspace_dir

            self.work_dir = workspace_dir(str(workspace))
            self.env["GPUWS_WORKSPACE"] = self.work_dir
            self.env["PYTHONPATH"] = os.pathsep.join(
                p for p in (self.work_dir, self.env.get("PYTHONPATH")) if p)
        self.announced: Set[str] = set()
        self.skipped: Set[str] = set()
        self.exit_code: Optional[int] = None
        #: The GPU the run uses (:func:`choose_gpu`); every tier pins to it through
        #: :attr:`env` (and ncu's device filter), none chooses one of its own.
        self.gpu: gpusel.Choice = gpusel.Choice(None, False, [])
        #: The interpreter workloads run under (``protocol.PythonChoice`` as a dict), from
        #: the probe ``tiers.execute`` makes; None: this agent's own (pythons.interpreter).
        self.python_choice: Optional[Dict[str, Any]] = None
        #: Bounds of one :meth:`announce_artifacts` pass (what a workload leaves is
        #: untrusted: the worker must reach ``run_finished`` whatever it is).
        self.hash_budget_s = HASH_BUDGET_S
        self.hash_budget_bytes = HASH_BUDGET_BYTES
        self.max_artifacts = MAX_ARTIFACTS
        #: How the run's children start, decided once (``tiers.launcher``).
        self.launch: Dict[str, Any] = {}

    def announce_artifacts(self) -> None:
        """Emit an ``artifact`` event for every new regular file under the artifact dir.

        The workload owns that directory and may leave anything there: FIFOs (an open
        would block forever), devices and links to them (a read never ends), names with
        escape sequences or newlines, files that keep growing. Only regular files are
        hashed, opened without following links and without blocking; links are never
        followed (a linked directory is not entered); each entry skipped is reported once
        as a warning. One call hashes for at most :attr:`hash_budget_s` seconds and
        :attr:`hash_budget_bytes` bytes; a file is hashed up to the size it had when
        opened, which is the size announced.
        """
        deadline = time.monotonic() + self.hash_budget_s
        budget = [self.hash_budget_bytes]
        try:
            st = os.lstat(self.artifact_dir)
        except OSError:
            return
        if not stat.S_ISDIR(st.st_mode):
            self._skip("", "the artifact directory itself was replaced (%s)"
                       % kind_of(st.st_mode))
            return
        left_out = 0
        for root, dirs, files in os.walk(self.artifact_dir, followlinks=False):
            entered = []
            for name in sorted(dirs):
                rel = os.path.relpath(os.path.join(root, name), self.artifact_dir)
                problem = _name_problem(name)
                if os.path.islink(os.path.join(root, name)):
                    # os.walk lists a linked directory and, with followlinks=False, does
                    # not enter it: say so, it may be what the person looks for.
                    self._skip(rel, "it is a symlink, not a regular file")
                elif problem is not None:
                    self._skip(rel, problem)
                else:
                    entered.append(name)
            dirs[:] = entered
            for name in sorted(files):
                path = os.path.join(root, name)
                rel = os.path.relpath(path, self.artifact_dir)
                if rel in self.announced or rel in self.skipped or rel.endswith((".part",
                                                                                 ".tmp")):
                    continue
                if time.monotonic() > deadline or budget[0] <= 0 \
                        or len(self.announced) >= self.max_artifacts:
                    left_out += 1
                    continue
                self._announce(rel, path, deadline, budget)
        if left_out:
            self.emit(wire.make("log", level="warning", message=(
                "%d artifact(s) not announced: over this run's bound of %d artifacts or the "
                "hashing budget (%.0f s, %d MiB per pass)" % (
                    left_out, self.max_artifacts, self.hash_budget_s,
                    self.hash_budget_bytes >> 20))))

    def _announce(self, rel: str, path: str, deadline: float, budget: List[int]) -> None:
        problem = _name_problem(rel)
        if problem is not None:
            self._skip(rel, problem)
            return
        try:
            size, digest = sha256_regular(path, deadline, budget)
        except NotRegular as exc:
            self._skip(rel, str(exc))
            return
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return  # gone before we got to it: nothing to announce
            self._skip(rel, "it cannot be read (%s)" % exc.strerror)
            return
        self.announced.add(rel)
        self.emit(wire.make("artifact", name=rel, path=path, size=size, sha256=digest,
                            kind=artifact_kind(rel)))

    def _skip(self, rel: str, why: str) -> bool:
        """Report a skipped entry (once per run); False, for use in filters."""
        if rel not in self.skipped:
            self.skipped.add(rel)
            self.emit(wire.make("log", level="warning", message="artifact %s skipped: %s"
                                % (visible(rel) if rel else "directory", why)))
        return False


#: Longest artifact name announced (bytes of UTF-8); longer ones are skipped.
MAX_NAME_BYTES = 1024


def _name_problem(rel: str) -> Optional[str]:
    """Why ``rel`` cannot be an artifact name, or None when it can.

    A name must be relative, already normalised, without ``..``, printable (no control
    characters: a newline would forge output lines, an escape sequence would drive the
    laptop's terminal) and valid UTF-8 (os.walk gives undecodable bytes as surrogates).
    """
    if not rel or os.path.isabs(rel) or os.path.normpath(rel) != rel:
        return "its name is not a plain relative path"
    if any(part in ("", ".", "..") for part in rel.split(os.sep)):
        return "its name contains '..' or an empty part"
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) <= 0xDFFF
           or c in "\u2028\u2029" for c in rel):
        return "its name contains control characters or bytes that are not UTF-8"
    if len(rel.encode("utf-8")) > MAX_NAME_BYTES:
        return "its name is over %d bytes" % MAX_NAME_BYTES
    return None


def visible(name: str, limit: int = 200) -> str:
    """``name`` with every control or undecodable character written as an escape."""
    out = []
    for c in name[:limit]:
        code = ord(c)
        if code < 0x20 or 0x7F <= code <= 0x9F or c in "\u2028\u2029":
            out.append("\\x%02x" % code if code < 0x100 else "\\u%04x" % code)
        elif 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, as os.fsdecode gives it
            out.append("\\x%02x" % (code - 0xDC00))
        elif 0xD800 <= code <= 0xDFFF:
            out.append("\\u%04x" % code)
        else:
            out.append(c)
    return repr("".join(out) + ("..." if len(name) > limit else ""))


def artifact_kind(name: str) -> str:
    for suffix, kind in ((".ncu-rep", "ncu-rep"), (".nsys-rep", "nsys-rep"),
                         (".sqlite", "sqlite"), (".csv", "csv"), (".log", "log")):
        if name.endswith(suffix):
            return kind
    return "file"


#: Disk set aside when a run starts, so its final event still fits when the disk fills up.
RESERVE_BYTES = 64 * 1024


def choose_gpu(ctx: RunContext) -> Optional[str]:
    """Resolve ``RunSpec.gpu`` against the pod's GPUs and pin the run's environment.

    Sets :attr:`RunContext.gpu`. Never raises: a listing that fails leaves the GPU
    unknown (and, when one was asked for, the run refused with the reason).

    Returns:
        The ``CUDA_VISIBLE_DEVICES`` value that pinning replaced, or None.
    """
    wanted = ctx.spec.get("gpu")
    wanted = None if wanted is None else str(wanted)
    try:
        found = gpus_with_sm_counts(bool(ctx.spec.get("fork_server")))
        choice = gpusel.choose(wanted, ctx.env, found.gpus, found.error)
    except Exception as exc:  # the first event must come whatever the driver does
        why = "the pod's GPUs could not be listed (%s: %s)" % (type(exc).__name__, exc)
        choice = gpusel.Choice(None, False, [], why if wanted is not None else None,
                               "run `gpuws doctor` to see what the pod reports")
    ctx.gpu = choice
    return gpusel.pin(ctx.env, choice)


#: How long ``run_started`` may wait for the CUDA driver's SM count (a driver that hangs
#: in cuInit leaves the count unknown, not the run unstarted).
SM_COUNT_TIMEOUT_S = 5.0


def gpus_with_sm_counts(session: bool) -> Any:
    """The pod's GPUs (``gpuinfo.GpuList``), each with its SM count where the CUDA
    driver gives it, for ``run_started``.

    The count is the probe's (cuDeviceGetAttribute in a child, by PCI bus id): in a
    session of ``gpuws watch`` the probe the session keeps, which the tiers read next
    anyway; else asked of the driver while NVML lists the GPUs, so the first event waits
    for the slower of the two, not for both.
    """
    from concurrent.futures import ThreadPoolExecutor

    from .pod import gpuinfo

    if session:
        from .forkserver import session_probe

        facts = session_probe() or {}
        counts = {gpuinfo.bus_key(g.get("pci_bus_id")): g.get("sm_count")
                  for g in facts.get("gpus") or [] if isinstance(g, dict)}
        found = gpuinfo.list_gpus()
        gpuinfo.add_sm_counts(found.gpus, {k: v for k, v in counts.items()
                                           if k is not None and isinstance(v, int)})
        return found
    with ThreadPoolExecutor(max_workers=1) as pool:
        asked = pool.submit(gpuinfo.sm_counts, gpuinfo.CUDA_LIB,
                            timeout_s=SM_COUNT_TIMEOUT_S)
        found = gpuinfo.list_gpus()
        if found.gpus:
            gpuinfo.add_sm_counts(found.gpus, asked.result())
    return found


def announce_gpu(ctx: RunContext, replaced: Optional[str]) -> None:
    """Before the tiers: say which inherited setting pinning replaced, and warn when
    other processes use the run's GPU (their work skews every figure)."""
    choice = ctx.gpu
    if replaced is not None:
        ctx.emit(wire.make("log", level="info", message=(
            "CUDA_VISIBLE_DEVICES=%s from the environment replaced by --gpu %s"
            % (visible(replaced, 80), visible(str(ctx.spec.get("gpu")), 80)))))
    if choice.busy and choice.gpu is not None:
        ctx.emit(wire.make(
            "diagnosis", code="gpu_busy", severity="warning",
            title="GPU %s is in use by other processes" % choice.gpu.get("index"),
            cause=gpusel.busy_sentence(choice),
            meaning="their work shares this GPU's SMs, memory bandwidth, power and clocks "
                    "with this run's: every figure of this run may be skewed",
            remedies=["wait until they finish, or pick an idle GPU with --gpu "
                      "(`gpuws doctor` lists who uses each GPU)"],
            details={"gpu": choice.gpu.get("index"), "processes": choice.busy}))


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
    from .forkserver import take_session

    take_session(os.environ)  # before the run's environment is copied from ours
    ctx = RunContext(run_id, spec, emit)
    start = time.time()
    replaced = choose_gpu(ctx)
    emit(wire.make("run_started", spec=spec, run_dir=rdir, pid=os.getpid(),
                   hostname=socket.gethostname(), gpu=gpusel.target_event(ctx.gpu)))
    status, error = "ok", None
    # Tracebacks go to worker.log only after the final event: on a full disk that log
    # competes for the same space, and the final event matters more.
    failure = ""
    if ctx.gpu.error is not None:
        # A GPU that is not there: refused before any tier, in one line with the choices.
        emit(wire.make("diagnosis", code="no_such_gpu", severity="error",
                       title="The GPU asked for is not on this pod", cause=ctx.gpu.error,
                       remedies=[ctx.gpu.remedy] if ctx.gpu.remedy else []))
        status, error = "failed", ctx.gpu.error + ("; " + ctx.gpu.remedy
                                                   if ctx.gpu.remedy else "")
    else:
        try:
            from .measure import (
                tiers,  # the tiers pull in more modules; keep startup of `serve` light
            )

            announce_gpu(ctx, replaced)
            tiers.execute(ctx)
            if procs.CANCELLED["flag"]:
                status, error = "cancelled", "cancelled by request"
            elif ctx.exit_code not in (None, 0):
                status, error = "failed", "the workload exited with code %s" % ctx.exit_code
            elif every_tier_failed(ctx.tier_ends):
                # Nothing asked for was measured (a workload that raises in every tier):
                # not an "ok" run with an exit status of 0.
                status, error = "failed", "every tier failed: " + "; ".join(
                    "Tier %d: %s" % (t, why or "failed")
                    for t, (_, why) in sorted(ctx.tier_ends.items()))[:1000]
        except Exception as exc:
            status = "cancelled" if procs.CANCELLED["flag"] else "failed"
            # A WorkloadError is already a sentence for people; anything else keeps its type.
            error = str(exc) if getattr(exc, "for_people", False) else "%s: %s" % (
                type(exc).__name__, exc)
            failure = traceback.format_exc()
    if log.write_error is None:
        try:
            ctx.announce_artifacts()
        except Exception:
            # Whatever the workload left behind, the run still gets its final event.
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


def every_tier_failed(ends: Dict[int, Tuple[str, str]]) -> bool:
    """Whether the measuring tiers that ran all failed (none ok, fell back or skipped)."""
    return bool(ends) and all(status == "failed" for status, _ in ends.values())


def _log(text: str) -> None:
    """Append to worker.log (stderr), which may itself be on the full disk."""
    if not text:
        return
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
