"""The workspace hash cache kept between processes (``GPUWS_HOME/hashes``).

A new ``gpuws sync`` must not read every file of a large tree again: the hashes of the last
scan are kept, trusted while size, mtime, ctime and inode agree, as git's index trusts them.
What is checked here: that a new process hashes only what changed; that a hash read too
soon after its file's last change is never trusted by a later process; that a cache that
is corrupt, foreign, oversized or lying costs time and never a wrong tree; that it is
private. Real files and a real agent (the local transport); the hash function is wrapped
only to count its calls.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuws.client import AgentClient
from gpuws.transport import make_transport
from gpuws.workspace import manifest
from gpuws.workspace.manifest import HashCache, scan
from gpuws.workspace.sync import WorkspaceSync


def make_tree(root: Path, files: int = 30) -> Path:
    for i in range(files):
        d = root / f"d{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.py").write_text(f"VALUE = {i}\n" * (i + 1))
    return root


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The paths each scan reads to hash, in order (the real hash, counted)."""
    calls: list[str] = []
    real = manifest._hash_file

    def counting(path: str, size: int) -> str:
        calls.append(path)
        return real(path, size)

    monkeypatch.setattr(manifest, "_hash_file", counting)
    yield calls


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files written by the test count as long settled (a test cannot wait RACY_NS for
    each file's ctime to age; the racy rule itself is tested below with its default)."""
    monkeypatch.setattr(manifest, "RACY_NS", -(10 ** 12))


def cache_file(root: Path) -> Path:
    (found,) = (Path(os.environ["GPUWS_HOME"]) / "hashes").glob("*.json")
    return found


def test_a_new_process_hashes_only_the_changed_file(tmp_path: Path, hashed: list[str],
                                                    settled: None) -> None:
    root = make_tree(tmp_path / "proj")
    first = WorkspaceSync(root).scan()
    assert len(hashed) == 30
    (root / "d1" / "f4.py").write_text("VALUE = 'edited'\n")
    hashed.clear()
    again = WorkspaceSync(root).scan()  # a new object: only what the data dir kept
    assert hashed == [str(root / "d1" / "f4.py")]
    assert again.entries == scan(root).entries  # what a scan without any cache says
    assert again.tree_sha256 != first.tree_sha256


def test_the_cache_is_private(tmp_path: Path, settled: None) -> None:
    root = make_tree(tmp_path / "proj")
    WorkspaceSync(root).scan()
    path = cache_file(root)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left


def test_a_hash_read_just_after_a_change_is_not_trusted_by_the_next_process(
        tmp_path: Path, hashed: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Files changed within RACY_NS of being read could change again within the same
    clock tick, unseen by size, times and inode; the next process hashes them again, and
    knows their contents only as contents (for what it sends unasked). The window is
    widened to a day here, so a slow machine cannot let the files age out of it."""
    monkeypatch.setattr(manifest, "RACY_NS", 86_400 * 10 ** 9)
    root = make_tree(tmp_path / "proj", files=3)
    WorkspaceSync(root).scan()
    kept = json.loads(cache_file(root).read_bytes())
    assert kept["files"] == {}
    assert sorted(kept["recent"]) == sorted(e.sha256 for e in scan(root).entries)
    hashed.clear()
    WorkspaceSync(root).scan()
    assert len(hashed) == 3


@pytest.mark.parametrize("damage", ["garbage", "bad-hash", "other-root", "format", "huge"])
def test_a_bad_cache_file_means_hashing_again(tmp_path: Path, hashed: list[str],
                                              settled: None, damage: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_tree(tmp_path / "proj")
    WorkspaceSync(root).scan()
    path = cache_file(root)
    kept = json.loads(path.read_bytes())
    if damage == "garbage":
        path.write_bytes(b"\x00{not json")
    elif damage == "bad-hash":
        first = next(iter(kept["files"]))
        kept["files"][first][4] = "../../etc/passwd"
        path.write_text(json.dumps(kept))
    elif damage == "other-root":
        kept["root"] = str(tmp_path / "elsewhere")
        path.write_text(json.dumps(kept))
    elif damage == "format":
        kept["format"] = 99
        path.write_text(json.dumps(kept))
    else:
        monkeypatch.setattr(manifest, "MAX_CACHE_BYTES", path.stat().st_size - 1)
    hashed.clear()
    got = WorkspaceSync(root).scan()
    assert len(hashed) == 30
    assert got.entries == scan(root).entries


async def test_a_lying_cache_is_corrected_by_syncing_again(tmp_path: Path,
                                                           settled: None) -> None:
    """A cache that names the wrong content for a file whose state it matches (a stale
    entry, a tampered file): the bytes read to send it do not hash to it, so the sync
    takes the hash of what it read (its stat unchanged across the read: consistent),
    sends the truth, and the cache forgets the lie."""
    root = make_tree(tmp_path / "proj")
    WorkspaceSync(root).scan()
    path = cache_file(root)
    kept = json.loads(path.read_bytes())
    victim = str(root / "d2" / "f5.py")
    kept["files"][victim][4] = "ab" * 32
    path.write_text(json.dumps(kept))
    client = await AgentClient.connect(make_transport("local"))
    try:
        result = await WorkspaceSync(root).sync(client)
    finally:
        await client.close()
    there = Path(result.root)
    assert (there / "d2" / "f5.py").read_bytes() == Path(victim).read_bytes()
    truth = hashlib.sha256(Path(victim).read_bytes()).hexdigest()
    assert result.manifest.by_path()["d2/f5.py"].sha256 == truth
    assert result.manifest.tree_sha256 == scan(root).tree_sha256
    assert result.manifest.notes == []  # read consistently: nothing to tell
    assert HashCache.load(path, root).known[victim][4] != "ab" * 32
