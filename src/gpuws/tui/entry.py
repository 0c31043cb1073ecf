"""``gpuws`` (Home), ``gpuws connect`` and ``gpuws replay``: the CLI's doors into the TUI.

Imported only by those commands, so the headless ones never load Textual.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import signal
import sys
from functools import partial
from pathlib import Path

from ..errors import UsageError
from ..live.link import Target
from ..live.replay import check_file, check_session, check_speed
from ..live.storeio import StoreHandle
from ..text.textsafe import visible
from .app import GpuwsApp, Start, StartConnect, StartHome, StartReplay


def make_app(start: Start, *, ssh_config: str | None = None) -> GpuwsApp:
    """The app for a start mode; a file replay gets a throwaway store."""
    store = None
    if isinstance(start, StartReplay) and Path(start.source).expanduser().exists():
        store = StoreHandle.throwaway()
    return GpuwsApp(start, store=store, ssh_config=ssh_config)


async def run_app(app: GpuwsApp) -> int:
    """Run until the person quits; the session is ended and the link closed either way.

    SIGTERM and SIGHUP (the terminal closed) end it like Ctrl+C (exit 130): the session is
    ended and a replay's throwaway store removed, where the default action left both.
    """
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, partial(app.exit, return_code=130))
    try:
        await app.run_async()
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        await app.shutdown()
    for hint in app.attach_hints():
        # The CLI's Ctrl+C says the same: leaving never stops a run, and here is the way back.
        sys.stderr.write(f"gpuws: a run goes on on the pod: {visible(hint, None)}\n")
    return app.return_code or 0


def need_terminal(what: str, remedy: str) -> None:
    """Refuse to open the TUI where nobody can see it or press a key.

    Without a terminal on both sides, Textual writes its escape codes into a pipe or a
    file and waits forever for keys (a ``scripts/run`` in CI, a non-tty ``ssh``).
    """
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError(f"{what} opens the workstation (the TUI), which needs a terminal",
                         remedy=remedy)


async def home(args: argparse.Namespace) -> int:
    """``gpuws`` with no command."""
    need_terminal("gpuws with no command",
                  "run it in a terminal; without one, `gpuws --help` lists the headless "
                  "commands (doctor, run, sessions, history, export)")
    return await run_app(make_app(StartHome(), ssh_config=getattr(args, "ssh_config", None)))


async def connect(args: argparse.Namespace) -> int:
    """``gpuws connect HOST``."""
    need_terminal(f"gpuws connect {args.host}",
                  f"run it in a terminal; without one, `gpuws doctor {shlex.quote(args.host)}` "
                  "probes the pod and `gpuws run` runs a workload headless")
    target = Target(args.host, ssh_config=args.ssh_config, port=args.port, user=args.user,
                    python=args.python, rate=args.rate, accept_new=args.accept_new,
                    pty=True if getattr(args, "pty", False) else None)
    return await run_app(make_app(StartConnect(target), ssh_config=args.ssh_config))


async def replay(args: argparse.Namespace) -> int:
    """``gpuws replay FILE|SESSION``: the file (or session) and the speed are checked before
    the TUI opens, so a mistake is one ``gpuws: …`` line and exit 2, never a blank TUI."""
    speed = None if args.instant else args.speed
    check_speed(speed)
    path = Path(args.source).expanduser()
    if path.exists():
        await asyncio.to_thread(check_file, path, args.run)
    else:
        await asyncio.to_thread(_check_stored, args.source, args.run)
    need_terminal("gpuws replay", "run it in a terminal; `gpuws history` and `gpuws export "
                                  "SESSION` read stored runs without one")
    return await run_app(make_app(StartReplay(args.source, speed=speed, run=args.run)))


def _check_stored(session: str, run: str | None) -> None:
    from ..sessions.store import Store

    with Store() as store:
        check_session(store, session, run)
