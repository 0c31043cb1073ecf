"""``gpuws report FILE``: read a pulled .ncu-rep (or an ncu CSV) on the laptop."""

from __future__ import annotations

import argparse
import sys

from ..report import read_report, render_report, report_json
from .common import console


async def report(args: argparse.Namespace) -> int:
    kernels = read_report(args.file)
    if args.json:
        sys.stdout.write(report_json(kernels) + "\n")
    else:
        render_report(kernels, console())
    return 0
