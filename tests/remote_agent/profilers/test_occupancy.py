"""Theoretical occupancy from resource usage, checked against what ncu computed on an H200."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gpuws.remote_agent.profilers.ncu_reader import parse_number
from gpuws.remote_agent.profilers.occupancy import (
    arch_limits,
    parse_cuobjdump_resource_usage,
    parse_ptxas_verbose,
    static_shared_bytes,
    theoretical_occupancy,
)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "ncu-2025.3.1-h200"

# cuobjdump --dump-resource-usage of the same file compiled for sm_90 and for sm_80 (CUDA
# 13.0): sm_90 counts the 1 KB system reservation in SHARED for kernels using shared memory.
CUOBJDUMP_SM90 = """
Resource usage:
 Common:
  GLOBAL:0
 Function _Z11regs_kernelILi100EEvPfiii:
  REG:107 STACK:0 SHARED:1024 LOCAL:0 CONSTANT[0]:548 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _Z11regs_kernelILi4EEvPfiii:
  REG:12 STACK:0 SHARED:1024 LOCAL:0 CONSTANT[0]:548 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _Z5tiledPKfS0_Pfi:
  REG:29 STACK:0 SHARED:9472 LOCAL:0 CONSTANT[0]:556 TEXTURE:0 SURFACE:0 SAMPLER:0
"""
CUOBJDUMP_SM80 = CUOBJDUMP_SM90.replace("SHARED:1024", "SHARED:0").replace(
    "SHARED:9472", "SHARED:8448").replace("REG:29", "REG:30")
# A fatbin dump names the arch and the code kind of each block.
CUOBJDUMP_FATBIN = """
Fatbin elf code:
================
arch = sm_90
code version = [1,8]
host = linux
compile_size = 64bit

Resource usage:
 Common:
  GLOBAL:0
 Function _Z5saxpyifPKfPf:
  REG:10 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:552 TEXTURE:0 SURFACE:0 SAMPLER:0

Fatbin ptx code:
================
arch = sm_90
code version = [9,0]
host = linux
compile_size = 64bit
compressed
ptxasOptions =

Resource usage:
 Common:
  GLOBAL:0
 Function _Z5saxpyifPKfPf:
  REG:10 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:376 TEXTURE:0 SURFACE:0 SAMPLER:0
"""

# What ncu 2025.3.1 computed on the H200 for 92 launches of one kernel with three register
# counts, eight block sizes and five dynamic shared-memory sizes: block size, registers per
# thread, shared memory per block (launch__shared_mem_per_block, reservation included), the
# carve-out the driver chose, sm__maximum_warps_per_active_cycle_pct, and the block limits
# (registers, shared memory, warps, blocks).
H200_SWEEP = [
    (32, 16, 1024, 32768, 50.0, (128, 32, 64, 32)),
    (32, 64, 1024, 32768, 50.0, (32, 32, 64, 32)),
    (32, 107, 1024, 32768, 25.0, (16, 32, 64, 32)),
    (32, 16, 5024, 167936, 50.0, (128, 32, 64, 32)),
    (32, 64, 5024, 167936, 50.0, (32, 32, 64, 32)),
    (32, 107, 5024, 135168, 25.0, (16, 26, 64, 32)),
    (32, 16, 21024, 233472, 17.19, (128, 11, 64, 32)),
    (32, 64, 21024, 233472, 17.19, (32, 11, 64, 32)),
    (32, 107, 21024, 233472, 17.19, (16, 11, 64, 32)),
    (32, 16, 50176, 200704, 6.25, (128, 4, 64, 32)),
    (32, 64, 50176, 200704, 6.25, (32, 4, 64, 32)),
    (32, 107, 50176, 200704, 6.25, (16, 4, 64, 32)),
    (32, 16, 101024, 233472, 3.12, (128, 2, 64, 32)),
    (32, 64, 101024, 233472, 3.12, (32, 2, 64, 32)),
    (32, 107, 101024, 233472, 3.12, (16, 2, 64, 32)),
    (96, 16, 1024, 32768, 98.44, (42, 32, 21, 32)),
    (96, 64, 1024, 32768, 46.88, (10, 32, 21, 32)),
    (96, 107, 1024, 32768, 23.44, (5, 32, 21, 32)),
    (96, 16, 5024, 135168, 98.44, (42, 26, 21, 32)),
    (96, 64, 5024, 102400, 46.88, (10, 20, 21, 32)),
    (96, 107, 5024, 65536, 23.44, (5, 12, 21, 32)),
    (96, 16, 21024, 233472, 51.56, (42, 11, 21, 32)),
    (96, 64, 21024, 233472, 46.88, (10, 11, 21, 32)),
    (96, 107, 21024, 135168, 23.44, (5, 6, 21, 32)),
    (96, 16, 50176, 200704, 18.75, (42, 4, 21, 32)),
    (96, 64, 50176, 200704, 18.75, (10, 4, 21, 32)),
    (96, 107, 50176, 200704, 18.75, (5, 4, 21, 32)),
    (96, 16, 101024, 233472, 9.38, (42, 2, 21, 32)),
    (96, 64, 101024, 233472, 9.38, (10, 2, 21, 32)),
    (96, 107, 101024, 233472, 9.38, (5, 2, 21, 32)),
    (128, 16, 1024, 32768, 100.0, (32, 32, 16, 32)),
    (128, 64, 1024, 32768, 50.0, (8, 32, 16, 32)),
    (128, 107, 1024, 32768, 25.0, (4, 32, 16, 32)),
    (128, 16, 5024, 135168, 100.0, (32, 26, 16, 32)),
    (128, 64, 5024, 102400, 50.0, (8, 20, 16, 32)),
    (128, 107, 5024, 65536, 25.0, (4, 12, 16, 32)),
    (128, 16, 21024, 233472, 68.75, (32, 11, 16, 32)),
    (128, 64, 21024, 200704, 50.0, (8, 9, 16, 32)),
    (128, 107, 21024, 135168, 25.0, (4, 6, 16, 32)),
    (128, 16, 50176, 200704, 25.0, (32, 4, 16, 32)),
    (128, 64, 50176, 200704, 25.0, (8, 4, 16, 32)),
    (128, 107, 50176, 200704, 25.0, (4, 4, 16, 32)),
    (128, 16, 101024, 233472, 12.5, (32, 2, 16, 32)),
    (128, 64, 101024, 233472, 12.5, (8, 2, 16, 32)),
    (128, 107, 101024, 233472, 12.5, (4, 2, 16, 32)),
    (256, 16, 1024, 32768, 100.0, (16, 32, 8, 32)),
    (256, 64, 1024, 32768, 50.0, (4, 32, 8, 32)),
    (256, 107, 1024, 32768, 25.0, (2, 32, 8, 32)),
    (256, 16, 5024, 102400, 100.0, (16, 20, 8, 32)),
    (256, 64, 5024, 65536, 50.0, (4, 12, 8, 32)),
    (256, 107, 5024, 32768, 25.0, (2, 6, 8, 32)),
    (256, 16, 21024, 200704, 100.0, (16, 9, 8, 32)),
    (256, 64, 21024, 135168, 50.0, (4, 6, 8, 32)),
    (256, 107, 21024, 102400, 25.0, (2, 4, 8, 32)),
    (256, 16, 50176, 200704, 50.0, (16, 4, 8, 32)),
    (256, 64, 50176, 200704, 50.0, (4, 4, 8, 32)),
    (256, 107, 50176, 135168, 25.0, (2, 2, 8, 32)),
    (256, 16, 101024, 233472, 25.0, (16, 2, 8, 32)),
    (256, 64, 101024, 233472, 25.0, (4, 2, 8, 32)),
    (256, 107, 101024, 233472, 25.0, (2, 2, 8, 32)),
    (384, 16, 1024, 32768, 93.75, (10, 32, 5, 32)),
    (384, 64, 1024, 32768, 37.5, (2, 32, 5, 32)),
    (384, 107, 1024, 8192, 18.75, (1, 8, 5, 32)),
    (384, 16, 5024, 65536, 93.75, (10, 12, 5, 32)),
    (384, 64, 5024, 32768, 37.5, (2, 6, 5, 32)),
    (384, 107, 5024, 8192, 18.75, (1, 1, 5, 32)),
    (384, 16, 21024, 135168, 93.75, (10, 6, 5, 32)),
    (384, 64, 21024, 102400, 37.5, (2, 4, 5, 32)),
    (384, 107, 21024, 32768, 18.75, (1, 1, 5, 32)),
    (384, 16, 50176, 200704, 75.0, (10, 4, 5, 32)),
    (384, 64, 50176, 135168, 37.5, (2, 2, 5, 32)),
    (384, 107, 50176, 65536, 18.75, (1, 1, 5, 32)),
    (384, 16, 101024, 233472, 37.5, (10, 2, 5, 32)),
    (384, 64, 101024, 233472, 37.5, (2, 2, 5, 32)),
    (384, 107, 101024, 102400, 18.75, (1, 1, 5, 32)),
    (512, 16, 1024, 16384, 100.0, (8, 16, 4, 32)),
    (512, 64, 1024, 16384, 50.0, (2, 16, 4, 32)),
    (512, 107, 1024, 8192, 25.0, (1, 8, 4, 32)),
    (512, 16, 5024, 65536, 100.0, (8, 12, 4, 32)),
    (512, 64, 5024, 32768, 50.0, (2, 6, 4, 32)),
    (512, 107, 5024, 8192, 25.0, (1, 1, 4, 32)),
    (512, 16, 21024, 135168, 100.0, (8, 6, 4, 32)),
    (512, 64, 21024, 102400, 50.0, (2, 4, 4, 32)),
    (512, 107, 21024, 32768, 25.0, (1, 1, 4, 32)),
    (512, 16, 50176, 200704, 100.0, (8, 4, 4, 32)),
    (512, 64, 50176, 135168, 50.0, (2, 2, 4, 32)),
    (512, 107, 50176, 65536, 25.0, (1, 1, 4, 32)),
    (512, 16, 101024, 233472, 50.0, (8, 2, 4, 32)),
    (512, 64, 101024, 233472, 50.0, (2, 2, 4, 32)),
    (512, 107, 101024, 102400, 25.0, (1, 1, 4, 32)),
    (640, 16, 1024, 16384, 93.75, (6, 16, 3, 32)),
    (640, 64, 1024, 8192, 31.25, (1, 8, 3, 32)),
]


def raw_values(name: str) -> dict[str, float]:
    """The numeric metrics of the one launch in a raw-page fixture."""
    with (FIXTURES / name).open() as f:
        rows = [r for r in csv.reader(f) if len(r) > 5]
    values = {k: parse_number(x) for k, x in zip(rows[0], rows[2], strict=True)}
    return {k: v for k, v in values.items() if v is not None}


@pytest.mark.parametrize(("fixture", "smem", "config", "limits"), [
    # saxpy prints bytes; the gemm's export prints Kbyte (189.66, 200.704) and is given here.
    ("saxpy_raw.csv", None, None, {"registers": 16, "shared memory": 32, "warps": 8,
                                   "blocks": 32}),
    ("gemm_raw.csv", 189_660, 200_704, {"registers": 1, "shared memory": 1, "warps": 5,
                                        "blocks": 32}),
])
def test_agrees_with_ncu_on_the_fixture_kernels(fixture: str, smem: int | None,
                                                config: int | None,
                                                limits: dict[str, int]) -> None:
    v = raw_values(fixture)
    occ = theoretical_occupancy(
        "9.0", int(v["launch__block_size"]), int(v["launch__registers_per_thread"]),
        smem if smem is not None else int(v["launch__shared_mem_per_block"]),
        reserved_included=True,
        smem_config_bytes=config if config is not None else int(
            v["launch__shared_mem_config_size"]))
    assert occ["pct"] == v["sm__maximum_warps_per_active_cycle_pct"]
    assert occ["block_limits"] == limits
    assert [int(v["launch__occupancy_limit_" + k])
            for k in ("registers", "shared_mem", "warps", "blocks")] == list(limits.values())


def test_gemm_limiters_match_ncus_own_words() -> None:
    # "limited by the number of required registers, and the required amount of shared memory"
    occ = theoretical_occupancy("9.0", 384, 168, 188_636)  # static + dynamic, no reservation
    assert occ["pct"] == 18.75 and occ["active_warps"] == 12 and occ["blocks_per_sm"] == 1
    assert occ["limiter"] == "registers"
    assert occ["limiters"] == ["registers", "shared memory"]


@pytest.mark.parametrize(("block", "regs", "smem", "config", "pct", "limits"), H200_SWEEP)
def test_agrees_with_ncu_across_a_sweep(block: int, regs: int, smem: int, config: int,
                                        pct: float, limits: tuple[int, int, int, int]) -> None:
    occ = theoretical_occupancy("9.0", block, regs, smem, reserved_included=True,
                                smem_config_bytes=config)
    assert occ["pct"] == pytest.approx(pct, abs=0.006)
    assert tuple(occ["block_limits"].values()) == limits
    # With the largest carve-out (what a counter-less estimate assumes) the occupancy is the
    # same: the driver picks a carve-out that does not lower it.
    assert theoretical_occupancy("9.0", block, regs, smem, reserved_included=True)["pct"] == \
        pytest.approx(pct, abs=0.006)


def test_cuobjdump_and_ptxas_fixtures() -> None:
    (dump,) = parse_cuobjdump_resource_usage((FIXTURES / "cuobjdump_resource_usage.txt")
                                             .read_text())
    assert dump == {"function": "tiled", "arch": None, "code": None, "registers": 32,
                    "shared": 9472, "local": 0, "stack": 0, "constant": 556}
    (ptxas,) = parse_ptxas_verbose((FIXTURES / "ptxas_v.txt").read_text())
    assert ptxas == {"function": "tiled", "arch": "sm_90", "registers": 32, "shared": 8448,
                     "local": 0, "barriers": 1, "stack": 0, "spill_stores": 0,
                     "spill_loads": 0, "constant": None}
    # Both describe one sm_90 kernel: cuobjdump's extra 1 KB is the system reservation.
    assert static_shared_bytes(dump, "9.0") == ptxas["shared"]
    occ = theoretical_occupancy("9.0", 1024, dump["registers"],
                                static_shared_bytes(dump, "9.0") or 0)
    assert occ["pct"] == 100.0 and occ["blocks_per_sm"] == 2


def test_static_shared_memory_across_archs() -> None:
    sm90 = {e["function"]: e for e in parse_cuobjdump_resource_usage(CUOBJDUMP_SM90)}
    sm80 = {e["function"]: e for e in parse_cuobjdump_resource_usage(CUOBJDUMP_SM80)}
    for name in sm90:
        assert static_shared_bytes(sm90[name], "sm_90") == static_shared_bytes(sm80[name], "8.0")
    assert static_shared_bytes(sm90["_Z5tiledPKfS0_Pfi"], 90) == 8448
    assert static_shared_bytes(sm90["_Z11regs_kernelILi4EEvPfiii"], "9.0") == 0
    # ncu on that tiled kernel (32x32 block, 29 registers): 9472 bytes, 100 % theoretical.
    tiled = sm90["_Z5tiledPKfS0_Pfi"]
    occ = theoretical_occupancy("9.0", 1024, tiled["registers"],
                                static_shared_bytes(tiled, "9.0") or 0)
    assert occ["pct"] == 100.0
    fat = parse_cuobjdump_resource_usage(CUOBJDUMP_FATBIN)
    assert [(e["code"], e["arch"], e["registers"], e["constant"]) for e in fat] == [
        ("elf", "sm_90", 10, 552), ("ptx", "sm_90", 10, 376)]
    assert static_shared_bytes({"shared": 2048, "arch": None}) == 2048  # arch unknown: as is


@pytest.mark.parametrize(("cc", "block", "regs", "smem", "pct", "limiter"), [
    ("8.0", 256, 64, 0, 50.0, "registers"),        # 2048 regs/warp: 32 warps of 64
    ("7.0", 128, 32, 48 * 1024, 12.5, "shared memory"),  # two 48 KB blocks in 96 KB
    ("8.6", 256, 32, 0, 100.0, "warps"),            # 48 warps: six blocks of eight
    ("7.5", 1024, 16, 0, 100.0, "warps"),           # Turing: 32 warps per SM
    ("8.9", 32, 16, 0, 50.0, "blocks"),             # 24 one-warp blocks of 48 warps
    ("12.0", 96, 255, 0, 12.5, "registers"),
    ("9.0", 128, 300, 0, 0.0, "registers"),         # more than 255 registers: cannot launch
    ("9.0", 128, 32, 228 * 1024, 0.0, "shared memory"),  # more than 227 KB: cannot launch
])
def test_other_architectures(cc: str, block: int, regs: int, smem: int, pct: float,
                             limiter: str) -> None:
    occ = theoretical_occupancy(cc, block, regs, smem)
    assert occ["pct"] == pytest.approx(pct)
    assert occ["limiter"] == limiter


def test_refusals() -> None:
    with pytest.raises(ValueError):
        theoretical_occupancy("6.1", 128, 32)
    with pytest.raises(ValueError):
        theoretical_occupancy("9.0", 0, 32)
    with pytest.raises(ValueError):
        theoretical_occupancy("9.0", 2048, 32)
    assert arch_limits("sm_90a").max_warps == 64 and arch_limits(86).max_warps == 48
