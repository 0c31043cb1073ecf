"""NVML GPM figures and Tier 3's estimate at the trust boundary: the worst value of each.

A lying agent (a pod is somebody else's machine) can claim DRAM bandwidth of 10,000%, a
negative Tier-3 time, 2**40 replay passes, a reason a megabyte long with a forged second
line. Each line below is decoded by the real decoder and checked by the real
:class:`~gpuws.live.boundary.Boundary` of one connection, as the engine does; a refused
event in its run's sequence becomes a logged refusal, and the honest events around it
pass untouched. No fake here: the lines are what a lying agent would write.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from faults.figures import record  # type: ignore[import-not-found]
from gpuws import protocol
from gpuws.errors import ProtocolError
from gpuws.live.boundary import Boundary, check_answer

RUN = "20261124-190000-abcdef"
NOW = time.time()

GPM_OK = {"window_s": 2.1, "sm_active_pct": 98.0, "sm_occupancy_pct": 61.0,
          "tensor_active_pct": 0.0, "dram_bw_pct": 89.0, "fp32_pct": 3.0, "reason": "",
          "source": "NVML GPM"}
EST_OK = {"seconds": 4.1, "passes": 27, "passes_basis": "measured", "launches": 1,
          "kernel_s": 0.00018, "pass_overhead_s": 0.044, "start_s": 2.4, "read_s": 0.35,
          "budget_s": 60.0, "cheaper": ["--launch-count 1: about 4 s"]}


def line(seq: int, type_: str, **fields: Any) -> bytes:
    return json.dumps({"type": type_, "run_id": RUN, "seq": seq, "ts": NOW,
                       **fields}).encode()


def boundary() -> tuple[Boundary, list[str]]:
    said: list[str] = []
    b = Boundary(on_refusal=lambda _kind, message, _n: said.append(message))
    b.expect(RUN)
    b.check(protocol.decode_event(line(0, "run_started", spec={"workload": "cmd:true"},
                                       run_dir="/home/p/.cache/gpuws/runs/" + RUN, pid=1)))
    return b, said


def finished(seq: int, gpm: dict[str, Any]) -> bytes:
    return line(seq, "tier_finished", tier=1, status="ok", wall_s=3.0, gpm=gpm)


def started(seq: int, est: dict[str, Any]) -> bytes:
    return line(seq, "tier_started", tier=3, name="Nsight Compute", estimate=est)


LIES = [
    (finished(1, dict(GPM_OK, dram_bw_pct=10_000.0)), "dram_bw_pct 10000.0 is not a percentage"),
    (finished(1, dict(GPM_OK, sm_active_pct=-0.5)), "sm_active_pct -0.5 is not a percentage"),
    (finished(1, dict(GPM_OK, window_s=1e12)), "NVML GPM window of 1000000000000.0 s"),
    (finished(1, dict(GPM_OK, window_s=-1.0)), "NVML GPM window of -1.0 s"),
    (finished(1, dict(GPM_OK, reason="x" * 1_000)), "NVML GPM reason is not one line"),
    (finished(1, dict(GPM_OK, reason="ok\nrun finished ok")), "NVML GPM reason is not one line"),
    (started(1, dict(EST_OK, seconds=-3.0)), "Tier-3 estimate of -3.0 s"),
    (started(1, dict(EST_OK, seconds=1e300)), "Tier-3 estimate of 1e+300 s"),
    (started(1, dict(EST_OK, budget_s=-1.0)), "Tier-3 budget of -1.0 s"),
    (started(1, dict(EST_OK, passes=2**40)), "1099511627776 passes"),
    (started(1, dict(EST_OK, launches=-1)), "-1 launches"),
    (started(1, dict(EST_OK, cheaper=["x"] * 1000)), "1000 cheaper plans"),
    (started(1, dict(EST_OK, start_basis="a\rb")), "Tier-3 estimate text is not one line"),
]


@pytest.mark.parametrize(("raw", "words"), LIES, ids=[w for _raw, w in LIES])
def test_a_lie_is_refused_in_its_place(raw: bytes, words: str) -> None:
    b, said = boundary()
    ev = protocol.decode_event(raw)
    assert not isinstance(ev, protocol.BadLine), ev  # well-formed: only the bounds catch it
    out = b.check(ev)
    # In sequence: a logged refusal takes its seq, so the stored run stays gap-free.
    assert isinstance(out, protocol.Log) and out.seq == 1 and words in out.message
    assert words in said[0]
    honest = b.check(protocol.decode_event(line(2, "log", message="after the lie")))
    assert isinstance(honest, protocol.Log) and honest.message == "after the lie"


def test_honest_figures_and_estimates_pass_untouched() -> None:
    b, said = boundary()
    gpm = b.check(protocol.decode_event(finished(1, GPM_OK)))
    assert isinstance(gpm, protocol.TierFinished) and gpm.gpm is not None
    assert (gpm.gpm.dram_bw_pct, gpm.gpm.sm_active_pct) == (89.0, 98.0)
    why = b.check(protocol.decode_event(finished(2, {"reason": "NVML GPM is not supported on "
                                                               "GPU 0 (Hopper or newer)"})))
    assert isinstance(why, protocol.TierFinished) and why.gpm is not None
    assert why.gpm.window_s is None
    edge = b.check(protocol.decode_event(finished(3, dict(GPM_OK, fp16_pct=100.0,
                                                           fp64_pct=0.0))))
    assert isinstance(edge, protocol.TierFinished)
    est = b.check(protocol.decode_event(started(4, EST_OK)))
    assert isinstance(est, protocol.TierStarted) and est.estimate is not None
    assert est.estimate.passes == 27 and said == []


def test_a_probe_answer_with_a_forged_gpm_reason_is_refused() -> None:
    gpu = {"index": 0, "name": "NVIDIA H100", "gpm_supported": False,
           "gpm_reason": "no\n\x1b[2Jgpuws: all fine"}
    probe = {"hostname": "p", "os": "linux", "kernel": "6", "arch": "x86_64", "container": [],
             "virtualization": [], "python_path": "/usr/bin/python3", "python_version": "3.12",
             "uid": 1000, "user": "u", "home": "/home/u", "gpus": [gpu]}
    ev = protocol.decode_event(json.dumps({"type": "probe_result", "req": 1, "ts": NOW,
                                           "probe": probe}).encode())
    assert isinstance(ev, protocol.ProbeResult)
    with pytest.raises(ProtocolError, match="GPU's GPM reason is not one line"):
        check_answer(ev)
    gpu["gpm_reason"] = "NVML refused GPM to this user"
    ok = protocol.decode_event(json.dumps({"type": "probe_result", "req": 1, "ts": NOW,
                                           "probe": probe}).encode())
    assert isinstance(ok, protocol.ProbeResult)
    assert check_answer(ok).probe.gpus[0].gpm_supported is False


def test_figures_every_lie_refused_every_honest_event_kept() -> None:
    """One connection, every lie above between honest events: the counts docs quote."""
    b, said = boundary()
    seq, refused, kept = 1, 0, 0
    honest = [finished(0, GPM_OK), started(0, EST_OK),
              finished(0, {"reason": "NVML GPM is not supported on GPU 0"})]
    for raw, _words in LIES:
        for good in honest:
            out = b.check(protocol.decode_event(good.replace(b'"seq": 0', f'"seq": {seq}'
                                                             .encode())))
            kept += isinstance(out, (protocol.TierFinished, protocol.TierStarted))
            seq += 1
        lie = protocol.decode_event(raw.replace(b'"seq": 1', f'"seq": {seq}'.encode()))
        refused += isinstance(b.check(lie), protocol.Log)
        seq += 1
    assert refused == len(LIES) and kept == len(LIES) * len(honest)
    assert b.refused_total() == len(LIES) and len(said) <= len(LIES)
    record("untrusted_evidence", lies=len(LIES), refused=refused, honest=kept,
           honest_lost=len(LIES) * len(honest) - kept, said_lines=len(said))
