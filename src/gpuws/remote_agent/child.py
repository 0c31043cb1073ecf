"""Workload processes started by the worker: ``agent child MODE RUN_ID [ARGS]``.

Modes:
  ``tier1``           time the workload with CUDA events (events on ``GPUWS_EVENT_FD``)
  ``exec ITERS``      set up, then run ITERS times between cudaProfilerStart/Stop — the
                      process that nsys/ncu wrap, so setup kernels stay out of the profile
  ``torchprof ITERS`` the same under torch.profiler, emitting a kernel table
  ``static``          registers/shared/local memory and theoretical occupancy only

A separate process per tier keeps CUDA state (and a crash in the workload) away from the
worker, which must always be able to write the run's final event.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from typing import Any, Dict, List

from . import wire


class EventPipe:
    def __init__(self) -> None:
        fd = os.environ.get("GPUWS_EVENT_FD")
        self._fd = int(fd) if fd else None

    def __call__(self, event: Dict[str, Any]) -> None:
        line = wire.dumps(event)
        if self._fd is None:
            sys.stdout.buffer.write(line)
            sys.stdout.flush()
            return
        view = memoryview(line)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]


def load_spec(run_id: str) -> Dict[str, Any]:
    from .runs import run_dir

    with open(os.path.join(run_dir(run_id), "spec.json")) as f:
        spec: Dict[str, Any] = json.load(f)
    return spec


def materialize_file(spec: Dict[str, Any], run_id: str) -> str:
    """Write a ``file:`` workload's source into the run dir; return its path there."""
    from .runs import run_dir

    name = os.path.basename(str(spec.get("file_name") or "workload.py")) or "workload.py"
    path = os.path.join(run_dir(run_id), "workload", name)
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(spec.get("file_b64") or ""))
    return path


def load_workload(spec: Dict[str, Any], run_id: str) -> Any:
    from ..kernels.registry import make_builtin, parse_workload
    from ..kernels.workload import load_file_workload

    ref = parse_workload(str(spec["workload"]))
    if ref.kind == "builtin":
        return make_builtin(ref.target, ref.params)
    if ref.kind == "file":
        workspace = spec.get("workspace")
        if workspace is None:
            return load_file_workload(materialize_file(spec, run_id))
        from .workspace import resolve_file, workspace_dir

        # The benchmark imports its own package: the workspace's root leads sys.path for
        # the whole child (load_file_workload adds the file's folder only while it runs).
        root = workspace_dir(str(workspace))
        if root not in sys.path:
            sys.path.insert(0, root)
        return load_file_workload(resolve_file(str(workspace), ref.target))
    raise ValueError("a %s: workload has no Python run() to load" % ref.kind)


def static_analysis(workload: Any, emit: EventPipe) -> None:
    """Registers, shared and local memory of each RawKernel, and the occupancy they allow."""
    import cupy

    from .profilers.occupancy import theoretical_occupancy

    raw = str(cupy.cuda.Device().compute_capability)  # "90" for sm_90
    cc = raw[:-1] + "." + raw[-1]
    for sk in workload.static_kernels():
        k = sk.kernel
        regs = int(k.num_regs)
        shared = int(k.shared_size_bytes)
        local = int(k.local_size_bytes)
        occ = theoretical_occupancy(cc, block_size=sk.block_size, registers_per_thread=regs,
                                    shared_mem_per_block=shared)
        emit(wire.make("static_analysis", kernel=sk.name, registers_per_thread=regs,
                       shared_mem_per_block=shared, local_mem_per_thread=local,
                       block_size=sk.block_size,
                       theoretical_occupancy_pct=occ.get("pct"),
                       limiter=occ.get("limiter"), source="cupy.RawKernel attributes"))


def mode_tier1(run_id: str, args: List[str]) -> int:
    import cupy

    from .measure.tier1 import measure_peaks, run_tier1
    from .pod.clocks import WINDOW_EVENT

    emit = EventPipe()
    spec = load_spec(run_id)
    workload = load_workload(spec, run_id)
    workload.setup()
    cupy.cuda.runtime.deviceSynchronize()
    # A file's check(state), on fresh inputs too, before anything is timed (workload.py).
    checked = workload.verify(cupy.cuda.runtime.deviceSynchronize)
    if checked:
        emit(wire.make("log", level="info", message="%s: %s" % (workload.name, checked)))
    static_analysis(workload, emit)
    peaks = measure_peaks()
    result = run_tier1(workload, emit=emit, target_ci=float(spec.get("target_ci", 0.01)),
                       max_seconds=float(spec.get("max_seconds", 10.0)),
                       min_samples=int(spec.get("min_samples", 10)),
                       warmup=int(spec.get("warmup", 5)), mode=_timing(spec),
                       peaks=peaks,
                       # The worker reads the GPU's clocks between these two markers
                       # (clocks.py); it takes them off the stream, never logs them.
                       on_window=lambda edge: emit({"type": WINDOW_EVENT, "edge": edge}))
    emit(result)
    err = workload.check()
    if err is not None:
        level = "info" if err < 1e-2 else "warning"
        emit(wire.make("log", level=level,
                       message="%s result check: relative error %.2e" % (workload.name, err)))
    return 0


def _timing(spec: Dict[str, Any]) -> str:
    """Tier 1's mode from a spec (``protocol.RunSpec.timing_mode``, without msgspec)."""
    timing = spec.get("timing")
    if timing is not None:
        return str(timing)
    return "cold" if spec.get("cold") else "hot"


def mode_static(run_id: str, args: List[str]) -> int:
    import cupy

    spec = load_spec(run_id)
    workload = load_workload(spec, run_id)
    workload.setup()
    cupy.cuda.runtime.deviceSynchronize()
    static_analysis(workload, EventPipe())
    return 0


def mode_exec(run_id: str, args: List[str]) -> int:
    import cupy

    iters = int(args[0]) if args else 3
    spec = load_spec(run_id)
    workload = load_workload(spec, run_id)
    workload.setup()
    cupy.cuda.runtime.deviceSynchronize()
    # Profilers started with --profile-from-start off / --capture-range=cudaProfilerApi
    # see only what runs between start and stop: the workload, not its setup.
    cupy.cuda.runtime.profilerStart()
    for _ in range(iters):
        workload.run()
    cupy.cuda.runtime.deviceSynchronize()
    cupy.cuda.runtime.profilerStop()
    return 0


def mode_torchprof(run_id: str, args: List[str]) -> int:
    """ITERS calls under torch.profiler; the table and trace go where the tier reads them
    (``$GPUWS_TORCH_TRACE_DIR``), written as the injected profiler writes them."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from .measure.torch_inject import DIR_ENV, stop_and_write

    iters = int(args[0]) if args else 10
    spec = load_spec(run_id)
    workload = load_workload(spec, run_id)
    workload.setup()
    torch.cuda.synchronize()
    prof = profile(activities=[ProfilerActivity.CUDA])
    prof.start()
    for _ in range(iters):
        workload.run()
    if not stop_and_write(prof, torch, os.environ[DIR_ENV]):
        sys.stderr.write("torch.profiler wrote no results (see torch-inject-*.err)\n")
        return 1
    return 0


MODES = {"tier1": mode_tier1, "exec": mode_exec, "torchprof": mode_torchprof,
         "static": mode_static}


def main(mode: str, run_id: str, args: List[str]) -> int:
    fn = MODES.get(mode)
    if fn is None:
        sys.stderr.write("unknown child mode %r\n" % mode)
        return 2
    return fn(run_id, args)
