"""Kernel names for people: the one owner of a kernel's short name.

A demangled CUDA kernel name carries its return type, namespaces, template arguments and
parameter list; CUTLASS, cuBLAS and PyTorch names run past a thousand characters. The
short name is what Nsight shows as the "function name": the last component of the
qualified name, without template arguments or parameters. A generic wrapper
(``cutlass::Kernel2<cutlass_80_tensorop_…>``, ``device_kernel<…>``) keeps its first
template argument, shortened the same way, since the wrapper's own name says nothing.
"""

from __future__ import annotations

import re
from typing import List, Tuple

#: Longest short name shown; longer ones end with an ellipsis.
MAX_SHORT = 80
#: Wrappers whose name says nothing without their first template argument.
WRAPPERS = frozenset({"Kernel", "Kernel2", "device_kernel", "kernel", "cutlass_kernel",
                      "global_kernel", "launch_kernel"})
_OPEN = "<({["
_CLOSE = ">)}]"
#: A parameter list right after a name: the mark of a demangled function.
_CALL = re.compile(r"[\w>]\(")


def _top_level(text: str) -> Tuple[str, List[str]]:
    """``text`` cut at its parameter list, with template arguments taken out.

    Returns the depth-0 characters before the first top-level ``(`` that follows a name,
    and the template argument lists met at depth 0 (outer brackets removed), in order.
    """
    depth = 0
    kept: List[str] = []
    templates: List[str] = []
    start = 0
    for i, ch in enumerate(text):
        if ch in _OPEN:
            if ch == "(" and depth == 0 and kept and kept[-1] not in " :":
                break  # the parameter list: everything after it is arguments
            if depth == 0 and ch == "<":
                start = i + 1
            depth += 1
        elif ch in _CLOSE:
            depth = max(0, depth - 1)
            if depth == 0 and ch == ">":
                templates.append(text[start:i])
        elif depth == 0:
            kept.append(ch)
    return "".join(kept), templates


def _first_argument(args: str) -> str:
    depth = 0
    for i, ch in enumerate(args):
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            return args[:i].strip()
    return args.strip()


def _last_component(head: str) -> str:
    # The return type (``void``) and qualifiers end at the last top-level space.
    name = head.strip().rsplit(" ", 1)[-1]
    return name.rsplit("::", 1)[-1]


def short_name(full: str) -> str:
    """The name a person reads in a table: ``vectorized_elementwise_kernel`` for
    ``void at::native::vectorized_elementwise_kernel<4, at::native::…>(int, …)``.

    Names without any C++ decoration (``nvjet_sm90_tst_…``, ``triton_poi_fused_add_0``,
    ``saxpy``) come back as they are; nothing is ever longer than :data:`MAX_SHORT`.
    """
    text = (full or "").strip().replace("(anonymous namespace)::", "")
    if "::" not in text and "<" not in text and not _CALL.search(text):
        # Not C++ (``Memcpy DtoD (Device -> Device)``, ``nvjet_…``): nothing to elide.
        return _capped(text)
    head, templates = _top_level(text)
    name = _last_component(head)
    if name in WRAPPERS and templates:
        inner = _first_argument(templates[-1])
        inner_head, _ = _top_level(inner)
        inner_name = _last_component(inner_head)
        if inner_name and not inner_name[0].isdigit():
            name = "%s<%s>" % (name, inner_name)
    return _capped(name or text)


def _capped(name: str) -> str:
    return name if len(name) <= MAX_SHORT else name[:MAX_SHORT - 1] + "…"
