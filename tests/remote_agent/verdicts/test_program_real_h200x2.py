"""The program verdict on the Tier-2 tables of two real programs, recorded on two H200s
(docs/gpu-validation.md run 19, tests/gpu/test_gpu_real_programs.py; the tables and the
timeline traces are kept in tests/fixtures/real-programs-h200x2/):

- a two-rank ``torchrun`` step over NCCL (a bf16 GEMM, then an all-reduce, 40 steps): the
  steps are judged, communication comes first, and the GEMM at 50% of kernel time is named
  as the largest lever, not waved away as "any one kernel buys little";
- a Hugging Face Llama ``generate``: dispatch-bound, from ``forward`` in modeling_llama.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuws.remote_agent.verdicts.program import program_verdict

FIXTURES = Path(__file__).parents[2] / "fixtures" / "real-programs-h200x2"


def table(name: str) -> dict[str, Any]:
    """The Tier-2 kernel table of the stream the run stored (``NAME.ndjson``)."""
    lines = (FIXTURES / f"{name}.ndjson").read_text().splitlines()
    found: dict[str, Any] = next(e for e in map(json.loads, lines) if e["type"] == "kernel_table")
    return found


def test_the_ddp_step_is_communication_bound_and_names_the_gemm() -> None:
    pv = program_verdict(table("ddp_step"))
    codes = [f["code"] for f in pv["findings"]]
    assert codes[0] == "communication_bound", codes
    assert pv["window"].startswith("steps 2–39")
    spread = next(f for f in pv["findings"] if f["code"] == "spread")
    assert spread["title"] == ("Kernel time is spread: the top kernel takes 50% of it, "
                               "across 3 kernels")
    assert spread["detail"].startswith("no kernel dominates; the top one, nvjet_sm90_tst_")
    assert "largest single lever" in spread["detail"]
    assert "buys little" not in spread["detail"]


def test_the_hf_generate_is_dispatch_bound_from_the_model() -> None:
    pv = program_verdict(table("hf_generate"))
    first = pv["findings"][0]
    assert first["code"] == "dispatch_bound"
    assert "forward in modeling_llama.py" in first["title"]
    assert pv["window"].startswith("decode steps 2–23")
