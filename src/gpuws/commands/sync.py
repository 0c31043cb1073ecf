"""``gpuws sync HOST -W DIR``: the workspace on the pod, without a run (scripts, benchmarks)."""

from __future__ import annotations

import argparse
import asyncio
from typing import TYPE_CHECKING

from ..text import humanfmt
from ..text.textsafe import visible
from ..workspace.code import CodeRecord
from ..workspace.sync import SyncResult, WorkspaceSync
from .common import connect, console, print_json

if TYPE_CHECKING:
    from rich.text import Text


def sync_line(synced: SyncResult, code: CodeRecord) -> Text:
    """``workspace NAME: 212 files (1.2 MB), sent 1 file (3.4 kB) in 0.08 s · tree … · git …``"""
    from rich.text import Text  # here: `sync --json` prints no Rich text

    m = synced.manifest
    sent = (f"sent {synced.blobs_sent} file{'s' if synced.blobs_sent != 1 else ''} "
            f"({humanfmt.size(synced.bytes_sent)})" if synced.blobs_sent else "nothing to send")
    return Text(f"workspace {visible(synced.name)}: {len(m.entries)} files "
                f"({humanfmt.size(m.total_bytes)}), {sent}, {synced.written} written, "
                f"{synced.removed} removed in {humanfmt.duration(synced.seconds)} · "
                f"{visible(code.short())}", style="dim")


async def sync(args: argparse.Namespace) -> int:
    workspace = WorkspaceSync(args.workspace)
    # Refused (a link out of the tree, a file over its cap...) before anything connects.
    manifest = await asyncio.to_thread(workspace.scan)
    # What the printed line names (git's commit and changed files): asked of git while
    # the pod is being reached, not after.
    code = None if args.json else asyncio.create_task(asyncio.to_thread(workspace.code,
                                                                        manifest))
    try:
        client = await connect(args)
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
                        "seconds": synced.seconds})
            return 0
        console(markup=False).print(sync_line(synced, await code))
        return 0
    finally:
        if code is not None and not code.done():
            code.cancel()
