"""Workspaces on the pod: a content store of blobs and the trees made from it.

The laptop sends a project as a manifest (path, mode, sha256, size per file); blobs the
pod lacks arrive in ``workspace_put`` requests and are kept in ``<cache>/wsblobs/<sha256>``
once their bytes match their name; ``workspace_apply`` then makes
``<cache>/workspaces/<name>/`` exactly that tree: files whose content, mode or on-disk
state changed are written, paths the previous manifest had and this one lacks are removed.
Files the tree holds that no manifest named (``__pycache__``, a build directory a run
made) are left alone, so a build cache survives the next edit.

The tree is written by code the person did not write (a workload runs in it), so nothing
found there is trusted: every path is walked one component at a time from a directory
descriptor with ``O_NOFOLLOW``; a symlink or file where a directory of the manifest should
be is removed (the link, never what it points to) and replaced by a directory; a file is
written to a fresh name (``O_EXCL``) beside its target and renamed over it, which replaces
a planted link instead of following it. So a sync never writes outside the workspace.
"""

from __future__ import annotations

import base64
import binascii
import errno
import fcntl
import hashlib
import json
import os
import re
import stat
import time
import zlib
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

from .runs import cache_root, ensure_private_dir

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HEX = re.compile(r"^[0-9a-f]{64}$")
#: Bounds on what one request may describe (the laptop refuses far less; see
#: gpuws/workspace/manifest.py): a path's bytes and depth, a blob's size, a manifest's files.
MAX_PATH = 1024
MAX_DEPTH = 64
MAX_BLOB = 1 << 30
MAX_FILES = 100000
MODES = (0o644, 0o755)
_READ = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
#: Numbers the temporary names this process writes (with its pid: unique on the pod).
_tmp_counter = [0]


class WorkspaceError(ValueError):
    """A request that cannot be applied as asked (answered as a bad request)."""


def workspaces_root() -> str:
    return os.path.join(cache_root(), "workspaces")


def blobs_root() -> str:
    return os.path.join(cache_root(), "wsblobs")


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise WorkspaceError("invalid workspace name %r (letters, digits, . _ -; at most 64)"
                             % (name,))
    return name


def workspace_dir(name: str) -> str:
    """Where workspace ``name`` lives (its name checked: it cannot leave the root)."""
    return os.path.join(workspaces_root(), check_name(name))


def split_path(path: Any) -> List[str]:
    """A manifest path's components, refusing anything that is not a plain relative path."""
    if not isinstance(path, str) or not path or "\x00" in path \
            or len(path.encode("utf-8", "surrogatepass")) > MAX_PATH:
        raise WorkspaceError("invalid path in the manifest: %r" % (path,)[:200])
    parts = path.split("/")
    # Membership tests in C: a manifest holds thousands of paths.
    if len(parts) > MAX_DEPTH or "" in parts or "." in parts or ".." in parts:
        raise WorkspaceError("invalid path in the manifest: %r" % (path,)[:200])
    return parts


def _check_sha(value: Any) -> str:
    if not isinstance(value, str) or not _HEX.match(value):
        raise WorkspaceError("invalid sha256 %r" % (value,)[:100])
    return value


def _int(value: Any, what: str, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= high:
        raise WorkspaceError("invalid %s %r" % (what, value))
    return value


# ----------------------------------------------------------------------------- blobs
def _blob_fd(sha: str) -> Optional[int]:
    try:
        return os.open(os.path.join(blobs_root(), sha), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None


def has_blob(sha: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(os.path.join(blobs_root(), sha)).st_mode)
    except OSError:
        return False


def put(pieces: Any, data: Any, compressed: bool) -> Tuple[int, List[str]]:
    """Store the pieces of one ``workspace_put``; returns (blobs completed, hashes refused).

    A piece is appended to ``<sha>.part`` only where it continues it (offset 0 starts
    over); a blob is kept only when its bytes hash to its name.
    """
    if not isinstance(pieces, list) or not isinstance(data, str):
        raise WorkspaceError("a put needs pieces (a list) and data (base64 text)")
    parsed = []
    total = 0
    for p in pieces:
        if not isinstance(p, list) or len(p) != 4:
            raise WorkspaceError("a piece is [sha256, size, offset, length]")
        sha = _check_sha(p[0])
        size = _int(p[1], "blob size", MAX_BLOB)
        offset = _int(p[2], "offset", size)
        length = _int(p[3], "length", size - offset)
        parsed.append((sha, size, offset, length))
        total += length
    try:
        raw = base64.b64decode(data.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise WorkspaceError("a put's data is not base64: %s" % exc) from None
    if compressed:
        inflater = zlib.decompressobj()
        try:
            raw = inflater.decompress(raw, total + 1)  # never more than the pieces announce
        except zlib.error as exc:
            raise WorkspaceError("a put's data is not zlib: %s" % exc) from None
    if len(raw) != total:
        raise WorkspaceError("a put announced %d bytes and carried %d" % (total, len(raw)))
    root = blobs_root()
    ensure_private_dir(root)
    stored = 0
    refused: List[str] = []
    view = memoryview(raw)
    pos = 0
    for sha, size, offset, length in parsed:
        chunk = view[pos:pos + length]
        pos += length
        if has_blob(sha):
            continue
        if offset == 0 and length == size:
            # The common case, a whole blob in one piece: checked in memory, written once.
            done = _whole_blob(root, sha, chunk)
        else:
            done = _append_piece(root, sha, size, offset, chunk)
        if done is None:
            refused.append(sha)
        elif done:
            stored += 1
    return stored, refused


def _whole_blob(root: str, sha: str, chunk: memoryview) -> Optional[bool]:
    """A blob that came whole: kept when its bytes hash to its name. Not fsynced: a blob
    torn by a crash is caught when a tree is made from it (``_write_file`` hashes what it
    copies) and asked for again."""
    if hashlib.sha256(chunk).hexdigest() != sha:
        return None
    _tmp_counter[0] += 1
    tmp = os.path.join(root, "%s.%d-%d.tmp" % (sha, os.getpid(), _tmp_counter[0]))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        while chunk:
            chunk = chunk[os.write(fd, chunk):]
    finally:
        os.close(fd)
    os.rename(tmp, os.path.join(root, sha))
    return True


def _append_piece(root: str, sha: str, size: int, offset: int,
                  chunk: memoryview) -> Optional[bool]:
    """Append to the blob's part file; True: the blob is complete and verified, False: more
    to come, None: refused (out of order, or the bytes do not match the hash)."""
    part = os.path.join(root, sha + ".part")
    fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # two laptops may send the same blob at once
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        have = os.lseek(fd, 0, os.SEEK_END)
        if offset == 0 and have:
            os.ftruncate(fd, 0)
            have = 0
        if offset != have:
            return None
        os.lseek(fd, have, os.SEEK_SET)
        while chunk:
            n = os.write(fd, chunk)
            chunk = chunk[n:]
        have = os.lseek(fd, 0, os.SEEK_END)
        if have < size:
            return False
        digest = _hash_fd(fd)
        if have != size or digest != sha:
            os.unlink(part)
            return None
        os.rename(part, os.path.join(root, sha))
        return True
    finally:
        os.close(fd)


def _hash_fd(fd: int) -> str:
    h = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while True:
        block = os.read(fd, _READ)
        if not block:
            return h.hexdigest()
        h.update(block)


# ----------------------------------------------------------------------------- trees
def _state_path(name: str) -> str:
    return os.path.join(workspaces_root(), ".state", name + ".json")


def _load_state(name: str) -> Dict[str, List[Any]]:
    """What the last apply wrote: path -> [sha, mode, size, mtime_ns, ino]. Anything
    unreadable is an empty state: every file is then checked and written again."""
    try:
        fd = os.open(_state_path(name), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
        files = data.get("files") if isinstance(data, dict) else None
        return files if isinstance(files, dict) else {}
    except (OSError, ValueError):
        return {}


def _save_state(name: str, tree: str, files: Dict[str, List[Any]]) -> None:
    path = _state_path(name)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(json.dumps({"tree": tree, "files": files}, separators=(",", ":")).encode())
    os.replace(tmp, path)


def parse_entries(entries: Any) -> List[Tuple[str, List[str], int, str, int]]:
    """The manifest, checked: (path, components, mode, sha256, size) per file, in order."""
    if not isinstance(entries, list) or len(entries) > MAX_FILES:
        raise WorkspaceError("a manifest is a list of at most %d files" % MAX_FILES)
    out = []
    seen: Set[str] = set()
    dirs: Set[str] = set()
    for e in entries:
        if not isinstance(e, list) or len(e) != 4:
            raise WorkspaceError("a manifest entry is [path, mode, sha256, size]")
        parts = split_path(e[0])
        if e[1] not in MODES or isinstance(e[1], bool):
            raise WorkspaceError("invalid mode %r for %r" % (e[1], e[0]))
        if e[0] in seen:
            raise WorkspaceError("%r is twice in the manifest" % e[0])
        seen.add(e[0])
        parent = e[0].rpartition("/")[0]
        if parent and parent not in dirs:  # its own parents are in once it is
            for i in range(1, len(parts)):
                dirs.add("/".join(parts[:i]))
        out.append((e[0], parts, int(e[1]), _check_sha(e[2]), _int(e[3], "size", MAX_BLOB)))
    clash = seen & dirs
    if clash:
        raise WorkspaceError("%r is both a file and a directory in the manifest"
                             % sorted(clash)[0])
    return out


def _lstat(path: str) -> Optional[os.stat_result]:
    try:
        return os.lstat(path)
    except OSError:
        return None


class _Dirs:
    """Directory descriptors inside the tree, opened component by component with
    O_NOFOLLOW (created where missing, a link or file in a directory's place removed);
    a few are kept open because a manifest lists the files of one directory together."""

    KEEP = 64

    def __init__(self, root_fd: int) -> None:
        self.root_fd = root_fd
        self._open: Dict[Tuple[str, ...], int] = {}

    def get(self, parts: List[str], create: bool) -> Optional[int]:
        key = tuple(parts)
        if not key:
            return self.root_fd
        fd = self._open.get(key)
        if fd is not None:
            return fd
        parent = self.get(parts[:-1], create)
        if parent is None:
            return None
        name = parts[-1]
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                raise
            if not create:
                return None  # missing, or not a directory of ours: nothing of ours below
            if exc.errno != errno.ENOENT:
                remove_any(parent, name)  # a link or a file where our directory belongs
            os.mkdir(name, 0o700, dir_fd=parent)
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        if len(self._open) >= self.KEEP:
            self.close()
        self._open[key] = fd
        return fd

    def close(self) -> None:
        for fd in self._open.values():
            os.close(fd)
        self._open.clear()


def remove_any(dir_fd: int, name: str, depth: int = 0) -> None:
    """Remove ``name`` in ``dir_fd``: a file or link is unlinked (a link's target is never
    touched), a directory emptied the same way and removed."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    if depth > 256:
        raise OSError(errno.ELOOP, "directory nested too deeply to remove", name)
    fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    try:
        for child in os.listdir(fd):
            remove_any(fd, child, depth + 1)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def _open_root(name: str) -> int:
    top = workspaces_root()
    ensure_private_dir(top)
    ensure_private_dir(os.path.join(top, ".state"))
    top_fd = os.open(top, _DIR_FLAGS)
    try:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=top_fd)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                remove_any(top_fd, name)
            os.mkdir(name, 0o700, dir_fd=top_fd)
            return os.open(name, _DIR_FLAGS, dir_fd=top_fd)
    finally:
        os.close(top_fd)


def _up_to_date(root: str, path: str, mode: int, sha: str, old: Any,
                checked: Dict[str, bool]) -> bool:
    """Whether the file is as the last apply left it (same hash and mode asked, and on disk
    the same size, mtime, inode and mode, with every directory above it a real one)."""
    if not isinstance(old, list) or len(old) != 5 or old[0] != sha or old[1] != mode:
        return False
    parent = path.rpartition("/")[0]
    if parent and not _real_dir(root, parent, checked):
        return False
    st = _lstat(root + "/" + path)
    return (st is not None and stat.S_ISREG(st.st_mode) and st.st_size == old[2]
            and st.st_mtime_ns == old[3] and st.st_ino == old[4]
            and stat.S_IMODE(st.st_mode) == mode)


def _real_dir(root: str, rel: str, checked: Dict[str, bool]) -> bool:
    """Whether ``rel`` and every directory above it are real directories (no link), each
    looked at once per apply."""
    ok = checked.get(rel)
    if ok is None:
        parent = rel.rpartition("/")[0]
        if parent and not _real_dir(root, parent, checked):
            ok = False
        else:
            st = _lstat(root + "/" + rel)
            ok = st is not None and stat.S_ISDIR(st.st_mode)
        checked[rel] = ok
    return ok


def apply(name: str, entries: Any, tree: Any) -> Dict[str, Any]:
    """Make workspace ``name`` the manifest's tree; the answer's fields (see
    ``protocol.WorkspaceState``). Nothing changes while a blob is missing."""
    check_name(name)
    tree = _check_sha(tree)
    files = parse_entries(entries)
    root = workspace_dir(name)
    root_fd = _open_root(name)
    lock = os.open(_state_path(name)[:-5] + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW,
                   0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one apply per workspace at a time
        state = _load_state(name)
        checked: Dict[str, bool] = {}
        todo = [f for f in files if not _up_to_date(root, f[0], f[2], f[3], state.get(f[0]),
                                                   checked)]
        missing = sorted({f[3] for f in todo if not has_blob(f[3])})
        if missing:
            return {"name": name, "missing": missing, "applied": False}
        dirs = _Dirs(root_fd)
        try:
            wanted = {f[0] for f in files}
            removed = _remove_gone(dirs, (p for p in state if p not in wanted))
            new_state = {p: v for p, v in state.items() if p in wanted}
            corrupt: List[str] = []
            for path, parts, mode, sha, size in todo:
                rec = _write_file(dirs, parts, mode, sha, size)
                if rec is None:
                    corrupt.append(sha)
                    new_state.pop(path, None)
                else:
                    new_state[path] = rec
        finally:
            dirs.close()
        if todo or removed or new_state != state:
            _save_state(name, tree, new_state)
        prune_blobs(current=(name, new_state))
        if corrupt:
            # A blob changed in the store since it was verified: it is gone now, and the
            # laptop sends it again (the files already written stay written).
            return {"name": name, "missing": sorted(set(corrupt)), "applied": False}
        return {"name": name, "applied": True, "root": root, "written": len(todo),
                "removed": removed}
    finally:
        os.close(lock)
        os.close(root_fd)


#: A blob no workspace's state names is removed once it is this old: younger ones may be
#: the puts of a laptop whose apply has not come yet (several laptops may share a pod).
PRUNE_AGE_S = 3600.0


def prune_blobs(now: Optional[float] = None,
                current: Optional[Tuple[str, Dict[str, List[Any]]]] = None) -> int:
    """Remove blobs (and abandoned ``.part`` files) that no workspace's state names and
    that are older than :data:`PRUNE_AGE_S`, so the store does not grow without bound
    with every version ever sent. Returns how many went. ``current`` is the (name, files)
    state the caller has just written, used instead of reading it back."""
    cutoff = (time.time() if now is None else now) - PRUNE_AGE_S
    referenced: Set[str] = set()
    state_dir = os.path.join(workspaces_root(), ".state")
    try:
        names = os.listdir(state_dir)
    except OSError:
        return 0
    for entry in names:
        if entry.endswith(".json"):
            # The workspace just applied is taken as written, not read back.
            state = (current[1] if current is not None and entry[:-5] == current[0]
                     else _load_state(entry[:-5]))
            for rec in state.values():
                if isinstance(rec, list) and rec:
                    referenced.add(str(rec[0]))
    removed = 0
    try:
        blobs = os.scandir(blobs_root())
    except OSError:
        return 0
    with blobs:
        for item in blobs:
            sha = item.name.split(".", 1)[0]
            if sha in referenced:
                continue
            try:
                st = item.stat(follow_symlinks=False)
                if st.st_mtime < cutoff:
                    os.unlink(item.path)
                    removed += 1
            except OSError:
                pass  # gone already, or another agent's: next time
    return removed


def _remove_gone(dirs: _Dirs, paths: Iterable[str]) -> int:
    removed = 0
    emptied: Set[Tuple[str, ...]] = set()
    for path in paths:
        try:
            parts = split_path(path)
        except WorkspaceError:
            continue  # a state file we did not write: nothing of ours at that path
        fd = dirs.get(parts[:-1], create=False)
        if fd is None:
            continue  # its directory is gone or is not ours any more: nothing to remove
        try:
            remove_any(fd, parts[-1])
            removed += 1
        except FileNotFoundError:
            pass
        for i in range(1, len(parts)):
            emptied.add(tuple(parts[:i]))
    dirs.close()
    # Directories left empty by the removals go too (deepest first); others stay.
    for dir_parts in sorted(emptied, key=len, reverse=True):
        fd = dirs.get(list(dir_parts[:-1]), create=False)
        if fd is not None:
            try:
                os.rmdir(dir_parts[-1], dir_fd=fd)
            except OSError:
                pass  # not empty, or already gone
        dirs.close()
    return removed


def _write_file(dirs: _Dirs, parts: List[str], mode: int, sha: str,
                size: int) -> Optional[List[Any]]:
    """Copy blob ``sha`` to the path (fresh name, then rename over the target); None when
    the blob no longer matches its hash (it is removed from the store)."""
    src = _blob_fd(sha)
    if src is None:
        return None
    dir_fd = dirs.get(parts[:-1], create=True)
    assert dir_fd is not None
    _tmp_counter[0] += 1
    tmp = ".gpuws-%d-%d.tmp" % (os.getpid(), _tmp_counter[0])
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                  dir_fd=dir_fd)
    h = hashlib.sha256()
    try:
        while True:
            block = os.read(src, _READ)
            if not block:
                break
            h.update(block)
            view = memoryview(block)
            while view:
                view = view[os.write(out, view):]
        os.fchmod(out, mode)
    finally:
        os.close(out)
        os.close(src)
    if h.hexdigest() != sha:
        os.unlink(tmp, dir_fd=dir_fd)
        try:
            os.unlink(os.path.join(blobs_root(), sha))
        except OSError:
            pass
        return None
    name = parts[-1]
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            remove_any(dir_fd, name)  # a directory where the manifest has a file
    except FileNotFoundError:
        pass
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    if name.endswith(".py"):
        _drop_bytecode(dir_fd, name[:-3])
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    return [sha, mode, st.st_size, st.st_mtime_ns, st.st_ino]


def _drop_bytecode(dir_fd: int, stem: str) -> None:
    """Remove ``__pycache__/STEM.*.pyc`` beside a module just written.

    Python trusts a .pyc whose recorded source mtime (whole seconds) and size match the
    file: an edit of the same size synced within the second of the last import (``BLOCK
    = 64`` to ``BLOCK = 32``, which ``gpuws watch`` makes a second's work) would run the
    old code. Never follows a link (a planted ``__pycache__`` link is not entered).
    """
    try:
        fd = os.open("__pycache__", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                     dir_fd=dir_fd)
    except OSError:
        return
    try:
        for entry in os.listdir(fd):
            # STEM.cpython-311.pyc, STEM.cpython-311.opt-1.pyc (a module's name has no dot).
            if entry.startswith(stem + ".") and entry.endswith(".pyc"):
                try:
                    os.unlink(entry, dir_fd=fd)
                except OSError:
                    pass
    finally:
        os.close(fd)


def resolve_file(name: str, path: str) -> str:
    """A ``file:PATH`` workload inside workspace ``name``: its real path, refused when it
    leaves the workspace (``..``, an absolute path, or a link that points out)."""
    root = os.path.realpath(workspace_dir(name))
    real = os.path.realpath(os.path.join(root, path))
    if not real.startswith(root + os.sep):
        raise WorkspaceError("file:%s is not inside the workspace %s" % (path, name))
    return real
