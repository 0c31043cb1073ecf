"""``gpuws sync HOST -W DIR``: the workspace on the pod, without a run (scripts, benchmarks)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from typing import TYPE_CHECKING

from ..text import humanfmt
from ..text.textsafe import visible
from ..workspace.code import CodeRecord
from ..workspace.manifest import Manifest, describe
from ..workspace.sync import SyncResult, WorkspaceSync
from .common import connect, console, print_json, transport_for

if TYPE_CHECKING:
    from rich.text import Text


def sync_line(synced: SyncResult, code: CodeRecord) -> Text:
    """``workspace NAME: 212 files (1.2 MB), sent 1 file (3.4 kB) in 0.08 s · tree … · git …``,
    and what was skipped (``· skipped 1 link to nothing: .#bench.py``)."""
    from rich.text import Text  # here: `sync --json` prints no Rich text

    m = synced.manifest
    sent = (f"sent {synced.blobs_sent} file{'s' if synced.blobs_sent != 1 else ''} "
            f"({humanfmt.size(synced.bytes_sent)})" if synced.blobs_sent else "nothing to send")
    text = Text(f"workspace {visible(synced.name)}: {len(m.entries)} files "
                f"({humanfmt.size(m.total_bytes)}), {sent}, {synced.written} written, "
                f"{synced.removed} removed in {humanfmt.duration(synced.seconds)} · "
                f"{visible(code.short())}", style="dim")
    notes = describe(m.notes)
    if notes:
        text.append(f" · {notes}", style="yellow")
    return text


async def sync(args: argparse.Namespace) -> int:
    workspace = WorkspaceSync(args.workspace)
    # The scan and what connecting needs first (asyncssh's import, `ssh -G`: ~0.15 s of a
    # ~0.7 s process) go side by side; nothing connects until the scan has passed, so a
    # tree that is refused (a link out of it, a file over its cap...) reaches no pod.
    scanning = asyncio.create_task(asyncio.to_thread(workspace.scan))
    preparing = asyncio.create_task(asyncio.to_thread(transport_for, args))
    await asyncio.wait((scanning, preparing))
    preparing.exception()  # looked at here: should both have failed, the refusal is shown
    manifest = scanning.result()
    transport = preparing.result()
    # What the printed line names (git's commit and changed files) is asked of git, and
    # the printer imported, while the pod is reached: the loop only waits then.
    code = None if args.json else asyncio.create_task(asyncio.to_thread(_for_people,
                                                                        workspace, manifest))
    try:
        client = await connect(args, transport)
        try:
            synced = await workspace.sync(client, manifest)
        finally:
            await client.close()
        if code is None:
            print_json({"name": synced.name, "root": synced.root,
                        "files": len(manifest.entries), "tree_sha256": manifest.tree_sha256,
                        "blobs_sent": synced.blobs_sent, "bytes_sent": synced.bytes_sent,
                        "wire_bytes": synced.wire_bytes, "puts": synced.puts,
                        "written": synced.written, "removed": synced.removed,
                        "seconds": synced.seconds,
                        # left out (vanished, dangling, loop) or sent as last read
                        "notes": [{"path": n.path, "why": n.why} for n in manifest.notes]})
            return 0
        record = await code
        if record.tree_sha256 != manifest.tree_sha256:
            # A file changed or vanished while it was sent: the record names what the pod
            # holds (the manifest, updated in place by the sync).
            record = dataclasses.replace(record, tree_sha256=manifest.tree_sha256,
                                         files=len(manifest.entries),
                                         total_bytes=manifest.total_bytes)
        console(markup=False).print(sync_line(synced, record))
        return 0
    finally:
        if code is not None and not code.done():
            code.cancel()


def _for_people(workspace: WorkspaceSync, manifest: Manifest) -> CodeRecord:
    """The tree's code record, with Rich loaded for printing it (on a worker thread)."""
    from . import safeconsole  # noqa: F401  (imported for what follows it)

    return workspace.code(manifest)
