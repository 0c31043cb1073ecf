"""Workspace sync through the agent's own channel, on every transport.

Against the real agent: as a local subprocess, and through the real OpenSSH sshd with SFTP,
without SFTP (exec only) and behind the PTY-only proxy. The pod's side lives on this
machine (each server's ``pod_cache``), so what the sync wrote is checked on disk.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuws import protocol
from gpuws.client import AgentClient
from gpuws.transport import make_transport
from gpuws.workspace.sync import BATCH, WorkspaceSync
from sshd import SshServer  # type: ignore[import-not-found]

TRANSPORTS = ["local", "sshd", "sshd_nosftp", "sshd_pty"]


def make_project(root: Path) -> Path:
    (root / "mykern").mkdir(parents=True)
    (root / "mykern" / "__init__.py").write_text("VALUE = 1\n")
    (root / "mykern" / "attn.py").write_text("def fused():\n    return 42\n")
    (root / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (root / "run.sh").chmod(0o755)
    for i in range(40):
        (root / "many" / f"d{i % 4}").mkdir(parents=True, exist_ok=True)
        (root / "many" / f"d{i % 4}" / f"f{i}.txt").write_text(f"file {i}\n" * (i + 1))
    return root


@pytest.fixture(params=TRANSPORTS)
async def pod(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[
        tuple[AgentClient, Path]]:
    """A connected agent and the pod-side cache it writes to."""
    if request.param == "local":
        cache = Path(os.environ["GPUWS_POD_CACHE"])
        transport = make_transport("local")
    else:
        server: SshServer = request.getfixturevalue(request.param)
        server.reset_pod()
        config = server.client_files(tmp_path / "client")
        transport = make_transport("pod", config_file=str(config),
                                   pty=True if request.param == "sshd_pty" else None)
        cache = server.pod_cache
    client = await AgentClient.connect(transport)
    try:
        yield client, cache
    finally:
        await client.close()


def pod_tree(root: Path) -> dict[str, tuple[bytes, int]]:
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            out[path.relative_to(root).as_posix()] = (path.read_bytes(),
                                                      path.stat().st_mode & 0o777)
    return out


async def test_first_sync_edit_delete_and_exec_bits(pod: tuple[AgentClient, Path],
                                                    tmp_path: Path) -> None:
    client, cache = pod
    root = make_project(tmp_path / "proj")
    ws = WorkspaceSync(root)
    first = await ws.sync(client)
    there = cache / "workspaces" / ws.name
    assert Path(first.root) == there
    assert first.blobs_sent == 43 and first.written == 43
    tree = pod_tree(there)
    assert sorted(tree) == sorted(e.path for e in first.manifest.entries)
    assert tree["run.sh"] == ((root / "run.sh").read_bytes(), 0o755)
    assert tree["mykern/attn.py"][1] == 0o644

    again = await ws.sync(client)
    assert (again.blobs_sent, again.puts, again.written, again.removed) == (0, 0, 0, 0)

    # One file edited: only its bytes travel, in one put.
    (root / "mykern" / "attn.py").write_text("def fused():\n    return 43\n")
    edited = await ws.sync(client)
    assert (edited.blobs_sent, edited.bytes_sent, edited.puts) == (
        1, (root / "mykern" / "attn.py").stat().st_size, 1)
    assert edited.written == 1 and edited.diff.modified == ["mykern/attn.py"]
    assert (there / "mykern" / "attn.py").read_text() == "def fused():\n    return 43\n"

    # Deleted locally: gone on the pod, with the directory it leaves empty.
    for f in (root / "many" / "d3").iterdir():
        f.unlink()
    (root / "many" / "d3").rmdir()
    (root / "run.sh").chmod(0o644)  # a mode change alone is a change
    gone = await ws.sync(client)
    assert gone.removed == 10 and gone.blobs_sent == 0 and gone.written == 1
    assert not (there / "many" / "d3").exists()
    assert os.stat(there / "run.sh").st_mode & 0o777 == 0o644

    # A fresh laptop process (no memory of the last sync) sends nothing: the pod has it.
    fresh = await WorkspaceSync(root).sync(client)
    assert (fresh.blobs_sent, fresh.written) == (0, 0)


async def test_a_file_larger_than_a_put_travels_in_pieces(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    big = os.urandom(BATCH + BATCH // 2)  # random: zlib cannot shrink it
    (root / "weights.bin").write_bytes(big)
    (root / "small.py").write_text("x = 1\n")
    client = await AgentClient.connect(make_transport("local"))
    try:
        ws = WorkspaceSync(root)
        result = await ws.sync(client)
    finally:
        await client.close()
    assert result.blobs_sent == 2 and result.puts == 2
    there = Path(os.environ["GPUWS_POD_CACHE"]) / "workspaces" / ws.name
    assert (there / "weights.bin").read_bytes() == big


async def test_a_pod_that_plants_links_gets_no_write_outside(pod: tuple[AgentClient, Path],
                                                             tmp_path: Path) -> None:
    """What runs in the workspace (someone else's benchmark) may replace its directories
    and files with links to the person's files; the next sync must write none of them."""
    client, cache = pod
    root = make_project(tmp_path / "proj")
    ws = WorkspaceSync(root)
    await ws.sync(client)
    there = cache / "workspaces" / ws.name
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "authorized_keys"
    victim.write_text("ssh-ed25519 KEEP\n")
    # A directory of the tree becomes a link to a directory outside it...
    for f in (there / "mykern").iterdir():
        f.unlink()
    (there / "mykern").rmdir()
    (there / "mykern").symlink_to(outside, target_is_directory=True)
    # ...and a file becomes a link to a file outside.
    (there / "run.sh").unlink()
    (there / "run.sh").symlink_to(victim)
    (there / "many" / "d0").rename(there / "many" / "moved")
    (there / "many" / "d0").symlink_to(outside, target_is_directory=True)

    (root / "mykern" / "attn.py").write_text("def fused():\n    return 44\n")
    (root / "run.sh").write_text("#!/bin/sh\necho edited\n")
    (root / "many" / "d0" / "f0.txt").unlink()  # a removal under the linked directory
    result = await ws.sync(client)

    assert sorted(p.name for p in outside.iterdir()) == ["authorized_keys"]
    assert victim.read_text() == "ssh-ed25519 KEEP\n"
    for link in ("mykern", "run.sh", "many/d0"):
        assert not (there / link).is_symlink(), link
    assert pod_tree(there)["mykern/attn.py"][0] == b"def fused():\n    return 44\n"
    assert (there / "run.sh").read_text() == "#!/bin/sh\necho edited\n"
    assert result.blobs_sent == 2
    # Every file of the manifest is there, as sent (the moved directory is the pod's
    # own leftover, never named by a manifest, so it stays).
    tree = pod_tree(there)
    for e in result.manifest.entries:
        assert e.path in tree


async def test_the_workspace_root_replaced_by_a_link(tmp_path: Path) -> None:
    root = make_project(tmp_path / "proj")
    client = await AgentClient.connect(make_transport("local"))
    try:
        ws = WorkspaceSync(root)
        await ws.sync(client)
        there = Path(os.environ["GPUWS_POD_CACHE"]) / "workspaces" / ws.name
        outside = tmp_path / "outside"
        outside.mkdir()
        there.rename(tmp_path / "old-tree")
        there.symlink_to(outside, target_is_directory=True)
        result = await ws.sync(client)
    finally:
        await client.close()
    assert list(outside.iterdir()) == []
    assert not there.is_symlink() and result.written == 43


async def test_a_lying_answer_is_refused(tmp_path: Path) -> None:
    """The laptop checks the pod's answers: a hash this tree does not hold is refused
    (never looked up among the person's files)."""
    from gpuws import protocol
    from gpuws.errors import ProtocolError

    root = make_project(tmp_path / "proj")
    client = await AgentClient.connect(make_transport("local"))
    try:
        ws = WorkspaceSync(root)

        async def lying_apply(name: str, entries: list[protocol.WsEntry],
                              tree: str) -> protocol.WorkspaceState:
            # A stand-in for a hostile agent's answer (a real agent never says this).
            return protocol.WorkspaceState(name=name, missing=["ab" * 32])

        client.workspace_apply = lying_apply  # type: ignore[method-assign]
        with pytest.raises(ProtocolError, match="does not hold"):
            await ws.sync(client)
    finally:
        await client.close()


def test_refused_before_anything_connects(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A link out of the tree: one `gpuws:` line, exit 2, and no connection attempted
    (the host does not even resolve)."""
    from gpuws.cli import main

    root = make_project(tmp_path / "proj")
    (root / "key").symlink_to(Path.home() / ".ssh" / "id_ed25519")
    code = main(["sync", "no-such-host.invalid", "-W", str(root)])
    err = capsys.readouterr().err
    assert code == 2
    assert "Workspace refused" in err and "key is a symlink to" in err
    assert "no-such-host" not in err


async def test_many_tiny_files_are_cut_into_puts_that_fit_a_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A put holds at most MAX_PIECES pieces (each ~90 bytes of JSON): with thousands of
    tiny files the pieces, not the bytes, would overflow the 8 MiB line. The bound is
    checked on the worst put, and the cutting on a real sync with the bound lowered."""
    from gpuws import protocol
    from gpuws.workspace import sync

    worst = protocol.WorkspacePut(
        req=2**31, pieces=[protocol.WsPiece("f" * 64, 2**30, 2**30, 2**30)] * sync.MAX_PIECES,
        data="A" * (4 * ((sync.BATCH + 2) // 3)), zlib=True)
    assert len(protocol.encode(worst)) < protocol.MAX_LINE

    monkeypatch.setattr(sync, "MAX_PIECES", 100)
    root = tmp_path / "proj"
    for i in range(250):
        d = root / f"d{i // 50}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i}.txt").write_text(str(i))
    client = await AgentClient.connect(make_transport("local"))
    try:
        ws = WorkspaceSync(root)
        result = await ws.sync(client)
    finally:
        await client.close()
    assert (result.puts, result.blobs_sent, result.written) == (3, 250, 250)
    there = Path(os.environ["GPUWS_POD_CACHE"]) / "workspaces" / ws.name
    assert sorted(p.read_text() for p in there.rglob("*.txt")) == sorted(
        str(i) for i in range(250))


def count_applies(client: AgentClient) -> list[int]:
    """How many workspace_apply requests each sync made (the real request, counted)."""
    made = [0]
    real = client.workspace_apply

    async def counted(name: str, entries: list[protocol.WsEntry],
                      tree: str) -> protocol.WorkspaceState:
        made[0] += 1
        return await real(name, entries, tree)

    client.workspace_apply = counted  # type: ignore[method-assign]
    return made


async def test_a_new_process_sends_an_edit_with_its_apply(pod: tuple[AgentClient, Path],
                                                          tmp_path: Path) -> None:
    """`gpuws sync` as a new process after an edit: the edited file goes unasked (the
    contents the kept hash cache had not seen), its put and the apply leave together, and
    the pod applies at once: one put, one apply, on every transport."""
    client, cache = pod
    root = make_project(tmp_path / "proj")
    await WorkspaceSync(root).sync(client)
    applies = count_applies(client)
    (root / "mykern" / "attn.py").write_text("def fused():\n    return 45\n")
    fresh = await WorkspaceSync(root).sync(client)  # no memory but the data dir's
    assert (fresh.blobs_sent, fresh.puts, fresh.written, applies[0]) == (1, 1, 1, 1)
    there = cache / "workspaces" / fresh.name
    assert (there / "mykern" / "attn.py").read_text() == "def fused():\n    return 45\n"

    # Nothing changed: nothing sent, one apply.
    applies[0] = 0
    same = await WorkspaceSync(root).sync(client)
    assert (same.blobs_sent, same.written, applies[0]) == (0, 0, 1)


async def test_a_large_guess_asks_the_pod_first(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Over PRESEND_BYTES the guess is not sent unasked (a checkout of another branch
    whose blobs the pod may still hold): the pod names what it lacks, and only that goes."""
    from gpuws.workspace import sync

    monkeypatch.setattr(sync, "PRESEND_BYTES", 10)
    root = make_project(tmp_path / "proj")
    client = await AgentClient.connect(make_transport("local"))
    try:
        await WorkspaceSync(root).sync(client)
        applies = count_applies(client)
        (root / "mykern" / "attn.py").write_text("def fused():\n    return 46\n")
        fresh = await WorkspaceSync(root).sync(client)
    finally:
        await client.close()
    assert (fresh.blobs_sent, fresh.puts, fresh.written, applies[0]) == (1, 1, 1, 2)


def test_sync_json_loads_nothing_it_does_not_use(tmp_path: Path) -> None:
    """`gpuws sync --json` prints no Rich text, stores nothing and walks no .gitignore: it
    must not pay for importing Rich, SQLite or pathspec at every start (a process, run
    for real, against the local agent)."""
    import subprocess
    import sys

    root = make_project(tmp_path / "proj")
    code = ("import json, sys\nfrom gpuws.cli import main\n"
            f"rc = main(['sync', 'local', '-W', {str(root)!r}, '--json'])\n"
            "heavy = sorted({m.split('.')[0] for m in sys.modules} & "
            "{'rich', 'textual', 'sqlite3', 'pathspec'})\n"
            "sys.stderr.write(json.dumps([rc, heavy]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert json.loads(out.stderr.decode().splitlines()[-1]) == [0, []]
    assert json.loads(out.stdout)["written"] == 43
