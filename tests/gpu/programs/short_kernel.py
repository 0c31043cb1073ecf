"""A `file:` workload whose kernel takes about 5 µs on an H100/H200: x + y over 2^21
floats (25 MB moved), the size where CUDA events' resolution and launch overhead start
to show against ncu's gpu__time_duration.
"""

from __future__ import annotations

import torch

N = 1 << 21
BYTES = 3 * 4 * N
FLOPS = N
_state: dict = {}


def setup() -> None:
    _state["x"] = torch.randn(N, device="cuda")
    _state["y"] = torch.randn(N, device="cuda")
    _state["out"] = torch.empty(N, device="cuda")


def run() -> None:
    torch.add(_state["x"], _state["y"], out=_state["out"])
