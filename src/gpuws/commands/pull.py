"""``gpuws pull``: a run's artifacts home, as fast as ``scp`` brings them.

On a pod with an SFTP subsystem the files are read by the pod's sftp-server and the agent
is never started (its start was a seventh of a 256 MiB pull on loopback); without SFTP
the agent is deployed as for any command and streams each file with its ``cat``. Either
way the pull is :func:`gpuws.sessions.artifacts.pull_run`: confined, bounded, hashed as
the bytes arrive, resumed from a ``.part``, verified against the pod's sha256.
"""

from __future__ import annotations

import argparse
import asyncio

import msgspec

from ..client import AgentClient
from ..config import load_config
from ..deploy import start_agent
from ..errors import GpuwsError, TransferError
from ..sessions.artifacts import PullSource, SftpSource, destination, local_problem, pull_run
from ..sessions.store import ArtifactRow, Store
from ..text.textsafe import visible
from ..transport import make_transport
from .common import console, print_json
from .history import find_run


async def open_source(args: argparse.Namespace) -> SftpSource | AgentClient:
    """Connect to the pod for a pull: SFTP alone where the server has it, else the agent.

    Raises:
        GpuwsError: the connection or the agent's start failed (nothing is left open).
    """
    from ..transport.persist import idle_for

    transport = make_transport(args.host, config_file=args.ssh_config, port=args.port,
                               user=args.user, accept_new=args.accept_new,
                               pty=True if getattr(args, "pty", False) else None,
                               persist_s=idle_for(args.host,
                                                  enabled=getattr(args, "persist", True)))
    await transport.connect()
    try:
        await transport.settled()  # whether the server has SFTP is known after this
        if transport.info.sftp:
            return SftpSource(transport)
        proc, result, rest = await start_agent(transport, python=args.python)
    except BaseException:
        await transport.close()
        raise
    return AgentClient(transport, proc, result, rest, args.python)


def all_home(session_id: str, rows: list[ArtifactRow]) -> bool:
    """Whether every artifact is home and true (present, its size, its sha256: the files
    are read). Blocking: call it in a thread."""
    for row in rows:
        if row.status != "pulled":
            return False
        try:
            path = destination(session_id, row.run_id, row.name)
        except (TransferError, OSError):
            return False  # the pull says why, as it would have
        if local_problem(path, row.size, row.sha256) is not None:
            return False
    return True


async def pull(args: argparse.Namespace) -> int:
    with Store() as store:
        run = find_run(store, args.run_id)
        rows = store.artifacts(run.run_id)
        if not rows:
            raise GpuwsError(f"run {run.run_id} announced no artifacts", title="Nothing to pull")
        if await asyncio.to_thread(all_home, run.session_id, rows):
            # Said, and the pod left alone: it may be stopped, and every byte is here
            # already (issue 34, finding 26).
            return _show(args, rows, f"all {len(rows)} artifact(s) of run {run.run_id} are "
                                     "already home (size and sha256 checked): nothing to "
                                     "pull")
        source = await open_source(args)
        link: PullSource = source
        try:
            results = await pull_run(link, store, run.session_id, run.run_id,
                                     limits=load_config().pull)
        finally:
            await source.close()
        rows = store.artifacts(run.run_id)
    return _show(args, rows, *(
        f"pulled {r.name} → {r.local_path}"
        + (f" (resumed at {r.resumed_from} B)" if r.resumed_from else "") for r in results))


def _show(args: argparse.Namespace, rows: list[ArtifactRow], *said: str) -> int:
    """What was done, then each artifact's state (or the rows as JSON)."""
    if args.json:
        print_json(msgspec.to_builtins(rows))
        return 0
    out = console(markup=False)  # names come from the pod: never parsed as markup
    for line in said:
        out.print(visible(line))
    for row in rows:
        out.print(visible(f"{row.status:>8}  {row.name}  {row.size} B  sha256 {row.sha256}"))
    return 0
