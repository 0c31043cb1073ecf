"""Sending a workspace to the pod through the agent's own channel (every transport).

One :class:`WorkspaceSync` per local directory; :meth:`WorkspaceSync.sync` may be called
again and again on one open connection (``watch`` does, after every save): the manifest is
re-made (only changed files are hashed again), blobs the pod probably lacks (the files
changed since the last sync) go first, then ``workspace_apply``; the pod answers with the
hashes it still lacks, which are sent before it is asked again. So an unchanged tree costs
one request, one changed file one put and one apply. Every answer is checked here: the
pod may only ask for hashes of this tree, and what it reports is bounded text.

An editor saves while a sync reads: a file whose bytes no longer match the scan's hash
is read again until its stat holds across one read (:data:`READS` at most; past them
the last read is sent), and the manifest takes its new hash; a file that vanished (or is
no regular file any more) is left out. Either is a :class:`~.manifest.Note`
of the manifest, and the sync completes with what was read consistently.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import hashlib
import os
import re
import stat
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from .. import protocol
from ..client import AgentClient
from ..errors import GpuwsError, ProtocolError, WorkspaceError
from ..locations import gpuws_home
from ..text.textsafe import visible
from .code import CodeRecord, TreeDiff, diff_entries
from .gitinfo import GitState, git_state
from .manifest import DEFAULT_CAPS, UNSTABLE, VANISHED, Caps, HashCache, Manifest, scan

#: Raw bytes per put: base64 of 4 MiB is 5.6 MB, inside the protocol's 8 MiB line.
BATCH = 4 << 20
#: Pieces per put: a piece is ~90 bytes of JSON, so a batch of thousands of tiny files
#: stays well inside the 8 MiB line with its base64 beside it.
MAX_PIECES = 8192
#: Puts in flight at once: the agent answers them in order, and the link stays busy
#: while the next batch is read and encoded.
IN_FLIGHT = 4
#: A batch is sent compressed only when zlib (level 1: ~300 MB/s) saves this share.
ZLIB_GAIN = 0.9
#: At most this many bytes of a new process's guess (the files changed since the last
#: scan) are sent before the pod is asked what it lacks: about what a 100 Mbit/s link
#: carries in the time of a round trip and an apply of a large tree on the pod.
PRESEND_BYTES = 512 << 10
#: Rounds of "still missing" an apply may answer before the sync gives up.
ROUNDS = 3
#: Reads of a file that changed since the scan, looking for one its stat did not change
#: across; past them the last read is sent (the save that changed it makes the watcher's
#: next iteration, which reads it settled).
READS = 3


def workspace_name(root: Path) -> str:
    """The pod-side name of a local directory: its base name and a hash of its path, so two
    projects called ``kernels`` never share a tree."""
    base = re.sub(r"[^A-Za-z0-9._-]", "_", root.name).lstrip("._-")[:40] or "ws"
    return f"{base}-{hashlib.sha256(str(root).encode()).hexdigest()[:12]}"


@dataclass
class SyncResult:
    """One sync: what travelled and what the pod did."""

    name: str
    root: str
    manifest: Manifest
    #: Against the previous sync of this object (everything added on the first one).
    diff: TreeDiff
    blobs_sent: int = 0
    bytes_sent: int = 0
    wire_bytes: int = 0
    puts: int = 0
    written: int = 0
    removed: int = 0
    seconds: float = 0.0


class WorkspaceSync:
    """A local directory and what was last sent of it.

    Args:
        directory: the project on this machine.
        caps: what the workspace may hold (:class:`~.manifest.Caps`).
        name: the pod-side name (default :func:`workspace_name`).
    """

    def __init__(self, directory: Path | str, *, caps: Caps = DEFAULT_CAPS,
                 name: str | None = None) -> None:
        self.root = Path(directory).expanduser().resolve()
        self.caps = caps
        self.name = name or workspace_name(self.root)
        #: Loaded by the first :meth:`scan` (it reads a file: not on the event loop).
        self.cache: HashCache | None = None
        #: The manifest the pod confirmed last (None before the first sync).
        self.last: Manifest | None = None
        #: The last scan's tree and the contents the hash cache had not seen before it.
        self._unseen: tuple[str, set[str]] = ("", set())

    def scan(self) -> Manifest:
        """The manifest now, refused (``WorkspaceError``) before anything is sent.

        Files are hashed only where size, mtime, ctime or inode changed since the last
        scan of this directory, by this process or an earlier one (the hash cache is kept
        in the data directory's ``hashes/``).
        """
        if self.cache is None:
            self.cache = _load_cache(self.root)
        before = self.cache.contents()
        manifest = scan(self.root, self.caps, self.cache)
        self.cache.save()
        self._unseen = (manifest.tree_sha256,
                        {e.sha256 for e in manifest.entries} - before)
        return manifest

    def code(self, manifest: Manifest) -> CodeRecord:
        """What a run in this tree records: the tree hash and, in git, commit and changes."""
        state: GitState | None = (git_state(self.root, manifest.safegit) if manifest.git
                                    else None)
        return CodeRecord(str(self.root), self.name, manifest.tree_sha256,
                          len(manifest.entries), manifest.total_bytes,
                          state.commit if state else None, state.dirty if state else None,
                          state.changed if state else [])

    async def sync(self, client: AgentClient, manifest: Manifest | None = None) -> SyncResult:
        """Make the pod's copy this tree; ``manifest`` is one :meth:`scan` just made.

        A file that changed or vanished since the scan changes ``manifest`` in place (its
        entries, tree hash and notes): afterwards it is the tree the pod holds, which is
        what a run records."""
        t0 = time.monotonic()
        if manifest is None:
            manifest = await asyncio.to_thread(self.scan)
        previous = self.last.entries if self.last is not None else []
        result = SyncResult(self.name, "", manifest, diff_entries(previous, manifest.entries))
        wanted = {e.sha256 for e in manifest.entries}
        sizes = {e.sha256: e.size for e in manifest.entries}
        guess: set[str] = set()
        if self.last is not None:
            # What changed since the last sync is what the pod lacks, most likely: sent
            # before the apply, it saves a round trip per edit.
            guess = wanted - {e.sha256 for e in self.last.entries}
        elif self._unseen[0] == manifest.tree_sha256:
            # A new process: the contents this directory's hash cache had not seen (the
            # edits since the last scan, by any process). A wrong guess costs bytes, so
            # only a small one is sent unasked; a large one (a first sync, another
            # branch checked out) waits for the pod to say what it lacks.
            unseen = self._unseen[1] & wanted
            if sum(sizes[h] for h in unseen) <= PRESEND_BYTES:
                guess = unseen
        # The puts' lines go out before the apply's, which the pod answers after them:
        # the apply need not wait for their answers, one round trip for both.
        puts = await self._send(client, manifest, guess, result)
        try:
            for _ in range(ROUNDS + 1):
                state = await client.workspace_apply(self.name, manifest.entries,
                                                     manifest.tree_sha256)
                await _stored(puts, manifest)
                puts = []
                if state.name != self.name:
                    raise ProtocolError(f"the pod answered for workspace "
                                        f"{visible(state.name, 80)} when asked for "
                                        f"{self.name}", title="Refused answer")
                if state.applied:
                    result.root, result.written, result.removed = (state.root, state.written,
                                                                   state.removed)
                    break
                wanted = {e.sha256 for e in manifest.entries}  # reads may have changed it
                strange = set(state.missing) - wanted
                if strange or not state.missing:
                    odd = visible(sorted(strange)[0] if strange else "", 70)
                    raise ProtocolError("the pod asked for content this workspace does not "
                                        f"hold ({odd})",
                                        title="Refused answer",
                                        remedy="the agent on the pod is not gpuws's own; "
                                               "reconnect")
                puts = await self._send(client, manifest, set(state.missing), result)
            else:
                raise ProtocolError(f"the pod still lacked files after {ROUNDS} rounds",
                                    remedy="check free disk space on the pod and sync again")
        finally:
            for task in puts:
                task.cancel()
        self.last = manifest
        if self.cache is not None:
            self.cache.save()  # the hashes a changed file's reads forgot
        result.diff = diff_entries(previous, manifest.entries)
        result.seconds = time.monotonic() - t0
        return result

    async def _send(self, client: AgentClient, manifest: Manifest, hashes: set[str],
                    result: SyncResult) -> list[asyncio.Task[protocol.WorkspaceStored]]:
        """Write the blobs ``hashes`` in puts of at most :data:`BATCH` bytes, a few in
        flight; returns the puts whose answers are still to come (:func:`_stored`)."""
        if not hashes:
            return []
        first: dict[str, protocol.WsEntry] = {}
        for e in manifest.entries:
            first.setdefault(e.sha256, e)
        # Files are read a batch at a time on a thread (a thread hop per file cost more
        # than reading a small one).
        groups: list[list[protocol.WsEntry]] = [[]]
        size = 0
        for sha in sorted(hashes):
            if size >= BATCH:
                groups.append([])
                size = 0
            groups[-1].append(first[sha])
            size += first[sha].size
        slots = asyncio.Semaphore(IN_FLIGHT)
        tasks: list[asyncio.Task[protocol.WorkspaceStored]] = []
        batch = _Batch()

        async def flush() -> None:
            await slots.acquire()
            pieces, raw = batch.take()
            # Encoded off the loop (4 MiB through zlib and base64 is tens of ms), but here,
            # in order: each line is written as its put is made, so puts leave in the
            # order made, and the pieces of a large blob arrive in the order the pod needs.
            data, small = await asyncio.to_thread(_encode, raw)
            result.wire_bytes += len(data)
            result.puts += 1
            put = client.workspace_put_submitted(pieces, data, small)
            put.add_done_callback(lambda _: slots.release())
            tasks.append(put)

        try:
            for group in groups:
                read = await asyncio.to_thread(self._read_all, group)
                for entry, (data, how) in zip(group, read, strict=True):
                    if data is None:
                        manifest.replace(entry.path, None, VANISHED)
                        continue
                    if how:
                        # Changed since the scan: the manifest takes what was read (the
                        # apply that follows names it; a copy of the old content another
                        # path holds is read when the pod says it lacks it).
                        entry = protocol.WsEntry(entry.path, entry.mode,
                                                 hashlib.sha256(data).hexdigest(), len(data))
                        manifest.replace(entry.path, entry,
                                         UNSTABLE if how == UNSTABLE else "")
                    result.blobs_sent += 1
                    result.bytes_sent += len(data)
                    offset = 0
                    while True:
                        offset = batch.add(entry.sha256, data, offset)
                        if batch.full:
                            await flush()
                        if offset >= len(data):
                            break
            if batch.pieces:
                await flush()
            # A put refused while later ones were being made ends the sync here.
            await _stored([t for t in tasks if t.done()], manifest)
        except BaseException:
            for task in tasks:
                task.cancel()
            raise
        return tasks

    def _read_all(self, entries: list[protocol.WsEntry]) -> list[tuple[bytes | None, str]]:
        return [self._read(e) for e in entries]

    def _read(self, entry: protocol.WsEntry) -> tuple[bytes | None, str]:
        """The file's bytes and how they relate to the scan: "" (its hash), "changed"
        (read consistently: no change of its stat across the read), :data:`UNSTABLE`
        (still changing after :data:`READS` reads: the last one); None: it vanished.

        Raises:
            WorkspaceError: it cannot be read, grew over its cap, or is no longer a file
                inside the tree (a link replaced it).
        """
        path = os.path.join(self.root, entry.path)
        data: bytes | None = None
        for _ in range(READS):
            # Resolved each time: an edit may have made it a link since the scan, and new
            # content is only taken from a regular file inside the tree.
            real = os.path.realpath(path)
            try:
                # No following a link made after the resolve; no waiting on a FIFO made
                # in the file's place (O_NONBLOCK changes nothing for a regular file).
                fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK
                             | getattr(os, "O_NOFOLLOW", 0))
            except (FileNotFoundError, NotADirectoryError):
                self._forget(path)
                return None, ""
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    continue  # made a link between the resolve and the open: again
                raise WorkspaceError(f"cannot read {entry.path}: {exc.strerror or exc}",
                                     remedy="fix its permissions, or ignore it "
                                            "(.gitignore)") from exc
            read_at = time.time_ns()
            with os.fdopen(fd, "rb") as f:
                before = os.fstat(fd)
                if not stat.S_ISREG(before.st_mode):
                    # A directory or a FIFO where the file was: no file any more, as
                    # the next scan will see it.
                    self._forget(path)
                    return None, ""
                data = f.read(self.caps.file_bytes + 1)
                after = os.fstat(fd)
            if hashlib.sha256(data).hexdigest() == entry.sha256:
                return data, ""  # what the scan hashed: consistent by its hash
            self._forget(path)
            if not real.startswith(str(self.root) + os.sep):
                raise WorkspaceError(f"{entry.path} became a link out of the tree while "
                                     "the workspace was being sent",
                                     remedy="copy what it points to into the project, or "
                                            "ignore it (.gitignore)")
            if len(data) > self.caps.file_bytes:
                raise WorkspaceError(f"{entry.path} grew over the workspace's "
                                     f"{self.caps.file_bytes >> 20} MiB file cap while it "
                                     "was being sent", remedy="ignore it (.gitignore)")
            if _stat_key(before) == _stat_key(after):
                if self.cache is not None:  # the next scan need not read it again
                    self.cache.learn(real, after, hashlib.sha256(data).hexdigest(), read_at)
                return data, "changed"
        if data is None:
            raise WorkspaceError(f"{entry.path} kept being replaced by a link while the "
                                 "workspace was being sent", remedy="sync again")
        return data, UNSTABLE

    def _forget(self, path: str) -> None:
        """The cache's hash of ``path`` is no longer its content: hash it again next time."""
        if self.cache is not None:
            for key in (path, os.path.realpath(path)):  # a link's hash is its target's
                self.cache.forget(key)


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


async def _stored(puts: list[asyncio.Task[protocol.WorkspaceStored]],
                  manifest: Manifest) -> None:
    """Wait for the puts' answers; a blob the pod refused ends the sync."""
    if not puts:
        return
    paths = {e.sha256: e.path for e in manifest.entries}
    for stored in await asyncio.gather(*puts):
        if stored.refused:
            bad = ", ".join(paths[s] for s in stored.refused[:3] if s in paths)
            raise WorkspaceError(f"the pod refused the content of {visible(bad, 300)} "
                                 "(it changed while being sent?)", remedy="sync again")


def _load_cache(root: Path) -> HashCache:
    """The hash cache of ``root`` kept by earlier processes (in memory only when the data
    directory cannot be made)."""
    try:
        folder = gpuws_home() / "hashes"
    except GpuwsError:
        return HashCache(root=str(root))
    return HashCache.load(folder / f"{workspace_name(root)}.json", root)


def _encode(raw: bytes) -> tuple[str, bool]:
    """A put's data: zlib level 1 when it saves :data:`ZLIB_GAIN`, then base64."""
    packed = zlib.compress(raw, 1)
    small = len(packed) < ZLIB_GAIN * len(raw)
    return base64.b64encode(packed if small else raw).decode("ascii"), small


class _Batch:
    """The pieces of the next put and their bytes."""

    def __init__(self) -> None:
        self.pieces: list[protocol.WsPiece] = []
        self.buf = bytearray()

    @property
    def full(self) -> bool:
        return len(self.buf) >= BATCH or len(self.pieces) >= MAX_PIECES

    def add(self, sha: str, data: bytes, offset: int) -> int:
        """Add as much of ``data`` from ``offset`` as fits; returns the new offset."""
        take = min(BATCH - len(self.buf), len(data) - offset)
        self.pieces.append(protocol.WsPiece(sha, len(data), offset, take))
        self.buf += data[offset:offset + take]
        return offset + take

    def take(self) -> tuple[list[protocol.WsPiece], bytes]:
        pieces, raw = self.pieces, bytes(self.buf)
        self.pieces, self.buf = [], bytearray()
        return pieces, raw
