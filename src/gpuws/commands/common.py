"""What every pod-facing command shares: connecting, and printing errors the same way."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from ..client import AgentClient
from ..transport import make_transport


def add_connection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("host", help="ssh alias, user@host[:port], or 'local' for this machine")
    p.add_argument("-F", dest="ssh_config", metavar="FILE",
                   help="ssh config file (default ~/.ssh/config)")
    p.add_argument("-p", dest="port", type=int, help="port (overrides the config)")
    p.add_argument("-l", dest="user", help="remote user (overrides the config)")
    p.add_argument("--accept-new", action="store_true",
                   help="record an unknown host key (like StrictHostKeyChecking=accept-new); "
                        "a changed key is still refused")
    p.add_argument("--python", default="python3", help="the pod's python (default python3)")
    p.add_argument("--pty", action="store_true",
                   help="reach the pod through an interactive terminal only (a proxy that "
                        "refuses exec and SFTP, like RunPod's basic SSH); detected by itself "
                        "when the server refuses exec")


async def connect(args: argparse.Namespace) -> AgentClient:
    transport = make_transport(args.host, config_file=args.ssh_config, port=args.port,
                               user=args.user, accept_new=args.accept_new,
                               pty=True if getattr(args, "pty", False) else None)
    return await AgentClient.connect(transport, python=args.python)


def console(stderr: bool = False, markup: bool = True) -> Console:
    """A console for people. ``markup=False`` for anything that prints pod text: no
    ``[...]`` is parsed then, so only :class:`rich.text.Text` styles show."""
    return Console(stderr=stderr, highlight=False, soft_wrap=False, markup=markup,
                   emoji=markup)


def print_json(data: Any) -> None:
    import json

    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def write_report(text: str, output: str | None) -> None:
    """A markdown report to ``output`` (``-`` or None: stdout), written whole or not at all."""
    if output and output != "-":
        path = Path(output)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)  # never leave a half-written report behind
        console(stderr=True).print(f"wrote {path} ({len(text)} bytes)")
    else:
        sys.stdout.write(text)
