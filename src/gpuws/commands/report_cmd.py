"""``gpuws report FILE``: read a pulled .ncu-rep (or an ncu CSV) on the laptop.

The file is parsed in a child process with memory, CPU, time and size limits
(:func:`gpuws.report.read_report`); only its checked answer is rendered here.
"""

from __future__ import annotations

import argparse
import sys

from ..report import read_report, render_report, report_json
from .common import console


async def report(args: argparse.Namespace) -> int:
    kernels = read_report(args.file, max_memory_mib=args.max_memory, timeout_s=args.timeout)
    if args.json:
        # As bytes: valid UTF-8 whatever the locale says stdout's encoding is.
        sys.stdout.flush()
        sys.stdout.buffer.write((report_json(kernels) + "\n").encode("utf-8"))
        sys.stdout.buffer.flush()
    else:
        render_report(kernels, console())
    return 0
