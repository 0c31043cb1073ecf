"""Artifact pulls cut at random offsets, then resumed: every file ends whole and verified.

Two real sshd servers: one with SFTP (the normal path) and one without (files stream
through the agent's ``cat`` on an exec channel, where a cut lands at any byte). Each
pull is broken by aborting the SSH connection once a random offset has arrived; a new
connection then resumes with ``sessions.artifacts.pull_run``, the pull the product makes
(the engine after a run, ``gpuws pull``). Each file is the one artifact of its own run, so
every ``pull_run`` call is that file's pull. Some ``.part`` files are also truncated at a
random byte in between (the laptop died mid-write), and one is corrupted on purpose: that
pull must fail its sha256 check and start again.

After every attempt the artifact directory is looked at: a file in its final place that
is not the pod's file is a corrupted file; a ``.part`` that is not a true prefix, or an
unverified file presented as complete (in its final place, or marked pulled), is counted
too. The figures are those counts.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from pathlib import Path

from faults.figures import record  # type: ignore[import-not-found]
from gpuws import protocol
from gpuws.client import AgentClient
from gpuws.errors import GpuwsError, TransferError
from gpuws.sessions.artifacts import Progress, PullResult, pull_run
from gpuws.sessions.store import ArtifactRow, Store
from gpuws.transport.ssh import SSHTransport
from sshd import SshServer  # type: ignore[import-not-found]

SIZE = 12 * 1024 * 1024 + 4321
#: Bytes a transport may have asked for beyond what it has handed out (SFTP read-ahead
#: of 8 MiB, an SSH channel window of 2 MiB): a cut after SIZE - IN_FLIGHT could be
#: outrun by data already on its way.
IN_FLIGHT = 8 * 1024 * 1024 + 65536
FILES = ("big-a.bin", "big-b.bin")
CUTS_PER_FILE = 6  # x 2 files x 2 servers = 24 cuts


async def produce(cfg: Path, store: Store, sid: str, name: str) -> str:
    """A real run that writes one large artifact; its events go into the store."""
    client = await AgentClient.connect(SSHTransport("pod", config_file=str(cfg)))
    done = asyncio.Event()

    def on_event(ev: protocol.Events | protocol.BadLine) -> None:
        if isinstance(ev, protocol.Event) and ev.run_id is not None:
            store.ingest(sid, ev)
            if isinstance(ev, protocol.RunFinished):
                done.set()

    client.add_listener(on_event)
    cmd = f'head -c {SIZE} /dev/urandom > "$GPUWS_ARTIFACT_DIR/{name}"'
    info = await client.start_run(protocol.RunSpec(workload=f"cmd:{cmd}", tiers=[]))
    await asyncio.wait_for(done.wait(), 30)
    await client.close()
    return info.run_id


async def pull(client: AgentClient, store: Store, sid: str, art: ArtifactRow,
               progress: Progress | None = None) -> PullResult:
    """The product's pull of the artifact's run (its one file)."""
    results = await pull_run(client, store, sid, art.run_id, progress)
    assert [r.name for r in results] == [art.name], results
    return results[0]


async def cut_and_resume(server: SshServer, cfg: Path, store: Store, sid: str, run_id: str,
                         rng: random.Random, figures: dict[str, int]) -> None:
    async def connect() -> AgentClient:
        return await AgentClient.connect(SSHTransport("pod", config_file=str(cfg)))

    for art in store.artifacts(run_id):
        original = Path(art.remote_path).read_bytes()  # the pod's file, read on its disk
        assert len(original) == SIZE and hashlib.sha256(original).hexdigest() == art.sha256
        if art.name == FILES[0]:
            # A flipped bit in what is already home: the sha256 check must catch it, and
            # the next pull must start over rather than resume from it.
            part = part_path(sid, art)
            data = bytearray(original[:rng.randrange(11, SIZE)])
            data[rng.randrange(len(data))] ^= 0x40
            part.write_bytes(bytes(data))
            client = await connect()
            try:
                await pull(client, store, sid, art)
                raise AssertionError("a corrupted copy was accepted")
            except TransferError as exc:
                assert "sha256" in exc.message
                caught = "sha256" in exc.message
            finally:
                await client.close()
            check_never_presented(store, art, original, figures)
            assert status_of(store, art) == "sha256_mismatch"
            assert not part.exists() and not final_path(sid, art).exists()
            figures["corruptions_caught"] += caught and status_of(store, art) == \
                "sha256_mismatch" and not part.exists()
        for cut in range(CUTS_PER_FILE):
            client = await connect()
            # Early enough that what the transport has in flight cannot finish the file.
            cut_at = rng.randrange(1, SIZE - IN_FLIGHT)
            fired = []

            def progress(name: str, done: int, total: int, client: AgentClient = client,
                         cut_at: int = cut_at, fired: list[int] = fired) -> None:
                if done >= cut_at and not fired:
                    fired.append(done)
                    client.transport._conn.abort()  # type: ignore[attr-defined]

            try:
                await pull(client, store, sid, art, progress)
                figures["finished_before_cut"] += 1
            except GpuwsError as exc:
                # A clear gpuws error (never a raw asyncssh/OSError traceback).
                assert isinstance(exc, TransferError), exc
                figures["cuts"] += bool(fired)
            finally:
                await client.close()
            check_never_presented(store, art, original, figures)
            if status_of(store, art) == "pulled":
                break
            part = part_path(sid, art)
            if cut % 3 == 1 and part.exists() and part.stat().st_size:
                # The laptop died mid-write: the .part ends at an arbitrary byte.
                with part.open("r+b") as f:
                    f.truncate(rng.randrange(0, part.stat().st_size))
                figures["torn_parts"] += 1
        client = await connect()
        try:
            result = await pull(client, store, sid, art)
        finally:
            await client.close()
        check_never_presented(store, art, original, figures)
        assert result.local_path.read_bytes() == original
        assert not part_path(sid, art).exists()
        row = next(a for a in store.artifacts(run_id) if a.name == art.name)
        assert row.status == "pulled" and row.local_path == str(result.local_path)
        figures["files"] += hashlib.sha256(result.local_path.read_bytes()).hexdigest() == \
            art.sha256
        # The product's pull records its transfer phase (the cost table's "transfer").
        assert any(p.phase == "transfer" and p.run_id == run_id for p in store.phases(sid))


def status_of(store: Store, art: ArtifactRow) -> str:
    return next(a.status for a in store.artifacts(art.run_id) if a.name == art.name)


def final_path(sid: str, art: ArtifactRow) -> Path:
    from gpuws.locations import artifacts_dir

    return artifacts_dir(sid, art.run_id) / art.name


def part_path(sid: str, art: ArtifactRow) -> Path:
    final = final_path(sid, art)
    return final.with_name(final.name + ".part")


def check_never_presented(store: Store, art: ArtifactRow, original: bytes,
                          figures: dict[str, int]) -> None:
    """After any pull attempt: either complete and verified, or clearly not there yet.

    Counts what it finds (``files_corrupted``: a file in its final place that is not the
    pod's; ``part_presented_as_complete``: an unverified file in its final place or
    recorded as home; ``bad_parts``: a kept ``.part`` that is not a prefix of the file),
    then asserts, so the figures are what was seen.
    """
    sid = store.run(art.run_id).session_id
    row = next(a for a in store.artifacts(art.run_id) if a.name == art.name)
    final, part = final_path(sid, art), part_path(sid, art)
    figures["checks"] += 1
    if final.exists() and final.read_bytes() != original:
        figures["files_corrupted"] += 1
    if row.status == "pulled":
        figures["part_presented_as_complete"] += part.exists()
        assert final.read_bytes() == original and not part.exists()
        return
    figures["part_presented_as_complete"] += final.exists() or row.local_path is not None
    assert not final.exists(), "an unverified file was put in its final place"
    assert row.local_path is None
    if part.exists():
        data = part.read_bytes()
        # What is kept to resume from is a true prefix of the file, never garbage.
        figures["bad_parts"] += data != original[:len(data)]
        assert data == original[:len(data)]
        figures["resumed_bytes"] += len(data)


def test_cut_transfers_resume_to_verified_files(sshd: SshServer, sshd_nosftp: SshServer,
                                                tmp_path: Path) -> None:
    rng = random.Random(7)
    figures = {"cuts": 0, "finished_before_cut": 0, "torn_parts": 0, "corruptions_caught": 0,
               "files": 0, "resumed_bytes": 0, "checks": 0, "files_corrupted": 0,
               "part_presented_as_complete": 0, "bad_parts": 0}
    store = Store()
    t0 = time.monotonic()
    for server, name in ((sshd, "sftp"), (sshd_nosftp, "exec")):
        server.reset_pod()
        cfg = server.client_files(tmp_path / name)
        sid = store.open_session("pod", name, None, 1.0)
        for file in FILES:
            run_id = asyncio.run(produce(cfg, store, sid, file))
            assert [a.name for a in store.artifacts(run_id)] == [file]
            asyncio.run(cut_and_resume(server, cfg, store, sid, run_id, rng, figures))
    store.close()
    assert figures["files"] == 2 * len(FILES)
    assert figures["cuts"] >= 20
    assert figures["corruptions_caught"] == 2
    assert (figures["files_corrupted"], figures["part_presented_as_complete"],
            figures["bad_parts"]) == (0, 0, 0)
    record("transfer_cut", trials=figures["cuts"] + figures["finished_before_cut"],
           faults=figures["cuts"] + figures["torn_parts"] + figures["corruptions_caught"],
           cuts=figures["cuts"], torn_parts=figures["torn_parts"],
           corruptions_caught=figures["corruptions_caught"], files=figures["files"],
           states_checked=figures["checks"], files_corrupted=figures["files_corrupted"],
           part_presented_as_complete=figures["part_presented_as_complete"],
           parts_not_a_prefix=figures["bad_parts"], seconds=round(time.monotonic() - t0, 1))
