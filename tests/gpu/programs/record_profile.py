"""Run a Python program under torch.profiler with host activity and Python stacks (what
Tier 2's evidence for host time and for the code behind each kernel needs), and write,
per process, the Chrome trace and the key_averages table into $REC_DIR.

Usage: python3 record_profile.py PROGRAM.py [ARGS...]   (also under torchrun)
"""

from __future__ import annotations

import os
import runpy
import sys

import torch
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    out = os.environ.get("REC_DIR", ".")
    tag = os.environ.get("REC_TAG", "prog")
    rank = os.environ.get("RANK", "0")
    program = sys.argv[1]
    sys.argv = sys.argv[1:]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 with_stack=True, record_shapes=False) as prof:
        runpy.run_path(program, run_name="__main__")
        torch.cuda.synchronize()
    base = os.path.join(out, f"{tag}-rank{rank}")
    prof.export_chrome_trace(base + ".trace.json")
    with open(base + ".keyavg.txt", "w") as f:
        f.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=-1,
                                          max_name_column_width=4096))
    with open(base + ".stacks.txt", "w") as f:
        f.write(prof.key_averages(group_by_stack_n=5).table(
            sort_by="self_cpu_time_total", row_limit=60, max_name_column_width=300))


if __name__ == "__main__":
    main()
