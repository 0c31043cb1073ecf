"""The verdicts on four programs recorded on a real H100 (tests/fixtures/verdict-h100).

Recorded 2026-11-24 by ``bash tests/gpu/record_verdict_characters.sh`` (device tool,
NVIDIA H100 80GB HBM3, driver 580.159.04, ncu 2025.3.1, torch 2.11+cu130): each workload
through ``gpuws run local --tiers 2,3 --json``. The laptop's logic (``live.verdicts``) is
run again over the recorded events, as a replay or an export of an old session does, and
must reach what a kernel engineer would say of each.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuws import protocol
from gpuws.live.verdicts import derive, inputs_from_events

FIX = Path(__file__).parents[1] / "fixtures" / "verdict-h100"


def verdicts_of(name: str) -> tuple[protocol.ProgramVerdict, list[protocol.KernelVerdict]]:
    # (recorded before `run --json` kept its "pulled" lines off stdout: they are skipped)
    events = [protocol.decode_event(line) for line in (FIX / f"{name}.ndjson").read_bytes()
              .splitlines() if line.startswith(b"{")]
    assert not any(isinstance(e, protocol.BadLine) for e in events)
    got = derive(inputs_from_events([e for e in events
                                     if not isinstance(e, protocol.BadLine)]))
    assert got.program is not None
    return got.program, got.kernels


@pytest.mark.parametrize(("name", "bound", "words"), [
    # A batch-1 decode loop with .item() every step: the GPU waits on the host.
    ("decode", "host", "idle 97%"),
    # 200 launches of an 8-block kernel: short kernels, gaps between them.
    ("tiny_grid", "launch", "Launch-bound"),
    # saxpy alone: the GPU is busy with one kernel.
    ("saxpy", "gpu", "saxpy takes 100%"),
])
def test_the_program_verdict_names_what_bounds_it(name: str, bound: str, words: str) -> None:
    program, _ = verdicts_of(name)
    assert program.bound == bound and words in program.summary, program.summary


def test_the_kernel_verdicts_name_the_bound_from_the_counters() -> None:
    _, saxpy = verdicts_of("saxpy")
    assert saxpy[0].bound == "dram" and "DRAM bandwidth-bound" in saxpy[0].sentence
    _, gemm = verdicts_of("gemm")
    assert gemm[0].bound == "compute_tensor" and "tensor cores" in gemm[0].sentence
    _, tiny = verdicts_of("tiny_grid")
    assert tiny[0].bound in ("latency", "occupancy", "small_grid"), tiny[0].sentence
