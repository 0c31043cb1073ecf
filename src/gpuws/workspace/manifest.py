"""A local project as a content-addressed manifest: (path, mode, sha256, size) per file.

Which files: in a git work tree, what ``git ls-files --cached --others
--exclude-standard`` lists under the directory (tracked files and new ones git does not
ignore); elsewhere every file under it minus the patterns of its ``.gitignore`` files (read
by :mod:`pathspec`, git's own rules, nested files included) and the usual junk
(:data:`JUNK_DIRS`, virtualenvs, bytecode). Everything is checked before a byte is sent:
a symlink that leaves the tree, a file over :attr:`Caps.file_bytes`, a tree over
:attr:`Caps.tree_bytes` or :attr:`Caps.files` is refused, naming the biggest files.

What an editor leaves in a project for a moment is skipped, never refused: a link to
nothing (Emacs's ``.#name -> user@host.PID:TIME`` lock beside each modified buffer), a
link in a loop, a file that vanished between git's list and its read (``bench.py~``).
Each is a :class:`Note` of the manifest, told in one line (:func:`describe`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import msgspec

from .. import protocol
from ..errors import GpuwsError, WorkspaceError
from ..locations import ensure_private_dir
from ..protocol import MAX_LINE
from ..text import humanfmt
from ..text.textsafe import visible
from .safegit import SafeGit, inside_work_tree

if TYPE_CHECKING:
    import pathspec

#: Directories never sent outside a git work tree (git's own ignore rules decide inside one).
JUNK_DIRS = frozenset({
    ".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache",
    ".tox", ".nox", ".venv", "venv", "node_modules", ".ipynb_checkpoints", "build", "dist",
    ".eggs", ".cache", ".idea", ".gradle", ".DS_Store",
})
JUNK_SUFFIXES = (".pyc", ".pyo", ".egg-info")
#: The longest path the pod accepts (remote_agent/workspace.py MAX_PATH).
MAX_PATH_BYTES = 1024


@dataclass(frozen=True)
class Caps:
    """What a workspace may hold (docs/architecture.md lists the defaults).

    Attributes:
        file_bytes: the largest single file (64 MiB: a dataset belongs elsewhere).
        tree_bytes: the whole tree (256 MiB).
        files: how many files (20,000; a manifest of that many is ~2 MB on the wire).
    """

    file_bytes: int = 64 << 20
    tree_bytes: int = 256 << 20
    files: int = 20_000


DEFAULT_CAPS = Caps()


#: Why a path is a :class:`Note`: left out (the first three) or sent as last read.
VANISHED = "vanished"
DANGLING = "dangling"
LOOP = "loop"
UNSTABLE = "unstable"
#: (what was done, one, many) per reason, for :func:`describe`.
_WHY = {
    VANISHED: ("skipped", "file that vanished while it was read",
               "files that vanished while they were read"),
    DANGLING: ("skipped", "link to nothing", "links to nothing"),
    LOOP: ("skipped", "link in a loop", "links in a loop"),
    UNSTABLE: ("sent as last read", "file that kept changing while it was read",
               "files that kept changing while they were read"),
}


@dataclass(frozen=True)
class Note:
    """A path the manifest left out, or sent as it last read it (``why``: :data:`VANISHED`,
    :data:`DANGLING`, :data:`LOOP`, :data:`UNSTABLE`)."""

    path: str
    why: str


def describe(notes: list[Note], limit: int = 3) -> str:
    """One line for the notes: ``skipped 1 file that vanished while it was read:
    bench.py~; skipped 1 link to nothing: .#bench.py`` ("" for none)."""
    parts = []
    for why, (verb, one, many) in _WHY.items():
        paths = sorted({n.path for n in notes if n.why == why})
        if paths:
            named = ", ".join(visible(p, 80) for p in paths[:limit])
            more = f", … {len(paths) - limit} more" if len(paths) > limit else ""
            parts.append(f"{verb} {len(paths)} {one if len(paths) == 1 else many}: "
                         f"{named}{more}")
    return "; ".join(parts)


@dataclass
class Manifest:
    """A tree as the pod will hold it; ``entries`` sorted by path."""

    root: Path
    entries: list[protocol.WsEntry]
    tree_sha256: str
    #: The git checkout it came from, or None outside one.
    git: bool = False
    #: What was skipped, or sent as last read (:class:`Note`).
    notes: list[Note] = field(default_factory=list)
    #: The git the scan listed files with (its drivers read once): git's view of the same
    #: tree (``gitinfo.git_state``) reuses it.
    safegit: SafeGit | None = field(default=None, repr=False, compare=False)

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)

    def by_path(self) -> dict[str, protocol.WsEntry]:
        return {e.path: e for e in self.entries}

    def replace(self, path: str, entry: protocol.WsEntry | None, note: str = "") -> None:
        """Make ``path`` ``entry`` (None: leave it out), noting why (a sync does, for a
        file that changed or vanished between the scan and its read)."""
        self.entries = [e for e in self.entries if e.path != path]
        if entry is not None:
            self.entries.append(entry)
            self.entries.sort(key=lambda e: e.path.encode("utf-8"))
        self.tree_sha256 = tree_sha256(self.entries)
        if note:
            self.notes.append(Note(path, note))


#: A hash is kept for the next process only when the file's ctime and mtime lie this far
#: before the moment it was read: an edit right after the read, within the same tick of the
#: kernel's coarse clock (or the 2 s of a FAT mtime), would leave size, times and inode as
#: they were, and a later process would trust the old hash. Git's index handles the same
#: race ("racily clean" entries) by comparing with the index file's own mtime.
RACY_NS = 3_000_000_000
#: The format of the persisted cache (:meth:`HashCache.save`); another one is ignored.
CACHE_FORMAT = 1
#: A persisted cache larger than this is ignored unread (5,000 entries of the bench's tree,
#: whose absolute paths are ~70 bytes, took 0.97 MB: 20,000 such are ~4 MB).
MAX_CACHE_BYTES = 64 << 20

_Sha256 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
_NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class _CacheFile(msgspec.Struct, forbid_unknown_fields=True):
    """The persisted cache: per absolute path (size, mtime_ns, ctime_ns, inode, sha256)."""

    format: int
    root: str
    files: dict[str, tuple[_NonNegative, int, int, _NonNegative, _Sha256]]
    #: The contents of the racy files: not trusted for any path, only known to exist.
    recent: list[_Sha256] = []


@dataclass
class HashCache:
    """sha256 of files already hashed, trusted while size, mtime, ctime and inode agree
    (what git's index trusts): a repeated sync hashes only what changed.

    With a ``file`` it outlives the process (:meth:`load`, :meth:`save`): a new ``gpuws
    sync`` reads only the files changed since the last one, not the whole tree. A hash
    read within :data:`RACY_NS` of its file's last change is trusted in this process only.
    """

    known: dict[str, tuple[int, int, int, int, str]] = field(default_factory=dict)
    #: Where the cache is kept between processes (None: in memory only).
    file: Path | None = None
    #: The directory whose files it holds (a persisted cache of another one is ignored).
    root: str = ""
    #: Paths hashed too soon after their last change to be persisted (see RACY_NS).
    racy: set[str] = field(default_factory=set)
    #: Contents an earlier process hashed in racy files (known, trusted for no path).
    recent: set[str] = field(default_factory=set)
    #: Changed since it was loaded or saved.
    dirty: bool = False

    def lookup(self, path: str, st: os.stat_result) -> str | None:
        """The cached hash of ``path`` if ``st`` is the state it was hashed in."""
        hit = self.known.get(path)
        if hit is not None and hit[:4] == (st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                                           st.st_ino):
            return hit[4]
        return None

    def sha256(self, path: str, st: os.stat_result) -> str:
        key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        hit = self.known.get(path)
        if hit is not None and hit[:4] == key:
            return hit[4]
        read_at = time.time_ns()  # before the read: an edit after it must not go unseen
        digest = _hash_file(path, st.st_size)
        self.learn(path, st, digest, read_at)
        return digest

    def learn(self, path: str, st: os.stat_result, digest: str, read_at: int) -> None:
        """``path`` in state ``st`` holds ``digest``, read from ``read_at`` (ns)."""
        self.known[path] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, digest)
        if max(st.st_ctime_ns, st.st_mtime_ns) >= read_at - RACY_NS:
            self.racy.add(path)
        else:
            self.racy.discard(path)
        self.dirty = True

    def forget(self, path: str) -> None:
        """Hash ``path`` again next time (its bytes did not match the cached hash)."""
        if self.known.pop(path, None) is not None:
            self.dirty = True

    def keep_only(self, paths: set[str]) -> None:
        """Drop the files no longer in the tree (so the cache never outgrows it)."""
        gone = [p for p in self.known if p not in paths]
        for p in gone:
            del self.known[p]
        self.racy &= paths
        self.dirty = self.dirty or bool(gone)

    @classmethod
    def load(cls, file: Path, root: Path) -> HashCache:
        """The cache kept in ``file`` for ``root``; empty when there is none, or it is
        unreadable, too large, of another format or another directory (every file is
        then hashed again: a bad cache costs time, never a wrong hash)."""
        cache = cls(file=file, root=str(root))
        try:
            with open(file, "rb") as f:
                if os.fstat(f.fileno()).st_size > MAX_CACHE_BYTES:
                    return cache
                data = msgspec.json.decode(f.read(), type=_CacheFile)
        except (OSError, msgspec.ValidationError, msgspec.DecodeError):
            return cache
        if data.format == CACHE_FORMAT and data.root == cache.root:
            cache.known = dict(data.files)
            cache.recent = set(data.recent)
        return cache

    def contents(self) -> set[str]:
        """Every content this cache has seen in the directory (racy files' included)."""
        return {v[4] for v in self.known.values()} | self.recent

    def save(self) -> None:
        """Keep the cache for the next process (atomically, 0600 in a 0700 directory),
        without its racy entries. Best effort: a home that cannot be written only costs
        the next process the time to hash again."""
        if self.file is None or not self.dirty:
            return
        files = {p: v for p, v in self.known.items() if p not in self.racy}
        recent = sorted({self.known[p][4] for p in self.racy if p in self.known})
        data = msgspec.json.encode(_CacheFile(CACHE_FORMAT, self.root, files, recent))
        tmp = self.file.with_name(f".{self.file.name}.{os.getpid()}.tmp")
        with contextlib.suppress(OSError, GpuwsError):
            ensure_private_dir(self.file.parent)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self.file)
            self.dirty = False
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def tree_sha256(entries: list[protocol.WsEntry]) -> str:
    """The tree's identity: the hash of its sorted (path, mode, sha256, size) lines."""
    h = hashlib.sha256()
    for e in entries:
        h.update(f"{e.path}\0{e.mode:o}\0{e.sha256}\0{e.size}\n".encode("utf-8",
                                                                       "surrogateescape"))
    return h.hexdigest()


def is_git_tree(directory: Path) -> bool:
    """Whether ``directory`` lies inside a git work tree (and git is installed)."""
    return inside_work_tree(directory)


def scan(directory: Path, caps: Caps = DEFAULT_CAPS, cache: HashCache | None = None) -> Manifest:
    """The manifest of ``directory``, checked against ``caps``.

    Links to nothing or in a loop, and files that vanish before they are read, are left
    out, each a :class:`Note` of the manifest.

    Raises:
        WorkspaceError: not a directory; a symlink leaving the tree (or to a directory);
            a name that is not UTF-8 or too long; a file, the file count or the tree over
            its cap (the biggest files named); a file that cannot be read.
    """
    root = directory.expanduser().resolve()
    if not root.is_dir():
        raise WorkspaceError(f"{directory} is not a directory",
                             remedy="give -W the project's directory")
    git = is_git_tree(root)
    safegit = SafeGit(root) if git else None
    names = _git_files(safegit) if safegit is not None else _walked_files(root)
    cache = cache if cache is not None else HashCache()
    found: list[tuple[str, int, int, str]] = []  # (path, mode, size, absolute path)
    looked: dict[str, os.stat_result] = {}
    notes: list[Note] = []
    for rel in names:
        full = os.path.join(root, rel)
        try:
            st = os.lstat(full)
        except (FileNotFoundError, NotADirectoryError):
            continue  # in git's index but deleted in the work tree: not part of the tree
        if stat.S_ISLNK(st.st_mode):
            # Not strict: a loop or a missing target resolves as far as it goes (a loop's
            # own name, the missing path), which says whether it leaves the tree.
            target = os.path.realpath(full)
            if not (target + os.sep).startswith(str(root) + os.sep) or target == str(root):
                raise WorkspaceError(f"{rel} is a symlink to {target}, outside {root}",
                                     remedy="copy what it points to into the project, or "
                                            "ignore it (.gitignore)")
            try:
                st = os.stat(full)
            except OSError as exc:
                # An editor's lock (Emacs: `.#name -> user@host.PID:TIME`), a link whose
                # file was deleted, a loop: nothing to send, and nothing to refuse.
                if exc.errno == errno.ELOOP:
                    notes.append(Note(rel, LOOP))
                elif exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    notes.append(Note(rel, DANGLING))
                else:
                    raise WorkspaceError(f"cannot read {rel}: {exc.strerror or exc}",
                                         remedy="fix its permissions, or ignore it "
                                                "(.gitignore)") from exc
                continue
            if stat.S_ISDIR(st.st_mode):
                raise WorkspaceError(f"{rel} is a symlink to a directory; workspaces carry "
                                     "files only", remedy="ignore it (.gitignore)")
            full = target
        if not stat.S_ISREG(st.st_mode):
            continue  # a submodule's directory, a socket, a FIFO: nothing to send
        _check_name(rel)
        if len(found) >= caps.files:
            raise WorkspaceError(f"{root} holds more than {caps.files:,} files",
                                 remedy="ignore what the pod does not need (.gitignore), or "
                                        "give -W a smaller directory")
        mode = 0o755 if st.st_mode & 0o111 else 0o644
        found.append((rel, mode, st.st_size, full))
        looked[rel] = st
    _check_sizes(root, found, caps)
    # The manifest travels as one request line; each entry is its path, a hash and ~40
    # bytes of JSON. Far beyond any tree within the caps' defaults, but a cap raised (or
    # 20,000 very long paths) must be refused here, not dropped by the pod as too long.
    line = sum(len(f[0].encode("utf-8")) + 110 for f in found)
    if line > MAX_LINE - (64 << 10):
        raise WorkspaceError(f"{root}'s file list would be a {humanfmt.size(line)} request, "
                             f"over the protocol's {humanfmt.size(MAX_LINE)} line",
                             remedy="fewer files or shorter paths (.gitignore), or give -W a "
                                    "smaller directory")
    entries = []
    for rel, mode, _, full in sorted(found, key=lambda f: f[0].encode("utf-8")):
        st = looked[rel]
        digest = cache.lookup(full, st)  # the first look suffices where the cache knows it
        if digest is None:
            try:
                st = os.stat(full)  # the size that goes with the hash, should it have grown
                digest = cache.sha256(full, st)
            except (FileNotFoundError, NotADirectoryError):
                notes.append(Note(rel, VANISHED))  # a backup file, an editor's temporary
                continue
            except OSError as exc:
                raise WorkspaceError(f"cannot read {rel}: {exc.strerror or exc}",
                                     remedy="fix its permissions, or ignore it "
                                            "(.gitignore)") from exc
        entries.append(protocol.WsEntry(rel, mode, digest, st.st_size))
    cache.keep_only({f[3] for f in found})
    return Manifest(root, entries, tree_sha256(entries), git, notes, safegit)


def _check_name(rel: str) -> None:
    try:
        size = len(rel.encode("utf-8"))
    except UnicodeEncodeError:
        raise WorkspaceError(f"{rel!r}: the file name is not UTF-8",
                             remedy="rename it, or ignore it (.gitignore)") from None
    if size > MAX_PATH_BYTES:
        raise WorkspaceError(f"{rel[:80]}…: a path of {size} bytes (limit {MAX_PATH_BYTES})",
                             remedy="shorten it, or ignore it (.gitignore)")


def _check_sizes(root: Path, found: list[tuple[str, int, int, str]], caps: Caps) -> None:
    biggest = sorted(found, key=lambda f: -f[2])[:5]
    named = ", ".join(f"{rel} ({humanfmt.size(size)})" for rel, _, size, _ in biggest)
    over = [f for f in biggest if f[2] > caps.file_bytes]
    if over:
        raise WorkspaceError(
            f"{over[0][0]} is {humanfmt.size(over[0][2])}, over the "
            f"{humanfmt.size(caps.file_bytes)} a workspace file may be (biggest: {named})",
            remedy="ignore it (.gitignore) and fetch it on the pod, or give -W a smaller "
                   "directory")
    total = sum(f[2] for f in found)
    if total > caps.tree_bytes:
        raise WorkspaceError(
            f"{root} holds {humanfmt.size(total)}, over the {humanfmt.size(caps.tree_bytes)} "
            f"a workspace may be (biggest: {named})",
            remedy="ignore what the pod does not need (.gitignore), or give -W a smaller "
                   "directory")


def _git_files(safegit: SafeGit) -> list[str]:
    root = safegit.root
    try:
        # With the project's config unable to run programs: ls-files reads the index,
        # and a repository's core.fsmonitor runs on every index read (safegit).
        out = safegit("ls-files", "--cached", "--others", "--exclude-standard", "-z")
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WorkspaceError(f"git ls-files failed in {root}: {exc}") from exc
    if out.returncode != 0:
        raise WorkspaceError(f"git ls-files failed in {root}: "
                             f"{out.stderr.decode('utf-8', 'replace').strip()[-300:]}")
    # A path changed both in the index and the work tree is listed once; an unmerged one
    # once per stage: keep each once.
    return list(dict.fromkeys(os.fsdecode(p) for p in out.stdout.split(b"\0") if p))


def _walked_files(root: Path) -> Iterator[str]:
    """Every file under ``root`` that no ``.gitignore`` there ignores, junk left out."""
    # (directory relative to root, its .gitignore's spec) for the directories walked into,
    # deepest last: a deeper file's verdict overrides a shallower one, as in git.
    specs: list[tuple[str, pathspec.GitIgnoreSpec]] = []

    def ignored(rel: str, is_dir: bool) -> bool:
        verdict = None
        for base, spec in specs:
            if base and not rel.startswith(base + "/"):
                continue
            sub = rel[len(base) + 1:] if base else rel
            result = spec.check_file(sub + "/" if is_dir else sub)
            if result.include is not None:
                verdict = result.include
        return bool(verdict)

    for top, dirs, files in os.walk(root):
        rel_top = os.path.relpath(top, root)
        rel_top = "" if rel_top == "." else rel_top.replace(os.sep, "/")
        specs = [(b, s) for b, s in specs if not rel_top or rel_top == b or not b
                 or rel_top.startswith(b + "/")]
        if ".gitignore" in files:
            # Imported here: a git work tree (git decides) or a tree without .gitignore
            # never needs it, and it is ~30 ms of every `gpuws sync`'s start.
            import pathspec

            try:
                lines = Path(top, ".gitignore").read_text("utf-8", "replace").splitlines()
                specs.append((rel_top, pathspec.GitIgnoreSpec.from_lines(lines)))
            except OSError:
                pass
        keep = []
        for d in sorted(dirs):
            rel = f"{rel_top}/{d}" if rel_top else d
            if (d in JUNK_DIRS or d.endswith(JUNK_SUFFIXES)
                    or os.path.exists(os.path.join(top, d, "pyvenv.cfg")) or ignored(rel, True)):
                continue
            keep.append(d)
        dirs[:] = keep
        for name in sorted(files):
            rel = f"{rel_top}/{name}" if rel_top else name
            if name.endswith(JUNK_SUFFIXES) or name == ".DS_Store" or ignored(rel, False):
                continue
            yield rel


def _hash_file(path: str, size: int) -> str:
    h = hashlib.sha256()
    # Non-blocking: a FIFO made in the file's place since its stat must not hang the scan
    # (O_NONBLOCK changes nothing for a regular file); it is no file, as if it vanished.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileNotFoundError(errno.ENOENT, "no longer a regular file", path)
        if size <= 1 << 20:
            h.update(f.read())
        else:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()
