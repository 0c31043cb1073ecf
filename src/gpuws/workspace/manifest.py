"""A local project as a content-addressed manifest: (path, mode, sha256, size) per file.

Which files: in a git work tree, what ``git ls-files --cached --others
--exclude-standard`` lists under the directory (tracked files and new ones git does not
ignore); elsewhere every file under it minus the patterns of its ``.gitignore`` files (read
by :mod:`pathspec`, git's own rules, nested files included) and the usual junk
(:data:`JUNK_DIRS`, virtualenvs, bytecode). Everything is checked before a byte is sent:
a symlink that leaves the tree, a file over :attr:`Caps.file_bytes`, a tree over
:attr:`Caps.tree_bytes` or :attr:`Caps.files` is refused, naming the biggest files.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from .. import protocol
from ..errors import WorkspaceError
from ..protocol import MAX_LINE
from ..text import humanfmt

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


@dataclass
class Manifest:
    """A tree as the pod will hold it; ``entries`` sorted by path."""

    root: Path
    entries: list[protocol.WsEntry]
    tree_sha256: str
    #: The git checkout it came from, or None outside one.
    git: bool = False

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)

    def by_path(self) -> dict[str, protocol.WsEntry]:
        return {e.path: e for e in self.entries}


@dataclass
class HashCache:
    """sha256 of files already hashed, trusted while size, mtime, ctime and inode agree
    (what git's index trusts): a repeated sync hashes only what changed."""

    known: dict[str, tuple[int, int, int, int, str]] = field(default_factory=dict)

    def sha256(self, path: str, st: os.stat_result) -> str:
        key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        hit = self.known.get(path)
        if hit is not None and hit[:4] == key:
            return hit[4]
        digest = _hash_file(path, st.st_size)
        self.known[path] = (*key, digest)
        return digest


def tree_sha256(entries: list[protocol.WsEntry]) -> str:
    """The tree's identity: the hash of its sorted (path, mode, sha256, size) lines."""
    h = hashlib.sha256()
    for e in entries:
        h.update(f"{e.path}\0{e.mode:o}\0{e.sha256}\0{e.size}\n".encode("utf-8",
                                                                       "surrogateescape"))
    return h.hexdigest()


def is_git_tree(directory: Path) -> bool:
    """Whether ``directory`` lies inside a git work tree (and git is installed)."""
    try:
        out = subprocess.run(["git", "-C", str(directory), "rev-parse",
                              "--is-inside-work-tree"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip() == b"true"


def scan(directory: Path, caps: Caps = DEFAULT_CAPS, cache: HashCache | None = None) -> Manifest:
    """The manifest of ``directory``, checked against ``caps``.

    Raises:
        WorkspaceError: not a directory; a symlink leaving the tree (or to a directory);
            a name that is not UTF-8 or too long; a file, the file count or the tree over
            its cap (the biggest files named).
    """
    root = directory.expanduser().resolve()
    if not root.is_dir():
        raise WorkspaceError(f"{directory} is not a directory",
                             remedy="give -W the project's directory")
    git = is_git_tree(root)
    names = _git_files(root) if git else _walked_files(root)
    cache = cache if cache is not None else HashCache()
    found: list[tuple[str, int, int, str]] = []  # (path, mode, size, absolute path)
    for rel in names:
        full = os.path.join(root, rel)
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            continue  # in git's index but deleted in the work tree: not part of the tree
        if stat.S_ISLNK(st.st_mode):
            target = os.path.realpath(full)
            if not (target + os.sep).startswith(str(root) + os.sep) or target == str(root):
                raise WorkspaceError(f"{rel} is a symlink to {target}, outside {root}",
                                     remedy="copy what it points to into the project, or "
                                            "ignore it (.gitignore)")
            st = os.stat(full)
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
        st = os.stat(full)  # the size that goes with the hash, should the file have grown
        entries.append(protocol.WsEntry(rel, mode, cache.sha256(full, st), st.st_size))
    return Manifest(root, entries, tree_sha256(entries), git)


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


def _git_files(root: Path) -> list[str]:
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "--cached", "--others",
                              "--exclude-standard", "-z"], capture_output=True, timeout=120)
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
    with open(path, "rb") as f:
        if size <= 1 << 20:
            h.update(f.read())
        else:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()
