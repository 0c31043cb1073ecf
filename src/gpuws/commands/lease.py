"""``gpuws start HOST`` and ``gpuws stop HOST``: the provider's own tool, run on the laptop.

The argvs come from the host's ``start`` and ``stop`` in the config (no shell). ``start``
then waits, with a bound and a countdown on stderr, for the host to answer SSH; ``stop``
waits for it to stop answering, and says so when it still answers: a stop that did not
stop still bills.

"Answers" means an SSH connection through the same transport every other command uses
(OpenSSH's rules for the host's config); a refused host key or login also answers: the
pod is up, and that error is the one the person must see.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from ..config import host_config, load_config
from ..errors import AuthError, ConnectError, GpuwsError, HostKeyError, UsageError
from ..live.engine import Engine
from ..live.link import Target
from ..sessions.store import Store
from ..transport import make_transport

# One try at SSH may take this long before it counts as "not answering".
TRY_S = 5.0
# Between tries: a pod that is booting is not helped by a tighter loop.
PAUSE_S = 1.0


class LeaseError(GpuwsError):
    """A start or stop command that failed, timed out, or did not have its effect."""

    title = "gpuws lease"


async def start(args: argparse.Namespace) -> int:
    """Run the host's ``start``, then wait for SSH to answer (bounded by ``--wait``)."""
    argv = _argv(args.host, "start")
    with _recorded(args.host, "start"):
        await _start(args, argv)
    print(f"{args.host} answers", file=sys.stderr)
    return 0


async def _start(args: argparse.Namespace, argv: list[str]) -> None:
    await run_command(argv, "start", args.host, timeout_s=args.timeout)
    if not await wait_for(args, answering=True):
        raise LeaseError(f"{args.host} did not answer SSH within {args.wait:g} s of "
                         f"`{argv[0]}` starting it",
                         remedy=f"check the pod in the provider's console, or wait longer "
                                f"with `gpuws start {args.host} --wait SECONDS`")


async def stop(args: argparse.Namespace) -> int:
    """Run the host's ``stop``, then check it stops answering (bounded by ``--wait``)."""
    argv = _argv(args.host, "stop")
    with _recorded(args.host, "stop"):
        await _stop(args, argv)
    print(f"{args.host} no longer answers", file=sys.stderr)
    return 0


async def _stop(args: argparse.Namespace, argv: list[str]) -> None:
    await _release_lease(args)
    await run_command(argv, "stop", args.host, timeout_s=args.timeout)
    if not await wait_for(args, answering=False):
        raise LeaseError(f"the stop did not stop: {args.host} still answers SSH "
                         f"{args.wait:g} s after `{argv[0]}`",
                         remedy="it may still bill: stop it in the provider's console, "
                                "and check the host's `stop` in the config")


async def _release_lease(args: argparse.Namespace) -> None:
    """Release the pod's lease first, where the pod answers: stopped by the laptop, it
    must not be stopped again (or at all, if the stop command turns out to do nothing)
    by a lease still armed. A pod that does not answer has no lease to release."""
    if not await answers(args):
        return
    from .common import connect

    try:
        client = await asyncio.wait_for(connect(args), 60)
    except (TimeoutError, GpuwsError):
        return
    try:
        await client.lease(release=True)
        print(f"{args.host}: its lease released", file=sys.stderr)
    except GpuwsError as exc:
        print(f"{args.host}: its lease could not be released ({exc.one_line()})",
              file=sys.stderr)
    finally:
        await client.close()


@contextmanager
def _recorded(host: str, action: str) -> Iterator[None]:
    """Record the action in the store, whether it had its effect or not: a start that
    failed half-way may still bill, and the export must not pretend otherwise."""
    started = time.time()
    try:
        yield
    except GpuwsError as exc:
        with Store() as store:
            store.add_host_action(host, action, started, time.time(), ok=False,
                                  detail=exc.one_line())
        raise
    with Store() as store:
        store.add_host_action(host, action, started, time.time(), ok=True)


def _argv(host: str, which: str) -> list[str]:
    cfg = host_config(load_config(), host)
    argv = cfg.start if which == "start" else cfg.stop
    if not argv:
        raise UsageError(f"no `{which}` command for {host} in the config",
                         remedy=f"add {which} = [\"...\"] under [hosts.{host}] (the README "
                                "has presets for RunPod, GCP, AWS, SkyPilot)")
    return argv


async def run_command(argv: Sequence[str], which: str, host: str, *,
                      timeout_s: float) -> None:
    """Run ``argv`` on the laptop; a failure is one :class:`LeaseError` with its stderr."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE)
    except OSError as exc:
        raise LeaseError(f"{which} command for {host} could not run: {argv[0]}: "
                         f"{exc.strerror or exc}",
                         remedy=f"install it, or fix `{which}` under [hosts.{host}]") from exc
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise LeaseError(f"{which} command for {host} ran past {timeout_s:g} s: {argv[0]}",
                         remedy="check the provider's tool by hand, or raise --timeout"
                         ) from None
    if proc.returncode != 0:
        lines = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
        last = lines[-1].strip() if lines else "(no stderr)"
        raise LeaseError(f"{which} command for {host} failed (exit {proc.returncode}): "
                         f"{last[:300]}",
                         remedy=f"fix the cause it names, or `{which}` under "
                                f"[hosts.{host}]")


async def answers(args: argparse.Namespace) -> bool:
    """Whether the host answers SSH now (one try, at most :data:`TRY_S`)."""
    transport = make_transport(args.host, config_file=args.ssh_config, port=args.port,
                               user=args.user, accept_new=args.accept_new)
    try:
        await asyncio.wait_for(transport.connect(), TRY_S)
    except (HostKeyError, AuthError):
        raise  # it answers, and refuses: the person must see why
    except (TimeoutError, ConnectError, OSError):
        return False
    try:
        await transport.close()
    except (ConnectError, OSError):
        pass  # it answered; how the close went does not change that
    return True


async def wait_for(args: argparse.Namespace, *, answering: bool) -> bool:
    """Try SSH until it answers (or stops answering), with a countdown on stderr."""
    deadline = time.monotonic() + args.wait
    what = "to answer" if answering else "to stop answering"
    while True:
        if await answers(args) == answering:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        print(f"waiting for {args.host} {what}: {int(left) // 60}:{int(left) % 60:02d} left",
              file=sys.stderr)
        await asyncio.sleep(min(PAUSE_S, left))


async def connect_starting(engine: Engine, target: Target, args: argparse.Namespace) -> None:
    """``engine.connect``, and where the host does not answer and has a ``start`` command,
    start it first (issue 22): with ``--start``, or when the person says yes on a terminal;
    otherwise the one line says how. A refused key or login is never a reason to start."""
    try:
        await engine.connect(target)
        return
    except (HostKeyError, AuthError):
        raise
    except ConnectError as exc:
        argv = host_config(load_config(), args.host).start
        if not argv:
            raise
        if not getattr(args, "start", False):
            if not (sys.stdin.isatty() and sys.stderr.isatty()):
                raise ConnectError(exc.message, title=exc.title,
                                   remedy=f"start it with `gpuws start {args.host}`, or add "
                                          "--start to this command") from exc
            print(f"gpuws: {exc.message}", file=sys.stderr)
            answer = await asyncio.to_thread(
                input, f"start {args.host} with its `start` command ({argv[0]} …)? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                raise
    waiting = argparse.Namespace(**vars(args))
    # (run's own --timeout is the workload's: the start command gets gpuws start's default)
    waiting.wait, waiting.timeout = 300.0, 300.0
    with _recorded(args.host, "start"):
        await _start(waiting, argv)
    print(f"{args.host} answers", file=sys.stderr)
    await engine.connect(target)
