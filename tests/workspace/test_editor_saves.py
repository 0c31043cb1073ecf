"""A workspace survives what real editors do to a project while it is sent.

Links an editor or a person leaves (Emacs's ``.#name -> user@host.PID:TIME`` lock beside
every modified buffer, a link to a deleted file, links in a loop) are skipped with one
line naming them, never a traceback; a link out of the tree is still refused. A file that
changes or vanishes between the scan and its read is read again (or left out) and the
sync completes. Through the real CLI on the real sshd pod, with a real writer process
rewriting a file in a tight loop; the read races themselves are also made to happen
deterministically, by changing the file between ``scan`` and ``sync``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from cli.test_watch import Lines  # type: ignore[import-not-found]
from gpuws.cli import main
from gpuws.client import AgentClient
from gpuws.errors import WorkspaceError
from gpuws.transport import make_transport
from gpuws.workspace import manifest as manifest_mod
from gpuws.workspace import sync as sync_mod
from gpuws.workspace.manifest import DANGLING, LOOP, UNSTABLE, VANISHED, Note, describe, scan
from gpuws.workspace.sync import WorkspaceSync, workspace_name
from sshd import SshServer  # type: ignore[import-not-found]
from workspace.test_manifest import NEEDS_GIT, git  # type: ignore[import-not-found]


def project(root: Path, *, in_git: bool = False) -> Path:
    (root / "mykern").mkdir(parents=True)
    (root / "mykern" / "__init__.py").write_text("V = 1\n")
    (root / "bench.py").write_text("def run():\n    return 1\n")
    if in_git:
        git(root, "init", "-q")
        git(root, "add", "-A")
        git(root, "commit", "-qm", "one")
    return root


def editor_links(root: Path) -> None:
    """What editors and people leave: a lock, a link to a deleted file, loops, and a link
    to a file inside the tree (which travels as its file)."""
    (root / ".#bench.py").symlink_to("user@host.12345:1700000000")
    (root / "gone.py").symlink_to("deleted.py")
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("a")
    (root / "c").symlink_to("c")
    (root / "mykern" / "same.py").symlink_to("../bench.py")


def pod_file(server: SshServer, root: Path, rel: str) -> Path:
    return server.pod_cache / "workspaces" / workspace_name(root.resolve()) / rel


@pytest.mark.parametrize("in_git", [False, pytest.param(True, marks=NEEDS_GIT)])
def test_links_to_nothing_and_loops_are_skipped_in_one_line(
        tmp_path: Path, in_git: bool, ssh_config: Path, sshd: SshServer,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # the sync's line unwrapped
    root = project(tmp_path / "proj", in_git=in_git)
    editor_links(root)
    assert main(["sync", "pod", "-F", str(ssh_config), "-W", str(root)]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    (said,) = [ln for ln in out.splitlines() if "skipped" in ln]  # one line
    assert "skipped 2 links to nothing: .#bench.py, gone.py" in said
    assert "skipped 3 links in a loop: a, b, c" in said and "3 files" in said
    assert pod_file(sshd, root, "mykern/same.py").read_bytes() == b"def run():\n    return 1\n"
    for rel in (".#bench.py", "gone.py", "a", "b", "c"):
        assert not os.path.lexists(pod_file(sshd, root, rel))
    # A script reads the same from --json.
    assert main(["sync", "pod", "-F", str(ssh_config), "-W", str(root), "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert sorted((n["why"], n["path"]) for n in notes) == [
        ("dangling", ".#bench.py"), ("dangling", "gone.py"), ("loop", "a"), ("loop", "b"),
        ("loop", "c")]


def test_run_in_a_project_with_an_emacs_lock(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    root = project(tmp_path / "proj")
    (root / ".#bench.py").symlink_to("user@host.12345:1700000000")
    assert main(["run", "local", "-W", str(root), "-w", "cmd:true", "--tiers", "2"]) == 0
    err = capsys.readouterr().err
    assert "skipped 1 link to nothing: .#bench.py" in err and "Traceback" not in err


@pytest.mark.parametrize("how", ["out", "dir"])
def test_links_out_of_the_tree_and_to_directories_are_still_refused(
        tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]) -> None:
    root = project(tmp_path / "proj")
    editor_links(root)
    if how == "out":
        (root / "key").symlink_to(tmp_path / "secret")  # dangling, and outside: refused
        words = "key is a symlink to"
    else:
        git(root, "init", "-q")  # git lists a link to a directory as one entry
        (root / "kern").symlink_to("mykern")
        words = "kern is a symlink to a directory"
    assert main(["sync", "no-such-host.invalid", "-W", str(root)]) == 2
    err = capsys.readouterr().err
    assert "Workspace refused" in err and words in err and "Traceback" not in err


# ---------------------------------------------------------------- races, deterministic
@pytest.fixture
async def client() -> AsyncIterator[AgentClient]:
    """The real agent as a local subprocess (the embedded pod)."""
    c = await AgentClient.connect(make_transport("local"))
    try:
        yield c
    finally:
        await c.close()


async def test_a_file_saved_between_scan_and_read_is_sent_as_saved(
        tmp_path: Path, client: AgentClient) -> None:
    root = project(tmp_path / "proj")
    ws = WorkspaceSync(root)
    m = ws.scan()
    (root / "bench.py").write_text("def run():\n    return 2  # saved meanwhile\n")
    result = await ws.sync(client, m)
    there = Path(result.root)
    assert (there / "bench.py").read_text() == "def run():\n    return 2  # saved meanwhile\n"
    assert m.tree_sha256 == scan(root).tree_sha256  # the manifest is what the pod holds
    assert m.notes == [] and result.diff.added == ["bench.py", "mykern/__init__.py"]


async def test_a_file_that_vanished_before_its_read_is_left_out(
        tmp_path: Path, client: AgentClient) -> None:
    root = project(tmp_path / "proj")
    (root / "bench.py~").write_text("backup\n")
    ws = WorkspaceSync(root)
    m = ws.scan()
    (root / "bench.py~").unlink()
    result = await ws.sync(client, m)
    assert not (Path(result.root) / "bench.py~").exists()
    assert m.notes == [Note("bench.py~", VANISHED)]
    assert describe(m.notes) == "skipped 1 file that vanished while it was read: bench.py~"
    assert m.tree_sha256 == scan(root).tree_sha256


@pytest.mark.parametrize("how", ["deleted", "fifo"])
def test_a_file_that_vanished_before_the_scan_hashed_it_is_left_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """Listed, then deleted (or made a FIFO, whose open would wait for a writer) before
    the scan read it: the hook does it just before the real read."""
    root = project(tmp_path / "proj")
    (root / "bench.py~").write_text("backup\n")
    real = manifest_mod._hash_file

    def deleted_first(path: str, size: int) -> str:
        if path.endswith("~"):
            os.unlink(path)
            if how == "fifo":
                os.mkfifo(path)
        return real(path, size)

    monkeypatch.setattr(manifest_mod, "_hash_file", deleted_first)
    m = scan(root)
    assert [e.path for e in m.entries] == ["bench.py", "mykern/__init__.py"]
    assert m.notes == [Note("bench.py~", VANISHED)]


async def test_a_file_that_keeps_changing_is_sent_as_last_read(
        tmp_path: Path, client: AgentClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer faster than any read: every read sees the file's stat change across it
    (made so here by a stat that differs each time: no real writer is that reliable)."""
    root = project(tmp_path / "proj")
    ws = WorkspaceSync(root)
    m = ws.scan()
    (root / "bench.py").write_text("def run():\n    return 3\n")
    counter = itertools.count()
    monkeypatch.setattr(sync_mod, "_stat_key", lambda st: (next(counter), 0, 0, 0))
    result = await ws.sync(client, m)
    assert (Path(result.root) / "bench.py").read_text() == "def run():\n    return 3\n"
    assert m.notes == [Note("bench.py", UNSTABLE)]
    assert describe(m.notes) == ("sent as last read 1 file that kept changing while it "
                                 "was read: bench.py")


async def test_a_file_replaced_by_a_link_out_of_the_tree_is_not_sent(
        tmp_path: Path, client: AgentClient) -> None:
    """Between scan and read the file becomes a link to a secret: refused, not sent."""
    secret = tmp_path / "secret"
    secret.write_text("PRIVATE KEY\n")
    root = project(tmp_path / "proj")
    ws = WorkspaceSync(root)
    m = ws.scan()
    (root / "bench.py").unlink()
    (root / "bench.py").symlink_to(secret)
    with pytest.raises(WorkspaceError, match="became a link out of the tree"):
        await ws.sync(client, m)
    cache = Path(os.environ["GPUWS_POD_CACHE"])
    assert not any(b"PRIVATE KEY" in p.read_bytes() for p in cache.rglob("*") if p.is_file())


async def test_a_file_replaced_by_a_fifo_is_left_out_without_waiting(
        tmp_path: Path, client: AgentClient) -> None:
    """A FIFO where the file was: opening it for reading would wait for a writer forever;
    it is no file any more, so it is left out, as the next scan would."""
    root = project(tmp_path / "proj")
    ws = WorkspaceSync(root)
    m = ws.scan()
    (root / "bench.py").unlink()
    os.mkfifo(root / "bench.py")
    result = await asyncio.wait_for(ws.sync(client, m), 60)
    assert m.notes == [Note("bench.py", VANISHED)]
    assert not (Path(result.root) / "bench.py").exists()


def test_describe_names_at_most_three_and_counts_the_rest() -> None:
    notes = [Note(f"f{i}", DANGLING) for i in range(5)] + [Note("x\x1b[2J", LOOP)]
    said = describe(notes)
    assert said.startswith("skipped 5 links to nothing: f0, f1, f2, … 2 more; skipped 1 "
                           "link in a loop: x")
    assert "\x1b" not in said


# ---------------------------------------------------------------- a real writer
WRITER = r"""
import os, sys
path, n = sys.argv[1], 0
while True:
    n += 1
    with open(path, "w") as f:  # in place, as a formatter writes: truncate, then write
        f.write("def run():\n    return %d\n" % n * (1 + n % 40))
    with open(path + "~", "w") as f:  # a backup that comes and goes
        f.write("x")
    os.unlink(path + "~")
"""


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    root = project(tmp_path / "proj")
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(root / "bench.py")])
    try:
        yield root, proc
    finally:
        proc.kill()
        proc.wait()


def test_sync_completes_while_a_writer_rewrites_a_file(
        writer: tuple[Path, subprocess.Popen[bytes]], ssh_config: Path,
        sshd: SshServer) -> None:
    root, proc = writer
    argv = [sys.executable, "-m", "gpuws", "sync", "pod", "-F", str(ssh_config), "-W",
            str(root)]
    for _ in range(5):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr and "changed while" not in done.stderr
    proc.kill()
    proc.wait()
    assert subprocess.run(argv, capture_output=True, timeout=120).returncode == 0
    assert pod_file(sshd, root, "bench.py").read_bytes() == (root / "bench.py").read_bytes()


def test_watch_goes_on_through_a_writer_links_and_a_refused_save(
        tmp_path: Path, ssh_config: Path) -> None:
    """The watch loop through the real sshd: an Emacs lock and a loop are named on the
    iteration's line; a writer rewriting a file in a tight loop makes iterations, none
    of which ends the loop; a link out of the tree is an iteration refused with its
    reason, and the next save measures again."""
    root = project(tmp_path / "proj")
    argv = [sys.executable, "-m", "gpuws", "watch", "pod", "-F", str(ssh_config), "-W",
            str(root), "-w", "cmd:true", "--debounce-ms", "100", "--yes"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = Lines(proc)
    writing: subprocess.Popen[bytes] | None = None
    try:
        lines.until(lambda s: s.startswith("#1"), "the first iteration")
        (root / ".#bench.py").symlink_to("user@host.12345:1700000000")
        (root / "c").symlink_to("c")
        (root / "mykern" / "__init__.py").write_text("V = 2\n")
        second = lines.until(lambda s: s.startswith("#2"), "the save's iteration")
        assert "skipped 1 link to nothing: .#bench.py" in second
        assert "skipped 1 link in a loop: c" in second
        writing = subprocess.Popen([sys.executable, "-c", WRITER, str(root / "bench.py")])
        lines.until(lambda s: s.startswith("#5"), "iterations while the writer writes",
                    timeout=120)
        writing.kill()
        writing.wait()
        # The writer's last saves may still make an iteration or two: the refusal is
        # waited for by its words.
        (root / "key").symlink_to(tmp_path / "secret")
        (root / "mykern" / "__init__.py").write_text("V = 3\n")
        refused = lines.until(lambda s: "refused" in s, "the refused iteration")
        assert "key is a symlink to" in refused and "outside" in refused
        (root / "key").unlink()
        (root / "mykern" / "__init__.py").write_text("V = 4\n")
        lines.until(lambda s: s.startswith("#") and "mykern/__init__.py" in s
                    and "refused" not in s, "the iteration after the fix")
        assert proc.poll() is None  # still watching
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if writing is not None and writing.poll() is None:
            writing.kill()
            writing.wait()
        if proc.poll() is None:
            proc.kill()
    rest = lines.rest()
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert "watch: the iterations" in rest
    assert "Traceback" not in err and "changed while" not in rest + err
