"""``gpuws run``'s printer shows verdicts first-class and kernel names short (full in
``--json``), on the events of the recorded H200 run and the verdicts the agent's own
functions state over them."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from gpuws import protocol
from gpuws.commands.run import Printer
from gpuws.live.feed import Batch
from gpuws.remote_agent import wire
from gpuws.remote_agent.verdicts import kernel, program

FIXTURES = Path(__file__).parents[1] / "fixtures"
RECORDED = FIXTURES / "recorded" / "saxpy_h200.ndjson"
CUTLASS = ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>("
           "cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)")
ELEMENTWISE = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>,"
               " at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, "
               "at::detail::Array<char*, 1>)")


def _line(event: dict, seq: int, run_id: str) -> protocol.Events:
    ev = protocol.decode_event(wire.dumps(dict(event, run_id=run_id, seq=seq))[:-1])
    assert not isinstance(ev, protocol.BadLine), ev
    return ev


def run_with_verdicts() -> list[protocol.Events]:
    """The recorded run, its kernel table grown to 14 rows (the real saxpy row and
    demangled names of real ATen/CUTLASS kernels, the LLM-decode shape: many short
    launches on a mostly idle GPU), and the verdicts the worker would state."""
    raw = [json.loads(line) for line in RECORDED.read_text().splitlines()]
    run_id = raw[0]["run_id"]
    out: list[dict] = []
    for e in raw:
        if e["type"] == "kernel_table":
            rows = [dict(e["kernels"][0], share_pct=40.0, total_ns=4e5, calls=100)]
            rows += [{"name": f"{name}_{i}" if i else name, "calls": 50, "total_ns": 3e4,
                      "mean_ns": 600.0, "share_pct": 60.0 / 13}
                     for i, name in enumerate([CUTLASS, ELEMENTWISE] * 6 + [CUTLASS])]
            e = dict(e, kernels=rows, gpu_idle_pct=99.5, memcpy_pct=0.1, source="nsys")
            pv = program.program_verdict(e)
            pv["tier3_advice"] = program.tier3_advice(pv, rows, None)
            out += [e, dict(pv, type="program_verdict")]
            continue
        out.append(e)
        if e["type"] == "rule_findings":
            km = next(x for x in raw if x["type"] == "kernel_metrics")
            out.append(dict(kernel.kernel_verdict(km, e["rules"]), type="kernel_verdict"))
    return [_line({k: v for k, v in e.items() if k not in ("run_id", "seq")}, i, run_id)
            for i, e in enumerate(out)]


def test_launch_bound_comes_first_with_what_to_try_and_names_are_short(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    events = run_with_verdicts()
    Printer(as_json=False).batch(Batch(events, [0.0] * len(events), len(events)))
    out = capsys.readouterr().out
    lines = out.splitlines()
    star = next(i for i, line in enumerate(lines) if line.startswith("★ "))
    assert lines[star].startswith("★ Launch-bound: the GPU is idle 100% of the time between "
                                  "750 short kernels")
    assert "CUDA graph" in out and "evidence: GPU busy share of the kernel span 0.5% (nsys)" \
        in out
    assert "the launch bound comes first" in out
    assert "★ saxpy: DRAM bandwidth-bound: DRAM throughput 89% of peak, SM 30% (ncu)" in out
    assert "CPIStall (est. speedup 86%) — top stall long_scoreboard 86.2% (ncu)" in out
    # The table: short names, the top 10, then one row for the other 4 with their share.
    assert "Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>" in out
    assert "at::native" not in out and "Params)" not in out
    assert any("4 others" in line and "18.5%" in line for line in lines)

    Printer(as_json=True).batch(Batch(events, [0.0] * len(events), len(events)))
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    table = next(e for e in printed if e["type"] == "kernel_table")
    assert CUTLASS in [k["name"] for k in table["kernels"]]  # --json keeps the full name
    assert [e["type"] for e in printed].count("program_verdict") == 1
    for e in printed:
        ev = protocol.decode_event(json.dumps(e).encode())
        assert msgspec.to_builtins(ev)["type"] == e["type"]
