"""The same vector add as triton_add.py, through torch (``torch.add(x, y, out=out)``)."""

from __future__ import annotations

from typing import Any

N = (1 << 24) + (1 << 23)
BYTES = 3 * 4 * N
FLOPS = N
KERNEL_REGEX = "elementwise"


def setup() -> tuple[Any, Any, Any]:
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.rand(N, device="cuda", generator=g)
    y = torch.rand(N, device="cuda", generator=g)
    return x, y, torch.empty_like(x)


def run(state: tuple[Any, Any, Any]) -> None:
    import torch

    x, y, out = state
    torch.add(x, y, out=out)
