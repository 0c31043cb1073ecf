"""The ``gpuws`` command line. Thin: parses arguments and hands off to a command.

Heavy imports (textual, asyncssh) happen inside the subcommands that need them, so
``gpuws sessions`` or ``gpuws report`` start fast and never load the TUI.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from . import __version__
from .errors import GpuwsError

Command = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


def make_parser() -> argparse.ArgumentParser:
    from .commands.common import add_connection_args

    parser = argparse.ArgumentParser(
        prog="gpuws", description="A terminal profiling workstation for rented GPU pods.")
    parser.add_argument("--version", action="version", version=f"gpuws {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("doctor", help="deploy the agent and show what the pod has")
    add_connection_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_lazy("doctor", "doctor"))
    return parser


def _lazy(module: str, name: str) -> Command:
    async def run(args: argparse.Namespace) -> int:
        import importlib

        mod = importlib.import_module(f"gpuws.commands.{module}")
        fn: Command = getattr(mod, name)
        return await fn(args)
    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return asyncio.run(args.func(args))
    except GpuwsError as exc:
        sys.stderr.write(f"gpuws: {exc.one_line()}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("gpuws: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
