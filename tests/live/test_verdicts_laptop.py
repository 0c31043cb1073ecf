"""Verdicts on the laptop: the boundary bounds them, the model keeps the pod's, and an old
session (recorded on the H200 before verdict events existed) gets today's by replay."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest

from gpuws import protocol
from gpuws.live import verdicts
from gpuws.live.boundary import MAX_VERDICT_ITEMS, MAX_VERDICT_TEXT, Boundary
from gpuws.live.model import RunModel

RECORDED = Path(__file__).parents[1] / "fixtures" / "recorded" / "saxpy_h200.ndjson"


def recorded_events() -> list[protocol.Events]:
    out = []
    for line in RECORDED.read_bytes().splitlines():
        ev = protocol.decode_event(line)
        assert not isinstance(ev, protocol.BadLine)
        out.append(ev)
    return out


def test_an_old_session_gets_todays_verdicts_from_its_stored_events() -> None:
    events = recorded_events()
    assert not any(isinstance(e, protocol.KernelVerdict) for e in events)  # recorded before
    got = verdicts.derive(verdicts.inputs_from_events(events))
    assert got.program is not None and got.program.findings[0].code == "dominant_kernel"
    assert got.program.tier3_advice.startswith("Tier 3 profiles saxpy")
    assert [k.bound for k in got.kernels] == ["dram"]
    assert got.coverage is not None and got.coverage.regex == "saxpy"
    assert [r.name for r in got.coverage.profiled] == ["saxpy"]
    # The model of the same events (a replay) derives the same.
    model = RunModel(events[0].run_id or "")
    model.apply(events)
    assert verdicts.derive(verdicts.inputs_from_model(model)) == got


def test_without_counters_the_pods_gpm_verdict_is_kept() -> None:
    # What the laptop cannot recompute (GPM samples only the pod saw) stays as the pod
    # said; where there is nothing from the pod, Tier 1 and static analysis speak.
    events = [e for e in recorded_events()
              if not isinstance(e, (protocol.KernelMetrics, protocol.RuleFindings))]
    fallback = next(e for e in events if isinstance(e, protocol.TierFinished) and e.tier == 3)
    fallback.status = "fallback"
    got = verdicts.derive(verdicts.inputs_from_events(events))
    assert [k.counters for k in got.kernels] == [False]
    assert got.kernels[0].sources == ["CUDA events", "static analysis"]
    pod = protocol.KernelVerdict(run_id=events[0].run_id, seq=999, kernel="saxpy",
                                 bound="dram", sentence="from GPM", counters=False,
                                 sources=["NVML GPM"])
    got = verdicts.derive(verdicts.inputs_from_events([*events, pod]))
    assert [k.sentence for k in got.kernels] == ["from GPM"]


def test_the_model_keeps_the_pods_verdicts_once() -> None:
    model = RunModel("r1")
    pv = protocol.ProgramVerdict(run_id="r1", seq=0, source="nsys", bound="launch",
                                 summary="Launch-bound")
    kv = protocol.KernelVerdict(run_id="r1", seq=1, kernel="k", bound="dram", sentence="s")
    again = protocol.KernelVerdict(run_id="r1", seq=2, kernel="k", bound="latency",
                                   sentence="t")
    cov = protocol.Tier3Coverage(run_id="r1", seq=3)
    changed, _ = model.apply([pv, kv, again, cov, pv])
    assert changed == {"verdict"}
    assert model.program_verdict is pv and [k.sentence for k in model.kernel_verdicts] == ["t"]
    assert model.coverage is cov


def _boundary() -> Boundary:
    b = Boundary()
    b.expect("20261124-120000-abcdef", started=time.time())
    return b


@pytest.mark.parametrize("worst", [
    protocol.ProgramVerdict(source="nsys", bound="gpu", summary="x" * (MAX_VERDICT_TEXT + 1)),
    protocol.ProgramVerdict(source="nsys", bound="gpu", summary="s", findings=[
        protocol.Finding(code="c", title="t", remedies=["r"] * (MAX_VERDICT_ITEMS + 1))]),
    protocol.KernelVerdict(kernel="k", bound="dram", sentence="s", rules=[
        protocol.RankedRule(rule="r", kind="OPT", message="m")] * (MAX_VERDICT_ITEMS + 1)),
    protocol.KernelVerdict(kernel="k" * 20_000, bound="dram", sentence="s"),
    protocol.Tier3Coverage(others=["k"] * (MAX_VERDICT_ITEMS + 1)),
    protocol.Tier3Coverage(missed=[protocol.CoverageRow(name="k", why="w" * 5000)]),
])
def test_oversized_verdicts_are_refused_and_the_sequence_stays_whole(
        worst: protocol.Events) -> None:
    b = _boundary()
    ev = msgspec.structs.replace(worst, run_id="20261124-120000-abcdef", seq=0, ts=time.time())
    kept = b.check(ev)
    assert isinstance(kept, protocol.Log) and "refused" in kept.message
    assert b.refused_total() == 1
    honest = msgspec.structs.replace(
        protocol.KernelVerdict(kernel="void cutlass::Kernel2<" + "x" * 3000 + ">()",
                               bound="dram", sentence="DRAM bandwidth-bound"),
        run_id="20261124-120000-abcdef", seq=1, ts=time.time())
    assert b.check(honest) is honest
