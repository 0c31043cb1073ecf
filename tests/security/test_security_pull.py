"""A lying pod cannot make a pull write outside the run's artifact directory, or write too much.

A real run through the real agent and the real sshd produces one honest artifact. The
hostile announcements are then stand-in records (``store.record_artifact`` with a
traversal name, or a remote path of ``/dev/zero`` announced as 16 bytes): that is the
"lying agent" case, which a real agent never produces, so a fake is the only way to
have it; every byte still moves through the real transport from the real sshd. Also
planted on the laptop: a symbolic link as a parent directory pointing out of the
artifact directory, a ``.part`` that is a link to a victim file, a ``.part`` that is a FIFO.

After everything: no file was created or changed outside that run's artifact directory
(the test's whole temporary tree is walked, and the escape targets in /tmp checked), no ``.part``
ever exceeded its announced size, every refusal was one printable line, and the honest
artifact of the same run was pulled all the same.

Every pull is the product's, ``sessions.artifacts.pull_run`` (what the engine does after a
run and ``gpuws pull`` does): where one announcement's own answer is wanted, the lying
agent announces it as the one artifact of a run of its own (``lone_run``).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuws import protocol
from gpuws.client import AgentClient
from gpuws.config import PullConfig
from gpuws.errors import TransferError
from gpuws.locations import artifacts_dir
from gpuws.sessions.artifacts import PullResult, pull_run
from gpuws.sessions.store import Store
from gpuws.transport.ssh import SSHTransport
from sshd import SshServer  # type: ignore[import-not-found]

HONEST = "honest.bin"
HONEST_SIZE = 4 * 1024 * 1024 + 3
ESCAPE = f"gpuws-escape-{uuid.uuid4().hex}"


async def connect(cfg: Path) -> AgentClient:
    return await AgentClient.connect(SSHTransport("pod", config_file=str(cfg)))


async def produce(cfg: Path, store: Store, sid: str) -> str:
    """A real run writing one honest artifact; its events go into the store."""
    client = await connect(cfg)
    done = asyncio.Event()

    def on_event(ev: protocol.Events | protocol.BadLine) -> None:
        if isinstance(ev, protocol.Event) and ev.run_id is not None:
            store.ingest(sid, ev)
            if isinstance(ev, protocol.RunFinished):
                done.set()

    client.add_listener(on_event)
    cmd = f'head -c {HONEST_SIZE} /dev/urandom > "$GPUWS_ARTIFACT_DIR/{HONEST}"'
    info = await client.start_run(protocol.RunSpec(workload=f"cmd:{cmd}", tiers=[]))
    await asyncio.wait_for(done.wait(), 30)
    await client.close()
    return info.run_id


def lone_run(store: Store, sid: str, name: str, remote_path: str, size: int,
             sha256: str) -> str:
    """A run of the lying agent's that announces one artifact, stored as the engine stores
    a run's start: ``pull_run`` of it is that one announcement's pull."""
    run_id = f"20990101-000000-{uuid.uuid4().hex[:6]}"
    store.ingest(sid, protocol.RunStarted(run_id=run_id, seq=0, ts=time.time(),
                                          spec=protocol.RunSpec(workload="cmd:true"),
                                          run_dir="/nonexistent", pid=1))
    store.record_artifact(run_id, name, remote_path, size, sha256)
    return run_id


async def pull_lone(cfg: Path, store: Store, sid: str, run_id: str,
                    **kw: object) -> list[PullResult]:
    """``pull_run`` of a lone run over a new link (the product's pull of one file)."""
    client = await connect(cfg)
    try:
        return await asyncio.wait_for(pull_run(client, store, sid, run_id, **kw),  # type: ignore[arg-type]
                                      30)
    finally:
        await client.close()


def snapshot(*roots: Path) -> dict[str, tuple[int, int]]:
    """Every file and link under ``roots``: (size, mtime_ns), links not followed."""
    out: dict[str, tuple[int, int]] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for n in filenames + dirnames:
                st = os.lstat(os.path.join(dirpath, n))
                out[os.path.join(dirpath, n)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def honest_run(sshd: SshServer, tmp_path: Path) -> Iterator[tuple[Path, Store, str, str]]:
    sshd.reset_pod()
    cfg = sshd.client_files(tmp_path / "client")
    store = Store()
    sid = store.open_session("pod", "sftp", None, 1.0)
    run_id = asyncio.run(produce(cfg, store, sid))
    yield cfg, store, sid, run_id
    store.close()


def assert_confined(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]],
                    run_dir: Path, *more_run_dirs: Path) -> None:
    changed = {p for p, v in after.items() if before.get(p) != v}
    db = str(run_dir.parent.parent.parent / "sessions.db")
    dirs = (run_dir, *more_run_dirs)
    outside = {p for p in changed if not p.startswith(db)
               and not any(p.startswith(str(d) + os.sep) for d in dirs)}
    # The runs' own directories are written by the pull (and the store records what it
    # did); nothing else may appear or change.
    assert outside <= {str(d) for d in dirs} | {str(run_dir.parent)}, sorted(outside)


def test_traversal_and_control_names_are_refused_and_nothing_escapes(
        honest_run: tuple[Path, Store, str, str], tmp_path: Path) -> None:
    cfg, store, sid, run_id = honest_run
    honest = store.artifacts(run_id)[0]
    outside = tmp_path / "outside"
    outside.mkdir()
    hostile = [
        "../../x", "../../../../../../../../../../../../tmp/" + ESCAPE, "a/../../x",
        "sub/../../../y", str(outside / "abs.txt"), "/" + "tmp/" + ESCAPE + "-abs",
        "x\nforged: pulled ok", "\x1b[2J\x1b]0;pwned\x07.bin", "..", ".", "a//b", "p.part",
        ".gpuws-pull.lock",
    ]
    for name in hostile:  # the lying agent: names the real agent never announces
        store.record_artifact(run_id, name, honest.remote_path, honest.size, honest.sha256)
    run_dir = artifacts_dir(sid, run_id)
    before = snapshot(tmp_path)

    async def pull() -> None:
        client = await connect(cfg)
        try:
            await asyncio.wait_for(pull_run(client, store, sid, run_id), 60)
        finally:
            await client.close()

    with pytest.raises(TransferError) as err:
        asyncio.run(pull())
    line = err.value.one_line()
    assert f"{len(hostile)} artifacts of run {run_id} were not pulled" in line
    assert "\n" not in line and "\x1b" not in line and "\x07" not in line

    after = snapshot(tmp_path)
    assert_confined(before, after, run_dir)
    assert not Path("/tmp", ESCAPE).exists() and not Path("/tmp", ESCAPE + "-abs").exists()
    assert list(outside.iterdir()) == []
    rows = {a.name: a for a in store.artifacts(run_id)}
    assert rows[HONEST].status == "pulled"  # the honest file of the same run still came home
    assert (run_dir / HONEST).read_bytes() == Path(honest.remote_path).read_bytes()
    assert all(rows[n].status == "remote" and rows[n].local_path is None for n in hostile)

    # Each refusal alone: one line naming the artifact (escaped) and why.
    lone_dirs = []
    for name in hostile:
        lone = lone_run(store, sid, name, honest.remote_path, honest.size, honest.sha256)
        lone_dirs.append(artifacts_dir(sid, lone))
        with pytest.raises(TransferError) as each:
            asyncio.run(pull_lone(cfg, store, sid, lone))
        msg = each.value.one_line()
        assert "refused" in msg and "\n" not in msg and "\x1b" not in msg, msg
        assert "artifacts of run" not in msg  # its own refusal, not a count
    assert_confined(before, snapshot(tmp_path), run_dir, *lone_dirs)


def test_planted_links_and_fifos_are_never_followed(
        honest_run: tuple[Path, Store, str, str], tmp_path: Path) -> None:
    cfg, store, sid, run_id = honest_run
    honest = store.artifacts(run_id)[0]
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_bytes(b"precious")
    planted = {"linked/x.bin": "symbolic link", "deep/up/z.bin": "symbolic link",
               "y.bin": "a link or FIFO there is never followed",
               "f.bin": "not a regular file"}
    # Each announcement is the one artifact of a run of its own, whose directory holds
    # every plant.
    lone = {name: lone_run(store, sid, name, honest.remote_path, honest.size, honest.sha256)
            for name in planted}
    run_dirs = [artifacts_dir(sid, r) for r in lone.values()]
    for run_dir in run_dirs:
        (run_dir / "linked").symlink_to(outside, target_is_directory=True)
        (run_dir / "deep").mkdir()
        (run_dir / "deep" / "up").symlink_to(outside, target_is_directory=True)
        (run_dir / "y.bin.part").symlink_to(victim)
        os.mkfifo(run_dir / "f.bin.part")
    before = snapshot(tmp_path)
    for name, why in planted.items():
        with pytest.raises(TransferError) as err:
            asyncio.run(pull_lone(cfg, store, sid, lone[name]))
        assert why in err.value.message, err.value.message
    after = snapshot(tmp_path)
    assert_confined(before, after, *run_dirs)
    assert victim.read_bytes() == b"precious" and sorted(os.listdir(outside)) == ["victim"]
    assert all(store.artifacts(r)[0].status == "remote" for r in lone.values())


@pytest.mark.parametrize("server", ["sshd", "sshd_nosftp"])
def test_a_pull_stops_at_the_announced_size(server: str, request: pytest.FixtureRequest,
                                            tmp_path: Path) -> None:
    pod: SshServer = request.getfixturevalue(server)
    pod.reset_pod()
    cfg = pod.client_files(tmp_path / "client")
    store = Store()
    sid = store.open_session("pod", server, None, 1.0)
    run_id = asyncio.run(produce(cfg, store, sid))
    honest = store.artifacts(run_id)[0]
    zeros = hashlib.sha256(b"\0" * 16).hexdigest()
    # A 4 MiB run file announced as 16 bytes (what a file still growing looks like). An
    # endless device such as /dev/zero is not read at all, over either transport: only
    # regular files are (tests/security/test_hostile_pulls.py).
    endless = honest.remote_path
    truth = hashlib.sha256(Path(endless).read_bytes()[:16]).hexdigest()
    lone = {name: lone_run(store, sid, name, endless, size, sha) for name, size, sha in (
        ("endless-true.bin", 16, truth), ("endless-lie.bin", 16, "0" * 64),
        ("huge.bin", 1 << 40, zeros))}
    lone[HONEST] = lone_run(store, sid, HONEST, endless, honest.size, honest.sha256)

    def run_dir(name: str) -> Path:
        return artifacts_dir(sid, lone[name])

    seen: list[int] = []

    def progress(name: str, done: int, total: int) -> None:
        part = run_dir(name) / (name + ".part")
        if name.startswith("endless") and part.exists():
            seen.append(part.stat().st_size)
            assert done <= total == 16

    def one(name: str, **kw: PullConfig) -> None:
        asyncio.run(pull_lone(cfg, store, sid, lone[name], progress=progress, **kw))

    one("endless-true.bin")
    assert (run_dir("endless-true.bin") / "endless-true.bin").stat().st_size == 16
    with pytest.raises(TransferError, match="sha256"):
        one("endless-lie.bin")
    assert not (run_dir("endless-lie.bin") / "endless-lie.bin.part").exists()
    assert not (run_dir("endless-lie.bin") / "endless-lie.bin").exists()
    assert seen and max(seen) <= 16

    # Above the ceiling: refused before any byte moves, with the remedy. Alone in its run
    # it is over the run's ceiling first; with that raised, over one artifact's.
    with pytest.raises(TransferError) as err:
        one("huge.bin")
    assert "above the ceiling" in err.value.message and "max_run_bytes" in err.value.remedy
    assert not (run_dir("huge.bin") / "huge.bin.part").exists()
    with pytest.raises(TransferError) as err:
        one("huge.bin", limits=PullConfig(max_run_bytes=1 << 41))
    assert "above the ceiling" in err.value.message and "max_artifact_bytes" in err.value.remedy
    assert not (run_dir("huge.bin") / "huge.bin.part").exists()
    # The ceiling is the caller's: a configured 1 MiB refuses the 4 MiB honest file.
    with pytest.raises(TransferError, match="ceiling of 1048576 bytes"):
        one(HONEST, limits=PullConfig(max_artifact_bytes=1 << 20))
    assert not (run_dir(HONEST) / (HONEST + ".part")).exists()
    assert {name: store.artifacts(r)[0].status for name, r in lone.items()} == {
        "endless-lie.bin": "sha256_mismatch", "endless-true.bin": "pulled", HONEST: "remote",
        "huge.bin": "remote"}
    assert store.artifacts(run_id)[0].status == "remote"
    store.close()
