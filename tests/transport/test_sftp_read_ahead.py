"""SFTP reads with several requests in flight, against the real sshd: same bytes, in order."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

from gpuws.transport.ssh import SSHTransport
from sshd import SshServer  # type: ignore[import-not-found]

CHUNK = 64 << 10


def blob(sshd: SshServer, size: int) -> tuple[Path, bytes]:
    path = sshd.pod_cache / "runs" / "r-ahead" / "artifacts" / "blob.bin"
    path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
    data = os.urandom(size)
    path.write_bytes(data)
    return path, data


async def connected(cfg: Path) -> SSHTransport:
    t = SSHTransport("pod", config_file=str(cfg))
    await t.connect()
    await t.settled()
    assert t.info.sftp
    return t


def test_whole_file_from_an_offset(sshd: SshServer, ssh_config: Path) -> None:
    path, data = blob(sshd, (3 << 20) + 12345)

    async def go() -> list[bytes]:
        t = await connected(ssh_config)
        try:
            return [c async for c in t.read_file(str(path), 1000, [], chunk=CHUNK)]
        finally:
            await t.close()
    chunks = asyncio.run(go())
    assert b"".join(chunks) == data[1000:]
    assert max(len(c) for c in chunks) <= CHUNK and len(chunks) > 40


def test_bytes_appended_while_reading_are_read_too(sshd: SshServer, ssh_config: Path) -> None:
    path, data = blob(sshd, 1 << 20)
    more = os.urandom(300_000)

    async def go() -> bytes:
        t = await connected(ssh_config)
        try:
            got = []
            async for c in t.read_file(str(path), 0, [], chunk=CHUNK):
                if not got:
                    with open(path, "ab") as f:  # the file grows after it was opened
                        f.write(more)
                got.append(c)
            return b"".join(got)
        finally:
            await t.close()
    assert asyncio.run(go()) == data + more


def test_a_file_cut_short_while_reading_gives_a_prefix(sshd: SshServer,
                                                       ssh_config: Path) -> None:
    path, data = blob(sshd, 2 << 20)

    async def go() -> bytes:
        t = await connected(ssh_config)
        try:
            got = []
            async for c in t.read_file(str(path), 0, [], chunk=CHUNK):
                if not got:
                    os.truncate(path, 700_000)
                got.append(c)
            return b"".join(got)
        finally:
            await t.close()
    out = asyncio.run(go())
    # Reads already answered before the cut may still arrive; never bytes that never were.
    assert CHUNK <= len(out) <= len(data) and out == data[:len(out)]


def test_stopping_early_leaves_the_link_usable(sshd: SshServer, ssh_config: Path) -> None:
    path, data = blob(sshd, 2 << 20)

    async def go() -> tuple[bytes, bytes]:
        t = await connected(ssh_config)
        try:
            reader = t.read_file(str(path), 0, [], chunk=CHUNK)
            assert isinstance(reader, AsyncIterator)
            first = await anext(reader)
            await reader.aclose()  # the reads still in flight are cancelled
            again = b"".join([c async for c in t.read_file(str(path), 0, [])])
            return first, again
        finally:
            await t.close()
    first, again = asyncio.run(go())
    assert first == data[:CHUNK] and again == data
