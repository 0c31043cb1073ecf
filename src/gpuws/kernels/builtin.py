"""The bundled workloads: CuPy RawKernels, cuBLAS through CuPy, attention through torch.

Each class declares its parameters (``PARAMS``, listed by the UI through
``gpuws.kernels.registry.BUILTINS``), the bytes one call must move and the FLOPs it
does. Constructors only validate and compute those numbers; GPU work (imports,
allocation, compilation) waits for :meth:`Workload.setup`, so the laptop can build and
describe a workload without CuPy.

Bandwidth-bound kernels (copy, saxpy, reduce) read and write ``float4`` (16-byte
accesses: a quarter of the load instructions of scalar code) in a grid-stride loop; the
``n % 4`` tail runs as a scalar loop. Grids are chosen by :func:`_stream_grid` from
measurements on an H200. Inputs
are random, never zeros: zeros can hide unwritten outputs and run faster than real data.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any, ClassVar, Dict, List, Optional, Tuple, Type

from .workload import Param, ParamValue, StaticKernel, Workload

_SEED = 1234

# One source for the streaming kernels: they share the float4 grid-stride shape.
_STREAM_SRC = r"""
extern "C" __global__ void copy_kernel(const float* __restrict__ x, float* __restrict__ y,
                                       long long n) {
    long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    long long n4 = n >> 2;
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x);
    float4* __restrict__ y4 = reinterpret_cast<float4*>(y);
    for (long long i = tid; i < n4; i += stride) {
        y4[i] = x4[i];
    }
    for (long long i = (n4 << 2) + tid; i < n; i += stride) {
        y[i] = x[i];
    }
}

extern "C" __global__ void saxpy(const float* __restrict__ x, float* __restrict__ y, float a,
                                 long long n) {
    long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    long long n4 = n >> 2;
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x);
    float4* __restrict__ y4 = reinterpret_cast<float4*>(y);
    for (long long i = tid; i < n4; i += stride) {
        float4 xv = x4[i];
        float4 yv = y4[i];
        yv.x = a * xv.x + yv.x;
        yv.y = a * xv.y + yv.y;
        yv.z = a * xv.z + yv.z;
        yv.w = a * xv.w + yv.w;
        y4[i] = yv;
    }
    for (long long i = (n4 << 2) + tid; i < n; i += stride) {
        y[i] = a * x[i] + y[i];
    }
}
"""

_REDUCE_SRC = r"""
// Sum over the block; the result is valid in thread 0. blockDim.x is a multiple of 32.
__device__ float block_sum(float v, float* warp_sums) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    __syncthreads();  // warp_sums may still be read by an earlier call
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    int nwarps = blockDim.x >> 5;
    v = (threadIdx.x < nwarps) ? warp_sums[lane] : 0.0f;
    if (warp == 0) {
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    }
    return v;
}

// One pass: each block writes its partial sum; the last block to finish (seen through an
// atomic counter after a fence) adds the partials in a fixed order and resets the
// counter, so the result is deterministic and needs no memset before each call.
extern "C" __global__ void reduce_sum(const float* __restrict__ x, long long n,
                                      float* partials, unsigned int* counter,
                                      float* __restrict__ out) {
    __shared__ float warp_sums[32];
    __shared__ bool is_last;
    long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    long long n4 = n >> 2;
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x);
    float acc = 0.0f;
    for (long long i = tid; i < n4; i += stride) {
        float4 v = x4[i];
        acc += (v.x + v.y) + (v.z + v.w);
    }
    for (long long i = (n4 << 2) + tid; i < n; i += stride) {
        acc += x[i];
    }
    acc = block_sum(acc, warp_sums);
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = acc;
        __threadfence();
        unsigned int done = atomicAdd(counter, 1u);
        is_last = (done == gridDim.x - 1);
    }
    __syncthreads();
    if (is_last) {
        float s = 0.0f;
        for (unsigned int i = threadIdx.x; i < gridDim.x; i += blockDim.x) {
            s += __ldcg(&partials[i]);  // L2, not a stale L1 line
        }
        s = block_sum(s, warp_sums);
        if (threadIdx.x == 0) {
            *out = s;
            *counter = 0u;
        }
    }
}
"""

_MATMUL_SRC = r"""
// C = A B for row-major n x n fp32 matrices; one thread per element of C.
extern "C" __global__ void naive_matmul(const float* __restrict__ A, const float* __restrict__ B,
                                        float* __restrict__ C, int n) {
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < n && col < n) {
        const float* a = A + (size_t)row * n;
        float acc = 0.0f;
        for (int k = 0; k < n; ++k) acc += a[k] * B[(size_t)k * n + col];
        C[(size_t)row * n + col] = acc;
    }
}

#define TILE 32
// Same product through 32x32 shared-memory tiles: each element of A and B is read from
// global memory n/32 times instead of n times. Rows are not padded: As[ty][k] is one
// address per warp (a broadcast) and Bs[k][tx] spans the 32 banks, so nothing conflicts,
// and 16-byte-aligned rows let the compiler read As four floats at a time (on an H200 at
// n=4096, padding to 33 columns took 20.3 ms instead of 16.0).
extern "C" __global__ void tiled_matmul(const float* __restrict__ A, const float* __restrict__ B,
                                        float* __restrict__ C, int n) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int tx = threadIdx.x;
    int ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty;
    int col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int t = 0; t < n; t += TILE) {
        As[ty][tx] = (row < n && t + tx < n) ? A[(size_t)row * n + t + tx] : 0.0f;
        Bs[ty][tx] = (t + ty < n && col < n) ? B[(size_t)(t + ty) * n + col] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    if (row < n && col < n) C[(size_t)row * n + col] = acc;
}
"""

#: Regex for the cuBLAS / cuBLASLt GEMM kernels on Ampere-Blackwell (``nvjet`` on Hopper+).
_CUBLAS_REGEX = "nvjet|gemm|sm80|sm90|sm100|cutlass"
_DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


# Values arrive typed from registry.make_builtin; these guard direct construction.
def _p_int(params: Dict[str, ParamValue], key: str) -> int:
    value = params[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key}={value!r}: expected an integer")
    return value


def _p_float(params: Dict[str, ParamValue], key: str) -> float:
    value = params[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key}={value!r}: expected a number")
    return float(value)


def _p_str(params: Dict[str, ParamValue], key: str, choices: Tuple[str, ...]) -> str:
    value = params[key]
    if value not in choices:
        raise ValueError(f"{key}={value!r}: expected one of {', '.join(choices)}")
    return str(value)


def _p_bool(params: Dict[str, ParamValue], key: str) -> bool:
    value = params[key]
    if not isinstance(value, bool):
        raise ValueError(f"{key}={value!r}: expected true or false")
    return value


def _positive(name: str, value: int, limit: Optional[int] = None) -> None:
    if value < 1 or (limit is not None and value > limit):
        bound = f"between 1 and {limit}" if limit is not None else "at least 1"
        raise ValueError(f"{name}={value}: must be {bound}")


def _check_block(value: int) -> None:
    if value < 32 or value > 1024 or value % 32:
        raise ValueError(f"block={value}: must be a multiple of 32 between 32 and 1024")


def _sm_count() -> int:
    import cupy

    return int(cupy.cuda.Device().attributes["MultiProcessorCount"])


def _stream_grid(n: int, block: int, *, one_wave: bool = False) -> int:
    """Blocks for a float4 grid-stride loop over ``n`` floats.

    By default one thread per float4, so the loop body runs once: on an H200 that moved
    saxpy at 4.29 TB/s against 4.01 TB/s for a single full-occupancy wave of blocks
    looping over the array (the memcpy rate there is 4.26 TB/s). ``one_wave`` caps the
    grid at 2048 resident threads per SM instead, which the reduction needs: its last
    block adds one partial per block, and 65536 partials cost it 3.6×.
    """
    needed = max(1, -(-(n // 4) // block))
    if one_wave:
        return min(needed, _sm_count() * max(1, 2048 // block))
    return min(needed, 2**31 - 1)


def _rel_error(out: Any, ref: Any) -> float:
    """``‖out − ref‖ / ‖ref‖`` in float64 (CuPy or torch arrays)."""
    import cupy

    o = cupy.asarray(out).astype(cupy.float64).ravel()
    r = cupy.asarray(ref).astype(cupy.float64).ravel()
    denom = float(cupy.linalg.norm(r))
    err = float(cupy.linalg.norm(o - r))
    if not math.isfinite(err):
        return math.inf
    return err / denom if denom else err


def _random(shape: Tuple[int, ...], seed: int = _SEED) -> Any:
    import cupy

    return cupy.random.RandomState(seed).standard_normal(shape, dtype=cupy.float32)


def _require_torch(what: str, hint: str = "") -> None:
    # find_spec answers without importing torch (seconds) and works where torch is absent.
    if importlib.util.find_spec("torch") is None:
        raise ValueError(f"{what} needs torch, which is not installed on this machine{hint}")


class BuiltinWorkload(Workload):
    """A bundled workload: declares ``PARAMS``; built by ``registry.make_builtin``."""

    NAME: ClassVar[str] = ""
    SUMMARY: ClassVar[str] = ""
    PARAMS: ClassVar[Tuple[Param, ...]] = ()

    def __init__(self, params: Optional[Dict[str, ParamValue]] = None) -> None:
        full: Dict[str, ParamValue] = {p.name: p.default for p in self.PARAMS}
        full.update(params or {})
        super().__init__(full)
        self.name = self.NAME
        self._block = 0
        self._kernels: List[Tuple[str, Any]] = []

    def _choice(self, key: str) -> str:
        """A ``str`` parameter, checked against the choices its :class:`Param` lists."""
        choices = next(p.choices for p in self.PARAMS if p.name == key)
        return _p_str(self.params, key, choices or ())

    def static_kernels(self) -> List[StaticKernel]:
        """The RawKernels this workload launches, with the block size it uses."""
        return [StaticKernel(name, kernel, self._block) for name, kernel in self._kernels]

    def _raw_kernel(self, source: str, name: str) -> Any:
        import cupy

        kernel = cupy.RawKernel(source, name, options=("-std=c++14",))
        kernel.compile()
        self._kernels.append((name, kernel))
        return kernel


class Copy(BuiltinWorkload):
    """Device-to-device copy of ``n`` floats (a memcpy, or a float4 kernel ncu can see)."""

    NAME = "copy"
    SUMMARY = "device-to-device copy of n floats (bandwidth ceiling)"
    PARAMS = (
        Param("n", "int", 2**26, "number of float32 elements"),
        Param("impl", "str", "memcpy", "cudaMemcpyAsync, or a float4 copy kernel ncu can profile",
              ("memcpy", "kernel")),
        Param("block", "int", 256, "threads per block (impl=kernel)"),
    )

    def __init__(self, params: Optional[Dict[str, ParamValue]] = None) -> None:
        super().__init__(params)
        self.n = _p_int(self.params, "n")
        self.impl = self._choice("impl")
        self.block = _p_int(self.params, "block")
        _positive("n", self.n)
        _check_block(self.block)
        self.bytes_moved = 2.0 * 4 * self.n  # read n floats, write n floats
        self.flops = None
        # ncu profiles kernels only; a memcpy is invisible to it.
        self.kernel_regex = "copy_kernel" if self.impl == "kernel" else None

    def setup(self) -> None:
        """Allocate source (random) and destination; compile the kernel if used."""
        import cupy

        self.x = _random((self.n,))
        self.y = cupy.empty_like(self.x)
        if self.impl == "kernel":
            self._block = self.block
            self._kernel = self._raw_kernel(_STREAM_SRC, "copy_kernel")
            self._grid = _stream_grid(self.n, self.block)

    def run(self) -> None:
        """One copy on the current stream."""
        if self.impl == "kernel":
            import numpy

            self._kernel((self._grid,), (self.block,), (self.x, self.y, numpy.int64(self.n)))
        else:
            self.y.data.copy_from_device_async(self.x.data, self.x.nbytes)

    def check(self) -> Optional[float]:
        """Copy once into a poisoned destination; relative error against the source."""
        import cupy

        self.y.fill(cupy.nan)
        self.run()
        return _rel_error(self.y, self.x)


class Saxpy(BuiltinWorkload):
    """``y = a*x + y`` over ``n`` floats: 3 × 4 B and 2 FLOP per element."""

    NAME = "saxpy"
    SUMMARY = "y = a*x + y, float4 RawKernel (memory bound)"
    PARAMS = (
        Param("n", "int", 2**26, "number of float32 elements"),
        Param("a", "float", 2.0, "the scalar a"),
        Param("block", "int", 256, "threads per block"),
    )

    def __init__(self, params: Optional[Dict[str, ParamValue]] = None) -> None:
        super().__init__(params)
        self.n = _p_int(self.params, "n")
        self.a = _p_float(self.params, "a")
        self.block = _p_int(self.params, "block")
        _positive("n", self.n)
        _check_block(self.block)
        self.bytes_moved = 3.0 * 4 * self.n  # read x, read y, write y
        self.flops = 2.0 * self.n
        self.flops_kind = "fp32"
        self.kernel_regex = "saxpy"

    def setup(self) -> None:
        """Random x and y; compile ``saxpy``; keep y's start for :meth:`check`."""
        self.x = _random((self.n,), _SEED)
        self.y = _random((self.n,), _SEED + 1)
        self._block = self.block
        self._kernel = self._raw_kernel(_STREAM_SRC, "saxpy")
        self._grid = _stream_grid(self.n, self.block)

    def run(self) -> None:
        """One ``y = a*x + y`` on the current stream."""
        import numpy

        self._kernel((self._grid,), (self.block,),
                     (self.x, self.y, numpy.float32(self.a), numpy.int64(self.n)))

    def check(self) -> Optional[float]:
        """Run once on a fresh y and compare with ``a*x + y`` computed in float64."""
        import cupy

        y0 = _random((self.n,), _SEED + 7)
        self.y[...] = y0
        self.run()
        ref = self.a * self.x.astype(cupy.float64) + y0.astype(cupy.float64)
        return _rel_error(self.y, ref)


class Reduce(BuiltinWorkload):
    """Sum of ``n`` floats in one pass (block trees, then the last block adds the partials)."""

    NAME = "reduce"
    SUMMARY = "sum of n floats, one-pass RawKernel (memory bound)"
    PARAMS = (
        Param("n", "int", 2**26, "number of float32 elements"),
        Param("block", "int", 256, "threads per block"),
    )

    def __init__(self, params: Optional[Dict[str, ParamValue]] = None) -> None:
        super().__init__(params)
        self.n = _p_int(self.params, "n")
        self.block = _p_int(self.params, "block")
        _positive("n", self.n)
        _check_block(self.block)
        self.bytes_moved = 4.0 * self.n
        self.flops = float(self.n)  # one add per element (the tail is negligible)
        self.flops_kind = "fp32"
        self.kernel_regex = "reduce_sum"

    def setup(self) -> None:
        """Random input, partials buffer, zeroed counter; compile ``reduce_sum``."""
        import cupy

        self.x = _random((self.n,))
        self._block = self.block
        self._kernel = self._raw_kernel(_REDUCE_SRC, "reduce_sum")
        self._grid = _stream_grid(self.n, self.block, one_wave=True)
        self.partials = cupy.empty(self._grid, dtype=cupy.float32)
        self.counter = cupy.zeros(1, dtype=cupy.uint32)
        self.out = cupy.empty(1, dtype=cupy.float32)

    def run(self) -> None:
        """One sum on the current stream; the result lands in ``self.out``."""
        import numpy

        self._kernel((self._grid,), (self.block,),
                     (self.x, numpy.int64(self.n), self.partials, self.counter, self.out))

    def check(self) -> Optional[float]:
        """Relative error of the sum against a float64 sum."""
        import cupy

        self.run()
        return _rel_error(self.out, cupy.sum(self.x, dtype=cupy.float64).reshape(1))


class _SquareMatmul(BuiltinWorkload):
    """Shared parts of the naive/tiled fp32 ``n × n`` matrix products."""

    KERNEL: ClassVar[str] = ""
    BLOCK: ClassVar[Tuple[int, int]] = (16, 16)
    PARAMS = (Param("n", "int", 4096, "matrix size (n × n × n product)"),)

    def __init__(self, params: Optional[Dict[str, ParamValue]] = None) -> None:
        super().__init__(params)
        self.n = _p_int(self.params, "n")
        _positive("n", self.n, 32768)
        self.bytes_moved = 3.0 * 4 * self.n * self.n  # A and B read once, C written once
        self.flops = 2.0 * self.n**3
        self.flops_kind = "fp32"
        self.kernel_regex = self.KERNEL

    def setup(self) -> None:
        """Random A and B, empty C; compile the kernel."""
        import cupy

        self.a = _random((self.n, self.n), _SEED)
        self.b = _random((self.n, self.n), _SEED + 1)
        self.c = cupy.empty_like(self.a)
        bx, by = self.BLOCK
        self._block = bx * by
        self._kernel = self._raw_kernel(_MATMUL_SRC, self.KERNEL)
        self._grid = (-(-self.n // bx), -(-self.n // by))

    def run(self) -> None:
        """One product on the current stream."""
        import numpy

        self._kernel(self._grid, self.BLOCK, (self.a, self.b, self.c, numpy.int32(self.n)))

    def check(self) -> Optional[float]:
        """Relative error against a float64 cuBLAS product."""
        import cupy

        self.c.fill(cupy.nan)  # poison: an unwritten element fails the check
        self.run()
        ref = cupy.matmul(self.a.astype(cupy.float64), self.b.astype(cupy.float64))
        return _rel_error(self.c, ref)


class NaiveMatmul(_SquareMatmul):
    """fp32 matrix product, one thread per output, every operand read from global memory."""

    NAME = "naive_matmul"
    SUMMARY = "fp32 n×n matmul, one thread per output (the 'before')"
    KERNEL = "naive_matmul"
    BLOCK = (16, 16)


class TiledMatmul(_SquareMatmul):
    """fp32 matrix product through 32×32 shared-memory tiles."""

    NAME = "tiled_matmul"
    SUMMARY = "fp32 n×n matmul, 32×32 shared-memory tiles (the 'after')"
    KERNEL = "tiled_matmul"
    BLOCK = (32, 32)


class Gemm(BuiltinWorkload):
    """Dense ``m×k @ k×n`` through cuBLAS (CuPy for fp32/fp16, torch for bf16)."""

    NAME = "gemm"
    SUMMARY = "cuBLAS matmul (cupy.matmul; torch for bf16)"
    PARAMS = (
        Param("m", "int", 4096, "rows of A and C"),
        Param("n", "int", 4096, "columns of B and C"),
        Param("k", "int", 4096, "columns of A, rows of B"),
        Param("dtype", "str", "fp16", "element type (fp32 runs on CUDA cores, not TF32)",
              ("fp32", "fp16", "bf16")),
    )

    def __init__(self, params: Optional[Dict[str, ParamValue]] = None) -> None:
        super().__init__(params)
        self.m = _p_int(self.params, "m")
        self.n = _p_int(self.params, "n")
        self.k = _p_int(self.params, "k")
        self.dtype = self._choice("dtype")
        for key in ("m", "n", "k"):
            _positive(key, _p_int(self.params, key))
        size = _DTYPE_BYTES[self.dtype]
        self.bytes_moved = float(size * (self.m * self.k + self.k * self.n + self.m * self.n))
        self.flops = 2.0 * self.m * self.n * self.k
        self.flops_kind = "fp32" if self.dtype == "fp32" else "tensor"
        self.kernel_regex = _CUBLAS_REGEX
        self._torch = self.dtype == "bf16"

    def setup(self) -> None:
        """Random operands in the chosen dtype (bf16 through torch: CuPy has no bf16)."""
        if self._torch:
            _require_torch("gemm dtype=bf16", "; CuPy has no bfloat16 dtype: use dtype=fp16 "
                           "or dtype=fp32, or install torch")
            import torch

            gen = torch.Generator(device="cuda").manual_seed(_SEED)
            self.a = torch.randn(self.m, self.k, device="cuda", generator=gen,
                                 dtype=torch.float32).to(torch.bfloat16)
            self.b = torch.randn(self.k, self.n, device="cuda", generator=gen,
                                 dtype=torch.float32).to(torch.bfloat16)
            self.c = torch.empty(self.m, self.n, device="cuda", dtype=torch.bfloat16)
            torch.cuda.synchronize()
            return
        import cupy

        dt = cupy.float32 if self.dtype == "fp32" else cupy.float16
        self.a = _random((self.m, self.k), _SEED).astype(dt)
        self.b = _random((self.k, self.n), _SEED + 1).astype(dt)
        self.c = cupy.empty((self.m, self.n), dtype=dt)

    def run(self) -> None:
        """One product into the preallocated C on the current stream."""
        if self._torch:
            import torch

            torch.matmul(self.a, self.b, out=self.c)
        else:
            import cupy

            cupy.matmul(self.a, self.b, out=self.c)

    def check(self) -> Optional[float]:
        """Relative error against a float64 product of the same (rounded) operands."""
        import cupy

        self.run()
        if self._torch:
            a, b, c = (cupy.asarray(t.float()) for t in (self.a, self.b, self.c))
        else:
            a, b, c = self.a, self.b, self.c
        ref = cupy.matmul(a.astype(cupy.float64), b.astype(cupy.float64))
        return _rel_error(c, ref)


class Sdpa(BuiltinWorkload):
    """``torch.nn.functional.scaled_dot_product_attention`` on ``B×H×S×D`` tensors."""

    NAME = "sdpa"
    SUMMARY = "torch scaled_dot_product_attention (flash / cuDNN)"
    PARAMS = (
        Param("B", "int", 32, "batch"),
        Param("H", "int", 8, "heads"),
        Param("S", "int", 512, "sequence length (queries and keys)"),
        Param("D", "int", 64, "head dimension"),
        Param("dtype", "str", "fp16", "element type", ("fp16", "bf16", "fp32")),
        Param("causal", "bool", False, "causal mask (halves the FLOPs)"),
    )

    def __init__(self, params: Optional[Dict[str, ParamValue]] = None) -> None:
        super().__init__(params)
        self.shape = tuple(_p_int(self.params, key) for key in ("B", "H", "S", "D"))
        for key in ("B", "H", "S", "D"):
            _positive(key, _p_int(self.params, key))
        self.dtype = self._choice("dtype")
        self.causal = _p_bool(self.params, "causal")
        b, h, s, d = self.shape
        # QK^T and PV are each 2·S·S·D per head; a causal mask skips half of both.
        self.flops = 4.0 * b * h * s * s * d / (2 if self.causal else 1)
        self.bytes_moved = 4.0 * b * h * s * d * _DTYPE_BYTES[self.dtype]  # q, k, v read; o written
        self.flops_kind = "fp32" if self.dtype == "fp32" else "tensor"
        self.kernel_regex = "sdpa|flash|fmha|attention"

    def setup(self) -> None:
        """Random q, k, v on the GPU through torch."""
        _require_torch("sdpa")
        import torch

        dt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[self.dtype]
        gen = torch.Generator(device="cuda").manual_seed(_SEED)
        self.q, self.k, self.v = (
            torch.randn(*self.shape, device="cuda", generator=gen, dtype=torch.float32).to(dt)
            for _ in range(3)
        )
        self.out: Any = None
        torch.cuda.synchronize()

    def run(self) -> None:
        """One attention forward on torch's current stream."""
        import torch.nn.functional as F

        self.out = F.scaled_dot_product_attention(self.q, self.k, self.v, is_causal=self.causal)

    def check(self) -> Optional[float]:
        """Relative error against attention computed in float32 from the same inputs."""
        import torch

        self.run()
        q, k, v = (t.float() for t in (self.q, self.k, self.v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.shape[3])
        if self.causal:
            s = self.shape[2]
            mask = torch.ones(s, s, device="cuda", dtype=torch.bool).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
        ref = torch.softmax(scores, dim=-1) @ v
        err = float(torch.linalg.vector_norm(self.out.float() - ref))
        return err / float(torch.linalg.vector_norm(ref))


#: Every bundled workload class, in the order the UI lists them.
WORKLOAD_CLASSES: Tuple[Type[BuiltinWorkload], ...] = (
    Copy, Saxpy, Reduce, NaiveMatmul, TiledMatmul, Gemm, Sdpa,
)
