"""A small transformer forward: the ``cmd:`` workload of bench/answer.py (issue 13).

A few layers of ``nn.TransformerEncoder`` (fp16, inference) on random input, a few
iterations, synchronised at the end. Alone it takes a few seconds on an H200, most of
it Python, torch's import and CUDA's start; that is the point: Tier 2 and Tier 3 must
not multiply what a person already waits for. Run it as ``python3 transformer.py``.
"""

from __future__ import annotations

import argparse
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    import torch  # here, so --help and a syntax check need no torch

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(args.d_model, args.heads, 4 * args.d_model,
                                             batch_first=True)
    model = torch.nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)
    model = model.to("cuda", torch.float16).eval()
    x = torch.randn(args.batch, args.seq, args.d_model, device="cuda", dtype=torch.float16)
    with torch.inference_mode():
        model(x)  # warm-up: cuBLAS handles, kernel selection
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        for _ in range(args.iters):
            y = model(x)
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    print(f"transformer: {args.layers} layers, d_model {args.d_model}, {args.batch}x{args.seq} "
          f"tokens, {args.iters} forwards in {(t2 - t1) * 1e3:.1f} ms "
          f"({(t2 - t0):.2f} s with start-up); checksum {float(y.float().abs().mean()):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
