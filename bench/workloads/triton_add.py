"""Vector add of 2^24 + 2^23 float32 launched from Python by Triton (~90 µs on an H100).

The ``file:`` workload of bench/tier1_launch_bias.py and the GPU check's Triton case:
a kernel whose host launch (Triton's Python launcher) costs far more than a CuPy
RawKernel's, so a timer that lets launch latency into the event interval shows it here.
torch and triton are imported inside the functions, so the file loads without them.
"""

from __future__ import annotations

from typing import Any

N = (1 << 24) + (1 << 23)
#: Two inputs read once, one output written once.
BYTES = 3 * 4 * N
FLOPS = N
KERNEL_REGEX = "add_kernel"
BLOCK = 1024


def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, x + tl.load(y_ptr + offs, mask=mask), mask=mask)

    return add_kernel


def setup() -> tuple[Any, Any, Any, Any]:
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.rand(N, device="cuda", generator=g)
    y = torch.rand(N, device="cuda", generator=g)
    return _kernel(), x, y, torch.empty_like(x)


def run(state: tuple[Any, Any, Any, Any]) -> None:
    kernel, x, y, out = state
    kernel[((N + BLOCK - 1) // BLOCK,)](x, y, out, N, BLOCK=BLOCK)
