"""NDJSON framing over a byte stream: whole lines out, oversized lines dropped and reported."""

from __future__ import annotations

from collections.abc import AsyncIterator

from .protocol import MAX_LINE, BadLine, Events, decode_event
from .transport.base import ByteReader


async def read_lines(reader: ByteReader, initial: bytes = b"",
                     max_line: int = MAX_LINE) -> AsyncIterator[bytes | BadLine]:
    """Yield each complete line (without newline), or a BadLine for an oversized one.

    A line longer than ``max_line`` is skipped up to its newline; the stream then goes on
    with the next line, so one bad frame never ends a session.
    """
    buf = bytearray(initial)
    skipping = 0
    while True:
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            if skipping:
                yield BadLine(f"line of {skipping + nl} bytes exceeds the {max_line}-byte limit",
                              "", skipping + nl)
                skipping = 0
            else:
                yield bytes(buf[start:nl]).rstrip(b"\r")
            start = nl + 1
        del buf[:start]
        if len(buf) > max_line:
            skipping += len(buf)
            buf.clear()
        chunk = await reader.read(1 << 16)
        if not chunk:
            if buf and not skipping:
                yield bytes(buf)  # a last line without newline (truncated stream)
            return
        buf += chunk


async def read_events(reader: ByteReader, initial: bytes = b"") -> AsyncIterator[Events | BadLine]:
    """Decode each line into an event; undecodable lines come out as BadLine."""
    async for line in read_lines(reader, initial):
        if isinstance(line, BadLine):
            yield line
        elif line.strip():
            yield decode_event(line)
