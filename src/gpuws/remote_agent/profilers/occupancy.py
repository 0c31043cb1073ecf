"""Theoretical occupancy without counters: from registers, shared memory and block size.

When ncu cannot read the performance counters, the kernel's resource usage (from its
attributes, ``cuobjdump --dump-resource-usage`` or ``ptxas -v``) still gives the
occupancy the hardware allows, computed as the CUDA occupancy calculator does: blocks
per SM are limited by warps, by the block slots, by registers (allocated per warp in
units of 256, within each of the SM's four sub-partitions) and by shared memory
(allocated in units of 128 bytes from sm_80, 256 before, plus 1 KB reserved per block
from sm_80). The result agrees with ncu's "Theoretical Occupancy"
(``sm__maximum_warps_per_active_cycle_pct``).

Named-barrier limits and thread-block clusters are not modelled; both bind only for
unusual kernels.

Standard library only: this runs on the pod's python3 (>= 3.8).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "ARCH_LIMITS",
    "ArchLimits",
    "arch_limits",
    "parse_cuobjdump_resource_usage",
    "parse_ptxas_verbose",
    "static_shared_bytes",
    "theoretical_occupancy",
]


class ArchLimits:
    """Per-SM limits of one compute capability (CUDA programming guide, occupancy calculator).

    Attributes:
        max_warps: resident warps per SM.
        max_blocks: resident blocks per SM.
        registers: 32-bit registers per SM.
        max_regs_per_thread: registers one thread may use.
        max_regs_per_block: registers one block may use.
        reg_unit: register allocation unit per warp.
        sub_partitions: SM sub-partitions registers are allocated in.
        smem_per_sm: the largest shared-memory carve-out per SM, bytes.
        smem_per_block: the largest shared memory one block may opt in to, bytes.
        smem_unit: shared-memory allocation unit, bytes.
        smem_reserved: shared memory the system reserves per block, bytes.
        max_threads_per_block: threads one block may have.
    """

    __slots__ = ("max_blocks", "max_regs_per_block", "max_regs_per_thread",
                 "max_threads_per_block", "max_warps", "reg_unit", "registers", "smem_per_block",
                 "smem_per_sm", "smem_reserved", "smem_unit", "sub_partitions")

    def __init__(self, max_warps: int, max_blocks: int, smem_per_sm_kb: int,
                 smem_per_block_kb: int, smem_unit: int, smem_reserved: int,
                 registers: int = 65536, max_regs_per_thread: int = 255,
                 max_regs_per_block: int = 65536, reg_unit: int = 256,
                 sub_partitions: int = 4, max_threads_per_block: int = 1024) -> None:
        self.max_warps = max_warps
        self.max_blocks = max_blocks
        self.smem_per_sm = smem_per_sm_kb * 1024
        self.smem_per_block = smem_per_block_kb * 1024
        self.smem_unit = smem_unit
        self.smem_reserved = smem_reserved
        self.registers = registers
        self.max_regs_per_thread = max_regs_per_thread
        self.max_regs_per_block = max_regs_per_block
        self.reg_unit = reg_unit
        self.sub_partitions = sub_partitions
        self.max_threads_per_block = max_threads_per_block


#: Limits by compute capability (major*10 + minor).
ARCH_LIMITS: dict[int, ArchLimits] = {
    70: ArchLimits(64, 32, 96, 96, 256, 0),    # V100
    72: ArchLimits(64, 32, 96, 96, 256, 0),    # Xavier
    75: ArchLimits(32, 16, 64, 64, 256, 0),    # Turing
    80: ArchLimits(64, 32, 164, 163, 128, 1024),  # A100
    86: ArchLimits(48, 16, 100, 99, 128, 1024),   # GA10x
    87: ArchLimits(48, 16, 164, 163, 128, 1024),  # Orin
    89: ArchLimits(48, 24, 100, 99, 128, 1024),   # Ada
    90: ArchLimits(64, 32, 228, 227, 128, 1024),  # Hopper
    100: ArchLimits(64, 32, 228, 227, 128, 1024),  # B200
    103: ArchLimits(64, 32, 228, 227, 128, 1024),  # B300
    120: ArchLimits(48, 32, 100, 99, 128, 1024),  # RTX Blackwell
    121: ArchLimits(48, 32, 100, 99, 128, 1024),  # GB10
}


def _cc_number(compute_capability: str) -> int:
    """``"9.0"``/``"sm_90"``/``"sm_90a"``/``"90"`` → 90."""
    cc = compute_capability.strip().lower()
    if cc.startswith("sm_"):
        cc = cc[3:]
    m = re.match(r"^(\d+)\.(\d)$", cc)
    if m:
        return int(m.group(1)) * 10 + int(m.group(2))
    m = re.match(r"^(\d+)[a-z]?$", cc)
    if m:
        return int(m.group(1))
    raise ValueError(f"not a compute capability: {compute_capability!r}")


def arch_limits(compute_capability: str | int) -> ArchLimits:
    """The limits for ``"9.0"``, ``"sm_90"``, ``"90"`` or ``90``.

    Raises:
        ValueError: for an architecture not in :data:`ARCH_LIMITS`.
    """
    key = compute_capability if isinstance(compute_capability, int) else _cc_number(
        compute_capability)
    if key not in ARCH_LIMITS:
        raise ValueError(f"no occupancy limits for compute capability {compute_capability!r}")
    return ARCH_LIMITS[key]


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def theoretical_occupancy(compute_capability: str | int, block_size: int,
                          registers_per_thread: int, shared_mem_per_block: int = 0, *,
                          reserved_included: bool = False,
                          smem_config_bytes: int | None = None) -> dict[str, Any]:
    """Theoretical occupancy of a kernel launch and what limits it.

    Args:
        compute_capability: the GPU's, e.g. ``"9.0"``.
        block_size: threads per block.
        registers_per_thread: registers per thread (``REG`` of cuobjdump).
        shared_mem_per_block: static + dynamic shared memory per block, bytes.
        reserved_included: the shared memory already holds the 1 KB the system reserves
            per block (ncu's ``launch__shared_mem_per_block`` does; cuobjdump and ptxas
            do not).
        smem_config_bytes: the shared-memory carve-out the driver chose (ncu's
            ``launch__shared_mem_config_size``); default the largest one.

    Returns:
        ``{"pct", "active_warps", "max_warps", "blocks_per_sm", "warps_per_block",
        "limiter", "limiters", "block_limits"}``: ``limiter`` is the first of
        ``registers``, ``shared memory``, ``warps``, ``blocks`` that allows the fewest
        blocks (all that tie are in ``limiters``); ``block_limits`` holds each limit.

    Raises:
        ValueError: for an unknown architecture or a block size outside 1..1024.
    """
    lim = arch_limits(compute_capability)
    if not 1 <= block_size <= lim.max_threads_per_block:
        raise ValueError(f"block size {block_size} is outside 1..{lim.max_threads_per_block}")
    if registers_per_thread < 0 or shared_mem_per_block < 0:
        raise ValueError("registers and shared memory cannot be negative")
    warps_per_block = -(-block_size // 32)

    by_warps = lim.max_warps // warps_per_block
    by_blocks = lim.max_blocks
    # Registers: each warp takes regs*32 rounded up to the allocation unit, out of one
    # sub-partition's share of the register file; a block must fit the per-block limit.
    if registers_per_thread == 0:
        by_regs = by_blocks
    elif registers_per_thread > lim.max_regs_per_thread:
        by_regs = 0
    else:
        regs_per_warp = _round_up(registers_per_thread * 32, lim.reg_unit)
        if regs_per_warp * warps_per_block > lim.max_regs_per_block:
            by_regs = 0
        else:
            per_partition = (lim.registers // lim.sub_partitions) // regs_per_warp
            by_regs = (per_partition * lim.sub_partitions) // warps_per_block
    smem = shared_mem_per_block + (0 if reserved_included else lim.smem_reserved)
    user_smem = smem - lim.smem_reserved
    smem_alloc = _round_up(smem, lim.smem_unit)
    config = smem_config_bytes if smem_config_bytes else lim.smem_per_sm
    if user_smem > lim.smem_per_block:
        by_smem = 0
    elif smem_alloc == 0:
        by_smem = by_blocks
    else:
        by_smem = config // smem_alloc

    limits = {"registers": by_regs, "shared memory": by_smem, "warps": by_warps,
              "blocks": by_blocks}
    blocks = min(limits.values())
    limiters = [name for name, value in limits.items() if value == blocks]
    active = blocks * warps_per_block
    return {
        "pct": 100.0 * active / lim.max_warps,
        "active_warps": active,
        "max_warps": lim.max_warps,
        "blocks_per_sm": blocks,
        "warps_per_block": warps_per_block,
        "limiter": limiters[0],
        "limiters": limiters,
        "block_limits": limits,
    }


_CUOBJ_FUNC = re.compile(r"^\s*Function\s+(?P<name>.+?):\s*$")
_CUOBJ_FIELD = re.compile(r"(?P<key>[A-Z]+(?:\[\d+\])?):(?P<value>\d+)")
_CUOBJ_ARCH = re.compile(r"^\s*arch\s*=\s*(?P<arch>sm_\d+[a-z]?)")


def parse_cuobjdump_resource_usage(text: str) -> list[dict[str, Any]]:
    """Parse ``cuobjdump --dump-resource-usage``.

    Args:
        text: its output; ``Fatbin elf code``/``Fatbin ptx code`` blocks carry an
            ``arch = sm_NN`` line, a bare ``Resource usage:`` block (a single cubin) none.

    Returns:
        One dict per function and code block: ``function`` (mangled), ``arch``
        (``sm_90`` or None), ``code`` (``elf``, ``ptx`` or None), ``registers``,
        ``shared`` (static bytes; for sm_90 cubins of kernels using shared memory this
        includes the 1 KB system reservation), ``local``, ``stack``, ``constant``
        (``CONSTANT[0]``), in order.
    """
    out: list[dict[str, Any]] = []
    arch: str | None = None
    code: str | None = None
    function: str | None = None
    for line in text.splitlines():
        if line.startswith("Fatbin elf code"):
            code, arch = "elf", None
            continue
        if line.startswith("Fatbin ptx code"):
            code, arch = "ptx", None
            continue
        m = _CUOBJ_ARCH.match(line)
        if m is not None:
            arch = m.group("arch")
            continue
        m = _CUOBJ_FUNC.match(line)
        if m is not None:
            function = m.group("name")
            continue
        fields = dict((f.group("key"), int(f.group("value")))
                      for f in _CUOBJ_FIELD.finditer(line))
        if function is not None and "REG" in fields:
            out.append({
                "function": function,
                "arch": arch,
                "code": code,
                "registers": fields.get("REG"),
                "shared": fields.get("SHARED"),
                "local": fields.get("LOCAL"),
                "stack": fields.get("STACK"),
                "constant": fields.get("CONSTANT[0]"),
            })
            function = None
    return out


def static_shared_bytes(entry: dict[str, Any], compute_capability: str | int | None = None
                        ) -> int | None:
    """The kernel's own static shared memory from a :func:`parse_cuobjdump_resource_usage` entry.

    cuobjdump counts the 1 KB the system reserves per block in ``SHARED`` for sm_90 and
    newer cubins of kernels that use shared memory (a 32x32 tiled matmul shows 9472 on
    sm_90 and 8448 on sm_80, as ptxas reports for both; a kernel with only dynamic shared
    memory shows 1024 on sm_90, 0 on sm_80). That reservation is taken off here so that
    :func:`theoretical_occupancy` does not count it twice.

    Args:
        entry: one parsed entry (its ``arch`` is used when present).
        compute_capability: the GPU's, when the dump names no arch (a bare cubin).
    """
    shared = entry.get("shared")
    if shared is None:
        return None
    arch = entry.get("arch") or compute_capability
    if arch is None:
        return int(shared)
    try:
        cc = arch if isinstance(arch, int) else _cc_number(str(arch))
    except ValueError:
        return int(shared)
    if cc >= 90 and shared >= 1024:
        return int(shared) - 1024
    return int(shared)


_PTXAS_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>[^']+)'")
_PTXAS_PROPS = re.compile(r"Function properties for (?P<name>\S+)")
_PTXAS_FRAME = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, "
    r"(?P<loads>\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"Used (?P<regs>\d+) registers")
_PTXAS_BYTES = re.compile(r"(?P<n>\d+) bytes (?P<space>smem|lmem|cmem\[\d+\])")
_PTXAS_BARRIERS = re.compile(r"used (?P<n>\d+) barriers")


def parse_ptxas_verbose(text: str) -> list[dict[str, Any]]:
    """Parse ``ptxas -v`` (``nvcc -Xptxas -v``) output.

    Returns:
        One dict per compiled entry: ``function``, ``arch``, ``registers``, ``shared``
        (static bytes, 0 when not printed), ``local`` (lmem bytes), ``barriers``,
        ``stack``, ``spill_stores``, ``spill_loads``, ``constant`` (cmem[0] bytes).
    """
    out: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        m = _PTXAS_ENTRY.search(line)
        if m is not None:
            current = {"function": m.group("name"), "arch": m.group("arch"), "registers": None,
                       "shared": 0, "local": 0, "barriers": None, "stack": None,
                       "spill_stores": None, "spill_loads": None, "constant": None}
            out.append(current)
            continue
        if current is None:
            continue
        m = _PTXAS_FRAME.search(line)
        if m is not None:
            current["stack"] = int(m.group("stack"))
            current["spill_stores"] = int(m.group("stores"))
            current["spill_loads"] = int(m.group("loads"))
            continue
        m = _PTXAS_USED.search(line)
        if m is not None:
            current["registers"] = int(m.group("regs"))
            b = _PTXAS_BARRIERS.search(line)
            if b is not None:
                current["barriers"] = int(b.group("n"))
            for f in _PTXAS_BYTES.finditer(line):
                space, n = f.group("space"), int(f.group("n"))
                if space == "smem":
                    current["shared"] = n
                elif space == "lmem":
                    current["local"] = n
                elif space == "cmem[0]":
                    current["constant"] = n
    return out
