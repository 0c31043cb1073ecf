"""What a timed workload is, and how a person's own Python file becomes one.

A :class:`Workload` enqueues its GPU work once per :meth:`Workload.run` call on the
current stream and never synchronizes: Tier 1 brackets calls with CUDA events and
decides itself when to wait. Each workload declares the bytes it must move and the
FLOPs it must do (``None`` when unknown), so its times can be placed on a roofline.

Standard library only at import time (this module ships in the pod agent's bundle);
CuPy and torch are imported lazily by the workloads that need them.
"""

from __future__ import annotations

import inspect
import os
import sys
import traceback
import types
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple, Union

#: A parameter value after parsing: what ``builtin:NAME?k=v`` values turn into.
# A runtime alias, so typing.Union (the pod's python3 may be 3.8, where `|` fails).
ParamValue = Union[int, float, bool, str]


class Param(NamedTuple):
    """One parameter of a bundled workload, as the UI lists it.

    Attributes:
        name: The key in ``builtin:NAME?key=value``.
        type: ``"int"``, ``"float"``, ``"bool"`` or ``"str"``.
        default: The value used when the key is absent.
        help: One line saying what it means.
        choices: The allowed values of a ``"str"`` parameter, or ``None`` for any.
    """

    name: str
    type: str
    default: ParamValue
    help: str
    choices: Optional[Tuple[str, ...]] = None


class StaticKernel(NamedTuple):
    """A compiled kernel whose attributes can be read without hardware counters.

    Attributes:
        name: The kernel's symbol name (what ncu and nsys show).
        kernel: The ``cupy.RawKernel``; its ``num_regs``, ``shared_size_bytes``,
            ``local_size_bytes`` and ``max_threads_per_block`` feed static analysis.
        block_size: Threads per block the workload launches it with.
    """

    name: str
    kernel: Any
    block_size: int


class Workload:
    """Base of every workload: a bundled kernel or a person's ``file:`` benchmark.

    Subclasses set the attributes in ``__init__`` or :meth:`setup` and implement
    :meth:`run`. Attributes:

    Attributes:
        name: Short name shown in the UI (``saxpy``, ``file:bench.py``).
        params: The parameters it was built with, after defaults were filled in.
        bytes_moved: Fewest bytes one call must move through device memory (each input
            read once, each output written once), or ``None`` when not declared.
        flops: Floating-point operations of one call, or ``None``.
        flops_kind: Which compute peak the FLOPs compare against: ``"fp32"`` (CUDA
            cores), ``"tensor"`` (fp16/bf16 tensor cores) or ``None``.
        kernel_regex: Regex ncu should use to find the main kernel, or ``None`` when
            the work is not a kernel ncu can profile (a memcpy) or is not known.
    """

    name: str = ""
    bytes_moved: Optional[float] = None
    flops: Optional[float] = None
    flops_kind: Optional[str] = None
    kernel_regex: Optional[str] = None

    def __init__(self, params: Optional[Dict[str, ParamValue]] = None) -> None:
        self.params: Dict[str, ParamValue] = dict(params or {})

    def setup(self) -> None:
        """Allocate inputs and compile kernels; called once before any :meth:`run`."""

    def run(self) -> None:
        """Enqueue the work once on the current stream, without synchronizing."""
        raise NotImplementedError

    def check(self) -> Optional[float]:
        """Relative error of the last result against a reference, if the workload has one.

        Call after :meth:`run` and a synchronize. ``None`` means no check exists.
        """
        return None

    def verify(self, sync: Callable[[], None]) -> Optional[str]:
        """Prove the workload computes before it is timed (a ``file:`` workload's
        ``check(state)``); returns what was checked, or ``None`` when nothing is.

        Args:
            sync: waits for the GPU (the calls are asynchronous).

        Raises:
            ValueError: the check failed: the message says on which inputs.
        """
        return None

    def static_kernels(self) -> List[StaticKernel]:
        """The RawKernels this workload launches (empty when it launches library code)."""
        return []

    def describe(self) -> str:
        """One line for logs and reports: the name, parameters and declared work."""
        parts = [self.name]
        if self.params:
            parts.append(" ".join(f"{k}={v}" for k, v in sorted(self.params.items())))
        if self.bytes_moved is not None:
            parts.append(f"bytes={self.bytes_moved:.4g}")
        if self.flops is not None:
            parts.append(f"flops={self.flops:.4g}")
        return " ".join(parts)


class FileWorkload(Workload):
    """A workload defined by a person's Python file (``file:PATH``).

    The file is executed as a module once, at load time. It must define ``run()``; it
    may define ``setup()``, whose result is passed to ``run(state)``. It may declare the
    work of one ``run`` call with ``BYTES``/``FLOPS`` constants or ``bytes_moved()``/
    ``flops()`` functions (given the setup state when they take an argument), and the
    ncu kernel filter with ``KERNEL_REGEX`` and the compute peak with ``FLOPS_KIND``.

    It may define ``check(state)`` (``check()`` without ``setup()``): called after
    ``run`` has finished on the GPU, it returns ``True``/``None`` when the result is right,
    ``False`` or raises when not, or a relative error compared with ``CHECK_TOLERANCE``
    (default 1e-3). gpuws calls it before timing (:meth:`verify`) on inputs the file
    cannot predict: a run that caches its output or skips work is refused, not timed.
    """

    def __init__(self, path: str, module: types.ModuleType) -> None:
        super().__init__({})
        self.path = path
        self.module = module
        self.name = "file:" + os.path.basename(path)
        self._run: Callable[..., Any] = module.run
        self._setup: Optional[Callable[..., Any]] = getattr(module, "setup", None)
        self._check: Optional[Callable[..., Any]] = getattr(module, "check", None)
        self._state: Any = None
        regex = getattr(module, "KERNEL_REGEX", None)
        self.kernel_regex = str(regex) if regex is not None else None
        kind = getattr(module, "FLOPS_KIND", None)
        self.flops_kind = str(kind) if kind is not None else None
        # Constants are known before setup; functions are evaluated after it.
        self.bytes_moved = _number(module, "BYTES", path)
        self.flops = _number(module, "FLOPS", path)

    def setup(self) -> None:
        """Call the file's ``setup()`` (if any), then its ``bytes_moved()``/``flops()``."""
        if self._setup is not None:
            # A setup(seed) gets the first of the seeds verify() feeds it.
            seeded = _positional_count(self._setup) >= 1
            self._state = self._call_user(self._setup, *((CHECK_SEEDS[0],) if seeded else ()))
        bytes_fn = getattr(self.module, "bytes_moved", None)
        if callable(bytes_fn):
            self.bytes_moved = self._declared(bytes_fn, "bytes_moved")
        flops_fn = getattr(self.module, "flops", None)
        if callable(flops_fn):
            self.flops = self._declared(flops_fn, "flops")

    def run(self) -> None:
        """Call the file's ``run()`` (or ``run(state)`` when it defines ``setup()``)."""
        if self._setup is not None:
            self._run(self._state)
        else:
            self._run()

    def describe(self) -> str:
        """The file path and what it declared."""
        return Workload.describe(self) + f" ({self.path})"

    def verify(self, sync: Callable[[], None]) -> Optional[str]:
        """Run and check the file on its set-up inputs, then on fresh ones, then on the
        first again (``setup()`` must have run).

        Fresh inputs come from a second ``setup``: given a seed where ``setup`` takes an
        argument, else after gpuws reseeds the random generators the file has imported
        (``random``, NumPy, CuPy, torch). An output cached from the first call is then
        wrong for the second inputs; work skipped leaves the output unwritten.
        """
        if self._check is None:
            return None
        if self._setup is None:
            self._checked(None, "its only inputs", sync)
            return "check() passed after one call (no setup(): no fresh inputs to feed)"
        first = self._state
        self._checked(first, "the first set-up inputs", sync)
        fresh = self._fresh_state(CHECK_SEEDS[1])
        self._checked(fresh, "fresh inputs (a second setup)", sync)
        del fresh  # its buffers go before timing
        self._checked(first, "the first inputs again", sync)
        return "check(state) passed on the set-up inputs, on fresh inputs and on the first again"

    def _fresh_state(self, seed: int) -> Any:
        assert self._setup is not None
        if _positional_count(self._setup) >= 1:
            return self._call_user(self._setup, seed)
        reseed(seed)
        return self._call_user(self._setup)

    def _checked(self, state: Any, inputs: str, sync: Callable[[], None]) -> None:
        assert self._check is not None
        args = (state,) if self._setup is not None else ()
        self._call_user(self._run, *args)
        sync()
        try:
            verdict = self._check(*args)
        except Exception as exc:
            raise ValueError(_where(self.path, exc) + f"check(state) failed on {inputs}: "
                             f"{type(exc).__name__}: {exc}{_NOT_TIMED}") from exc
        tolerance = _number(self.module, "CHECK_TOLERANCE", self.path)
        tolerance = DEFAULT_CHECK_TOLERANCE if tolerance is None else tolerance
        if verdict is False:
            raise ValueError(f"{self.path}: check(state) returned False on {inputs}"
                             f"{_NOT_TIMED}")
        if isinstance(verdict, (int, float)) and not isinstance(verdict, bool):
            if not verdict <= tolerance:  # NaN fails too
                raise ValueError(f"{self.path}: check(state) gave a relative error of "
                                 f"{verdict:.3g} on {inputs}, over CHECK_TOLERANCE "
                                 f"{tolerance:g}{_NOT_TIMED}")

    def _call_user(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            raise ValueError(_where(self.path, exc) + f"{type(exc).__name__}: {exc}") from exc

    def _declared(self, fn: Callable[..., Any], what: str) -> Optional[float]:
        args = (self._state,) if self._setup is not None and _positional_count(fn) >= 1 else ()
        value = self._call_user(fn, *args)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{self.path}: {what}() returned {value!r}; it must return a number")
        return float(value)


#: The seeds of the set-ups :meth:`FileWorkload.verify` makes (the first is the file's own).
CHECK_SEEDS = (0, 0x5EED)
#: The relative error a ``check`` may return and still pass, unless the file sets
#: ``CHECK_TOLERANCE``.
DEFAULT_CHECK_TOLERANCE = 1e-3
_NOT_TIMED = (" — the run is not timed: a kernel that caches its output or skips work "
              "gives the wrong result on inputs it has not seen")


def reseed(seed: int) -> None:
    """Reseed the random generators a workload file may draw its inputs from, where it
    has imported them (none is imported here: the pod may lack them)."""
    import random

    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed)
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        cupy.random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)


def load_file_workload(path: str) -> FileWorkload:
    """Execute a person's benchmark file as a module and wrap it as a workload.

    Args:
        path: Path of the ``.py`` file.

    Returns:
        The workload; its ``setup()`` has not been called yet.

    Raises:
        ValueError: The file is missing or unreadable, has a syntax error (the message
            names the file and line), fails while executing (the line that raised), has
            no callable ``run``, or ``run`` cannot take the state ``setup()`` returns.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            source = fh.read()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the workload file: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: the workload file is not UTF-8 text: {exc}") from exc
    try:
        code = compile(source, path, "exec")
    except SyntaxError as exc:
        where = f"{path}:{exc.lineno}" if exc.lineno else path
        raise ValueError(f"{where}: syntax error: {exc.msg}") from exc
    module = types.ModuleType(_module_name(path))
    module.__file__ = path
    # The file may import helpers that sit beside it, as `python file.py` would allow.
    folder = os.path.dirname(os.path.abspath(path))
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        exec(code, module.__dict__)
    except (Exception, SystemExit) as exc:
        # SystemExit too: a top-level sys.exit() must not end the agent's worker.
        raise ValueError(_where(path, exc) + f"{type(exc).__name__}: {exc}") from exc
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)
    run = getattr(module, "run", None)
    if run is None:
        raise ValueError(f"{path}: defines no run() function; a file: workload must define "
                         "run() (and may define setup(), BYTES, FLOPS)")
    if not callable(run):
        raise ValueError(f"{path}: run is a {type(run).__name__}, not a function")
    setup = getattr(module, "setup", None)
    if setup is not None and not callable(setup):
        raise ValueError(f"{path}: setup is a {type(setup).__name__}, not a function")
    check = getattr(module, "check", None)
    if check is not None and not callable(check):
        raise ValueError(f"{path}: check is a {type(check).__name__}, not a function")
    if setup is not None and _positional_count(run) < 1:
        line = getattr(getattr(run, "__code__", None), "co_firstlineno", None)
        where = f"{path}:{line}" if line else path
        raise ValueError(f"{where}: run() takes no argument, but the file defines setup(), "
                         "whose result is passed to run(state)")
    return FileWorkload(path, module)


def _module_name(path: str) -> str:
    stem = os.path.splitext(os.path.basename(path))[0]
    return "gpuws_file_" + "".join(c if c.isalnum() else "_" for c in stem)


def _number(module: types.ModuleType, attr: str, path: str) -> Optional[float]:
    value = getattr(module, attr, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{path}: {attr} = {value!r}; it must be a number")
    return float(value)


def _positional_count(fn: Callable[..., Any]) -> int:
    """How many positional arguments ``fn`` accepts (a large number for ``*args``)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        # Builtins without a signature: assume they accept what they are given.
        return 1
    count = 0
    for p in sig.parameters.values():
        if p.kind == inspect.Parameter.VAR_POSITIONAL:
            return 1 << 30
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            count += 1
    return count


def _where(path: str, exc: BaseException) -> str:
    """``path:line: `` of the deepest traceback frame inside the person's file."""
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == path:
            line = frame.lineno
    return f"{path}:{line}: " if line else f"{path}: "
