"""torch.profiler for a workload's own Python, started at interpreter start.

The worker writes this file's source as ``sitecustomize.py`` into a directory of the run
and puts that directory first on the workload's ``PYTHONPATH``; ``site`` imports it in
every Python the workload starts. It costs nothing until the program imports ``torch``
and then initialises CUDA (:func:`start_at_cuda_init`): then it starts ``torch.profiler``
with CUDA activity (CUPTI activity records: no hardware counters, no permissions) and CPU
activity
with Python stacks (``with_stack=True``): the host's operators, API calls and Python
frames, which say where the host's time goes between kernels and which code launched
each kernel. ``GPUWS_TORCH_STACK=0`` leaves the stacks out (CUDA and CPU activity only),
for a program whose Python is too hot to trace. At exit it writes, into
``$GPUWS_TORCH_TRACE_DIR``, per process (``<rank>`` from ``RANK``, else ``LOCAL_RANK``,
where a launcher such as ``torchrun`` set it):

- ``torch-keyavg-<pid>[-r<rank>].txt``: ``key_averages().table()``, names at full width;
- ``torch-trace-<pid>[-r<rank>].json``: the Chrome trace, whose kernel and memcpy
  intervals give the GPU idle and memcpy shares;
- ``torch-inject-<pid>.err``: why not, when the profiler could not start or stop.

Measured on the H200 pod (CUDA activity only, before host activity and stacks were
added): a small transformer script took 7.4 s this way against 31.8 s under one ncu pass
through a shell. Whatever goes wrong here must never break the
workload: every step is guarded, and the ``sitecustomize`` this one shadows (a distro's
or a virtualenv's) still runs.

Standard library only until torch is imported; runs under the workload's Python.
"""

from __future__ import annotations

import os
import sys
from typing import Any, List, Optional

DIR_ENV = "GPUWS_TORCH_TRACE_DIR"
STACK_ENV = "GPUWS_TORCH_STACK"
#: ``import`` starts the profiler as torch is imported instead of at CUDA's start.
START_ENV = "GPUWS_TORCH_START"
#: Tier 3 of one rank: the process of this rank opens an NVTX start/end range named
#: ``RANK_RANGE % rank`` as torch is imported, and ncu profiles only kernels inside it
#: (``--nvtx --nvtx-include``), so the other ranks run unprofiled.
NVTX_RANK_ENV = "GPUWS_NVTX_RANK"
RANK_RANGE = "gpuws_rank%d"
#: Where launchers put a process's rank: torchrun, then Open MPI, then MPICH/Slurm's PMI.
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "LOCAL_RANK")


def process_rank() -> Optional[int]:
    """This process's rank as its launcher set it, or None outside a launcher."""
    for var in RANK_VARS:
        value = os.environ.get(var, "")
        if value.isdigit() and len(value) <= 6:
            return int(value)
    return None


def _suffix() -> str:
    """``<pid>-r<rank>`` under a launcher that names ranks, else ``<pid>``."""
    rank = process_rank()
    return "%d" % os.getpid() if rank is None else "%d-r%d" % (os.getpid(), rank)


def _note(directory: str, text: str) -> None:
    try:
        with open(os.path.join(directory, "torch-inject-%d.err" % os.getpid()), "a") as f:
            f.write(text.rstrip() + "\n")
    except OSError:
        pass


def _chain_shadowed() -> None:
    """Run the ``sitecustomize`` that ours hides on ``sys.path``, as site would have."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


class TorchHook:
    """A ``sys.meta_path`` finder that starts the profiler once ``torch`` is imported."""

    def __init__(self, directory: Optional[str], nvtx_rank: Optional[int] = None) -> None:
        self.directory = directory
        self.nvtx_rank = nvtx_rank

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)  # once only; the real finders do the finding
        except ValueError:
            pass
        import importlib.util

        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module
        directory = self.directory
        nvtx_rank = self.nvtx_rank

        def exec_module(module: Any) -> None:
            original(module)
            if directory:
                start_at_cuda_init(module, directory)
            if nvtx_rank is not None:
                mark_rank(module, nvtx_rank)

        loader.exec_module = exec_module
        return spec


def start_at_cuda_init(torch: Any, directory: str) -> None:
    """Start the profiler when the process first initialises CUDA, not at torch's import.

    No kernel can run before CUDA is initialised, so the GPU side loses nothing; the host
    side leaves out the imports and model building before it, which under ``with_stack``
    are most of a trace: an HF generate's whole-program trace was 2.3 GB on the H200
    (the import of transformers alone is millions of Python calls), far over what is
    read back. A process that never touches CUDA (``torchrun``'s launcher) writes
    nothing. torch's C++ initialises CUDA through ``torch.cuda._lazy_init`` looked up by
    name, as do torch.cuda's own functions, so wrapping that attribute sees every path.
    """
    cuda: Any = getattr(torch, "cuda", None)
    original = getattr(cuda, "_lazy_init", None)
    try:
        ready = bool(cuda.is_initialized()) if cuda is not None else True
    except Exception:
        ready = True
    if original is None or ready or os.environ.get(START_ENV) == "import":
        start_profiler(torch, directory)
        return
    started: List[bool] = []

    def _lazy_init(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if not started:
            started.append(True)
            cuda._lazy_init = original  # once: later calls go straight to torch's
            start_profiler(torch, directory)
        return result

    cuda._lazy_init = _lazy_init


def start_profiler(torch: Any, directory: str) -> Optional[Any]:
    """Start CPU and CUDA activity profiling (with Python stacks unless
    ``GPUWS_TORCH_STACK=0``) and register the writer that runs at exit."""
    import atexit

    try:
        from torch.profiler import ProfilerActivity, profile

        stacks = os.environ.get(STACK_ENV, "1") != "0"
        prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                       with_stack=stacks, record_shapes=False)
        prof.start()
    except Exception as exc:  # the workload must run even when the profiler cannot
        _note(directory, "torch.profiler did not start: %s: %s" % (type(exc).__name__, exc))
        return None
    atexit.register(stop_and_write, prof, torch, directory)
    return prof


def mark_rank(torch: Any, wanted: int) -> bool:
    """In the process of rank ``wanted`` (rank 0 outside a launcher), open the NVTX range
    Tier 3's ncu is told to profile in; it stays open to the process's end."""
    rank = process_rank()
    if (rank if rank is not None else 0) != wanted:
        return False
    try:
        torch.cuda.nvtx.range_start(RANK_RANGE % wanted)
    except Exception:  # the workload must run even when NVTX cannot
        return False
    return True


def stop_and_write(prof: Any, torch: Any, directory: str) -> List[str]:
    """Stop the profiler and write its table and trace; returns the paths written."""
    written: List[str] = []
    try:
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
        prof.stop()
    except Exception as exc:
        _note(directory, "torch.profiler did not stop: %s: %s" % (type(exc).__name__, exc))
        return written
    try:
        events = prof.key_averages()
        try:
            table = events.table(row_limit=-1, max_name_column_width=4096)
        except TypeError:  # torch before 1.9 has no max_name_column_width
            table = events.table(row_limit=-1)
        path = os.path.join(directory, "torch-keyavg-%s.txt" % _suffix())
        _write_atomic(path, table)
        written.append(path)
    except Exception as exc:
        _note(directory, "key_averages failed: %s: %s" % (type(exc).__name__, exc))
    try:
        path = os.path.join(directory, "torch-trace-%s.json" % _suffix())
        tmp = path + ".tmp"
        prof.export_chrome_trace(tmp)
        os.replace(tmp, path)
        written.append(path)
    except Exception as exc:
        _note(directory, "export_chrome_trace failed: %s: %s" % (type(exc).__name__, exc))
    return written


def _write_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def install() -> None:
    """What ``sitecustomize`` does: hook torch's import (when asked to), then chain."""
    directory = os.environ.get(DIR_ENV)
    wanted = os.environ.get(NVTX_RANK_ENV, "")
    nvtx_rank = int(wanted) if wanted.isdigit() and len(wanted) <= 6 else None
    if (directory or nvtx_rank is not None) and "torch" not in sys.modules:
        sys.meta_path.insert(0, TorchHook(directory, nvtx_rank))
    try:
        _chain_shadowed()
    except Exception as exc:
        if directory:
            _note(directory, "the shadowed sitecustomize failed: %s: %s"
                  % (type(exc).__name__, exc))


if __name__ == "sitecustomize":
    install()
