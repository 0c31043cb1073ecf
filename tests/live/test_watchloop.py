"""What the watch loop takes for a save (``live.watchloop.SaveFilter``), on real files and
real symlinks; the loop itself runs in tests/cli/test_watch.py (``gpuws watch``) and
tests/tui/test_watch_screen.py (the TUI), both against the local pod."""

from __future__ import annotations

from pathlib import Path

import pytest
from watchfiles import Change

from gpuws.errors import UsageError
from gpuws.live.watchloop import SaveFilter, watched_paths


def test_a_project_s_saves_are_its_own_files_not_what_a_link_leads_to(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    (root / "kern").mkdir(parents=True)
    (root / "kern" / "attn.py").write_text("x = 1\n")
    elsewhere = tmp_path / "datasets"
    elsewhere.mkdir()
    (elsewhere / "shard.bin").write_bytes(b"\0")
    # A link the workspace leaves out, but that the watcher follows into another tree.
    (root / "data").symlink_to(elsewhere)
    saves = SaveFilter([root])
    assert saves(Change.modified, str(root / "kern" / "attn.py"))
    assert saves(Change.added, str(root / "kern" / "new.py"))
    assert not saves(Change.modified, str(root / "data" / "shard.bin"))
    assert not saves(Change.modified, str(root / ".git" / "index"))
    assert not saves(Change.modified, str(root / "kern" / "__pycache__" / "attn.pyc"))
    # A link inside the project to one of its own files is the project's.
    (root / "alias.py").symlink_to(root / "kern" / "attn.py")
    assert saves(Change.modified, str(root / "alias.py"))


def test_a_file_workload_s_saves_are_that_file_s_only(tmp_path: Path) -> None:
    bench = tmp_path / "bench.py"
    bench.write_text("def run():\n    pass\n")
    saves = SaveFilter([bench])
    assert saves.files and saves(Change.modified, str(bench))
    assert not saves(Change.modified, str(tmp_path / "notes.txt"))
    # An editor saving through a link to it saves it.
    (tmp_path / "link.py").symlink_to(bench)
    assert saves(Change.modified, str(tmp_path / "link.py"))


def test_what_cannot_be_watched_is_refused_with_a_remedy(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as nothing:
        watched_paths(None, "builtin:saxpy")
    assert "-W DIR" in (nothing.value.remedy or "")
    with pytest.raises(UsageError):
        watched_paths(str(tmp_path / "missing"), "cmd:true")
    with pytest.raises(UsageError):
        watched_paths(None, f"file:{tmp_path / 'missing.py'}")
    assert watched_paths(str(tmp_path), "builtin:saxpy") == [tmp_path]
