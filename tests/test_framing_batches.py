"""Batch decoding (one call per chunk) gives exactly what decoding line by line gives."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuws import protocol
from gpuws.framing import LineBuffer, decode_block, read_event_batches

RECORDED = Path(__file__).parent / "fixtures" / "recorded" / "saxpy_h200.ndjson"


class Chunks:
    """Feeds a byte string in fixed-size chunks, like a socket would."""

    def __init__(self, data: bytes, chunk: int) -> None:
        self.data, self.chunk, self.pos = data, chunk, 0

    async def read(self, n: int = -1) -> bytes:
        out = self.data[self.pos:self.pos + min(n, self.chunk)]
        self.pos += len(out)
        return out


def line_by_line(block: bytes) -> list[protocol.Events | protocol.BadLine]:
    """The reference: what the framing did before batches (one decode per line)."""
    lines = [line.rstrip(b"\r") for line in block.split(b"\n")[:-1]]
    return [protocol.decode_event(line) for line in lines if line.strip()]


def batches(data: bytes, chunk: int) -> list[list[protocol.Events | protocol.BadLine]]:
    async def go() -> list[list[protocol.Events | protocol.BadLine]]:
        return [b async for b in read_event_batches(Chunks(data, chunk))]
    return asyncio.run(go())


def test_a_recorded_gpu_run_decodes_the_same_in_one_call() -> None:
    data = RECORDED.read_bytes()
    events = decode_block(data)
    assert len(events) == 34 and not any(isinstance(e, protocol.BadLine) for e in events)
    assert events == line_by_line(data)
    assert isinstance(events[0], protocol.RunStarted)
    assert isinstance(events[-1], protocol.RunFinished) and events[-1].status == "ok"
    assert [e.seq for e in events] == list(range(34))


def test_batches_in_any_chunking_are_the_events_in_order() -> None:
    data = RECORDED.read_bytes()
    expected = line_by_line(data)
    for chunk in (1, 7, 4096, 1 << 20):
        got = batches(data, chunk)
        assert [e for b in got for e in b] == expected
        assert all(got)  # no empty batches
    assert len(batches(data, 1 << 20)) == 1  # a big read is one batch


def test_lines_that_only_look_like_one_object_each_take_the_careful_path() -> None:
    pong = protocol.encode(protocol.Pong(req=1))
    cases = [
        pong + b'{"type":"pong"} {"type":"pong"}\n' + pong,  # two values on one line
        pong + b'{"type":"pong"}{"type":"pong"}\n{"type":\n"pong"}\n',  # and one across two
        pong + b"\n" + pong + b"   \n" + pong,  # blank lines are skipped, not events
        pong.replace(b"\n", b"\r\n") * 3,  # CRLF from a terminal
        pong + b'{"type":"pong","req":"one"}\n' + pong,  # wrong field type
        pong + b'{"type":"log","message":"a}\n{b"}\n' + pong,  # raw newline inside a string
        b"garbage\n" + pong + b"\x00\xff\n",
    ]
    for block in cases:
        assert decode_block(block) == line_by_line(block), block
    odd = decode_block(cases[0])
    assert [type(e).__name__ for e in odd] == ["Pong", "BadLine", "Pong"]
    assert "trailing characters" in odd[1].reason  # type: ignore[union-attr]


def test_an_oversized_line_is_reported_between_its_neighbours() -> None:
    pong = protocol.encode(protocol.Pong(req=2))
    lines = LineBuffer(max_line=1000)
    out: list[object] = []
    for piece in (pong, b"x" * 3000, b"y" * 3000 + b"\n" + pong):
        lines.feed(piece)
        bad, whole = lines.take()
        out += ([bad] if bad else []) + ([whole] if whole else [])
    assert out[0] == pong
    assert isinstance(out[1], protocol.BadLine) and out[1].length == 6000
    assert out[2] == pong
    assert lines.rest() == b""


def test_a_last_line_without_newline_still_counts() -> None:
    pong = protocol.encode(protocol.Pong(req=3))
    got = batches(pong + pong[:-1], 5)
    assert [e for b in got for e in b] == [protocol.Pong(req=3)] * 2


frames = st.one_of(
    st.builds(protocol.Samples, run_id=st.text(max_size=8), seq=st.integers(0, 10**6),
              values_ms=st.lists(st.floats(0, 1e3), max_size=5)).map(protocol.encode),
    st.builds(protocol.Output, run_id=st.text(max_size=8),
              stream=st.sampled_from(["stdout", "stderr"]),
              text=st.text(max_size=40)).map(protocol.encode),
    st.sampled_from([b"\n", b"\r\n", b"  \n", b"}\n{\n", b'{"type":"pong"} {"type":"pong"}\n',
                     b'{"type":\n', b'"pong"}\n', b"{}\n", b'{"type":"nope"}\n']),
    st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"") + b"\n"),
)


@given(st.lists(frames, max_size=25))
@settings(max_examples=300, deadline=None)
def test_any_mix_of_frames_and_garbage_decodes_as_line_by_line(parts: list[bytes]) -> None:
    block = b"".join(parts)
    assert decode_block(block) == line_by_line(block)


@given(st.lists(frames, max_size=25), st.integers(1, 97))
@settings(max_examples=100, deadline=None)
def test_the_batches_flattened_are_the_lines_decoded_alone(parts: list[bytes],
                                                           chunk: int) -> None:
    data = b"".join(parts)
    flat = [e for b in batches(data, chunk) for e in b]
    assert flat == line_by_line(data if data.endswith(b"\n") or not data else data + b"\n")
