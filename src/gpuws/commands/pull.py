"""``gpuws pull``: a run's artifacts home, as fast as ``scp`` brings them.

On a pod with an SFTP subsystem the files are read by the pod's sftp-server and the agent
is never started (its start was a seventh of a 256 MiB pull on loopback); without SFTP
the agent is deployed as for any command and streams each file with its ``cat``. Either
way the pull is :func:`gpuws.sessions.artifacts.pull_run`: confined, bounded, hashed as
the bytes arrive, resumed from a ``.part``, verified against the pod's sha256.
"""

from __future__ import annotations

import argparse

import msgspec

from ..client import AgentClient
from ..config import load_config
from ..deploy import start_agent
from ..errors import GpuwsError
from ..sessions.artifacts import PullSource, SftpSource, pull_run
from ..sessions.store import Store
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


async def pull(args: argparse.Namespace) -> int:
    with Store() as store:
        run = find_run(store, args.run_id)
        if not store.artifacts(run.run_id):
            raise GpuwsError(f"run {run.run_id} announced no artifacts", title="Nothing to pull")
        source = await open_source(args)
        link: PullSource = source
        try:
            results = await pull_run(link, store, run.session_id, run.run_id,
                                     limits=load_config().pull)
        finally:
            await source.close()
        rows = store.artifacts(run.run_id)
    if args.json:
        print_json(msgspec.to_builtins(rows))
        return 0
    out = console(markup=False)  # names come from the pod: never parsed as markup
    for r in results:
        resumed = f" (resumed at {r.resumed_from} B)" if r.resumed_from else ""
        out.print(visible(f"pulled {r.name} → {r.local_path}{resumed}"))
    for row in rows:
        out.print(visible(f"{row.status:>8}  {row.name}  {row.size} B  sha256 {row.sha256}"))
    return 0
