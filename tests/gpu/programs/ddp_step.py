"""A two-rank data-parallel step of the kind `torchrun` starts: a bf16 GEMM then an
all-reduce of its result, 40 steps after the communicator's set-up.

Usage: torchrun --nproc-per-node 2 ddp_step.py [--steps 40]
NCCL where every rank has a GPU of its own; on a machine with fewer GPUs than ranks
(NCCL refuses two ranks on one GPU) gloo, which all-reduces through the host, and says so.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--n", type=int, default=4096)
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    gpus = torch.cuda.device_count()
    backend = "nccl" if gpus >= world else "gloo"
    torch.cuda.set_device(local % gpus)
    dist.init_process_group(backend)
    if rank == 0:
        print(f"backend {backend}: {world} ranks on {gpus} GPU(s)", flush=True)
    a = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16)
    for _ in range(args.steps):
        c = a @ b
        dist.all_reduce(c)
        a = c * (1.0 / (args.n * world))
    torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        print("done", float(a.float().abs().mean()), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
