"""``gpuws start HOST`` and ``gpuws stop HOST``: the provider's own tool, run on the laptop.

The work is ``live/uptime/power.py``'s, shared with the TUI; here the countdown goes to
stderr, the actions to the store, and ``run``/``watch`` get :func:`connect_starting`.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import socket
import sys

from ..config import host_config, is_local, load_config
from ..errors import AuthError, ConfigError, ConnectError, GpuwsError, HostKeyError, UsageError
from ..live.engine import Engine
from ..live.link import Target
from ..live.uptime import observed, power
from ..live.uptime.lease import is_this_machine
from ..sessions.store import Store
from ..text.textsafe import visible
from ..transport.sshconfig import resolve
from .common import connect, target_of


async def start(args: argparse.Namespace) -> int:
    """Run the host's ``start``, then wait for SSH to answer (bounded by ``--wait``)."""
    argv = _argv(args.host, "start")
    await _learn_from_silence(args)
    async with power.recorded(save, args.host, "start"):
        refused = await power.start(target_of(args), argv, wait_s=args.wait,
                                    timeout_s=args.timeout, on_wait=_countdown(args.host))
    _say(f"{args.host} answers" + (f", and refuses this laptop: {refused.one_line()}"
                                   if refused else ""))
    return 0


async def stop(args: argparse.Namespace) -> int:
    """Run the host's ``stop``, then check it stops answering (bounded by ``--wait``)."""
    argv = await _stop_argv(args)
    async with power.recorded(save, args.host, "stop"):
        await _release_lease(args)
        await power.stop(target_of(args), argv, wait_s=args.wait, timeout_s=args.timeout,
                         on_wait=_countdown(args.host))
    _say(f"{args.host} no longer answers")
    return 0


async def save(host: str, action: str, started: float, ended: float, ok: bool,
               detail: str) -> None:
    """:data:`power.Save` for the headless faces: the store, opened for the one row."""
    with Store() as store:
        store.add_host_action(host, action, started, ended, ok=ok, detail=detail)


async def _learn_from_silence(args: argparse.Namespace) -> None:
    """Before starting a host whose lease was armed when gpuws last saw it: a host that
    does not answer after the lease's deadline was stopped by it (recorded, said). One
    SSH try, and only then."""
    with Store() as store:
        armed = store.pod_lease(args.host) is not None
    if not armed or await power.answers(target_of(args)):
        return
    with Store() as store:
        said = observed.host_silent(store, args.host)
    if said is not None:
        _say(f"gpuws: {said}")


def _countdown(host: str) -> power.OnWait:
    def on_wait(what: str, left: float) -> None:
        _say(f"waiting for {host} {what}: {power.clock(left)} left")
    return on_wait


async def _release_lease(args: argparse.Namespace) -> None:
    """Release the pod's lease first, where the pod answers: stopped by the laptop, it
    must not be stopped again (or at all, if the stop command turns out to do nothing)
    by a lease still armed. A pod that does not answer has no lease to release."""
    if not await power.answers(target_of(args)):
        return
    try:
        client = await asyncio.wait_for(connect(args), 60)
    except (TimeoutError, GpuwsError):
        return
    try:
        await client.lease(release=True)
        with Store() as store:
            store.clear_pod_lease(args.host)
        _say(f"{args.host}: its lease released")
    except GpuwsError as exc:
        _say(f"{args.host}: its lease could not be released ({exc.one_line()})")
    finally:
        await client.close()


async def _stop_argv(args: argparse.Namespace) -> list[str]:
    """The host's ``stop``. One inherited from ``[defaults]`` never runs on this machine
    (issue 31: a ``shutdown -h now`` meant for pods would power off the laptop): only the
    host's own table names a stop for it. Whether the host is this machine is asked only
    when the stop would come from ``[defaults]``: by its name (``local``, a loopback
    address), else by its probe's machine id where it answers."""
    cfg = load_config()
    if host_config(cfg, args.host, this_machine=True).stop or not cfg.defaults.stop:
        return _argv(args.host, "stop")  # its own table's (or none: _argv says so)
    if await _this_machine(args):
        raise ConfigError(
            f"{args.host} is this machine: the `stop` in [defaults] is for pods and never "
            "runs on it",
            remedy=f"to stop this machine with gpuws all the same, give it its own "
                   f"stop = [\"...\"] under [hosts.{args.host}]")
    return _argv(args.host, "stop")


async def _this_machine(args: argparse.Namespace) -> bool:
    """Whether the host is the laptop: ``local``, a loopback address, or (where it answers
    SSH) an agent whose probe carries this machine's id. A host that does not answer, or
    whose agent cannot start, is taken to be a pod (the stop is what stops its bill)."""
    if is_local(args.host) or _loopback(args):
        return True
    if not await power.answers(target_of(args)):
        return False
    try:
        client = await asyncio.wait_for(connect(args), 60)
    except (TimeoutError, GpuwsError):
        return False
    try:
        return is_this_machine(await client.probe())
    except GpuwsError:
        return False
    finally:
        await client.close()


def _loopback(args: argparse.Namespace) -> bool:
    """Whether the host's SSH destination (as ``ssh -G`` resolves it) is a loopback
    address or this machine's own name."""
    target = target_of(args)
    try:
        host = resolve(target.host, target.ssh_config, port=target.port,
                       user=target.user).hostname
    except GpuwsError:
        return False
    if host in ("localhost", socket.gethostname()):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _say(line: str) -> None:
    """One line on stderr, through the terminal-safe filter: these lines quote the pod
    (its agent's refusal, an SSH server's words) and the provider's tool, and no escape
    sequence from either may reach the terminal (issue 31)."""
    print(visible(line, None), file=sys.stderr)


def _argv(host: str, which: str) -> list[str]:
    cfg = host_config(load_config(), host)
    argv = cfg.start if which == "start" else cfg.stop
    if not argv:
        raise UsageError(f"no `{which}` command for {host} in the config",
                         remedy=f"add {which} = [\"...\"] under [hosts.{host}] (the README "
                                "has presets for RunPod, GCP, AWS, SkyPilot)")
    return argv


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
            _say(f"gpuws: {exc.message}")
            answer = await asyncio.to_thread(
                input, f"start {args.host} with its `start` command "
                       f"({visible(power.shown(argv), 200)})? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                raise
    # (run's own --timeout is the workload's: the start command gets gpuws start's default)
    async with power.recorded(save, args.host, "start"):
        await power.start(target, argv, on_wait=_countdown(args.host))
    _say(f"{args.host} answers")
    await engine.connect(target)
