"""One kernel, two launch configurations: the small one first, the large one most of the
time (issue 32: "where several instances share a name, the one Tier 2 chose is the one
profiled").

``x.mul_(2.0)`` on float32 is one kernel (``vectorized_elementwise_kernel<4,
AUnaryFunctor<float, float, float, MulFunctor<float>>, …>``) whatever the size; its grid
grows with the tensor. Each call does SMALL_CALLS launches over 2^12 floats, then
BIG_CALLS over 2^24 floats, so the large grid takes nearly all of the kernel's time but
is not its first launch. As a ``file:`` workload (``setup``/``run``) or a ``cmd:``
(``python3 two_grids.py``: one warm-up-free call).
"""

from __future__ import annotations

import torch

SMALL, BIG = 1 << 12, 1 << 24
SMALL_CALLS, BIG_CALLS = 3, 8


def setup() -> dict:
    return {"small": torch.empty(SMALL, device="cuda"), "big": torch.empty(BIG, device="cuda")}


def run(state: dict) -> None:
    for _ in range(SMALL_CALLS):
        state["small"].mul_(2.0)
    for _ in range(BIG_CALLS):
        state["big"].mul_(2.0)


if __name__ == "__main__":
    run(setup())
    torch.cuda.synchronize()
