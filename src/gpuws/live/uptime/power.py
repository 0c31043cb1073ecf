"""Starting and stopping a host with the provider's own tool (issue 22, point 1).

The argvs are the host's ``start`` and ``stop`` from the config, run on the laptop with no
shell. A start then waits, with a bound and a countdown (``on_wait``), for the host to
answer SSH; a stop waits for it to stop answering: a stop that did not stop still bills.
"Answers" means an SSH connection through the same transport every other face uses
(OpenSSH's rules for the host's config); a refused host key or login also answers: the pod
is up, and that error is the one the person must see.

Every face shares this: ``gpuws start/stop``, ``run``/``watch`` with ``--start``, the TUI's
connect screen, and the engine's budget stop. Each action is recorded (:func:`recorded`)
whether it had its effect or not, for the export's billed time.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager

from ...errors import AuthError, ConnectError, GpuwsError, HostKeyError
from ...transport import make_transport
from ..link import Target

#: One try at SSH may take this long before it counts as "not answering".
TRY_S = 5.0
#: Between tries: a pod that is booting is not helped by a tighter loop.
PAUSE_S = 1.0
#: The bounds ``run --start`` and the TUI use (``gpuws start`` takes them as options).
START_TIMEOUT_S = 300.0
WAIT_S = 300.0

#: ``on_wait(what, seconds_left)``: the countdown, once per try ("to answer").
OnWait = Callable[[str, float], None]
#: ``save(host, action, started, ended, ok, detail)``: where an action is recorded.
Save = Callable[[str, str, float, float, bool, str], Awaitable[None]]


class PowerError(GpuwsError):
    """A start or stop command that failed, timed out, or did not have its effect."""

    # Not "gpuws lease": the line is already printed behind "gpuws: ".
    title = "Lease"


def shown(argv: Sequence[str]) -> str:
    """The whole command as a shell would take it (``sh -c 'runpodctl start …'``), not
    its argv[0] alone (``sh`` says nothing of which pod); cut to stay one line."""
    text = shlex.join(argv)
    return text if len(text) <= 200 else text[:199] + "…"


@asynccontextmanager
async def recorded(save: Save, host: str, action: str) -> AsyncIterator[None]:
    """Record the action whether it had its effect or not: a start that failed half-way
    may still bill, and the export must not pretend otherwise."""
    started = time.time()
    try:
        yield
    except GpuwsError as exc:
        await save(host, action, started, time.time(), False, exc.one_line())
        raise
    except asyncio.CancelledError:
        # Stopped by the person (Ctrl+C, the TUI's Back): the tool was killed, but what it
        # had begun may bill; recorded as not done, then the cancellation goes on.
        await asyncio.shield(save(host, action, started, time.time(), False,
                                  f"{action} cancelled before it finished"))
        raise
    await save(host, action, started, time.time(), True, "")


#: How much of a tool's stderr is kept for its error message (the end: the provider's
#: tools put the cause last, after progress noise); the rest is read and dropped, so a
#: tool that floods (4.33 GB once, from a CLI stuck retrying) costs no memory.
TAIL_BYTES = 64 * 1024
#: After the tool exits, how long its last words may take to arrive. A child it left
#: behind may hold stderr open for ever: the tool is judged by its own exit status, and
#: the pipe is then closed on the child (it is not ours to kill: a daemon the person
#: wanted would have left the group with setsid anyway).
DRAIN_S = 1.0
#: Between SIGTERM to the tool's process group and SIGKILL to what is left of it.
TERM_GRACE_S = 3.0


class _Tool(asyncio.SubprocessProtocol):
    """The provider's tool as seen from the event loop: stderr's last :data:`TAIL_BYTES`,
    and its exit (known when the process ends, not when its pipes close)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.tail = bytearray()
        self.exited: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.tail += data
        if len(self.tail) > TAIL_BYTES:
            del self.tail[:-TAIL_BYTES]

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def run_command(argv: Sequence[str], which: str, host: str, *,
                      timeout_s: float) -> None:
    """Run ``argv`` on the laptop; a failure is one :class:`PowerError` with its stderr's
    last line (the provider's tools put the cause there, after progress noise).

    The tool runs in a process group of its own: the timeout (and a cancellation) ends the
    whole group, SIGTERM then SIGKILL, so nothing it started goes on billing unseen. Its
    stderr is read as it comes and only the tail kept (:data:`TAIL_BYTES`).
    """
    loop = asyncio.get_running_loop()
    try:
        transport, tool = await loop.subprocess_exec(
            lambda: _Tool(loop), *argv, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)
    except OSError as exc:
        raise PowerError(f"{which} command for {host} could not run: {argv[0]}: "
                         f"{exc.strerror or exc}",
                         remedy=f"install it, or fix `{which}` under [hosts.{host}]") from exc
    try:
        try:
            await asyncio.wait_for(asyncio.shield(tool.exited), timeout_s)
        except asyncio.CancelledError:
            # The person gave up (the TUI's Back): the provider's tool must not go on alone.
            await asyncio.shield(_end_group(transport, tool))
            raise
        except TimeoutError:
            await asyncio.shield(_end_group(transport, tool))
            raise PowerError(f"{which} command for {host} ran past {timeout_s:g} s: "
                             f"{shown(argv)}",
                             remedy="check the provider's tool by hand, or raise --timeout"
                             ) from None
        try:  # its last words, unless a child it left holds the pipe
            await asyncio.wait_for(asyncio.shield(tool.closed), DRAIN_S)
        except TimeoutError:
            pass
        code = transport.get_returncode()
    finally:
        transport.close()
    if code != 0:
        lines = [ln for ln in bytes(tool.tail).decode("utf-8", "replace").splitlines()
                 if ln.strip()]
        last = lines[-1].strip() if lines else "(no stderr)"
        raise PowerError(f"{which} command for {host} failed (exit {code}): "
                         f"{last[:300]}",
                         remedy=f"fix the cause it names, or `{which}` under [hosts.{host}]")


async def _end_group(transport: asyncio.SubprocessTransport, tool: _Tool) -> None:
    """SIGTERM the tool's process group, give it :data:`TERM_GRACE_S` to go, then SIGKILL
    whatever of the group is left (the tool itself, or children that ignore SIGTERM)."""
    pgid = transport.get_pid()  # start_new_session: the group's id is the tool's pid
    _signal_group(pgid, signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.shield(tool.exited), TERM_GRACE_S)
    except TimeoutError:
        pass
    _signal_group(pgid, signal.SIGKILL)
    try:  # (a tool run under sudo may not be ours to kill: bounded, then left)
        await asyncio.wait_for(asyncio.shield(tool.exited), TERM_GRACE_S)
    except TimeoutError:
        pass


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already


async def answers(target: Target) -> bool:
    """Whether the host answers SSH now (one try, at most :data:`TRY_S`)."""
    transport = make_transport(target.host, config_file=target.ssh_config, port=target.port,
                               user=target.user, accept_new=target.accept_new)
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


async def wait_for(target: Target, *, answering: bool, wait_s: float,
                   on_wait: OnWait) -> bool:
    """Try SSH until it answers (or stops answering), ``on_wait`` told before each pause."""
    deadline = time.monotonic() + wait_s
    what = "to answer" if answering else "to stop answering"
    while True:
        if await answers(target) == answering:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        on_wait(what, left)
        await asyncio.sleep(min(PAUSE_S, left))


async def start(target: Target, argv: Sequence[str], *, wait_s: float = WAIT_S,
                timeout_s: float = START_TIMEOUT_S, on_wait: OnWait) -> ConnectError | None:
    """Run the host's ``start``, then wait for SSH to answer, at most ``wait_s``.

    Returns: None, or the refusal of a host that answered and refused this laptop (an
    unknown key, a login): the start worked, and the connection after it says why.
    """
    await run_command(argv, "start", target.host, timeout_s=timeout_s)
    try:
        answered = await wait_for(target, answering=True, wait_s=wait_s, on_wait=on_wait)
    except (HostKeyError, AuthError) as exc:
        return exc
    if not answered:
        raise PowerError(f"{target.host} did not answer SSH within {wait_s:g} s of "
                         f"`{shown(argv)}` starting it",
                         remedy=f"check the pod in the provider's console, or wait longer "
                                f"with `gpuws start {target.host} --wait SECONDS`")
    return None


async def stop(target: Target, argv: Sequence[str], *, wait_s: float = WAIT_S,
               timeout_s: float = START_TIMEOUT_S, on_wait: OnWait) -> None:
    """Run the host's ``stop``, then check it stops answering, at most ``wait_s``."""
    await run_command(argv, "stop", target.host, timeout_s=timeout_s)
    if not await wait_for(target, answering=False, wait_s=wait_s, on_wait=on_wait):
        raise PowerError(f"the stop did not stop: {target.host} still answers SSH "
                         f"{wait_s:g} s after `{shown(argv)}`",
                         remedy="it may still bill: stop it in the provider's console, "
                                "and check the host's `stop` in the config")


def clock(seconds: float) -> str:
    """``m:ss`` (or ``h:mm:ss``), the countdown's and the lease's format."""
    s = max(0, int(seconds))
    if s >= 3600:
        return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{s // 60}:{s % 60:02d}"
