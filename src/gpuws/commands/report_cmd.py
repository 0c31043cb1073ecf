"""``gpuws report FILE``: read a pulled .ncu-rep (or an ncu CSV) on the laptop."""

from __future__ import annotations

import argparse
import sys

from ..report import read_report, render_report, report_json_chunks
from ..report_child import Limits, output_mib_for
from .common import console


async def report(args: argparse.Namespace) -> int:
    kernels = read_report(args.file, Limits(memory_mib=args.max_memory, seconds=args.timeout,
                                            output_mib=output_mib_for(args.max_memory)))
    if args.json:
        # Bytes, so that the JSON is UTF-8 whatever the terminal's locale says.
        sys.stdout.flush()
        for chunk in report_json_chunks(kernels):
            sys.stdout.buffer.write(chunk.encode("utf-8"))
        sys.stdout.buffer.write(b"\n")
        sys.stdout.buffer.flush()
    else:
        render_report(kernels, console())
    return 0
