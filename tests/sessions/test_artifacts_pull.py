"""Pulls against a real agent through the real sshd: local copies stay true, pulls don't collide.

A real run (a ``cmd:`` workload writing files into ``$GPUWS_ARTIFACT_DIR``) announces its
artifacts through the real agent; they are pulled over SFTP from the test sshd. Then the
laptop's copies are deleted or corrupted (``gpuws pull`` must notice and fetch them again,
saying why), and two pulls of the same run race (both must end with the right files,
each file fetched once).
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from gpuws import protocol
from gpuws.client import AgentClient
from gpuws.errors import TransferError
from gpuws.locations import artifacts_dir
from gpuws.sessions import artifacts as art_mod
from gpuws.sessions.artifacts import name_problem, pull_run, run_lock, shown
from gpuws.sessions.store import Store
from gpuws.transport.ssh import SSHTransport

FILES = {"a.bin": 3 * 1024 * 1024 + 17, "sub/dir/b.bin": 200_001, "empty.txt": 0}


async def connect(cfg: Path) -> AgentClient:
    return await AgentClient.connect(SSHTransport("pod", config_file=str(cfg)))


async def produce(cfg: Path, store: Store, sid: str) -> str:
    """A real run whose workload writes ``FILES``; its events go into the store."""
    client = await connect(cfg)
    done = asyncio.Event()

    def on_event(ev: protocol.Events | protocol.BadLine) -> None:
        if isinstance(ev, protocol.Event) and ev.run_id is not None:
            store.ingest(sid, ev)
            if isinstance(ev, protocol.RunFinished):
                done.set()

    client.add_listener(on_event)
    cmd = "; ".join(f'mkdir -p "$(dirname "$GPUWS_ARTIFACT_DIR/{n}")" && '
                    f'head -c {size} /dev/urandom > "$GPUWS_ARTIFACT_DIR/{n}"'
                    for n, size in FILES.items())
    info = await client.start_run(protocol.RunSpec(workload=f"cmd:{cmd}", tiers=[]))
    await asyncio.wait_for(done.wait(), 30)
    await client.close()
    return info.run_id


def pod_bytes(store: Store, run_id: str) -> dict[str, bytes]:
    """Each artifact as the pod holds it (the test sshd's pod is this machine)."""
    return {a.name: Path(a.remote_path).read_bytes() for a in store.artifacts(run_id)}


@pytest.fixture
def pulled_run(ssh_config: Path) -> tuple[Path, Store, str, str]:
    store = Store()
    sid = store.open_session("pod", "sftp", None, 1.0)
    run_id = asyncio.run(produce(ssh_config, store, sid))
    assert sorted(a.name for a in store.artifacts(run_id)) == sorted(FILES)
    return ssh_config, store, sid, run_id


async def pull_with_new_link(cfg: Path, store: Store, sid: str, run_id: str,
                             **kw: float) -> list[art_mod.PullResult]:
    client = await connect(cfg)
    try:
        return await pull_run(client, store, sid, run_id, **kw)  # type: ignore[arg-type]
    finally:
        await client.close()


def test_deleted_and_corrupted_copies_are_fetched_again(
        pulled_run: tuple[Path, Store, str, str]) -> None:
    cfg, store, sid, run_id = pulled_run
    first = asyncio.run(pull_with_new_link(cfg, store, sid, run_id))
    assert sorted(r.name for r in first) == sorted(FILES)
    assert all(r.refetched is None for r in first)
    want = pod_bytes(store, run_id)
    home = artifacts_dir(sid, run_id)
    for name, data in want.items():
        assert (home / name).read_bytes() == data

    # Nothing changed: a second pull fetches nothing (the copies are checked, not trusted).
    assert asyncio.run(pull_with_new_link(cfg, store, sid, run_id)) == []

    (home / "a.bin").unlink()                                   # deleted
    corrupted = bytearray(want["sub/dir/b.bin"])
    corrupted[1234] ^= 0x01                                     # same size, one bit off
    (home / "sub/dir/b.bin").write_bytes(bytes(corrupted))
    (home / "empty.txt").write_bytes(b"not empty")              # another size
    again = asyncio.run(pull_with_new_link(cfg, store, sid, run_id))
    reasons = {r.name: r.refetched for r in again}
    assert reasons == {"a.bin": "the local copy was missing",
                       "sub/dir/b.bin": "the local copy's sha256 differed from the pod's",
                       "empty.txt": "the local copy had 9 of 0 bytes"}
    for name, data in want.items():
        assert (home / name).read_bytes() == data
    assert all(a.status == "pulled" for a in store.artifacts(run_id))
    assert not list(home.rglob("*.part"))
    store.close()


def test_two_pulls_of_one_run_at_once_both_end_true(
        pulled_run: tuple[Path, Store, str, str]) -> None:
    cfg, store, sid, run_id = pulled_run
    other = Store()  # a second process's view: its own SQLite connection

    async def both() -> tuple[list[art_mod.PullResult], list[art_mod.PullResult]]:
        # Both links are up before either pull starts, so the two really overlap.
        c1, c2 = await asyncio.gather(connect(cfg), connect(cfg))
        try:
            return await asyncio.gather(pull_run(c1, store, sid, run_id),
                                        pull_run(c2, other, sid, run_id))
        finally:
            await asyncio.gather(c1.close(), c2.close())

    a, b = asyncio.run(both())
    # The lock made one wait; it then found every file home and fetched nothing again.
    assert sorted(r.name for r in a + b) == sorted(FILES)
    assert [] in (a, b)
    home = artifacts_dir(sid, run_id)
    for name, data in pod_bytes(store, run_id).items():
        assert (home / name).read_bytes() == data
    for s in (store, other):
        assert all(x.status == "pulled" for x in s.artifacts(run_id))

    # A third pull, once both are done: every file is home and true, nothing is fetched.
    async def again() -> list[art_mod.PullResult]:
        client = await connect(cfg)
        try:
            return await pull_run(client, other, sid, run_id)
        finally:
            await client.close()

    assert asyncio.run(again()) == []
    other.close()
    store.close()


def test_a_pull_waits_for_the_lock_a_bounded_time(
        pulled_run: tuple[Path, Store, str, str]) -> None:
    cfg, store, sid, run_id = pulled_run

    async def blocked() -> None:
        async with run_lock(sid, run_id):
            await pull_with_new_link(cfg, store, sid, run_id, lock_wait=0.3)

    with pytest.raises(TransferError) as err:
        asyncio.run(blocked())
    assert err.value.title == "Pull busy" and run_id in err.value.message
    assert "\n" not in err.value.one_line()
    assert all(a.status == "remote" for a in store.artifacts(run_id))
    store.close()


def test_the_store_is_handed_the_digest_not_made_to_reread(
        pulled_run: tuple[Path, Store, str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, store, sid, run_id = pulled_run
    import gpuws.sessions.store as store_mod

    def reread(path: Path) -> tuple[str, int]:
        raise AssertionError(f"{path} was read again after its last byte arrived")

    monkeypatch.setattr(store_mod, "_sha256_file", reread)
    results = asyncio.run(pull_with_new_link(cfg, store, sid, run_id))
    assert sorted(r.name for r in results) == sorted(FILES)
    for name, data in pod_bytes(store, run_id).items():
        row = next(a for a in store.artifacts(run_id) if a.name == name)
        assert row.sha256 == hashlib.sha256(data).hexdigest() and row.status == "pulled"
    store.close()


def test_mark_pulled_checks_a_given_digest_and_keeps_the_old_way(tmp_path: Path) -> None:
    store = Store()
    sid = store.open_session("pod", "sftp", None, 1.0)
    store.ingest(sid, protocol.RunStarted(run_id="r1", seq=0, ts=1.0, run_dir="/x", pid=1,
                                          spec=protocol.RunSpec(workload="cmd:true")))
    data = b"hello"
    sha = hashlib.sha256(data).hexdigest()
    store.record_artifact("r1", "h.txt", "/x/h.txt", len(data), sha)
    # Given digest and size: the file is not read (it does not even exist here).
    store.mark_pulled("r1", "h.txt", tmp_path / "absent", sha256=sha, size=len(data))
    assert store.artifacts("r1")[0].status == "pulled"
    with pytest.raises(TransferError, match="sha256"):
        store.mark_pulled("r1", "h.txt", tmp_path / "absent", sha256="0" * 64, size=len(data))
    assert store.artifacts("r1")[0].status == "sha256_mismatch"
    with pytest.raises(ValueError):
        store.mark_pulled("r1", "h.txt", tmp_path / "absent", sha256=sha)
    # Without them, the file is read and hashed as before.
    copy = tmp_path / "h.txt"
    copy.write_bytes(data)
    store.mark_pulled("r1", "h.txt", copy)
    assert store.artifacts("r1")[0].status == "pulled"
    store.close()


@pytest.mark.parametrize(("name", "why"), [
    ("report.ncu-rep", None),
    ("sub/dir/file.csv", None),
    ("..", "'..' component"),
    ("../../x", "'..' component"),
    ("a/../../x", "'..' component"),
    ("/etc/passwd", "absolute"),
    ("", "empty"),
    (".", "not normalised"),
    ("a//b", "not normalised"),
    ("a/./b", "not normalised"),
    ("a/", "not normalised"),
    ("x\nforged: pulled", "control characters"),
    ("\x1b[2Jx", "control characters"),
    ("\x1b]0;title\x07", "control characters"),
    ("ok\u202etxt.exe", "control characters"),
    ("a\\..\\b", "backslash"),
    ("report.part", ".part"),
    (".gpuws-pull.lock", "pull lock"),
    ("x" * 256, "longer than 255"),
])
def test_name_rules(name: str, why: str | None) -> None:
    problem = name_problem(name)
    if why is None:
        assert problem is None
    else:
        assert problem is not None and why in problem
    assert "\n" not in shown(name) and "\x1b" not in shown(name)
