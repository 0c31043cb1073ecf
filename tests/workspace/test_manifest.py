"""The laptop side of a workspace: which files, their manifest, refusals, git's view.

Real git work trees made here with real commits and edits; real files, links and modes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuws.errors import WorkspaceError
from gpuws.workspace.code import diff_entries
from gpuws.workspace.gitinfo import git_state
from gpuws.workspace.manifest import Caps, HashCache, scan

NEEDS_GIT = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(root: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    out = subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                         env=env)
    return out.stdout.decode().strip()


def project(root: Path) -> Path:
    """A small project: a package, a benchmark, a script, ignored and junk files."""
    (root / "mykern").mkdir(parents=True)
    (root / "mykern" / "__init__.py").write_text("from .attn import fused\n")
    (root / "mykern" / "attn.py").write_text("def fused():\n    return 42\n")
    (root / "bench").mkdir()
    (root / "bench" / "b.py").write_text("import mykern\n")
    (root / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (root / "run.sh").chmod(0o755)
    (root / ".gitignore").write_text("*.log\nout/\n")
    (root / "x.log").write_text("ignored\n")
    (root / "out").mkdir()
    (root / "out" / "big.bin").write_bytes(b"0" * 100)
    (root / "mykern" / "__pycache__").mkdir()
    (root / "mykern" / "__pycache__" / "attn.cpython-311.pyc").write_bytes(b"pyc")
    return root


def paths(root: Path) -> list[str]:
    return [e.path for e in scan(root).entries]


def test_outside_git_gitignore_and_junk_are_left_out(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    (root / ".venv").mkdir()
    (root / ".venv" / "pyvenv.cfg").write_text("home = /usr\n")
    (root / "myenv").mkdir()  # a virtualenv by any name: it has a pyvenv.cfg
    (root / "myenv" / "pyvenv.cfg").write_text("home = /usr\n")
    (root / "myenv" / "lib.py").write_text("x\n")
    (root / "bench" / ".gitignore").write_text("tmp_*\n!tmp_keep.py\n")
    (root / "bench" / "tmp_a.py").write_text("a\n")
    (root / "bench" / "tmp_keep.py").write_text("k\n")
    m = scan(root)
    assert [e.path for e in m.entries] == [
        ".gitignore", "bench/.gitignore", "bench/b.py", "bench/tmp_keep.py",
        "mykern/__init__.py", "mykern/attn.py", "run.sh"]
    assert not m.git
    modes = {e.path: e.mode for e in m.entries}
    assert modes["run.sh"] == 0o755 and modes["bench/b.py"] == 0o644


@NEEDS_GIT
def test_a_git_tree_is_what_git_lists(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    git(root, "init", "-q")
    git(root, "add", "-A")  # __pycache__ too: in git, git decides, and it was added
    git(root, "rm", "-rq", "--cached", "mykern/__pycache__")
    git(root, "commit", "-qm", "one")
    (root / "new.py").write_text("new\n")  # untracked, not ignored: it travels
    (root / "bench" / "b.py").unlink()  # deleted in the work tree: it does not
    m = scan(root)
    assert m.git
    # The .pyc is now untracked and not ignored: git lists it, so it travels.
    assert [e.path for e in m.entries] == [".gitignore", "mykern/__init__.py",
                                           "mykern/__pycache__/attn.cpython-311.pyc",
                                           "mykern/attn.py", "new.py", "run.sh"]
    (root / ".gitignore").write_text("*.log\nout/\n__pycache__/\n")
    # A subdirectory of the work tree is a workspace of its own: paths relative to it.
    assert [e.path for e in scan(root / "mykern").entries] == ["__init__.py", "attn.py"]


@NEEDS_GIT
def test_git_state_commit_dirty_and_changed_files(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    git(root, "init", "-q")
    assert git_state(root) is not None and git_state(root).commit is None  # type: ignore
    git(root, "add", "-A")
    git(root, "commit", "-qm", "one")
    head = git(root, "rev-parse", "HEAD")
    clean = git_state(root)
    assert clean is not None and clean.commit == head and not clean.dirty and not clean.changed
    (root / "mykern" / "attn.py").write_text("def fused():\n    return 43\n")
    (root / "notes.py").write_text("n\n")
    (root / "run.sh").unlink()
    dirty = git_state(root)
    assert dirty is not None and dirty.commit == head and dirty.dirty
    assert dirty.changed == ["mykern/attn.py", "notes.py", "run.sh"]
    sub = git_state(root / "mykern")
    assert sub is not None and sub.changed == ["attn.py"]


def test_tree_hash_follows_content_and_mode(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    first = scan(root)
    assert scan(root).tree_sha256 == first.tree_sha256
    (root / "bench" / "b.py").chmod(0o755)
    moded = scan(root)
    assert moded.tree_sha256 != first.tree_sha256
    (root / "mykern" / "attn.py").write_text("changed\n")
    edited = scan(root)
    diff = diff_entries(first.entries, edited.entries)
    assert diff.modified == ["bench/b.py", "mykern/attn.py"] and not diff.added


def test_the_hash_cache_rehashes_only_what_changed(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    cache = HashCache()
    scan(root, cache=cache)
    hashed = dict(cache.known)
    (root / "mykern" / "attn.py").write_text("def fused():\n    return 7\n")
    scan(root, cache=cache)
    changed = [p for p in cache.known if cache.known[p] != hashed.get(p)]
    assert changed == [str(root / "mykern" / "attn.py")]


def test_a_symlink_out_of_the_tree_is_refused(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    secret = tmp_path / "secret.txt"
    secret.write_text("key\n")
    (root / "mykern" / "creds.txt").symlink_to(secret)
    with pytest.raises(WorkspaceError, match=r"creds\.txt is a symlink to .*outside"):
        scan(root)


def test_a_symlink_inside_the_tree_travels_as_its_file(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    (root / "alias.py").symlink_to(root / "mykern" / "attn.py")
    by = scan(root).by_path()
    assert by["alias.py"].sha256 == by["mykern/attn.py"].sha256


def test_caps_refuse_naming_the_biggest_files(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    (root / "weights.bin").write_bytes(b"w" * 5000)
    (root / "data.bin").write_bytes(b"d" * 3000)
    with pytest.raises(WorkspaceError, match=r"weights.bin is 4\.9 KiB.*biggest: weights.bin"
                       r".*data.bin") as exc:
        scan(root, Caps(file_bytes=4096))
    assert exc.value.exit_code == 2
    with pytest.raises(WorkspaceError, match=r"over the .* a workspace may be \(biggest: "
                                             r"weights.bin .*, data.bin"):
        scan(root, Caps(tree_bytes=6000))
    with pytest.raises(WorkspaceError, match="more than 3 files"):
        scan(root, Caps(files=3))


def test_not_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceError, match="not a directory"):
        scan(tmp_path / "nope")


def test_a_file_list_longer_than_a_line_is_refused(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifest travels as one request line: a list longer than the line is refused
    here (with the line shortened so that a small tree overflows it), never sent to be
    dropped by the pod."""
    from gpuws.workspace import manifest

    root = project(tmp_path / "p")
    assert scan(root).entries
    monkeypatch.setattr(manifest, "MAX_LINE", (64 << 10) + 300)
    with pytest.raises(WorkspaceError, match=r"file list would be a .* request, over the "
                                             "protocol's"):
        scan(root)
