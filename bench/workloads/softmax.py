"""Row softmax of a 4096 x 4096 float32 matrix: the ``file:`` workload of bench/answer.py.

One block per row: the row's maximum, then the sum of exponentials, then the outputs,
each a shared-memory reduction over the row (three reads of it, one write). CuPy is
imported inside the functions, so the file loads (and its declarations can be read)
where CuPy is absent.
"""

from __future__ import annotations

from typing import Any

ROWS = 4096
COLS = 4096
BLOCK = 256
#: Fewest bytes one call moves: the matrix read once, the result written once.
BYTES = 2 * 4 * ROWS * COLS
#: Per element: a subtraction, an exponential, a division, and the two reductions' adds
#: and compares (an exponential counted as one operation).
FLOPS = 5 * ROWS * COLS
KERNEL_REGEX = "softmax_rows"

SOURCE = r"""
extern "C" __global__ void softmax_rows(const float* x, float* y, int cols) {
    __shared__ float red[256];
    const float* row = x + (size_t)blockIdx.x * cols;
    float* out = y + (size_t)blockIdx.x * cols;
    float m = -3.402823466e38f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, row[j]);
    red[threadIdx.x] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    m = red[0];
    __syncthreads();
    float sum = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) sum += __expf(row[j] - m);
    red[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    const float inv = 1.0f / red[0];
    for (int j = threadIdx.x; j < cols; j += blockDim.x) out[j] = __expf(row[j] - m) * inv;
}
"""


def setup() -> tuple[Any, Any, Any]:
    import cupy

    kernel = cupy.RawKernel(SOURCE, "softmax_rows")
    x = cupy.random.default_rng(0).standard_normal((ROWS, COLS), dtype=cupy.float32)
    return kernel, x, cupy.empty_like(x)


def run(state: tuple[Any, Any, Any]) -> None:
    import numpy

    kernel, x, y = state
    kernel((ROWS,), (BLOCK,), (x, y, numpy.int32(COLS)))


def check(state: tuple[Any, Any, Any]) -> float:
    """Largest relative error against CuPy's own softmax (for a by-hand look)."""
    import cupy

    _kernel, x, y = state
    run(state)
    ref = cupy.exp(x - x.max(axis=1, keepdims=True))
    ref /= ref.sum(axis=1, keepdims=True)
    return float(cupy.max(cupy.abs(y - ref) / cupy.maximum(ref, 1e-30)))
