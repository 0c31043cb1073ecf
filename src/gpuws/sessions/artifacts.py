"""Pulling a run's artifacts home: confined, bounded, verified, never half-presented.

The pod is untrusted (DESIGN.md), so what it announces about a file (its name, size,
path and sha256) is input, checked here before any byte is written:

- *Where.* A name is relative and normalised (no ``..``, no empty or ``.`` component, no
  control characters, not ``*.part``), and its destination, with every existing parent's
  symbolic links resolved, lies strictly inside that run's artifact directory. Missing
  parents are created there only; the ``.part`` is opened ``O_NOFOLLOW`` so a planted
  link cannot redirect the write.
- *How much.* A pull never writes more than the announced size, and an announced size
  above a ceiling is refused before any byte moves: an endless file (``/dev/zero``)
  fills nothing. The ceilings are the config's ``[pull]`` table
  (:class:`gpuws.config.PullConfig`): one artifact's size, and per run the number of
  artifacts and their bytes together, taken in name order.
- *Which.* Only a regular file is read on the pod (the transport refuses a FIFO, a
  device or a link), and a transfer that goes ``stall_s`` seconds without a byte is
  stopped with one line: no pull can hang.
- *What.* The sha256 is computed as the bytes arrive, in one writer thread that also does
  the disk writes (the event loop only receives), so no pass over the file is left after
  the last byte; the store records the digest and renames the ``.part`` only if it
  matches what the pod announced. A mismatch removes the ``.part``.

Each file is written to ``NAME.part`` beside its final place and resumed from the size
already there after a broken link. One pull of a run at a time: an exclusive lock on
``.gpuws-pull.lock`` in the run's artifact directory makes a second pull wait (bounded),
then find the files already home. :func:`pull_run` also checks that every file marked
pulled is still there with its sha256, and fetches it again (saying why) if not.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import stat
import threading
import time
import unicodedata
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..config import PullConfig
from ..errors import TransferError
from ..locations import artifacts_dir, config_path
from ..transport.base import Transport
from .store import ArtifactRow, Store

#: progress(name, done_bytes, total_bytes)
Progress = Callable[[str, int, int], None]

#: Default ceiling on one artifact's announced size (the config's
#: ``[pull] max_artifact_bytes``). Real reports are far smaller (an ncu report of a
#: full-set profile is tens of MB); the ceiling stops a lying pod from filling the
#: laptop's disk.
MAX_ARTIFACT_BYTES = PullConfig().max_artifact_bytes
#: How long a pull waits for another pull of the same run to finish, in seconds.
LOCK_WAIT_S = 600.0
#: The lock file in each run's artifact directory (an artifact of this name is refused).
LOCK_NAME = ".gpuws-pull.lock"
#: Longest artifact name taken (UTF-8 bytes): the pod's worker announces none longer.
MAX_NAME_BYTES = 1024
#: Bytes handed to the writer thread and not yet on disk: the bound on a pull's memory
#: when the disk is slower than the link.
WRITE_AHEAD = 32 << 20
#: Dirty bytes after which the writer starts their writeback without waiting for it
#: (``posix_fadvise(DONTNEED)`` on Linux): the fsync after the last byte then has little
#: left to do. Without it that fsync took 0.12-0.21 s of a 256 MiB pull here; with it,
#: 0.01-0.04 s.
FLUSH_EVERY = 8 << 20
_FADVISE = getattr(os, "posix_fadvise", None)
_PART = ".part"
_CHUNK = 1 << 20
#: Characters refused in names: controls (C0, DEL, C1: terminal escapes, forged lines)
#: and format characters (bidi overrides, zero widths: names that read as other names).
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs"})


@dataclass
class PullResult:
    """What one artifact's pull did.

    Attributes:
        name: the artifact's name (relative to the run's artifact directory).
        local_path: where the verified copy now is.
        size: its size in bytes.
        seconds: wall time of this pull (lock wait excluded).
        resumed_from: bytes of an earlier ``.part`` kept (0 when it started afresh).
        refetched: why a file already marked pulled was fetched again (its local copy
            was missing, of another size or another sha256), or ``None``.
    """

    name: str
    local_path: Path
    size: int
    seconds: float
    resumed_from: int
    refetched: str | None = None


class PullSource(Protocol):
    """What a pull needs of the link to the pod: an agent client is one (the engine's pull
    after a run), :class:`SftpSource` another (``gpuws pull`` on a pod with SFTP)."""

    @property
    def transport(self) -> Transport:
        """The connected transport that reads the file."""
        ...

    def agent_argv(self) -> list[str]:
        """The argv that starts the cached agent on the pod (a transport without SFTP
        reads files through the agent's ``cat``)."""
        ...


@dataclass
class SftpSource:
    """A pull over SFTP alone: the pod's sftp-server reads the file, no agent is started.

    ``gpuws pull`` uses it when the server has an SFTP subsystem: starting the agent
    (its bootstrap, the pod's Python, the Hello) was 0.4 s of a 2.9 s pull of 256 MiB on
    loopback and only the exec fallback needs it (docs/performance.md §4).
    """

    transport: Transport

    def __post_init__(self) -> None:
        if not self.transport.info.sftp:
            raise ValueError("SftpSource needs a transport with SFTP")

    def agent_argv(self) -> list[str]:
        # A transport with SFTP reads over SFTP and never runs the agent's argv.
        return []

    async def close(self) -> None:
        """Close the transport."""
        await self.transport.close()


# ----------------------------------------------------------------------------- names
def shown(name: str) -> str:
    """``name`` as it may be put in a message: quoted and escaped unless plainly printable."""
    return name if name and name.isprintable() else ascii(name)


def name_problem(name: str) -> str | None:
    """Why an announced artifact name cannot be written on the laptop, or ``None``."""
    if not name:
        return "the name is empty"
    if any(unicodedata.category(c) in _REFUSED_CATEGORIES for c in name):
        return "the name contains control characters"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"the name is longer than {MAX_NAME_BYTES} bytes"
    if name.startswith("/"):
        return "the name is absolute"
    if "\\" in name:
        return "the name contains a backslash"
    parts = name.split("/")
    if ".." in parts:
        return "the name has a '..' component"
    if any(part in ("", ".") for part in parts):
        return "the name is not normalised (an empty or '.' component)"
    if any(len(part.encode("utf-8", "surrogatepass")) > 255 for part in parts):
        return "a component of the name is longer than 255 bytes"
    if name.endswith(_PART):
        return f"names ending in {_PART} are gpuws's unfinished downloads"
    if parts[0] == LOCK_NAME:
        return f"{LOCK_NAME} is gpuws's pull lock"
    return None


def _refused(name: str, why: str) -> TransferError:
    return TransferError(f"artifact {shown(name)} refused: {why}; nothing was written",
                         title="Artifact refused",
                         remedy="the pod announced a file gpuws will not write there; rename it "
                                "in the run's artifacts/ directory on the pod if it is yours")


def destination(session_id: str, run_id: str, name: str) -> Path:
    """Where artifact ``name`` of a run is written: strictly inside the run's artifact dir.

    Missing parent directories are created (0700), one at a time and only inside that
    directory; an existing parent that is a symbolic link or not a directory is refused,
    and the parent is resolved again at the end to prove where it leads.

    Raises:
        TransferError: the name or its destination is refused (one line saying why).
    """
    why = name_problem(name)
    if why is not None:
        raise _refused(name, why)
    root = artifacts_dir(session_id, run_id).resolve(strict=True)
    *dirs, leaf = name.split("/")
    parent = root
    for part in dirs:
        parent = parent / part
        try:
            st = os.lstat(parent)
        except FileNotFoundError:
            try:
                os.mkdir(parent, 0o700)
            except FileExistsError:
                pass  # another pull made it between our lstat and mkdir: checked below
            except OSError as exc:
                raise TransferError(f"artifact {shown(name)}: cannot create {parent}: "
                                    f"{exc.strerror or exc}") from exc
            st = os.lstat(parent)
        if stat.S_ISLNK(st.st_mode):
            raise _refused(name, f"{parent} is a symbolic link")
        if not stat.S_ISDIR(st.st_mode):
            raise _refused(name, f"{parent} is not a directory")
    final = parent / leaf
    _check_inside(root, final, name)
    return final


def _check_inside(root: Path, final: Path, name: str) -> None:
    real = final.parent.resolve(strict=True)
    if real != root and root not in real.parents:
        raise _refused(name, f"its directory resolves to {real}, outside {root}")
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(final).st_mode):
            raise _refused(name, f"{final} is a directory")


# ----------------------------------------------------------------------------- the lock
@contextlib.asynccontextmanager
async def run_lock(session_id: str, run_id: str,
                   wait: float = LOCK_WAIT_S) -> AsyncIterator[None]:
    """Hold the exclusive pull lock of a run (``flock`` on :data:`LOCK_NAME`).

    Polls without blocking the event loop, for at most ``wait`` seconds. The lock is
    released when the file is closed, so a killed pull never leaves it held.

    Raises:
        TransferError: another pull still holds it after ``wait`` seconds.
    """
    path = artifacts_dir(session_id, run_id) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise TransferError(f"cannot open the pull lock {path}: {exc.strerror or exc}",
                            remedy=f"remove {path} if it is not a plain file") from exc
    try:
        deadline = time.monotonic() + wait
        delay = 0.02
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TransferError(
                        f"another gpuws pull of run {run_id} still holds {path} after "
                        f"{wait:.0f} s", title="Pull busy",
                        remedy="let that pull finish (or stop it), then `gpuws pull` again"
                    ) from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.25)
            except OSError as exc:
                raise TransferError(f"cannot lock {path}: {exc.strerror or exc}",
                                    remedy="keep GPUWS_HOME on a local disk") from exc
        yield
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- checking
def local_problem(path: Path, size: int, sha256: str) -> str | None:
    """Why the file at ``path`` is not a true copy (``size`` bytes, ``sha256``), or ``None``.

    Blocking (it reads the whole file): call it in a thread.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return "the local copy was missing"
    except OSError as exc:
        return f"the local copy could not be read ({exc.strerror or exc})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "the local copy was not a regular file"
        if st.st_size != size:
            return f"the local copy had {st.st_size} of {size} bytes"
        digest = hashlib.sha256()
        while chunk := os.read(fd, _CHUNK):
            digest.update(chunk)
        if digest.hexdigest() != sha256:
            return "the local copy's sha256 differed from the pod's"
        return None
    except OSError as exc:
        return f"the local copy could not be read ({exc.strerror or exc})"
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- writing
class _Writer:
    """Writes and hashes one download in order, in one thread, off the event loop.

    ``put`` hands a chunk over and returns at once unless :data:`WRITE_AHEAD` bytes are
    still waiting for the disk: the loop keeps decrypting the next chunk while this one
    is written and hashed (both release the GIL). A write error surfaces at the next
    ``put`` or at ``finish``.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.digest = hashlib.sha256()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuws-pull")
        self._pending: deque[tuple[asyncio.Future[None], int]] = deque()
        self._queued = 0
        self._flushed = 0  # file offset up to which writeback was started
        self._stop = threading.Event()

    async def hash_prefix(self, length: int) -> int:
        """Hash the first ``length`` bytes already in the file (a resumed ``.part``)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._prefix,
                                                                length)

    def _prefix(self, length: int) -> int:
        done = 0
        while done < length:
            chunk = os.pread(self.fd, min(_CHUNK, length - done), done)
            if not chunk:
                break
            self.digest.update(chunk)
            done += len(chunk)
        self._flushed = done
        return done

    async def put(self, chunk: bytes) -> None:
        fut = asyncio.get_running_loop().run_in_executor(self._pool, self._write, chunk)
        self._pending.append((fut, len(chunk)))
        self._queued += len(chunk)
        while self._pending and (self._queued > WRITE_AHEAD or self._pending[0][0].done()):
            head, n = self._pending.popleft()
            self._queued -= n
            await head

    def _write(self, chunk: bytes) -> None:
        if self._stop.is_set():
            return
        view = memoryview(chunk)
        while view:
            view = view[os.write(self.fd, view):]
        self.digest.update(chunk)
        if _FADVISE is not None:
            end = os.lseek(self.fd, 0, os.SEEK_CUR)
            if end - self._flushed >= FLUSH_EVERY:
                _FADVISE(self.fd, self._flushed, end - self._flushed, os.POSIX_FADV_DONTNEED)
                self._flushed = end

    async def finish(self) -> None:
        """Wait for every write, then fsync (the rename that follows must not outlive it)."""
        while self._pending:
            head, n = self._pending.popleft()
            self._queued -= n
            await head
        await asyncio.get_running_loop().run_in_executor(self._pool, os.fsync, self.fd)

    def close(self) -> None:
        # Queued writes are skipped through a flag the thread checks, not by
        # shutdown(cancel_futures=True): that drains the queue while the thread may take
        # the next item, so chunk k could be cancelled and chunk k+1 written in its place
        # (seen: a kept .part shifted by one SFTP read, in the cut-and-resume test). The
        # thread runs items in order, so what the flag skips is always a suffix and the
        # .part stays a true prefix. Waiting for the write in progress means the caller
        # can close the fd without a write landing on a reused descriptor.
        self._stop.set()
        self._pool.shutdown(wait=True)


def _open_part(part: Path, name: str) -> int:
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(part, flags, 0o600)
    except OSError as exc:
        raise _refused(name, f"cannot open {part} as a plain file "
                             f"({exc.strerror or exc}; a link or FIFO there is never followed)"
                       ) from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _refused(name, f"{part} is not a regular file")
    return fd


def _over(name: str, why: str, key: str) -> TransferError:
    return TransferError(f"artifact {shown(name)} refused: {why}; nothing was written",
                         title="Artifact refused",
                         remedy=f"raise {key} in the [pull] table of the gpuws config "
                                f"({config_path()}) if the run really makes that much, or "
                                "copy the file with scp")


async def _fetch(client: PullSource, store: Store, session_id: str, art: ArtifactRow,
                 progress: Progress | None, limits: PullConfig,
                 refetched: str | None) -> PullResult:
    """One artifact, with the run's lock held: confined, bounded, hashed as it arrives."""
    t0 = time.monotonic()
    if art.size < 0 or art.size > limits.max_artifact_bytes:
        raise _over(art.name, f"the pod announced {art.size} bytes, above the ceiling of "
                              f"{limits.max_artifact_bytes} bytes", "max_artifact_bytes")
    final = destination(session_id, art.run_id, art.name)
    part = final.with_name(final.name + _PART)
    root = final.parent
    fd = _open_part(part, art.name)
    writer = _Writer(fd)
    offset = 0
    try:
        offset = os.fstat(fd).st_size
        if offset > art.size:  # a stale .part from a different file: start again
            os.ftruncate(fd, 0)
            offset = 0
        if offset:
            offset = await writer.hash_prefix(offset)
        resumed = offset
        os.lseek(fd, offset, os.SEEK_SET)
        if offset < art.size:
            stream = client.transport.read_file(art.remote_path, offset, client.agent_argv(),
                                                stall_s=limits.stall_s)
            try:
                async for chunk in stream:
                    room = art.size - offset
                    if len(chunk) > room:
                        # The pod sends more than it announced (a growing or endless
                        # file): never more than announced; the sha256 decides the rest.
                        chunk = chunk[:room]
                    await writer.put(chunk)
                    offset += len(chunk)
                    if progress:
                        progress(art.name, offset, art.size)
                    if offset >= art.size:
                        break
            finally:
                if isinstance(stream, AsyncGenerator):
                    await stream.aclose()  # stop the transport's reads now, not at GC
        await writer.finish()
    except OSError as exc:
        raise TransferError(f"{shown(art.name)}: writing {part} failed: {exc.strerror or exc}",
                            remedy="free disk space, then `gpuws pull` resumes where it stopped"
                            ) from exc
    finally:
        writer.close()
        os.close(fd)
    if offset < art.size:
        # The stream ended early (a link dropped without an error on the way): what is
        # there is a good prefix; keep it for the next pull to resume from.
        raise TransferError(f"{shown(art.name)}: the transfer stopped at {offset} of "
                            f"{art.size} bytes",
                            remedy="pull again (`gpuws pull`); it resumes where it stopped")
    try:
        _check_inside(root.resolve(strict=True), final, art.name)
        # The store compares the digest with the pod's, renames the .part into place and
        # records it; a mismatch is recorded and raised.
        store.mark_pulled(art.run_id, art.name, part, move_to=final,
                          sha256=writer.digest.hexdigest(), size=offset)
    except TransferError:
        # A wrong copy is never resumed from: the next pull must start again.
        part.unlink(missing_ok=True)
        raise
    return PullResult(art.name, final, art.size, time.monotonic() - t0, resumed,
                      refetched=refetched)


async def _verified(session_id: str, art: ArtifactRow) -> tuple[Path, str | None]:
    final = destination(session_id, art.run_id, art.name)
    return final, await asyncio.to_thread(local_problem, final, art.size, art.sha256)


# ----------------------------------------------------------------------------- public
async def pull_run(client: PullSource, store: Store, session_id: str, run_id: str,
                   progress: Progress | None = None, *, limits: PullConfig | None = None,
                   lock_wait: float = LOCK_WAIT_S) -> list[PullResult]:
    """Pull every artifact of a run not truly home; the phase is recorded for the cost table.

    With the run's pull lock held: each artifact marked pulled is checked (present,
    same size and sha256; the files are read) and fetched again if not; the others are
    fetched. One refused or failed artifact does not stop the rest.

    The run's bounds (``limits``, the config's ``[pull]`` table; its defaults when
    ``None``) are applied to the artifacts in name order: past the
    ``max_artifacts``-th, or once their sizes together pass ``max_run_bytes``, each is
    refused before any of its bytes move, with a line naming the key.

    Returns:
        One result per file fetched (``refetched`` set for those fetched again); empty
        when everything was already home and true.

    Raises:
        TransferError: after trying all of them, if any could not be pulled (the first
            one's line, with a count when there were several).
    """
    limits = limits or PullConfig()
    async with run_lock(session_id, run_id, lock_wait):
        todo: list[tuple[ArtifactRow, str | None]] = []
        failures: list[TransferError] = []
        count = total = 0
        for art in store.artifacts(run_id):
            count += 1
            total += max(art.size, 0)
            if count > limits.max_artifacts:
                failures.append(_over(art.name, f"run {run_id} announced more than "
                                                f"{limits.max_artifacts} artifacts",
                                      "max_artifacts"))
                continue
            if total > limits.max_run_bytes:
                failures.append(_over(art.name, f"with it, run {run_id}'s artifacts come to "
                                                f"{total} bytes, above the ceiling of "
                                                f"{limits.max_run_bytes} bytes",
                                      "max_run_bytes"))
                continue
            if art.status != "pulled":
                todo.append((art, None))
                continue
            try:
                _final, why = await _verified(session_id, art)
            except TransferError as exc:
                failures.append(exc)
                continue
            if why is not None:
                todo.append((art, why))
        out: list[PullResult] = []
        if todo:
            t0 = time.time()
            try:
                for art, why in todo:
                    try:
                        out.append(await _fetch(client, store, session_id, art, progress,
                                                limits, why))
                    except TransferError as exc:
                        failures.append(exc)
            finally:
                store.add_phase(session_id, run_id, "transfer", t0, time.time())
    if len(failures) == 1:
        raise failures[0]
    if failures:
        first = failures[0]
        raise TransferError(f"{len(failures)} artifacts of run {run_id} were not pulled; "
                            f"first: {first.message}", title=first.title, remedy=first.remedy)
    return out
