"""NDJSON framing over a byte stream: whole lines out, oversized lines dropped and reported."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec

from .protocol import MAX_LINE, BadLine, Events, decode_event

# The protocol's one event decoder, reused for whole blocks (decode_lines).
from .protocol import _event_decoder as _decoder
from .transport.base import ByteReader

_READ = 1 << 16


class LineBuffer:
    """Cuts a byte stream into whole lines; a line over ``max_line`` is skipped and reported.

    Bytes go in with ``feed``; ``take`` hands out every whole line buffered so far as one
    block (newlines included), so callers can decode many lines per call.
    """

    def __init__(self, initial: bytes = b"", max_line: int = MAX_LINE) -> None:
        self._buf = bytearray(initial)
        self._skipping = 0
        self.max_line = max_line

    def feed(self, chunk: bytes) -> None:
        """Append bytes read from the stream."""
        self._buf += chunk

    def take(self) -> tuple[BadLine | None, bytes]:
        """The report of an oversized line that has now ended, and the whole lines buffered.

        A line still growing past ``max_line`` is dropped as it arrives (memory stays
        bounded); its ``BadLine`` comes out once its newline does.
        """
        buf = self._buf
        bad = None
        whole = b""
        if self._skipping:
            nl = buf.find(b"\n")
            if nl >= 0:
                bad = BadLine(f"line of {self._skipping + nl} bytes exceeds the "
                              f"{self.max_line}-byte limit", "", self._skipping + nl)
                del buf[:nl + 1]
                self._skipping = 0
        if not self._skipping:
            end = buf.rfind(b"\n") + 1
            if end:
                whole = bytes(buf[:end])
                del buf[:end]
        if len(buf) > self.max_line:
            self._skipping += len(buf)
            buf.clear()
        return bad, whole

    def rest(self) -> bytes:
        """At end of stream: a last line without newline (never part of an oversized one)."""
        return b"" if self._skipping else bytes(self._buf)


def decode_block(block: bytes) -> list[Events | BadLine]:
    """Decode a block of whole lines (each ending in ``\\n``), skipping blank lines.

    Gives exactly what decoding each line alone gives (``decode_event``), but the common
    case costs one C call: ``decode_lines`` is taken only when every line is one JSON
    object (``{`` at the start of the block, ``}\\n{`` at every inner line break, ``}\\n``
    at its end), so no object can span lines (JSON strings hold no raw newline) and a
    count of one value per line proves each line decoded alone. Anything else (blank
    lines, CRLF, garbage, a field of the wrong type) takes the line-by-line path, which
    reports each bad line as a ``BadLine``.
    """
    lines = block.count(b"\n")
    if (len(block) <= MAX_LINE and block[:1] == b"{" and block.endswith(b"}\n")
            and block.count(b"}\n{") == lines - 1):
        try:
            events = _decoder.decode_lines(block)
        # The same three errors protocol.decode_event turns into bad lines.
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            pass
        else:
            if len(events) == lines:
                return list(events)
    out: list[Events | BadLine] = []
    for line in block.split(b"\n")[:-1]:
        line = line.rstrip(b"\r")
        if line.strip():
            out.append(decode_event(line))
    return out


def _decode_bounded(whole: bytes, max_line: int) -> list[Events | BadLine]:
    """``decode_block``, except that a line over ``max_line`` is reported, not decoded.

    Such a line got past the buffer when its newline came in the read that took it over
    the limit (the buffer skips only a line still open past it); ``decode_event`` bounds
    lines by the protocol's limit, not by ``max_line``.
    """
    if len(whole) <= max_line:
        return decode_block(whole)
    out: list[Events | BadLine] = []
    pending: list[bytes] = []  # lines within the limit, decoded together
    for line in whole.split(b"\n")[:-1]:
        if len(line) <= max_line:
            pending.append(line + b"\n")
            continue
        out += decode_block(b"".join(pending))
        pending = []
        out.append(BadLine(f"line of {len(line)} bytes exceeds the {max_line}-byte limit",
                           "", len(line)))
    return out + decode_block(b"".join(pending))


async def read_event_batches(reader: ByteReader, initial: bytes = b"",
                             max_line: int = MAX_LINE) -> AsyncIterator[list[Events | BadLine]]:
    """Decode the stream a read at a time: one list of events (or BadLines) per chunk.

    The events, in order, that decoding each line alone gives (``decode_event``); a line
    over ``max_line`` is a ``BadLine`` in its place and the stream goes on. A fast reader
    (the laptop replaying a long run) pays the per-line Python overhead once per chunk.
    This is the reader of the agent's stream (``client.AgentClient``).
    """
    lines = LineBuffer(initial, max_line)
    while True:
        bad, whole = lines.take()
        batch: list[Events | BadLine] = [] if bad is None else [bad]
        if whole:
            batch += _decode_bounded(whole, max_line)
        if batch:
            yield batch
        chunk = await reader.read(_READ)
        if not chunk:
            rest = lines.rest()
            if rest.strip():
                yield [decode_event(rest)]
            return
        lines.feed(chunk)
