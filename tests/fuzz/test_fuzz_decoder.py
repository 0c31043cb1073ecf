"""The laptop's stream reader and decoder fed malformed lines by the ten thousand.

Every malformed line (random bytes, truncated JSON, NUL, invalid UTF-8, unknown types,
wrong field types, unknown fields, non-objects, nesting 100,000 deep, lines over the
8 MiB limit, CR in odd places) sits between two good events. Through
``framing.read_event_batches`` (the reader the client and ``gpuws replay`` use) and through
a whole ``AgentClient`` reading a fake agent's stdout in random-sized chunks: nothing
raises, each bad line is reported once as a ``BadLine``, and every good event still
arrives, in order. The figures are counted on what came out. A hypothesis property pins
the batched decoder (``framing.decode_block``) to decoding each line alone.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import time
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from faults.figures import record  # type: ignore[import-not-found]
from faults.helpers import catch_loop_errors  # type: ignore[import-not-found]
from gpuws import protocol
from gpuws.client import AgentClient
from gpuws.deploy import DeployResult
from gpuws.framing import decode_block, read_event_batches
from gpuws.transport.base import RemoteProcess
from gpuws.transport.local import LocalTransport

RECORDED = Path(__file__).parent.parent / "fixtures" / "recorded" / "saxpy_h200.ndjson"
#: The recorded run as its lines came from the pod (``json.dumps`` spacing) and as msgspec
#: writes them (compact): both shapes reach the decoder.
RAW = [line for line in RECORDED.read_bytes().splitlines() if line]
GOOD = RAW + [protocol.encode(protocol.decode_event(line))[:-1] for line in RAW]  # type: ignore[arg-type]
MALFORMED = 10_000
HUGE = 2  # lines over protocol.MAX_LINE (8 MiB each)


def sentinel(i: int) -> bytes:
    return protocol.encode(protocol.Output(run_id="fuzz", seq=i, stream="stdout",
                                           text=f"good-{i}"))[:-1]


def wrong_type(value: Any) -> Any:
    # A value no field of that kind accepts: dicts get a string, anything else an object
    # (an int is valid for a float field, so "another scalar" would not always be wrong).
    return "not-a-dict" if isinstance(value, dict) else {"bad": [1]}


def malformed(rng: random.Random, kind: int) -> bytes:
    """One line (no newline) that must not decode as an event."""
    base = rng.choice(GOOD)
    if kind == 0:  # random bytes
        data = bytes(rng.randrange(256) for _ in range(rng.randint(1, 200)))
        data = data.replace(b"\n", b"?")
        return data if data.strip() else b"?" + data
    if kind == 1:  # truncated JSON
        return base[: rng.randrange(1, len(base) - 1)]
    if kind == 2:  # a NUL somewhere
        at = rng.randrange(1, len(base) - 1)
        return base[:at] + b"\x00" + base[at:]
    if kind == 3:  # invalid UTF-8 inside a string value
        at = base.index(b'"', base.index(b'"type"') + 6) + 1
        return base[:at] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8"]) + base[at:]
    if kind == 4:  # an unknown type
        return json.dumps({"type": f"no_such_type_{rng.randrange(10**6)}", "seq": 1}).encode()
    if kind == 5:  # a field of the wrong type
        event = json.loads(base)
        key = rng.choice([k for k in event if k != "type"])
        event[key] = wrong_type(event[key])
        return json.dumps(event).encode()
    if kind == 6:  # a field the protocol does not have
        event = json.loads(base)
        event[f"extra_{rng.randrange(1000)}"] = 1
        return json.dumps(event).encode()
    if kind == 7:  # JSON, but not an object
        return rng.choice([b"[1,2,3]", b'"text"', b"42", b"null", b"true", b"[]", b"{}"])
    if kind == 8:  # trailing garbage after a good event, or two events on one line
        return base + rng.choice([b"}", b"x", b" ,", b" " + base])
    if kind == 9:  # a raw CR inside a string (terminals), or a missing tag
        return rng.choice([base.replace(b'"type"', b'"ty\rpe"'),
                           base.replace(b'"type"', b'"tipe"')])
    # kind == 10: nested 100,000 deep inside a free-form field (msgspec: RecursionError)
    return (b'{"type":"diagnosis","code":"x","severity":"info","title":"t","cause":"c",'
            b'"details":{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}}")


def corpus(seed: int) -> tuple[list[bytes], int]:
    """MALFORMED bad lines, each followed by a numbered good one; HUGE over-long lines."""
    rng = random.Random(seed)
    lines: list[bytes] = []
    for i in range(MALFORMED):
        kind = 10 if i % 1000 == 999 else rng.randrange(10)
        lines.append(malformed(rng, kind))
        lines.append(sentinel(i))
    for j in range(HUGE):
        at = rng.randrange(len(lines))
        # One just over the limit (it may end inside the read that crosses the limit), one
        # far over it (the reader must drop it as it streams in).
        size = protocol.MAX_LINE + (j * 300_000)
        lines.insert(at, b'{"type":"output","text":"' + b"y" * size + b'"}')
    return lines, MALFORMED + HUGE


class ChunkedReader:
    """Hands out a byte string in random-sized reads, like an SSH channel."""

    def __init__(self, data: bytes, rng: random.Random) -> None:
        self.data, self.pos, self.rng = data, 0, rng

    async def read(self, n: int = -1) -> bytes:
        size = self.rng.choice([1, 7, 512, 4096, 65536, 1 << 20])
        size = size if n < 0 else min(size, n)
        out = self.data[self.pos:self.pos + size]
        self.pos += len(out)
        return out


class Sink:
    def write(self, data: bytes) -> None:
        pass

    async def drain(self) -> None:
        pass

    def write_eof(self) -> None:
        pass


class FakeAgent(RemoteProcess):
    """An agent process whose stdout is a prepared byte stream."""

    def __init__(self, data: bytes, rng: random.Random) -> None:
        self.stdin = Sink()
        self.stdout = ChunkedReader(data, rng)
        self.stderr = ChunkedReader(b"", rng)

    async def wait(self) -> int | None:
        return 0

    def close(self) -> None:
        pass


def test_the_stream_reader_keeps_every_line_apart() -> None:
    lines, _ = corpus(1)
    data = b"\n".join(lines) + b"\n"
    crashes: list[BaseException] = []

    async def go() -> tuple[list[protocol.Events | protocol.BadLine], int]:
        reader = ChunkedReader(data, random.Random(2))
        out: list[protocol.Events | protocol.BadLine] = []
        try:
            async for batch in read_event_batches(reader):
                out += batch
        except Exception as exc:  # a crash: the figure counts it, the assert below shows it
            crashes.append(exc)
        return out, reader.pos

    t0 = time.monotonic()
    out, consumed = asyncio.run(go())
    assert crashes == [] and consumed == len(data), crashes
    # What each line alone decodes to, in order; an over-long one is reported as such.
    want = [protocol.decode_event(ln.rstrip(b"\r")) for ln in lines]
    over = [i for i, ln in enumerate(lines) if len(ln) > protocol.MAX_LINE]
    huge = [x for x in out if isinstance(x, protocol.BadLine) and "exceeds" in x.reason]
    assert len(huge) == HUGE and all(b.length > protocol.MAX_LINE for b in huge)
    assert len(out) == len(want)
    wrong = [i for i, (got, exp) in enumerate(zip(out, want, strict=True))
             if (i in over) != (got in huge) or (i not in over and got != exp)]
    assert wrong == [], wrong[:5]
    bad = sum(isinstance(x, protocol.BadLine) for x in out)
    good = [x for x in out if isinstance(x, protocol.Output) and x.run_id == "fuzz"]
    lost = MALFORMED - len(good)
    assert bad == MALFORMED + HUGE and lost == 0 and [e.seq for e in good] == list(
        range(MALFORMED))
    record("fuzz_read_event_batches", lines=len(lines), malformed=MALFORMED + HUGE,
           reported=bad, oversized_reported=len(huge), good_events_lost=lost,
           lines_decoded_otherwise_than_alone=len(wrong), crashes=len(crashes),
           seconds=round(time.monotonic() - t0, 1))


def test_client_reports_each_bad_line_and_the_stream_goes_on() -> None:
    lines, bad = corpus(3)
    data = b"\n".join(lines) + b"\n"
    hello = protocol.Hello(agent_version="fuzz", agent_sha256="0" * 64, protocol_version=1)

    async def go() -> tuple[list[protocol.Events | protocol.BadLine], int, int]:
        loop_errors = catch_loop_errors()
        got: list[protocol.Events | protocol.BadLine] = []
        agent = FakeAgent(data, random.Random(4))
        client = AgentClient(LocalTransport(), agent,
                             DeployResult("0" * 64, 0, "cached", 0, 0.0, hello), b"", "python3")
        client.add_listener(got.append)
        await asyncio.wait_for(client.wait_closed(), 120)
        # The client keeps only samples (bounded); every bad line reaches the listeners.
        assert len(client.bad_lines) <= 100
        await client.close()
        gc.collect()  # a reader task that died is reported to the loop when collected
        # A crash: the reader stopped before the end of the stream, or died unseen.
        return got, client.bad_line_count, len(loop_errors) + (agent.stdout.pos < len(data))

    t0 = time.monotonic()
    got, counted, crashes = asyncio.run(go())
    bad_lines = [e for e in got if isinstance(e, protocol.BadLine)]
    good = [e for e in got if isinstance(e, protocol.Output) and e.run_id == "fuzz"]
    assert [e.seq for e in good] == list(range(MALFORMED))
    assert [e.text for e in good] == [f"good-{i}" for i in range(MALFORMED)]
    # No malformed line was taken for an event; each was reported, once, in its place.
    assert [isinstance(e, protocol.BadLine) for e in got].count(False) == len(good)
    assert len(bad_lines) == bad == counted
    reasons = {b.reason.split(" ")[0] for b in bad_lines}
    assert any("nested too deeply" in b.reason for b in bad_lines)
    assert any("exceeds" in b.reason for b in bad_lines)
    lost = MALFORMED - len(good)
    assert (lost, crashes) == (0, 0)
    record("fuzz_client_decoder", lines=len(lines), malformed=bad, reported=len(bad_lines),
           good_events_lost=lost, crashes=crashes, distinct_reasons=len(reasons),
           seconds=round(time.monotonic() - t0, 1))


def good_line(i: int) -> bytes:
    return GOOD[i]


event_lines = st.integers(0, len(GOOD) - 1).map(good_line)
mutated = st.builds(lambda seed, kind: malformed(random.Random(seed), kind),
                    st.integers(0, 2**32), st.integers(0, 9))
blank = st.sampled_from([b"", b" ", b"\t", b"\r"])


@given(st.lists(st.one_of(event_lines, event_lines, mutated, blank), max_size=40))
@settings(max_examples=300, deadline=None)
def test_batched_decoding_equals_decoding_each_line(lines: list[bytes]) -> None:
    """decode_block's one-call fast path never changes what a line decodes to."""
    block = b"".join(line + b"\n" for line in lines)
    expected = [protocol.decode_event(ln.rstrip(b"\r")) for ln in lines if ln.rstrip(b"\r").strip()]
    assert decode_block(block) == expected
