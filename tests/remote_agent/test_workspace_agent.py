"""The pod's workspace module (remote_agent/workspace.py) against the worst requests.

The laptop never sends these; a request is still input to the agent, and a mistake here
would write outside the workspace or keep bytes under a hash they do not have.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zlib
from pathlib import Path
from typing import Any

import pytest

from gpuws.remote_agent import workspace as ws


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def put(*blobs: bytes, compress: bool = False) -> tuple[int, list[str]]:
    raw = b"".join(blobs)
    data = zlib.compress(raw) if compress else raw
    return ws.put([[sha(b), len(b), 0, len(b)] for b in blobs],
                  base64.b64encode(data).decode(), compress)


def entry(path: str, data: bytes, mode: int = 0o644) -> list[Any]:
    return [path, mode, sha(data), len(data)]


def cache() -> Path:
    return Path(os.environ["GPUWS_POD_CACHE"])


def test_put_then_apply_makes_the_tree() -> None:
    a, b = b"print('a')\n", b"#!/bin/sh\n"
    assert put(a, b, compress=True) == (2, [])
    answer = ws.apply("proj", [entry("pkg/a.py", a), entry("run.sh", b, 0o755)], "0" * 64)
    assert answer["applied"] and answer["written"] == 2
    root = cache() / "workspaces" / "proj"
    assert (root / "pkg" / "a.py").read_bytes() == a
    assert (root / "run.sh").stat().st_mode & 0o777 == 0o755


def test_apply_changes_nothing_while_a_blob_is_missing() -> None:
    a = b"a\n"
    answer = ws.apply("proj", [entry("a.py", a)], "0" * 64)
    assert answer == {"name": "proj", "missing": [sha(a)], "applied": False}
    assert not (cache() / "workspaces" / "proj" / "a.py").exists()


def test_a_blob_whose_bytes_do_not_match_is_refused() -> None:
    good, forged = b"good\n", b"evil\n"
    stored, refused = ws.put([[sha(good), len(forged), 0, len(forged)]],
                             base64.b64encode(forged).decode(), False)
    assert (stored, refused) == (0, [sha(good)])
    assert not ws.has_blob(sha(good))


def test_pieces_out_of_order_are_refused_and_in_order_complete() -> None:
    data = os.urandom(1000)
    h = sha(data)
    assert ws.put([[h, 1000, 500, 500]], base64.b64encode(data[500:]).decode(),
                  False) == (0, [h])
    assert ws.put([[h, 1000, 0, 500]], base64.b64encode(data[:500]).decode(), False) == (0, [])
    assert ws.put([[h, 1000, 500, 500]], base64.b64encode(data[500:]).decode(),
                  False) == (1, [])
    assert (cache() / "wsblobs" / h).read_bytes() == data


@pytest.mark.parametrize("path", ["../x", "a/../../x", "/etc/passwd", "a//b", "./a", "",
                                  "a/./b", "a\x00b", "x/" * 70 + "y", "é" * 600])
def test_paths_that_could_leave_the_tree_are_refused(path: str) -> None:
    put(b"x")
    with pytest.raises(ws.WorkspaceError, match="invalid path"):
        ws.apply("proj", [[path, 0o644, sha(b"x"), 1]], "0" * 64)


@pytest.mark.parametrize("name", ["..", ".state", "a/b", "", "x" * 65, "-rf", 7, None])
def test_bad_workspace_names_are_refused(name: Any) -> None:
    with pytest.raises(ws.WorkspaceError, match="invalid workspace name"):
        ws.apply(name, [], "0" * 64)


@pytest.mark.parametrize("bad", [
    [["a.py", 0o4755, "0" * 64, 1]],                    # setuid is not a mode that travels
    [["a.py", True, "0" * 64, 1]],
    [["a.py", 0o644, "../" * 21 + "x", 1]],             # not a hash
    [["a.py", 0o644, "0" * 64, -1]],
    [["a.py", 0o644, "0" * 64, 1], ["a.py", 0o644, "0" * 64, 1]],   # twice
    [["a", 0o644, "0" * 64, 1], ["a/b", 0o644, "0" * 64, 1]],       # file and directory
    [["a.py", 0o644, "0" * 64]],
    "not a list",
])
def test_malformed_manifests_are_refused(bad: Any) -> None:
    with pytest.raises(ws.WorkspaceError):
        ws.apply("proj", bad, "0" * 64)


def test_a_compressed_put_cannot_inflate_past_what_it_announces() -> None:
    bomb = zlib.compress(b"\0" * (50 << 20))  # 50 MiB of zeros in ~50 KiB
    with pytest.raises(ws.WorkspaceError, match="announced 10 bytes"):
        ws.put([["0" * 64, 10, 0, 10]], base64.b64encode(bomb).decode(), True)


def test_a_blob_corrupted_in_the_store_is_asked_for_again() -> None:
    a = b"original\n"
    put(a)
    (cache() / "wsblobs" / sha(a)).write_bytes(b"tampered\n")
    answer = ws.apply("proj", [entry("a.py", a)], "0" * 64)
    assert answer["missing"] == [sha(a)] and not answer["applied"]
    assert not ws.has_blob(sha(a))
    put(a)
    assert ws.apply("proj", [entry("a.py", a)], "0" * 64)["applied"]
    assert (cache() / "workspaces" / "proj" / "a.py").read_bytes() == a


def test_a_file_a_run_changed_is_written_again(tmp_path: Path) -> None:
    a = b"v1\n"
    put(a)
    ws.apply("proj", [entry("a.py", a)], "0" * 64)
    target = cache() / "workspaces" / "proj" / "a.py"
    target.write_bytes(b"changed by the workload\n")
    answer = ws.apply("proj", [entry("a.py", a)], "0" * 64)
    assert answer["written"] == 1 and target.read_bytes() == a


def test_a_state_file_replaced_by_a_link_is_not_followed(tmp_path: Path) -> None:
    a = b"v1\n"
    put(a)
    ws.apply("proj", [entry("a.py", a)], "0" * 64)
    state = cache() / "workspaces" / ".state" / "proj.json"
    victim = tmp_path / "victim.json"
    victim.write_text("keep\n")
    state.unlink()
    state.symlink_to(victim)
    answer = ws.apply("proj", [entry("a.py", a)], "0" * 64)
    assert answer["applied"] and victim.read_text() == "keep\n"
    assert not state.is_symlink()


def test_blobs_no_tree_names_go_once_old() -> None:
    """The store keeps what a workspace names, and what another laptop may be about to
    name (young); an old blob no tree names goes at the next apply."""
    v1, v2, fresh = b"version 1\n", b"version 2\n", b"put, not applied yet\n"
    put(v1)
    ws.apply("proj", [entry("k.py", v1)], "0" * 64)
    put(v2, fresh)
    old = 1_000_000_000.0
    for blob in (v1, v2):
        os.utime(cache() / "wsblobs" / sha(blob), (old, old))
    (cache() / "wsblobs" / (sha(b"abandoned") + ".part")).write_bytes(b"aband")
    os.utime(cache() / "wsblobs" / (sha(b"abandoned") + ".part"), (old, old))
    ws.apply("proj", [entry("k.py", v2)], "0" * 64)  # v1 is named by no tree now
    assert not ws.has_blob(sha(v1))
    assert ws.has_blob(sha(v2)) and ws.has_blob(sha(fresh))
    assert sorted(p.name for p in (cache() / "wsblobs").iterdir()) == sorted(
        [sha(v2), sha(fresh)])
