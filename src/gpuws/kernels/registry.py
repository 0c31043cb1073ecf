"""Workload strings: ``builtin:NAME[?k=v&...]``, ``file:PATH`` and ``cmd:COMMAND``.

:func:`parse_workload` checks a string the way a person typed it (on the laptop, before
anything reaches the pod), :func:`validate` checks it as far as can be done without a GPU
(the laptop calls it before connecting), and :func:`make_builtin` turns a bundled
workload's name and parameters into a :class:`~gpuws.kernels.workload.Workload` (on the
pod). Every mistake is a :class:`WorkloadError` (a ``ValueError``) whose message lists
what would have been valid.

Standard library only: CuPy is imported by the workloads' ``setup()``, not here.
"""

from __future__ import annotations

import math
import re
from typing import Dict, List, Mapping, NamedTuple, Optional, Tuple, Type

from .builtin import WORKLOAD_CLASSES, BuiltinWorkload
from .workload import Param, ParamValue, Workload

KINDS = ("builtin", "file", "cmd")


class WorkloadError(ValueError):
    """A workload string that cannot run, and what would have been valid.

    ``str()`` is the whole line (``problem; valid``), as the pod records it; the laptop
    shows ``problem`` as the error and ``valid`` as its remedy.

    Args:
        problem: What is wrong, in one line.
        valid: What would have been valid (names, parameters with types), or ``""``.
    """

    def __init__(self, problem: str, valid: str = "") -> None:
        super().__init__(f"{problem}; {valid}" if valid else problem)
        self.problem = problem
        self.valid = valid


class BuiltinSpec(NamedTuple):
    """A bundled workload as the UI lists it.

    Attributes:
        name: The ``NAME`` in ``builtin:NAME``.
        summary: One line saying what it runs.
        params: Its parameters with types, defaults and help.
    """

    name: str
    summary: str
    params: Tuple[Param, ...]


#: Every bundled workload by name, in the order the UI lists them.
BUILTINS: Dict[str, BuiltinSpec] = {
    cls.NAME: BuiltinSpec(cls.NAME, cls.SUMMARY, cls.PARAMS) for cls in WORKLOAD_CLASSES
}
_CLASSES = {cls.NAME: cls for cls in WORKLOAD_CLASSES}


class WorkloadRef(NamedTuple):
    """A parsed workload string.

    Attributes:
        kind: ``"builtin"``, ``"file"`` or ``"cmd"``.
        target: The builtin's name, the file's path, or the command exactly as typed.
        params: For builtins, the parameters given (typed and checked; defaults are not
            filled in). Empty for the other kinds.
    """

    kind: str
    target: str
    params: Dict[str, ParamValue]

    def __str__(self) -> str:
        """The canonical workload string (parameters in the order given)."""
        if self.kind == "builtin" and self.params:
            query = "&".join(f"{k}={_format_value(v)}" for k, v in self.params.items())
            return f"builtin:{self.target}?{query}"
        return f"{self.kind}:{self.target}"


def parse_workload(text: str) -> WorkloadRef:
    """Parse ``builtin:NAME[?k=v&...]``, ``file:PATH`` or ``cmd:COMMAND``.

    Args:
        text: The workload string. A ``cmd:`` command is kept verbatim (spaces and all);
            ``builtin:`` and ``file:`` lose surrounding whitespace.

    Returns:
        The parsed reference; builtin parameters are converted to their declared types.

    Raises:
        WorkloadError: Unknown kind, empty target, unknown builtin or parameter, a value
            of the wrong type or not among the choices, or a parameter given twice.
    """
    kind, sep, rest = text.partition(":")
    kind = kind.strip()
    if not sep or kind not in KINDS:
        raise WorkloadError(
            f"workload {text!r} must start with builtin:, file: or cmd: "
            f"(e.g. builtin:saxpy?n=1048576, file:bench.py, cmd:python3 train.py)",
            f"builtins: {', '.join(BUILTINS)}")
    if kind == "cmd":
        if not rest.strip():
            raise WorkloadError("cmd: needs a command after the colon",
                                "e.g. cmd:python3 train.py")
        return WorkloadRef("cmd", rest, {})
    rest = rest.strip()
    if kind == "file":
        if not rest:
            raise WorkloadError("file: needs a path after the colon", "e.g. file:bench.py")
        return WorkloadRef("file", rest, {})
    name, _, query = rest.partition("?")
    name = name.strip()
    spec = _spec(name)
    given: Dict[str, str] = {}
    for item in query.split("&") if query else []:
        if not item:
            continue
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq:
            raise WorkloadError(f"{name}: parameter {item!r} has no value (write {key}=VALUE)",
                                f"valid: {_param_list(spec)}")
        if key in given:
            raise WorkloadError(f"{name}: parameter {key!r} is given twice")
        given[key] = value.strip()
    return WorkloadRef("builtin", name, _convert_all(spec, given))


def make_builtin(name: str, params: Optional[Mapping[str, object]] = None) -> Workload:
    """Build a bundled workload; nothing touches the GPU until its ``setup()``.

    Args:
        name: A key of :data:`BUILTINS`.
        params: Parameter values, as strings (as in a workload string) or already typed;
            missing ones take their defaults.

    Returns:
        The workload.

    Raises:
        WorkloadError: Unknown name or parameter, or a bad value (the message lists what
            is valid).
        ValueError: The workload's constructor refused the values (a size out of range).
    """
    spec = _spec(name)
    values = _convert_all(spec, dict(params or {}))
    cls: Type[BuiltinWorkload] = _CLASSES[name]
    return cls(values)


def validate(text: str) -> WorkloadRef:
    """Check a workload string as far as this machine can, without a GPU.

    What :func:`parse_workload` checks, and for a builtin also what its constructor
    checks (sizes in range, a block size that is a multiple of 32): constructors only
    compute the declared work, so this touches neither CuPy nor torch. What needs the
    pod (a GPU, CuPy, torch for bf16) is left to the pod.

    Args:
        text: The workload string as a person typed it.

    Returns:
        The parsed reference.

    Raises:
        WorkloadError: The string names no valid workload or has a bad parameter; its
            ``valid`` lists what would have been valid.
    """
    ref = parse_workload(text)
    if ref.kind == "builtin":
        try:
            make_builtin(ref.target, ref.params)
        except WorkloadError:
            raise
        except ValueError as exc:
            raise WorkloadError(f"{ref.target}: {exc}",
                                f"valid: {_param_list(BUILTINS[ref.target])}") from None
    return ref


def _spec(name: str) -> BuiltinSpec:
    spec = BUILTINS.get(name)
    if spec is None:
        lines = "; ".join(f"{s.name} ({s.summary})" for s in BUILTINS.values())
        raise WorkloadError(f"unknown builtin workload {name!r}", f"valid: {lines}")
    return spec


def _param_list(spec: BuiltinSpec) -> str:
    parts: List[str] = []
    for p in spec.params:
        kind = "|".join(p.choices) if p.choices else p.type
        parts.append(f"{p.name} ({kind}, default {_format_value(p.default)})")
    return ", ".join(parts) if parts else "none"


def _convert_all(spec: BuiltinSpec, given: Mapping[str, object]) -> Dict[str, ParamValue]:
    by_name = {p.name: p for p in spec.params}
    out: Dict[str, ParamValue] = {}
    for key, raw in given.items():
        param = by_name.get(key)
        if param is None:
            raise WorkloadError(f"{spec.name} has no parameter {key!r}",
                                f"valid: {_param_list(spec)}")
        try:
            out[key] = _convert(param, raw)
        except ValueError as exc:
            raise WorkloadError(f"{spec.name}: {key}={raw!r}: {exc}",
                                f"valid: {_param_list(spec)}") from None
    return out


_POW = re.compile(r"^(\d+)\s*(?:\*\*|\^)\s*(\d+)$")
_SHIFT = re.compile(r"^(\d+)\s*<<\s*(\d+)$")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _convert(param: Param, raw: object) -> ParamValue:
    """One value to its parameter's type (strings are parsed, typed values checked)."""
    if param.type == "int":
        return _to_int(raw)
    if param.type == "float":
        if isinstance(raw, bool):
            raise ValueError("expected a number")
        try:
            value = float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError("expected a number") from None
        if not math.isfinite(value):
            raise ValueError("expected a finite number")
        return value
    if param.type == "bool":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError("expected true or false")
    if not isinstance(raw, str):
        raise ValueError("expected text")
    if param.choices is not None:
        low = raw.lower()
        if low not in param.choices:
            raise ValueError(f"expected one of {', '.join(param.choices)}")
        return low
    return raw


def _to_int(raw: object) -> int:
    """Integers as people write sizes: ``4096``, ``1_000_000``, ``2**26``, ``1<<26``, ``1e6``."""
    if isinstance(raw, bool):
        raise ValueError("expected an integer")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float):
        if raw.is_integer():
            return int(raw)
        raise ValueError("expected an integer")
    if not isinstance(raw, str):
        raise ValueError("expected an integer")
    text = raw.strip()
    for pattern in (_POW, _SHIFT):
        match = pattern.match(text)
        if match:
            base, exp = int(match.group(1)), int(match.group(2))
            if exp > 62:
                raise ValueError("exponent too large")
            return base**exp if pattern is _POW else base << exp
    try:
        return int(text, 10)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise ValueError("expected an integer (e.g. 4096, 2**26, 1<<26, 1e6)") from None
    if math.isfinite(value) and value.is_integer():
        return int(value)
    raise ValueError("expected an integer (e.g. 4096, 2**26, 1<<26, 1e6)")


def _format_value(value: ParamValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
