"""One launch or a few of each kernel family a real program runs, for the names each tool
gives them: torch elementwise (vectorized and templated), reduce, cat, gather/index,
cuBLAS/nvjet GEMM, SDPA (flash/cuDNN), softmax, layer norm, a Triton kernel, a CuPy
RawKernel. Run under torch.profiler and under ncu with each --print-kernel-base.
"""

from __future__ import annotations

import cupy
import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)


_SAXPY = cupy.RawKernel(r'''
extern "C" __global__ void saxpy(float a, const float* x, const float* y, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + y[i];
}''', "saxpy")


def main() -> None:
    torch.manual_seed(0)
    n = 1 << 20
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        _ = x + 1.0                                  # vectorized_elementwise_kernel
        _ = x[::2] * 3.0                             # elementwise_kernel (strided)
        _ = y.float()                                # a cast
        _ = x.sum()                                  # reduce_kernel
        _ = torch.cat([x, x])                        # CatArrayBatchedCopy
        idx = torch.randint(0, n, (4096,), device="cuda")
        _ = x[idx]                                   # index (gather)
        _ = torch.gather(x, 0, idx)                  # gather
        a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
        _ = a @ a                                    # cuBLAS / nvjet
        q = torch.randn(4, 16, 512, 64, device="cuda", dtype=torch.bfloat16)
        _ = F.scaled_dot_product_attention(q, q, q, is_causal=True)   # flash / cuDNN
        _ = torch.softmax(a, dim=-1)
        _ = F.layer_norm(a, (2048,))
        out = torch.empty_like(x)
        _scale_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
        cx = cupy.random.rand(n, dtype=cupy.float32)
        co = cupy.empty_like(cx)
        _SAXPY(((n + 255) // 256,), (256,), (cupy.float32(2.0), cx, cx, co, cupy.int32(n)))
    torch.cuda.synchronize()
    cupy.cuda.runtime.deviceSynchronize()
    print("families done")


if __name__ == "__main__":
    main()
