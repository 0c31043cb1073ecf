"""A kernel whose grid is too small for the GPU: a sum over 64 Ki floats with 8 blocks
(a CuPy RawKernel, one block per 8 Ki elements, grid-stride inside), launched 200 times
with a wait between launches, so Tier 3 sees a kernel that leaves most SMs idle."""

import cupy as cp

SRC = r"""
extern "C" __global__ void tiny_sum(const float* x, float* out, int n) {
    __shared__ float part[256];
    float acc = 0.f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        acc += x[i];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, part[0]);
}
"""
kernel = cp.RawKernel(SRC, "tiny_sum")
n = 1 << 16
x = cp.ones(n, dtype=cp.float32)
out = cp.zeros(1, dtype=cp.float32)
for _ in range(200):
    out.fill(0)
    kernel((8,), (256,), (x, out, cp.int32(n)))
    cp.cuda.Device().synchronize()
print(f"tiny_grid: sum {float(out.get()[0]):.0f} (expected {n})")
