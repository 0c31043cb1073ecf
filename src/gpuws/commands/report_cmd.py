"""``gpuws report FILE``: read a pulled .ncu-rep (or an ncu CSV) on the laptop."""

from __future__ import annotations

import argparse
import sys

from ..report import read_report, render_report, report_json
from ..report_child import Limits
from .common import console


async def report(args: argparse.Namespace) -> int:
    kernels = read_report(args.file, Limits(memory_mib=args.max_memory, seconds=args.timeout))
    if args.json:
        # Bytes, so that the JSON is UTF-8 whatever the terminal's locale says.
        sys.stdout.flush()
        sys.stdout.buffer.write((report_json(kernels) + "\n").encode("utf-8"))
        sys.stdout.buffer.flush()
    else:
        render_report(kernels, console())
    return 0
