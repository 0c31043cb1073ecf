"""The same vector add as triton_add.py, as a CuPy RawKernel (a cheap host launch)."""

from __future__ import annotations

from typing import Any

N = (1 << 24) + (1 << 23)
BYTES = 3 * 4 * N
FLOPS = N
KERNEL_REGEX = "cupy_add"
BLOCK = 256
SOURCE = r"""
extern "C" __global__ void cupy_add(const float* x, const float* y, float* out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + y[i];
}
"""


def setup() -> tuple[Any, Any, Any, Any]:
    import cupy

    rng = cupy.random.default_rng(0)
    x = rng.random(N, dtype=cupy.float32)
    y = rng.random(N, dtype=cupy.float32)
    return cupy.RawKernel(SOURCE, "cupy_add"), x, y, cupy.empty_like(x)


def run(state: tuple[Any, Any, Any, Any]) -> None:
    import numpy

    kernel, x, y, out = state
    kernel(((N + BLOCK - 1) // BLOCK,), (BLOCK,), (x, y, out, numpy.int64(N)))
