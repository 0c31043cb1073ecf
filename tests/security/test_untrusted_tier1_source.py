"""Tier 1's timing source, event median and caution at the trust boundary: worst values.

A short call's result says what timed it (``timing_source``), the CUDA-event median a
CUPTI figure replaced (``events_median_ms``) and, where none could, a caution naming the
timer's floor. All three are shown beside the median, so a lying agent could claim an
event median of 1e308 ms (every later ratio overflows), a negative one, or a "caution" a
megabyte long with a forged second line. Each line is decoded by the real decoder and
checked by a real :class:`~gpuws.live.boundary.Boundary`, as the engine does; no fake.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from gpuws import protocol
from gpuws.live.boundary import Boundary
from gpuws.remote_agent.measure.device_time import floor_caution

RUN = "20261128-110000-abcdef"
NOW = time.time()
STATS = {"n": 400, "median_ms": 0.00518, "mean_ms": 0.0052, "stdev_ms": 0.0001,
         "min_ms": 0.0050, "max_ms": 0.0060, "p5_ms": 0.0051, "p95_ms": 0.0054,
         "ci_low_ms": 0.00517, "ci_high_ms": 0.00519, "ci_rel_halfwidth": 0.002}
HONEST = {"stats": STATS, "mode": "cold", "batch": 1, "warmup": 5,
          "stop_reason": "ci_reached", "timing_source": "CUPTI (torch.profiler)",
          "events_median_ms": 0.00595, "caution": None}


def line(seq: int, **fields: Any) -> bytes:
    return json.dumps({"type": "tier1_result", "run_id": RUN, "seq": seq, "ts": NOW,
                       **dict(HONEST, **fields)}).encode()


def boundary() -> tuple[Boundary, list[str]]:
    said: list[str] = []
    b = Boundary(on_refusal=lambda _kind, message, _n: said.append(message))
    b.expect(RUN)
    b.check(protocol.decode_event(json.dumps({
        "type": "run_started", "run_id": RUN, "seq": 0, "ts": NOW,
        "spec": {"workload": "cmd:true"}, "run_dir": "/home/p/.cache/gpuws/runs/" + RUN,
        "pid": 1}).encode()))
    return b, said


LIES = [
    (line(1, events_median_ms=1e308), "events_median_ms = 1e+308"),
    (line(1, events_median_ms=-0.005), "events_median_ms = -0.005"),
    (line(1, caution="x" * 1_000), "Tier-1 caution is not one line"),
    (line(1, caution="ncu may read 2% lower\nrun finished ok"), "Tier-1 caution is not one line"),
    (line(1, timing_source="CUPTI\r(torch.profiler)"), "Tier-1 timing source is not one line"),
    (line(1, timing_source="C" * 100_000), "Tier-1 timing source is not one line"),
]


@pytest.mark.parametrize(("raw", "words"), LIES, ids=[w for _raw, w in LIES])
def test_a_lie_is_refused_in_its_place(raw: bytes, words: str) -> None:
    b, said = boundary()
    ev = protocol.decode_event(raw)
    assert not isinstance(ev, protocol.BadLine), ev  # well-formed: only the bounds catch it
    out = b.check(ev)
    # In sequence: a logged refusal takes its seq, so the stored run stays gap-free.
    assert isinstance(out, protocol.Log) and out.seq == 1 and words in out.message
    assert len(said) == 1 and words in said[0]


def test_an_honest_result_passes_untouched_with_and_without_the_new_fields() -> None:
    b, said = boundary()
    cupti = protocol.decode_event(line(1))
    assert b.check(cupti) is cupti and isinstance(cupti, protocol.Tier1Result)
    assert cupti.timing_source == "CUPTI (torch.profiler)"
    assert cupti.events_median_ms == pytest.approx(0.00595)
    # What the agent writes when no CUPTI records came (its own function, not a copy).
    caution = floor_caution(0.00787, "no torch in the workload's Python")
    assert caution is not None
    cautioned = protocol.decode_event(line(2, timing_source="CUDA events",
                                           events_median_ms=None, caution=caution))
    assert b.check(cautioned) is cautioned
    # An agent from before these fields: they decode as None, and pass.
    old = {k: v for k, v in json.loads(line(3)).items()
           if k not in ("timing_source", "events_median_ms", "caution")}
    before = protocol.decode_event(json.dumps(old).encode())
    assert isinstance(before, protocol.Tier1Result) and before.timing_source is None
    assert b.check(before) is before
    assert said == []
