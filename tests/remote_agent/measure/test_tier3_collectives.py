"""Tier 3 does not aim ncu at a collective it was not asked for.

ncu replays a kernel to collect its counters; NCCL's all-reduce waits on its peers, which
run it once, so a replay on one rank waits for ranks that never come. When a two-rank
step's Tier 2 ranks the all-reduce first, Tier 3 profiles the top compute kernel and says
why in one line; a person who names the collective with ``--kernel-regex`` still gets it.
ncu is the stand-in of test_tier3_names (this machine has no GPU); the kernel names are
NCCL's and cuBLAS's spellings as torch.profiler reports them on an H200.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from gpuws import protocol
from gpuws.remote_agent.measure import tiers
from gpuws.remote_agent.worker import RunContext
from remote_agent.measure.test_tier3_names import row, stand_in_ncu  # type: ignore[import-not-found]
from remote_agent.measure.test_tier3_paths import (  # type: ignore[import-not-found]
    FakePod,
    ctx,  # noqa: F401
    events,
)

NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"


def launches() -> list[dict[str, str]]:
    return [{"demangled": n, "function": n.split("(")[0], "mangled": n} for n in (GEMM, NCCL)]


def test_a_collective_on_top_gives_way_to_the_top_compute_kernel(
        ctx: RunContext, tmp_path: Path) -> None:  # noqa: F811
    ncu, calls = stand_in_ncu(tmp_path, launches())
    assert not tiers.tier3(ctx, FakePod([ncu]), ["/bin/true"],
                           [row(NCCL, 45.0), row(GEMM, 40.0)], None, python=False)
    (made,) = [json.loads(line) for line in calls.read_text().splitlines()]
    assert [n for n in (GEMM, NCCL) if re.search(made[1], n)] == [GEMM]
    said = [e.message for e in events(ctx) if isinstance(e, protocol.Log)]
    assert any(m.startswith(f"Tier 3 profiles `{GEMM}`, the top kernel that is not a "
                            "collective") and "--kernel-regex" in m for m in said), said


def test_a_collective_named_by_the_person_is_profiled(ctx: RunContext,  # noqa: F811
                                                     tmp_path: Path) -> None:
    ncu, calls = stand_in_ncu(tmp_path, launches())
    tiers.tier3(ctx, FakePod([ncu]), ["/bin/true"], [row(NCCL, 45.0), row(GEMM, 40.0)],
                "AllReduce", python=False)
    (made,) = [json.loads(line) for line in calls.read_text().splitlines()]
    assert re.search(made[1], NCCL) and not re.search(made[1], GEMM)


def test_only_collectives_leaves_the_top_one(ctx: RunContext,  # noqa: F811
                                            tmp_path: Path) -> None:
    ncu, calls = stand_in_ncu(tmp_path, launches())
    tiers.tier3(ctx, FakePod([ncu]), ["/bin/true"], [row(NCCL, 100.0)], None, python=False)
    (made,) = [json.loads(line) for line in calls.read_text().splitlines()]
    assert re.search(made[1], NCCL)
