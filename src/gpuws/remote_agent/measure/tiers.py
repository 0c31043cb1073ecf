"""The profiling tiers, run by the worker in order for one workload.

Tier 1 times the workload with CUDA events (Python workloads only). Tier 2 finds which
kernels matter (nsys, else torch.profiler, else one ncu pass of gpu__time_duration).
Tier 3 profiles the chosen kernels with the Nsight Compute that fits the driver. When
counters are blocked, Tier 3 falls back to static analysis and says what was not
measured and why. Every step is an event in the run's durable log.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from .. import procs, runs, wire
from ..pod import clocks, gpm, gpusel, pythons
from . import findings, torch_profile

if TYPE_CHECKING:
    from ..worker import RunContext

#: What ncu would have measured; recorded as "not measured" when counters are blocked.
NCU_METRICS = ["duration_ns", "sm_throughput_pct", "memory_throughput_pct",
               "dram_throughput_pct", "achieved_occupancy_pct", "l1_hit_pct", "l2_hit_pct",
               "tensor_pipe_active_pct", "warp stall reasons", "flops", "dram_bytes"]
#: What Tier 2's timeline adds to its kernel table (``protocol.KernelTable``).
TIMELINE_KEYS = ("gpu_idle_pct", "memcpy_pct", "span_ns", "gap_count", "largest_gap_ns",
                 "sync_count", "sync_ns", "window", "host", "comm", "ranks")
COUNTER_REMEDIES = [
    "on the host: options nvidia NVreg_RestrictProfilingToAdminUsers=0 in "
    "/etc/modprobe.d/, then reboot (or reload the nvidia module)",
    "in a container: run it with --cap-add SYS_ADMIN (or --privileged); in Kubernetes: "
    "securityContext.capabilities.add: [SYS_ADMIN]",
    "run the profiler as root on the host, or pick a provider tier that allows profiling "
    "(RunPod's standard pods do not allow SYS_ADMIN)",
]


class WorkloadError(Exception):
    """The workload cannot run as given; the message is written for people."""

    for_people = True


class Pod:
    """What the worker needs to know about the pod, probed once per run.

    ``gpu_index``: the GPU the run uses (``RunContext.gpu``), whose architecture decides
    which ncu fits; None: the first GPU.
    """

    def __init__(self, gpu_index: Optional[int] = None,
                 facts: Optional[Dict[str, Any]] = None) -> None:
        from ..pod.probe import probe

        self.facts = probe() if facts is None else facts
        gpus = self.facts.get("gpus") or []
        mine = [g for g in gpus if g.get("index") == gpu_index] or gpus[:1]
        self.cc: Optional[str] = mine[0].get("compute_capability") if mine else None
        self.driver: Optional[str] = self.facts.get("driver")
        self.counters: Dict[str, Any] = self.facts.get("counters") or {}
        #: The interpreter workloads run under (``protocol.PythonChoice``), and its packages.
        self.python: Dict[str, Any] = self.facts.get("python_choice") or {}

    def has_package(self, name: str) -> bool:
        """Whether the workloads' interpreter has ``torch`` or ``cupy`` installed."""
        return pythons.installed(self.facts.get("python_packages") or [], name)

    @property
    def has_gpu(self) -> bool:
        return bool(self.facts.get("gpus"))

    def nsys(self, workload: Optional[str] = None) -> Optional[str]:
        """The nsys Tier 2 runs: of those that work and did not trace this workload only
        in part on this pod before, one whose CUPTI is as new as the driver's CUDA where
        there is one (a program may use all the driver offers), else the newest CUPTI (a
        trace of a newer program may be partial, and is said so)."""
        from ..profilers.nsys_output import nsys_cupti

        usable = [p for p in self._nsys_paths() if p not in self._partial_for(workload)]
        if len(usable) < 2:
            return usable[0] if usable else None
        cuptis = {p: nsys_cupti(p) or (0, 0) for p in usable}
        driver = _major_minor(self.facts.get("cuda_driver"))
        fits = [p for p in usable if driver is not None and cuptis[p] >= driver]
        return fits[0] if fits else max(usable, key=lambda p: cuptis[p])

    def _nsys_paths(self) -> List[str]:
        return [str(i["path"]) for i in self.facts.get("nsys") or [] if not i.get("error")]

    def _partial_for(self, workload: Optional[str]) -> List[str]:
        """The installs that traced ``workload`` only in part on this pod before."""
        from ..profilers.nsys_output import learnt, workload_key

        if workload is None:
            return []
        key = workload_key(workload, self.program_cuda())
        return [p for p, keys in learnt(runs.cache_root()).items() if key in keys]

    def nsys_passed_over(self, workload: Optional[str] = None) -> Optional[str]:
        """Why no nsys runs although the pod has a working one (what this pod learnt)."""
        skipped = [p for p in self._nsys_paths() if p in self._partial_for(workload)]
        if not skipped:
            return None
        return ("nsys %s traced this workload only in part on this pod before: not used "
                "(an nsys from a CUDA release at least as new as the program's %s traces "
                "it whole)" % (self.nsys_version(skipped[0]) or skipped[0],
                               self.program_cuda() or "CUDA"))

    def nsys_version(self, path: str) -> Optional[str]:
        for inst in self.facts.get("nsys") or []:
            if inst.get("path") == path and inst.get("version"):
                return str(inst["version"])
        return None

    def program_cuda(self) -> Optional[str]:
        """The CUDA the workloads' torch (else CuPy) was built for, as the probe read it."""
        for name in ("torch", "cupy"):
            for pkg in self.facts.get("python_packages") or []:
                if str(pkg.get("name", "")).startswith(name) and pkg.get("cuda"):
                    return str(pkg["cuda"])
        return None

    def select_ncu(self, exclude: List[str]) -> Dict[str, Any]:
        from ..profilers.ncu_provision import plan_for

        return plan_for(list(self.facts.get("ncu") or []), self.driver, self.cc,
                        self.facts.get("cuda_driver"), exclude)


def execute(ctx: "RunContext") -> None:
    from ...kernels.registry import parse_workload

    try:
        ref = parse_workload(str(ctx.spec["workload"]))
    except ValueError as exc:
        raise WorkloadError(str(exc)) from exc
    if ctx.work_dir != ctx.run_dir and not os.path.isdir(ctx.work_dir):
        raise WorkloadError("the workspace %s is not on this pod: sync it first (gpuws run "
                            "-W DIR sends it)" % ctx.spec.get("workspace"))
    facts = None
    if ctx.spec.get("fork_server"):
        from ..forkserver import session_probe

        facts = session_probe()  # a watch's pod, probed once for all its iterations
    pod = Pod(run_gpu_index(ctx), facts)
    ctx.python_choice = pod.python
    if ref.kind == "cmd":
        run_command(ctx, ref.target, pod)
    else:
        run_python(ctx, ref, pod)


def run_gpu_index(ctx: "RunContext") -> Optional[int]:
    """NVML's index of the GPU the run uses, or None when it is not known."""
    gpu = ctx.gpu.gpu
    return None if gpu is None else int(gpu["index"])


def tiers_of(ctx: "RunContext") -> List[int]:
    return sorted({int(t) for t in ctx.spec.get("tiers") or []})


# ----------------------------------------------------------------------------- cmd:
def run_command(ctx: "RunContext", command: str, pod: Pod) -> None:
    """A ``cmd:`` workload: run it once as asked, then under Tier 2/3 when asked."""
    if not command.strip():
        raise WorkloadError("empty command: give cmd:COMMAND")
    tiers = tiers_of(ctx)
    if 1 in tiers:
        ctx.emit(wire.make("tier_started", tier=1, name="CUDA events"))
        ctx.emit(wire.make("tier_finished", tier=1, status="skipped", wall_s=0.0,
                           reason="Tier 1 times a Python workload's run(); a command has none"))
    argv = command_argv(ctx, command)
    from ..cmdline import starts_python

    inject = starts_python(command)
    # The one run gives both the output and Tier 2's timeline when torch.profiler is the
    # timeline's path (no working nsys, a command that starts Python): running it plain
    # first and again under the profiler cost a whole start of Python and torch (3.5 s of
    # a 15.8 s transformer run on the H200, docs/performance.md §9). The command's wall
    # time then includes the profiler's start and the trace it writes at exit, so the
    # tier's name says the profiler was on.
    env, recorded = ctx.env, None
    if 2 in tiers and inject and pod.has_gpu and not pod.nsys(ctx.spec.get("workload")):
        from .torch_profile import prepare

        env = dict(ctx.env)
        recorded = prepare(ctx.run_dir, env, True)
    ctx.emit(wire.make("tier_started", tier=0, argv=argv, name="workload" if recorded is None
                       else "workload, under torch.profiler for Tier 2"))
    t0 = time.time()
    # NVML GPM over the command's whole run (device-wide: its start-up counts as idle).
    window = gpm.window_for(run_gpu_index(ctx)) if pod.has_gpu else None
    if window is not None:
        window.open()
    result = procs.run_streaming(argv, emit=ctx.emit, tier=0, cwd=ctx.work_dir, env=env,
                                 timeout_s=ctx.spec.get("timeout_s"))
    gpm_result = window.close() if window is not None else None
    ctx.exit_code = result.returncode
    status = "ok" if result.returncode == 0 else "failed"
    reason = "" if status == "ok" else "exit code %d" % result.returncode
    if result.timed_out:
        reason = "killed after the %.0f s timeout" % float(ctx.spec.get("timeout_s") or 0)
    wall0 = time.time() - t0
    finished = wire.make("tier_finished", tier=0, status=status, wall_s=wall0, reason=reason)
    if gpm_result is not None:
        finished["gpm"] = gpm_result
    ctx.emit(finished)
    ctx.announce_artifacts()
    if status != "ok" or procs.CANCELLED["flag"]:
        return
    if (2 in tiers or 3 in tiers) and not pod.has_gpu:
        ctx.emit(wire.make("diagnosis", code="no_gpu", severity="warning",
                           title="No GPU on the pod: Tiers 2 and 3 skipped",
                           cause=str(pod.facts.get("gpu_error") or "no NVIDIA GPU was found"),
                           meaning="the command ran and its output and artifacts are kept; "
                                   "there are no kernels to profile",
                           unmeasured=["kernel table", *NCU_METRICS]))
        for tier in (t for t in (2, 3) if t in tiers):
            ctx.emit(wire.make("tier_finished", tier=tier, status="skipped", wall_s=0.0,
                               reason="no GPU on the pod"))
        return
    t2 = time.time()
    table = tier2(ctx, pod, argv, python=False, inject=inject, recorded=recorded) \
        if 2 in tiers else None
    if 3 in tiers and not procs.CANCELLED["flag"]:
        regex = ctx.spec.get("kernel_regex")  # the person's --kernel-regex, else the top
        # Several ranks (Tier 2 saw them, or --rank named one): ncu profiles one.
        rank = ctx.spec.get("rank")
        if rank is None and recorded is not None and len(torch_profile.ranks_seen(recorded)) > 1:
            rank = 0
        fell_back = tier3(ctx, pod, argv, table, regex, python=False,
                          rank=int(rank) if rank is not None and inject else None, measured={
            "setup_s": wall0, "tier2_wall_s": time.time() - t2 if 2 in tiers else None,
            "setup_basis": "the command's own run" + (
                " (under torch.profiler)" if recorded is not None else "")})
        if fell_back:
            # No Tier 1 here: GPM over the command's run is what there is.
            from ..verdicts.kernel import first_match

            findings.without_counters(ctx, first_match(table, regex))


def command_argv(ctx: "RunContext", command: str) -> List[str]:
    """The argv of a ``cmd:`` workload, with no shell between a profiler and the program
    where the command allows (:mod:`.cmdline`); its own ``NAME=value`` words go to the
    run's environment.

    Raises:
        WorkloadError: the program is not on the pod's PATH (the shell would have said
            "not found" and exited 127; without a shell, say it as clearly).
    """
    from ..cmdline import plan_command

    plan = plan_command(command)
    ctx.env.update(plan.env)
    if "PATH" not in plan.env and "PATH" not in (ctx.spec.get("env") or {}):
        # A PATH the person gave (in the command or with --env) is theirs to keep.
        ctx.env["PATH"] = pythons.path_for(ctx.env.get("PATH", os.defpath),
                                           ctx.python_choice)
    if plan.how == "exec":
        plan.argv = pythons.command_argv(plan.argv, ctx.python_choice)
        program = plan.argv[0]
        if os.sep in program and not os.path.isabs(program):
            # ./run.sh is the work dir's (the workspace's), not the worker's current one.
            program = os.path.join(ctx.work_dir, program)
        found = shutil.which(program, path=ctx.env.get("PATH", os.defpath))
        if found is None:
            raise WorkloadError("cmd: %s: command not found on the pod (PATH=%s)"
                                % (plan.argv[0], ctx.env.get("PATH", os.defpath)))
    return plan.argv


# ----------------------------------------------------------------------------- python
def child_argv(ctx: "RunContext", mode: str, *args: str) -> List[str]:
    from ..runs import agent_entry

    return [pythons.interpreter(ctx.python_choice), agent_entry(), "child", mode, ctx.run_id,
            *args]


def ensure_cupy(ctx: "RunContext", pod: Pod) -> None:
    if pod.has_package("cupy"):
        return
    python = pythons.interpreter(ctx.python_choice)
    major = str(pod.facts.get("cuda_driver") or "").split(".")[0]
    wheel = "cupy-cuda13x" if major == "13" else "cupy-cuda12x" if major == "12" else None
    if wheel and ctx.spec.get("install_cupy"):
        argv = pythons.pip_install_argv(python, wheel)
        ctx.emit(wire.make("log", level="info", message="installing %s (asked for)" % wheel))
        res = procs.run_streaming(argv, emit=ctx.emit, tier=None, cwd=ctx.run_dir, env=ctx.env)
        if res.returncode == 0:
            return
    ctx.emit(wire.make(
        "diagnosis", code="no_cupy", severity="error", title="CuPy is not installed on the pod",
        cause="%s cannot import cupy; the bundled kernels and Tier 1 need it" % python,
        meaning="nothing can run on the GPU from Python until CuPy is installed",
        remedies=[" ".join(pythons.pip_install_argv(python, wheel)) if wheel else
                  "install the CuPy wheel that matches the driver's CUDA major version",
                  "or run again with --install-cupy to let gpuws install %s" % (wheel or "it")],
        details={"driver_cuda": pod.facts.get("cuda_driver"), "wheel": wheel,
                 "python": pod.python.get("reason")}))
    raise WorkloadError("CuPy is missing on the pod (%s fits driver CUDA %s)"
                        % (wheel or "no known wheel", pod.facts.get("cuda_driver")))


def run_python(ctx: "RunContext", ref: Any, pod: Pod) -> None:
    """A ``builtin:`` or ``file:`` workload through the tiers asked for."""
    if not pod.has_gpu:
        ctx.emit(wire.make("diagnosis", code="no_gpu", severity="error", title="No GPU on the pod",
                           cause=str(pod.facts.get("gpu_error") or "no NVIDIA GPU was found"),
                           remedies=["run on a machine with an NVIDIA GPU and driver"]))
        raise WorkloadError("no NVIDIA GPU on this pod: %s" % pod.facts.get("gpu_error"))
    ensure_cupy(ctx, pod)
    regex = ctx.spec.get("kernel_regex") or declared_regex(ref)
    tiers = tiers_of(ctx)
    iters = str(max(1, int(ctx.spec.get("profile_iters") or 10)))
    static_done = False
    measured: Dict[str, Any] = {}
    if 1 in tiers:
        measured = tier1(ctx)
        static_done = True
    if procs.CANCELLED["flag"]:
        return
    target = child_argv(ctx, "exec", iters)
    t2 = time.time()
    table = tier2(ctx, pod, target, python=True, torch_argv=child_argv(ctx, "torchprof", iters),
                  regex=regex) if 2 in tiers else None
    if 2 in tiers:
        measured["tier2_wall_s"] = time.time() - t2
    if 3 in tiers and not procs.CANCELLED["flag"]:
        fell_back = tier3(ctx, pod, target, table, regex, python=True, measured=measured)
        if fell_back and not static_done:
            run_child(ctx, "static", tier=3)
        if fell_back:
            findings.without_counters(ctx, regex or (str(table[0]["name"]) if table else None))


def declared_regex(ref: Any) -> Optional[str]:
    """The workload's own main-kernel regex, without touching the GPU."""
    if ref.kind != "builtin":
        return None
    try:
        from ...kernels.registry import make_builtin

        value = make_builtin(ref.target, ref.params).kernel_regex
        return str(value) if value else None
    except Exception:
        return None


#: The child modes a fork server may start (:mod:`..forkserver`): those run as a plain
#: child. ``exec`` and ``torchprof`` run under nsys, ncu or torch.profiler, which must
#: start the process themselves.
FORKABLE = ("tier1", "static")


def run_child(ctx: "RunContext", mode: str, *args: str, tier: int) -> procs.ProcResult:
    spawn = launcher(ctx) if mode in FORKABLE else None
    result = procs.run_streaming(child_argv(ctx, mode, *args), emit=ctx.emit, tier=tier,
                                 cwd=ctx.work_dir, env=ctx.env, child_events=True,
                                 timeout_s=ctx.spec.get("timeout_s"), spawn=spawn)
    if result.returncode != 0 and not procs.CANCELLED["flag"]:
        last = (result.stderr_tail.strip().splitlines() or ["exit %d" % result.returncode])[-1]
        raise WorkloadError("the workload failed in %s: %s" % (mode, last))
    return result


def launcher(ctx: "RunContext") -> Optional[procs.Spawn]:
    """The fork server's spawn for runs that asked for it (``RunSpec.fork_server``: the
    runs of ``gpuws watch``), found or started once per run; None: a fresh process."""
    if not ctx.spec.get("fork_server"):
        return None
    if "spawn" not in ctx.launch:
        from ..forkserver import launcher_for

        ctx.launch["spawn"] = launcher_for(ctx)
    spawn: Optional[procs.Spawn] = ctx.launch["spawn"]
    return spawn


def tier1(ctx: "RunContext") -> Dict[str, Any]:
    """The ``tier1`` child, with the GPU's clocks read while it samples (:mod:`.clocks`):
    its ``tier1_result`` leaves with ``clocks`` added, or without any where NVML cannot
    read the run's GPU; NVML GPM brackets the same window (:mod:`..pod.gpm`) and leaves
    with the ``tier_finished``.

    Returns:
        What Tier 3's estimate uses: ``setup_s`` (the child's start to its first timed
        round, with its ``setup_basis``) and ``tier1_median_ms``, where seen.
    """
    argv = child_argv(ctx, "tier1")
    ctx.emit(wire.make("tier_started", tier=1, name="CUDA events", argv=argv))
    t0 = time.time()
    gpu: Dict[str, float] = {"s": 0.0}
    measured: Dict[str, Any] = {}
    orig = ctx.emit
    sampler = clocks.sampler_for(run_gpu_index(ctx))
    window = gpm.window_for(run_gpu_index(ctx))

    def watch(event: Dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == clocks.WINDOW_EVENT:
            edge = str(event.get("edge"))
            if sampler is not None:
                sampler.mark(edge)
            if edge == "start":
                window.open()
                if launcher(ctx) is None:
                    # A forked child skips the imports a profiled process (Tier 3's)
                    # pays: its start is no estimate of theirs.
                    measured.setdefault("setup_s", time.time() - t0)
                    measured["setup_basis"] = "the Tier-1 child's start and setup"
            elif edge == "end":
                window.close()
            return  # the child's private marker: never in the run's log
        if kind == "samples":
            gpu["s"] += sum(event.get("values_ms") or []) * int(event.get("batch") or 1) / 1000
        elif kind == "tier1_result":
            # Only clocks this worker read go out: whatever a workload wrote there is dropped.
            event = {k: v for k, v in event.items() if k != "clocks"}
            summary = sampler.summary() if sampler is not None else None
            if summary is not None:
                event["clocks"] = summary
            median = (event.get("stats") or {}).get("median_ms")
            if isinstance(median, (int, float)):
                measured["tier1_median_ms"] = float(median)
        orig(event)

    ctx.emit = watch
    if sampler is not None:
        sampler.start()
    try:
        run_child(ctx, "tier1", tier=1)
    finally:
        ctx.emit = orig
        if sampler is not None:
            sampler.stop()
        window.close()  # frees its samples whatever happened (idempotent)
    ctx.emit(wire.make("tier_finished", tier=1, status="ok", wall_s=time.time() - t0,
                       gpu_s=gpu["s"], source="CUDA events (CuPy)",
                       gpm=with_timed_share(window.close(), gpu["s"])))
    return measured


def with_timed_share(result: Dict[str, Any], timed_s: float) -> Dict[str, Any]:
    """GPM's Tier-1 figures with the share of their window the timed calls took (the
    rest, flushes and idle holds, dilutes GPM's averages: a verdict must know how much)."""
    window = result.get("window_s")
    if not window or timed_s <= 0:
        return result
    return dict(result, timed_share_pct=min(100.0, 100.0 * timed_s / float(window)))


# ----------------------------------------------------------------------------- tier 2
def tier2(ctx: "RunContext", pod: Pod, target: List[str], *, python: bool,
          torch_argv: Optional[List[str]] = None, inject: bool = False,
          recorded: Optional[str] = None, regex: Optional[str] = None
          ) -> Optional[List[Dict[str, Any]]]:
    """Which kernels matter: returns the ranked kernel rows (or None).

    In order: nsys when a working one exists; else torch.profiler, with the GPU idle and
    memcpy shares (the ``torchprof`` child for a ``builtin:``/``file:`` workload; for a
    ``cmd:`` that starts Python (``inject``), injected at interpreter start, where
    ``recorded`` is the directory the command's own run already left its profiles in, so
    nothing runs again); else one ncu pass of ``gpu__time_duration.sum``, for what nothing
    else can time. Each path that runs a command announces it with its own
    ``tier_started`` (argv included), so the export lists every command Tier 2 really ran.

    The torchprof child costs a torch import and CUPTI's start (4.1–5.2 s for
    ``profile().start()`` on one H200 host; saxpy's Tier 2 took 9.2 s there against 3.0 s
    for an ncu pass): the shares are what that buys.
    """
    t0 = time.time()
    tried: List[str] = []
    ran = False  # whether some path ran a command (and so announced the tier itself)
    nsys = pod.nsys(ctx.spec.get("workload"))
    if nsys:
        ran = True
        found = tier2_nsys(ctx, pod, nsys, target, python, tried)
        if found is not None:
            return finish_tier2(ctx, t0, found[0], "nsys", tried, found[1], regex)
    else:
        tried.append(pod.nsys_passed_over(ctx.spec.get("workload"))
                     or "nsys: not installed on the pod")
    if python and torch_argv and pod.has_package("torch"):
        ran = True
        found = tier2_torch(ctx, torch_argv, False, tried)
        if found is not None:
            return finish_tier2(ctx, t0, found[0], torch_profile.source_label(False), tried,
                                found[1], regex)
    elif python:
        tried.append("torch.profiler: torch is not installed")
    elif inject and not procs.CANCELLED["flag"]:
        ran = True
        found = tier2_recorded(ctx, recorded, tried) if recorded is not None \
            else tier2_torch(ctx, target, True, tried)
        if found is not None:
            return finish_tier2(ctx, t0, found[0], torch_profile.source_label(True), tried,
                                found[1], regex)
    if not procs.CANCELLED["flag"]:
        sel = pod.select_ncu([])
        if sel.get("selected") and pod.counters.get("verdict") != "blocked":
            ran = True
            rows = tier2_ncu(ctx, str(sel["selected"]), target, python, tried)
            if rows is not None:
                return finish_tier2(ctx, t0, rows, "ncu gpu__time_duration", tried,
                                    regex=regex)
        else:
            tried.append("ncu: " + ("counters are blocked" if sel.get("selected")
                                    else "no compatible ncu"))
    if not ran:
        ctx.emit(wire.make("tier_started", tier=2, name="kernel timeline"))
    ctx.emit(wire.make("diagnosis", code="no_timeline", severity="warning",
                       title="No kernel timeline", cause="; ".join(tried),
                       meaning="Tier 3 needs a kernel regex (--kernel-regex) to pick kernels",
                       remedies=["install Nsight Systems, or torch for Python workloads"]))
    ctx.emit(wire.make("tier_finished", tier=2, status="failed", wall_s=time.time() - t0,
                       reason="; ".join(tried)))
    return None


def finish_tier2(ctx: "RunContext", t0: float, rows: List[Dict[str, Any]], source: str,
                 tried: List[str], extra: Optional[Dict[str, Any]] = None,
                 regex: Optional[str] = None) -> List[Dict[str, Any]]:
    """Emit the kernel table, the end of Tier 2, and the program verdict (before Tier 3
    chooses its target, so it can say whether that target is worth profiling)."""
    event = wire.make("kernel_table", source=source, kernels=rows)
    event.update(extra or {})
    ctx.emit(event)
    gpu_s = sum(float(r["total_ns"]) for r in rows) / 1e9
    ctx.emit(wire.make("tier_finished", tier=2, status="ok" if not tried else "fallback",
                       wall_s=time.time() - t0, gpu_s=gpu_s, source=source,
                       reason="; ".join(tried)))
    findings.after_tier2(ctx, event, regex, 3 in tiers_of(ctx))
    return rows


def tier2_torch(ctx: "RunContext", argv: List[str], inject: bool, tried: List[str]
                ) -> Optional[Tuple[List[Dict[str, Any]], Dict[str, Any]]]:
    """torch.profiler's kernel table and GPU idle/memcpy shares, or None (``tried`` says
    why). ``inject``: ``argv`` is the workload's own command, profiled through the
    ``sitecustomize`` of :mod:`.torch_inject`; else ``argv`` is the ``torchprof`` child.
    """
    from .torch_profile import prepare

    env = dict(ctx.env)
    out = prepare(ctx.run_dir, env, inject)
    ctx.emit(wire.make("tier_started", tier=2, name="kernel timeline (torch.profiler%s)"
                       % (", injected" if inject else ""), argv=argv))
    res = procs.run_streaming(argv, emit=ctx.emit, tier=2, cwd=ctx.work_dir, env=env,
                              child_events=not inject, timeout_s=ctx.spec.get("timeout_s"))
    if res.returncode != 0:
        tried.append("torch.profiler: the workload exited with code %d" % res.returncode)
        return None
    return torch_table(ctx, out, inject, tried)


def torch_table(ctx: "RunContext", out: str, inject: bool, tried: List[str]
                ) -> Optional[Tuple[List[Dict[str, Any]], Dict[str, Any]]]:
    """What torch.profiler left in ``out``: the kernels and shares, or None (``tried``
    says why); the problems met reading it go to the run's log."""
    from .timeline_trace import Merger
    from .torch_profile import read_results

    merger = Merger()
    got = read_results(out, merger=merger)
    try:
        # The timeline a person opens (gpuws trace): pulled with the run's artifacts.
        if merger.write(ctx.artifact_dir) is not None:
            ctx.announce_artifacts()
    except OSError as exc:
        ctx.emit(wire.make("log", level="warning",
                           message="timeline trace not kept: %s" % (exc.strerror or exc)))
    for problem in got["problems"]:
        ctx.emit(wire.make("log", level="warning", message="torch.profiler: %s" % problem))
    if not got["kernels"]:
        tried.append("torch.profiler: no kernel recorded (%s)" % (
            "no Python process imported torch" if not got["processes"] and inject
            else "; ".join(got["problems"][:2]) or "no GPU activity"))
        return None
    return got["kernels"], {k: got.get(k) for k in TIMELINE_KEYS}


def tier2_recorded(ctx: "RunContext", out: str, tried: List[str]
                   ) -> Optional[Tuple[List[Dict[str, Any]], Dict[str, Any]]]:
    """The kernel table from the profiles the workload's own run (Tier 0) left in ``out``."""
    ctx.emit(wire.make("tier_started", tier=2,
                       name="kernel timeline (torch.profiler, injected in the workload's run)"))
    return torch_table(ctx, out, True, tried)


def tier2_nsys(ctx: "RunContext", pod: Pod, nsys: str, target: List[str], python: bool,
               tried: List[str]) -> Optional[Tuple[List[Dict[str, Any]], Dict[str, Any]]]:
    """nsys profile + stats: the ranked rows and the timeline's idle/memcpy shares.

    A run nsys traced only in part (a program newer than its CUPTI) or could not import
    is said in one line (``tried``) and gives None, so Tier 2 falls back instead of
    showing a table that misses kernels.
    """
    from ..profilers import nsys_output
    from .tier2_parse import parse_nsys_kern_sum_csv, parse_nsys_sqlite, rank_kernels

    base = os.path.join(ctx.artifact_dir, "timeline")
    argv = [nsys, "profile", "--trace=cuda", "--force-overwrite=true", "--export=sqlite",
            "-o", base]
    if python:
        argv += ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
    argv += target
    ctx.emit(wire.make("tier_started", tier=2, name="kernel timeline (nsys)", argv=argv))
    res = procs.run_streaming(argv, emit=ctx.emit, tier=2, cwd=ctx.work_dir, env=ctx.env,
                              timeout_s=ctx.spec.get("timeout_s"))
    rep = base + ".nsys-rep"
    said = nsys_output.diagnose(res.stdout_tail + "\n" + res.stderr_tail,
                                pod.nsys_version(nsys), nsys_output.nsys_cupti(nsys),
                                pod.program_cuda())
    if res.returncode != 0 or not os.path.exists(rep):
        # Seen on real pods: nsys exists, runs, and leaves only a .qdstrm behind.
        tried.append("nsys: no report came out (exit %d)%s" % (
            res.returncode, ": " + said if said else ""))
        return None
    keep_nsys_trace(ctx, base + ".sqlite")
    if said is not None:
        tried.append(said)
        if os.path.exists(rep):  # traced in part, not failed: not worth a retry here
            nsys_output.remember_partial(runs.cache_root(), nsys, nsys_output.workload_key(
                str(ctx.spec.get("workload")), pod.program_cuda()))
        return None
    for report in ("cuda_gpu_kern_sum", "gpukernsum"):
        stats = procs.run_streaming([nsys, "stats", "--report", report, "--format", "csv",
                                     "--output", "-", rep], emit=lambda e: None, tier=2,
                                    cwd=ctx.run_dir, env=ctx.env, timeout_s=300)
        try:
            rows = parse_nsys_kern_sum_csv(stats.stdout_tail)
        except ValueError:
            continue
        if rows:
            extra: Dict[str, Any] = {}
            instances: Dict[str, Dict[str, Any]] = {}
            sqlite = base + ".sqlite"
            if os.path.exists(sqlite):
                try:
                    tl = parse_nsys_sqlite(sqlite)
                    extra = {k: tl.get(k) for k in TIMELINE_KEYS}
                    instances = tl.get("instances") or {}
                except (ValueError, OSError):
                    pass
            ctx.announce_artifacts()
            return with_instances(rank_kernels(rows), instances), extra
    # nsys stats runs its reports under the pod's python3 with modules a distribution may
    # package apart (Debian's nsysstats): the export the profile left is the same data.
    sqlite = base + ".sqlite"
    try:
        tl = parse_nsys_sqlite(sqlite)
    except (ValueError, OSError) as exc:
        tried.append("nsys stats: neither cuda_gpu_kern_sum nor gpukernsum gave a table, "
                     "and the SQLite export could not be read (%s)" % exc)
        return None
    if not tl.get("kernels"):
        tried.append("nsys: the trace holds no CUDA kernel")
        return None
    ctx.emit(wire.make("log", level="info", message=(
        "nsys stats gave no table; the kernel table is read from nsys's SQLite export")))
    ctx.announce_artifacts()
    return (with_instances(rank_kernels(tl["kernels"]), tl.get("instances") or {}),
            {k: tl.get(k) for k in ("gpu_idle_pct", "memcpy_pct")})


def with_instances(rows: List[Dict[str, Any]], instances: Dict[str, Dict[str, Any]]
                   ) -> List[Dict[str, Any]]:
    """``rows`` with the instance of each (grid, block, launch_skip) nsys's export gave."""
    for row in rows:
        row.update(instances.get(str(row["name"])) or {})
    return rows


def keep_nsys_trace(ctx: "RunContext", sqlite: str) -> None:
    """The nsys timeline as the Chrome/Perfetto trace every Tier 2 keeps (``gpuws trace``),
    from the SQLite export the profile left; a failure costs the trace, not the tier."""
    import sqlite3

    from .timeline_trace import Merger

    if not os.path.isfile(sqlite):
        return
    merger = Merger()
    try:
        merger.add_nsys(sqlite)
        if merger.write(ctx.artifact_dir) is not None:
            ctx.announce_artifacts()
    except (OSError, sqlite3.Error) as exc:
        ctx.emit(wire.make("log", level="warning",
                           message="timeline trace not kept: %s" % str(exc)[:200]))


def tier2_ncu(ctx: "RunContext", ncu: str, target: List[str], python: bool,
              tried: List[str]) -> Optional[List[Dict[str, Any]]]:
    from ..profilers.ncu_reader import read_raw_csv
    from ..safefiles import read_regular
    from .tier2_parse import launch_instances, ncu_dims, rank_kernels

    # ncu's own output (the CSV page, its ==PROF== lines) goes to a file, so stdout carries
    # only the workload's, shown under Tier 2 as every other tier shows it; mixed in with
    # the CSV it was lost, and a workload line could have been read as a row.
    log = os.path.join(ctx.run_dir, "ncu-pass.log")
    try:
        os.unlink(log)
    except OSError:
        pass
    argv = [ncu, "--metrics", "gpu__time_duration.sum", "--csv", "--page", "raw",
            "--kernel-name-base", "demangled", "--target-processes", "all",
            *gpusel.ncu_device_args(ctx.gpu),
            "--clock-control", str(ctx.spec.get("clock_control") or "none"),
            "--log-file", log]
    if python:
        argv += ["--profile-from-start", "off"]
    argv += target
    ctx.emit(wire.make("tier_started", tier=2, name="kernel timeline (ncu pass)", argv=argv))
    res = procs.run_streaming(argv, emit=ctx.emit, tier=2, cwd=ctx.work_dir, env=ctx.env,
                              timeout_s=ctx.spec.get("timeout_s"))
    try:
        # A page per launch: 16 MiB is some 40,000 launches.
        text = read_regular(log, 1 << 24).decode("utf-8", "replace")
    except OSError:
        text = ""
    launches = read_raw_csv(text) if res.returncode == 0 else []
    launches.sort(key=lambda x: int(x.get("launch") or 0))  # ncu's ID: its launch order
    totals: Dict[str, Dict[str, Any]] = {}
    for launch in launches:
        dur = (launch.get("metrics") or {}).get("duration_ns")
        if dur is None:
            continue
        row = totals.setdefault(launch["kernel"], {"name": launch["kernel"], "calls": 0,
                                                   "total_ns": 0.0})
        row["calls"] += 1
        row["total_ns"] += float(dur)
    if not totals:
        tried.append("ncu pass: no kernel durations (exit %d)" % res.returncode)
        return None
    instances = launch_instances(
        [x["kernel"], *ncu_dims(x.get("grid")), *ncu_dims(x.get("block")),
         (x.get("metrics") or {}).get("duration_ns")] for x in launches)
    return with_instances(rank_kernels(list(totals.values())), instances)


# ----------------------------------------------------------------------------- tier 3
def counters_blocked(ctx: "RunContext", *, observed: bool, cause: str, tier1_ran: bool) -> None:
    ctx.emit(wire.make(
        "diagnosis", code="counters_blocked", severity="warning",
        title="GPU performance counters are blocked" + (" (ncu said so)" if observed else ""),
        cause=cause,
        meaning="Nsight Compute cannot read hardware counters here, so Tier 3 metrics are "
                "not measured; Tier 1 timing%s and static analysis (registers, shared and "
                "local memory, theoretical occupancy) are given instead"
                % (" and Tier 2" if tier1_ran else ""),
        remedies=COUNTER_REMEDIES, unmeasured=NCU_METRICS))


def tier3_choice(ctx: "RunContext", table: List[Dict[str, Any]]) -> str:
    """The kernel Tier 3 profiles when the person named none: Tier 2's top kernel, passing
    over collectives (NCCL's all-reduce and kin). ncu replays a kernel several times to
    collect its counters, and a collective waits on peers that take part once, so it would
    hang the ranks; the top compute kernel is what there is to learn from on that rank.
    A person who wants a collective's counters names it with ``--kernel-regex``."""
    from .trace_analysis import COMM_KERNEL

    top = str(table[0]["name"])
    compute = next((str(r["name"]) for r in table if not COMM_KERNEL.match(str(r["name"]))),
                   None)
    if compute is None or compute == top:
        return top
    ctx.emit(wire.make("log", level="info", message=(
        "Tier 3 profiles `%s`, the top kernel that is not a collective: ncu's replay of "
        "`%s` would wait on the other ranks (name it with --kernel-regex to try)"
        % (shown(compute), shown(top)))))
    return compute


def tier3(ctx: "RunContext", pod: Pod, target: List[str], table: Optional[List[Dict[str, Any]]],
          regex: Optional[str], *, python: bool,
          measured: Optional[Dict[str, Any]] = None, rank: Optional[int] = None) -> bool:
    """Nsight Compute on the chosen kernels. Returns True when it fell back.

    ``rank``: profile only that rank's process of a command that starts several Pythons
    (:func:`.torch_profile.prepare_rank`).

    ``measured``: what earlier tiers measured for the estimate (:mod:`.tier3_cost`);
    the estimate rides on the ``tier_started`` that carries ncu's argv, and a plan over
    ``max_tier3_s`` is stopped before ncu starts (:func:`tier3_budget`).
    """
    from ..verdicts import kernelnames

    t0 = time.time()
    tier1_ran = 1 in tiers_of(ctx)
    if pod.counters.get("verdict") == "blocked":
        ctx.emit(wire.make("tier_started", tier=3, name="Nsight Compute"))
        counters_blocked(ctx, observed=False, cause=str(pod.counters.get("reason")),
                         tier1_ran=tier1_ran)
        ctx.emit(wire.make("tier_finished", tier=3, status="fallback", wall_s=time.time() - t0,
                           reason="counters blocked (predicted before running ncu)"))
        return True
    # The kernel Tier 2 chose, when Tier 3 is to profile it (None: the person's regex).
    chosen_name: Optional[str] = None
    # The launches of it ncu skips to reach the instance Tier 2 chose (None: the spec's).
    skip: Optional[int] = None
    # Its row of Tier 2's table: the instance Tier 2 saw most of it run as.
    chosen_row: Optional[Dict[str, Any]] = None
    if not regex and table:
        chosen_name = tier3_choice(ctx, table)
        chosen_row = next((r for r in table if str(r["name"]) == chosen_name), None)
    if chosen_name is not None:
        # Every spelling of it (torch.profiler's, nsys's, ncu's), and no sibling instance.
        regex = kernelnames.ncu_regex(chosen_name)
    if chosen_row is not None:
        skip = instance_skip(ctx, chosen_row)
    estimate = tier3_estimate(ctx, table, regex, measured or {}, launch_skip=skip)
    tier3_budget(ctx, estimate, t0)
    excluded: List[str] = []
    report = os.path.join(ctx.artifact_dir, "profile")
    name_base = "demangled"
    ncu, sel, res, parser = run_ncu(ctx, pod, target, regex, name_base, report, excluded,
                                    python=python, estimate=estimate, rank=rank,
                                    launch_skip=skip)
    if ncu is None:
        return no_ncu(ctx, sel, t0)
    assert res is not None and parser is not None
    if parser.no_kernels and chosen_name is not None:
        listed, grade = kernelnames.best_match(chosen_name, parser.available_kernels)
        # Only Tier 2's kernel itself: another instance of the same function (the base
        # name alone agrees) is another kernel, and profiling it would answer another
        # question.
        if listed is not None and grade in (kernelnames.EXACT, kernelnames.TEMPLATE):
            if skip is not None and safe_search(regex, listed):
                # The filter took ncu's name: it was the skip that went past every launch
                # (this run launched fewer of it than Tier 2's profile saw).
                ctx.emit(wire.make("log", level="warning", message=(
                    "ncu saw fewer than %d launches of `%s`: profiled its first launch "
                    "instead of the one Tier 2 chose" % (skip + 1, shown(chosen_name)))))
                skip = None
            else:
                # ncu spells the kernel some way the regex did not foresee: profile it by
                # the name ncu itself listed, in the same run, and say so.
                regex, name_base = retarget(listed)
                ctx.emit(wire.make("log", level="info", message=(
                    "ncu names it `%s`: profiled that (Tier 2's `%s` matched none of its "
                    "kernels as spelled)" % (shown(listed), shown(chosen_name)))))
            ncu, sel, res, parser = run_ncu(ctx, pod, target, regex, name_base, report,
                                            excluded, python=python, estimate=estimate,
                                            rank=rank, launch_skip=skip)
            if ncu is None:
                return no_ncu(ctx, sel, t0)
            assert res is not None and parser is not None
    wall = time.time() - t0
    if parser.profiler_unavailable is not None:
        ctx.emit(wire.make(
            "diagnosis", code="ncu_profiler_unavailable", severity="warning",
            title="Nsight Compute's profiler could not start here",
            cause="ncu: %s" % parser.profiler_unavailable[:300],
            meaning="ncu could not load or start its profiling library on this machine (seen "
                    "in gVisor-sandboxed containers, whose GPU passthrough lacks the "
                    "profiling interface), so Tier 3 metrics are not measured; Tier 1 timing, "
                    "Tier 2, NVML GPM and static analysis are given instead",
            remedies=["run the pod on a VM or bare-metal runtime rather than a gVisor "
                      "sandbox (ask the provider for one)",
                      "check that ncu and the driver match: `gpuws ncu HOST`"],
            unmeasured=NCU_METRICS))
        ctx.emit(wire.make("tier_finished", tier=3, status="fallback", wall_s=wall,
                           reason="ncu's profiler could not start (%s)"
                           % parser.profiler_unavailable[:200]))
        return True
    if parser.perm_error:
        counters_blocked(ctx, observed=True, cause="ncu: ERR_NVGPUCTRPERM - the user does not "
                         "have permission to access NVIDIA GPU performance counters",
                         tier1_ran=tier1_ran)
        ctx.emit(wire.make("tier_finished", tier=3, status="fallback", wall_s=wall,
                           reason="ERR_NVGPUCTRPERM"))
        return True
    if parser.no_kernels:
        # A regex written from Tier 2's name runs to thousands of characters: the name
        # says what was meant, the details keep the regex.
        asked = ("Tier 2's `%s` (%s)" % (shown(chosen_name), "-k regex:%s" % shown(
            str(regex), 80)) if chosen_name is not None else "-k regex:%s" % regex)
        ctx.emit(wire.make(
            "diagnosis", code="no_kernel_matched", severity="error",
            title="No kernel matched the filter",
            cause="ncu profiled nothing for %s" % asked,
            meaning="the regex did not match any kernel launched after setup",
            remedies=["try --kernel-regex '%s'" % parser.suggested_regex]
            if parser.suggested_regex else ["pick a name from the kernels ncu saw"],
            details={"available_kernels": parser.available_kernels,
                     "suggested_regex": parser.suggested_regex, "regex": regex}))
        ctx.emit(wire.make("tier_finished", tier=3, status="failed", wall_s=wall,
                           reason="no kernel matched %s" % asked))
        return False
    rep = report + ".ncu-rep"
    if res.returncode != 0 or not os.path.exists(rep):
        why = (parser.errors or [res.stderr_tail.strip()[-300:] or "exit %d" % res.returncode])
        ctx.emit(wire.make("tier_finished", tier=3, status="failed", wall_s=wall,
                           reason="ncu failed: %s" % why[-1]))
        return False
    launches = read_report(ctx, str(ncu), rep)
    from ..profilers.ncu_reader import kernel_metrics_event, rule_findings_event

    for launch in launches:
        ctx.emit(kernel_metrics_event(launch))
    if chosen_name is not None and launches:
        profiled_what(ctx, chosen_name, [str(x.get("kernel") or "") for x in launches])
        if chosen_row is not None:
            profiled_instance(ctx, chosen_row, launches[0])
    if launches:
        ctx.emit(rule_findings_event(launches))
        findings.after_tier3(ctx, launches, table, regex,
                             findings.sm_count_of(pod.facts, run_gpu_index(ctx)),
                             launch_skip=skip)
    ctx.announce_artifacts()
    passes = sum(int(p.get("passes") or 0) for p in parser.profiled)
    learn_passes(ctx, parser.profiled)
    kernel_ns = sum(float(x["metrics"].get("duration_ns") or 0) for x in launches)
    gpu_s = kernel_ns * max(passes, 1) / 1e9  # each replay pass runs the kernel again
    # Tier 3's time is up to its end, the report read: what the estimate says it is.
    wall = time.time() - t0
    learn_start(ctx, wall, estimate, (measured or {}).get("setup_s"), parser.profiled)
    ctx.emit(wire.make("tier_finished", tier=3, status="ok", wall_s=wall, gpu_s=gpu_s,
                       source="ncu_report" if launches and launches[0].get("source") ==
                       "ncu_report" else "csv",
                       reason="%d kernel launch(es), %d passes" % (len(launches), passes)))
    return False


def profiled_what(ctx: "RunContext", chosen: str, profiled: List[str]) -> None:
    """Say when ncu profiled something other than Tier 2's kernel: a sibling instance of
    the same template (only the base name agrees), which a regex cut short can take."""
    from ..verdicts import kernelnames

    grades = [kernelnames.same_kernel(chosen, name) for name in profiled]
    if any(g in (kernelnames.EXACT, kernelnames.TEMPLATE) for g in grades):
        return
    ctx.emit(wire.make("log", level="warning", message=(
        "ncu profiled `%s`, not Tier 2's `%s`%s: give --kernel-regex to pick it"
        % (shown(profiled[0]), shown(chosen), " (another instance of the same function)"
           if kernelnames.BASE in grades else ""))))


def instance_skip(ctx: "RunContext", row: Dict[str, Any]) -> Optional[int]:
    """The ``--launch-skip`` that brings ncu to the instance of ``row`` Tier 2 chose (the
    launch configuration that took most of its time, :mod:`.trace_analysis`), and a line
    saying so; None where that is its first launch, the profile did not say, or the
    person chose a skip.

    Tier 2 counts the kernel's own launches because ncu's ``--launch-skip`` counts only
    the launches its ``-k`` filter matched (``--launch-skip-before-match`` is the one that
    counts every launch: ``ncu --help``, and the CLI's filter examples)."""
    got = row.get("launch_skip")
    if ctx.spec.get("launch_skip") or not isinstance(got, int) or isinstance(got, bool) \
            or got <= 0:
        return None
    ctx.emit(wire.make("log", level="info", message=(
        "profiling launch %d of `%s`: grid %s, block %s, the launch configuration that "
        "took most of its time in Tier 2" % (got + 1, shown(str(row["name"])),
                                              row.get("grid"), row.get("block")))))
    return got


def profiled_instance(ctx: "RunContext", row: Dict[str, Any], launch: Dict[str, Any]) -> None:
    """Say when the launch ncu profiled ran with another configuration than the one Tier 2
    chose (a run that launches differently from the profiled one)."""
    want, got = (row.get("grid"), row.get("block")), (launch.get("grid"), launch.get("block"))
    if None in want or None in got or want == got:
        return
    ctx.emit(wire.make("log", level="warning", message=(
        "ncu profiled `%s` with grid %s, block %s; Tier 2 chose grid %s, block %s: give "
        "--launch-skip to pick the launch" % (shown(str(row["name"])), got[0], got[1],
                                               want[0], want[1]))))


def safe_search(regex: Optional[str], name: str) -> bool:
    """Whether ``regex`` finds ``name`` (False for a regex Python cannot read)."""
    try:
        return re.search(regex or ".*", name) is not None
    except re.error:
        return False


def run_ncu(ctx: "RunContext", pod: Pod, target: List[str], regex: Optional[str],
            name_base: str, report: str, excluded: List[str], *, python: bool,
            estimate: Dict[str, Any], rank: Optional[int] = None,
            launch_skip: Optional[int] = None
            ) -> Tuple[Optional[str], Dict[str, Any], Optional[procs.ProcResult], Any]:
    """One targeted ncu profile, stepping back one ncu release while one says the driver
    is not compatible (``excluded`` grows); with ``rank``, only that rank's process
    (:func:`.torch_profile.prepare_rank`); ``launch_skip`` in place of the spec's.

    Returns:
        (the ncu that ran, the selection, its result, its :class:`NcuConsoleParser`);
        the ncu is None when none fits the pod (then result and parser are None).
    """
    from ..profilers.ncu_cmd import DEFAULT_SECTIONS, build_ncu_argv
    from ..profilers.ncu_output import NcuConsoleParser, progress_event

    chosen = ctx.spec.get("ncu_path")
    while True:
        sel = pod.select_ncu(excluded)
        ncu = chosen or sel.get("selected")
        if not ncu:
            return None, sel, None, None
        argv = build_ncu_argv(
            str(ncu), report_path=report, target_argv=target, kernel_regex=regex,
            launch_skip=int(ctx.spec.get("launch_skip") or 0) if launch_skip is None
            else launch_skip,
            launch_count=int(ctx.spec.get("launch_count") or 1),
            ncu_set=ctx.spec.get("ncu_set"),
            sections=ctx.spec.get("ncu_sections") or (None if ctx.spec.get("ncu_set")
                                                      else list(DEFAULT_SECTIONS)),
            replay_mode=ctx.spec.get("replay_mode"),
            clock_control=str(ctx.spec.get("clock_control") or "none"),
            cache_control=str(ctx.spec.get("cache_control") or "all"),
            device_args=gpusel.ncu_device_args(ctx.gpu), name_base=name_base)
        if python:
            # Only what runs between cudaProfilerStart/Stop: the workload, not its setup.
            argv[1:1] = ["--profile-from-start", "off"]
        env = ctx.env
        if rank is not None:
            env = dict(ctx.env)
            argv[1:1] = torch_profile.prepare_rank(ctx.run_dir, env, rank)
        ctx.emit(wire.make("tier_started", tier=3, name="Nsight Compute %s"
                           % (sel.get("selected_version") or ""), argv=argv,
                           estimate=estimate))
        parser = NcuConsoleParser(regex)

        def on_chunk(stream: str, text: str, parser: NcuConsoleParser = parser) -> None:
            for item in parser.feed(text, stream):
                if item.get("kind") == "progress":
                    ctx.emit(progress_event(item))

        res = procs.run_streaming(argv, emit=ctx.emit, tier=3, cwd=ctx.work_dir, env=env,
                                  on_chunk=on_chunk, timeout_s=ctx.spec.get("timeout_s"),
                                  line_filter=lambda s: not s.startswith("==PROF== Profiling"))
        for item in parser.close():
            if item.get("kind") == "progress":
                ctx.emit(progress_event(item))
        if parser.driver_incompatible and not chosen:
            excluded.append(str(ncu))
            ctx.emit(wire.make("log", level="warning", message=(
                "%s says the driver is not compatible; stepping back one release" % ncu)))
            continue
        return str(ncu), sel, res, parser


def no_ncu(ctx: "RunContext", sel: Dict[str, Any], t0: float) -> bool:
    """Tier 3 skipped: no ncu fits the pod (the install plan is the remedy)."""
    ctx.emit(wire.make("tier_started", tier=3, name="Nsight Compute"))
    ctx.emit(wire.make(
        "diagnosis", code="no_ncu", severity="error",
        title="No Nsight Compute fits this pod", cause=str(sel.get("reason")),
        remedies=[" ".join(step) for step in (sel.get("install_plan") or [])]
        or ["install Nsight Compute matching the driver"],
        details={"install_target_version": sel.get("install_target_version")}))
    ctx.emit(wire.make("tier_finished", tier=3, status="skipped",
                       wall_s=time.time() - t0, reason=str(sel.get("reason"))))
    return True


def retarget(listed: str) -> Tuple[str, str]:
    """The ``-k regex:`` body and ``--kernel-name-base`` that select exactly the kernel
    ncu listed as ``listed`` (its listing uses the name base it was given, or the bare
    function name)."""
    from ..profilers.ncu_output import regex_escape

    if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", listed) is not None:  # a bare function name
        return "^%s$" % regex_escape(listed), "function"
    if listed.startswith("_Z"):
        return "^%s$" % regex_escape(listed), "mangled"
    return "^%s$" % regex_escape(listed), "demangled"


def shown(name: str, limit: int = 60) -> str:
    """A kernel name for a one-line note: no return type, cut at ``limit`` characters."""
    text = " ".join(name.split())
    if text.startswith("void "):
        text = text[5:]
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def tier3_estimate(ctx: "RunContext", table: Optional[List[Dict[str, Any]]],
                   regex: Optional[str], measured: Dict[str, Any],
                   launch_skip: Optional[int] = None) -> Dict[str, Any]:
    """The ``protocol.Tier3Estimate`` dict of this run's Tier-3 plan, with cheaper plans
    (the pass count this pod learnt for the plan where it has one; ``launch_skip`` in
    place of the spec's)."""
    from ..profilers.ncu_cmd import DEFAULT_SECTIONS
    from . import tier3_cost

    inputs: Dict[str, Any] = {k: measured.get(k)
                              for k in ("setup_s", "tier2_wall_s", "tier1_median_ms")}
    inputs["setup_basis"] = str(measured.get("setup_basis") or "")
    key = tier3_cost.plan_key(run_cc(ctx), ctx.spec.get("ncu_set"),
                              ctx.spec.get("ncu_sections"), DEFAULT_SECTIONS)
    inputs["passes_here"] = tier3_cost.learnt(runs.cache_root()).get(key)
    inputs["start_here"] = tier3_cost.learnt_start(runs.cache_root())
    spec = ctx.spec if launch_skip is None else dict(ctx.spec, launch_skip=launch_skip)
    est = tier3_cost.estimate(spec, table, regex, default_sections=DEFAULT_SECTIONS,
                              **inputs)
    est["cheaper"] = tier3_cost.cheaper_plans(spec, est, table, regex,
                                              default_sections=DEFAULT_SECTIONS, **inputs)
    return est


def run_cc(ctx: "RunContext") -> Optional[str]:
    """The compute capability of the run's GPU, where it is known."""
    gpu = ctx.gpu.gpu
    cc = None if gpu is None else gpu.get("compute_capability")
    return None if cc is None else str(cc)


def learn_passes(ctx: "RunContext", profiled: List[Dict[str, Any]]) -> None:
    """Remember what ncu said each launch of this plan took (every launch the same), so
    the next estimate on this pod uses it."""
    from ..profilers.ncu_cmd import DEFAULT_SECTIONS
    from . import tier3_cost

    counts = {int(p.get("passes") or 0) for p in profiled}
    if len(counts) == 1:
        key = tier3_cost.plan_key(run_cc(ctx), ctx.spec.get("ncu_set"),
                                  ctx.spec.get("ncu_sections"), DEFAULT_SECTIONS)
        tier3_cost.remember_passes(runs.cache_root(), key, counts.pop())


def learn_start(ctx: "RunContext", wall_s: float, estimate: Dict[str, Any],
                setup_s: Optional[float], profiled: List[Dict[str, Any]]) -> None:
    """Remember what ncu's own start took in this Tier 3, so the next estimate on this pod
    uses it (kernel replay only: application replay starts the workload once a pass)."""
    from . import tier3_cost

    if ctx.spec.get("replay_mode") in tier3_cost.APPLICATION_REPLAY:
        return
    counts = [int(p.get("passes") or 0) for p in profiled]
    passes = max(counts) if counts else 0
    tier3_cost.remember_start(runs.cache_root(), tier3_cost.start_seen(
        wall_s, estimate, None if setup_s is None else float(setup_s), passes, len(counts)))


def tier3_budget(ctx: "RunContext", estimate: Dict[str, Any], t0: float) -> None:
    """Stop a plan whose estimate exceeds ``--max-tier3-seconds`` before ncu starts.

    Raises:
        WorkloadError: over budget (the run ends ``failed``, everything before kept); the
            diagnosis names the cheaper plans.
    """
    from .tier3_cost import over_budget

    if not over_budget(estimate):
        return
    seconds, budget = float(estimate["seconds"]), float(estimate["budget_s"])
    ctx.emit(wire.make("tier_started", tier=3, name="Nsight Compute", estimate=estimate))
    cause = ("Tier 3 would take about %.0f s (%d launch(es) × %d passes, %.1f s to start), "
             "over --max-tier3-seconds %g" % (seconds, estimate["launches"],
                                              estimate["passes"], estimate["start_s"], budget))
    ctx.emit(wire.make(
        "diagnosis", code="tier3_over_budget", severity="error",
        title="Tier 3 stopped before ncu started: over its time budget", cause=cause,
        meaning="nothing was profiled by ncu; Tiers 1 and 2 are kept",
        remedies=[*(estimate.get("cheaper") or []),
                  "or raise --max-tier3-seconds above %.0f" % seconds],
        details={"estimate_s": seconds, "budget_s": budget}))
    ctx.emit(wire.make("tier_finished", tier=3, status="skipped", wall_s=time.time() - t0,
                       reason="estimated %.0f s, over --max-tier3-seconds %g"
                       % (seconds, budget)))
    cheaper = estimate.get("cheaper") or []
    raise WorkloadError(cause + ("; try " + cheaper[0] if cheaper else
                                 "; raise --max-tier3-seconds"))


def read_report(ctx: "RunContext", ncu: str, rep: str) -> List[Dict[str, Any]]:
    """The report through ncu_report; CSV export as the fallback."""
    from ..profilers.ncu_reader import read_details_csv, read_ncu_rep, read_raw_csv

    try:
        return read_ncu_rep(rep, ncu_path=ncu)
    except Exception as exc:
        ctx.emit(wire.make("log", level="warning",
                           message="reading the report through ncu_report failed (%s: %s); "
                                   "using ncu --import --csv" % (type(exc).__name__, exc)))
    raw = procs.run_streaming([ncu, "--import", rep, "--csv", "--page", "raw"],
                              emit=lambda e: None, tier=3, cwd=ctx.run_dir, env=ctx.env,
                              timeout_s=300, tail_chars=1 << 24)
    launches = read_raw_csv(raw.stdout_tail)
    details = procs.run_streaming([ncu, "--import", rep, "--csv", "--page", "details"],
                                  emit=lambda e: None, tier=3, cwd=ctx.run_dir, env=ctx.env,
                                  timeout_s=300, tail_chars=1 << 24)
    rules = read_details_csv(details.stdout_tail)
    for launch, with_rules in zip(launches, rules):
        launch["rules"] = with_rules.get("rules", [])
    return launches


def _major_minor(text: Optional[str]) -> Optional[Tuple[int, int]]:
    """``"13.0"`` → ``(13, 0)``; None for anything else."""
    parts = str(text or "").split(".")
    try:
        return (int(parts[0]), int(parts[1])) if len(parts) >= 2 else None
    except ValueError:
        return None
