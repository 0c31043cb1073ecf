"""``gpuws`` (Home), ``gpuws connect`` and ``gpuws replay``: the CLI's doors into the TUI.

Imported only by those commands, so the headless ones never load Textual.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from functools import partial
from pathlib import Path

from ..errors import UsageError
from ..live.link import Target
from ..live.replay import check_file, check_session, check_speed
from ..live.storeio import StoreHandle
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
    return app.return_code or 0


async def home(args: argparse.Namespace) -> int:
    """``gpuws`` with no command."""
    return await run_app(make_app(StartHome(), ssh_config=getattr(args, "ssh_config", None)))


async def connect(args: argparse.Namespace) -> int:
    """``gpuws connect HOST``."""
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
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        # Without one the TUI would wait forever for keys nobody can press.
        raise UsageError("replay shows the run in the TUI, which needs a terminal",
                         remedy="run it in a terminal; `gpuws history` and `gpuws export "
                                "SESSION` read stored runs without one")
    return await run_app(make_app(StartReplay(args.source, speed=speed, run=args.run)))


def _check_stored(session: str, run: str | None) -> None:
    from ..sessions.store import Store

    with Store() as store:
        check_session(store, session, run)
