"""Pulling a run's artifacts home: resumable, verified, never half-presented.

Each file is written to ``NAME.part`` beside its final place, resumed from the size
already there after a broken link, and renamed only after its sha256 matches what the
agent announced. A mismatch is reported and its ``.part`` removed (the next pull starts
again); the store never marks such a file pulled.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..client import AgentClient
from ..errors import TransferError
from ..locations import artifacts_dir
from .store import ArtifactRow, Store

#: progress(name, done_bytes, total_bytes)
Progress = Callable[[str, int, int], None]


@dataclass
class PullResult:
    name: str
    local_path: Path
    size: int
    seconds: float
    resumed_from: int


async def pull_one(client: AgentClient, store: Store, session_id: str, art: ArtifactRow,
                   progress: Progress | None = None) -> PullResult:
    """Pull one artifact (resuming a ``.part``) and record it in the store."""
    dest_dir = artifacts_dir(session_id, art.run_id)
    final = dest_dir / art.name
    final.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    part = final.with_name(final.name + ".part")
    t0 = time.monotonic()
    offset = part.stat().st_size if part.exists() else 0
    if offset > art.size:  # a stale .part from a different file: start again
        part.unlink()
        offset = 0
    resumed = offset
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        if offset < art.size:
            async for chunk in client.transport.read_file(art.remote_path, offset,
                                                          client.agent_argv()):
                os.write(fd, chunk)
                offset += len(chunk)
                if progress:
                    progress(art.name, offset, art.size)
        os.fsync(fd)
    except OSError as exc:
        raise TransferError(f"{art.name}: writing {part} failed: {exc.strerror or exc}",
                            remedy="free disk space, then `gpuws pull` resumes where it stopped"
                            ) from exc
    finally:
        os.close(fd)
    if offset < art.size:
        # The stream ended early (a link dropped without an error on the way): what is
        # there is a good prefix; keep it for the next pull to resume from.
        raise TransferError(f"{art.name}: the transfer stopped at {offset} of {art.size} bytes",
                            remedy="pull again (`gpuws pull`); it resumes where it stopped")
    try:
        # Checks the sha256 and size, then renames the .part into place; a mismatch is
        # recorded and raised.
        store.mark_pulled(art.run_id, art.name, part, move_to=final)
    except TransferError:
        # A wrong copy is never resumed from: the next pull must start again.
        part.unlink(missing_ok=True)
        raise
    return PullResult(art.name, final, art.size, time.monotonic() - t0, resumed)


async def pull_run(client: AgentClient, store: Store, session_id: str, run_id: str,
                   progress: Progress | None = None) -> list[PullResult]:
    """Pull every artifact of a run not yet home; the phase is recorded for the cost table."""
    todo = [a for a in store.artifacts(run_id) if a.status != "pulled"]
    if not todo:
        return []
    t0 = time.time()
    out = [await pull_one(client, store, session_id, a, progress) for a in todo]
    store.add_phase(session_id, run_id, "transfer", t0, time.time())
    return out
