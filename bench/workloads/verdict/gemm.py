"""A GPU-bound program dominated by one GEMM: bf16 8192x8192x8192 matmuls back to back
(the cuBLAS nvjet kernel of tests/fixtures/ncu-2025.3.1-h200/gemm_*). Prints TFLOP/s."""

import time

import torch

a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    a @ b
torch.cuda.synchronize()
n, t0 = 20, time.perf_counter()
for _ in range(n):
    a @ b
torch.cuda.synchronize()
print("gemm: %.0f TFLOP/s" % (n * 2 * 8192 ** 3 / (time.perf_counter() - t0) / 1e12))
