"""Issue 32 on a real GPU: Tier 3 profiles the kernel Tier 2 chose in an HF ``generate``.

Tier 2 ranks the kernels of ``tests/gpu/programs/hf_generate.py`` (a Llama-style model,
2 layers, 4 new tokens) with torch.profiler where nsys is absent (the machine as lent),
spelling them as torch does (``void at::native::elementwise_kernel<128, 4, …>``); Tier 3
must give ncu a filter that finds that same kernel under ncu's spelling
(``at::elementwise_kernel<(int)128, …>``, ``<unnamed>``, ``[lambda(int) (instance 1)]``)
and profile it, in the one run: before, it profiled nothing ("no kernel matched").
Also ``run_started`` carries the GPU's SM count. Through the ``local`` transport, as
test_gpu_verdicts.py: the agent and its worker are the real ones. The stream is saved as
``$GPUWS_GPU_OUT/names/hf_generate.ndjson``; figures go through tests/faults/figures.py.
A few minutes of GPU time (the model's load under ncu). Skipped without a GPU.
Run alone: ``GPU_TESTS=names:400 bash tests/gpu/run_gpu_check.sh``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from faults.figures import record  # type: ignore[import-not-found]
from gpuws.cli import main
from gpuws.remote_agent.verdicts.kernelnames import EXACT, TEMPLATE, same_kernel

pytestmark = pytest.mark.gpu
if shutil.which("nvidia-smi") is None:
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)

OUT = Path(os.environ["GPUWS_GPU_OUT"]) / "names" if os.environ.get("GPUWS_GPU_OUT") \
    else None
HF = Path(__file__).parent / "programs" / "hf_generate.py"


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWS_HOME", str(tmp_path / "gpuws-home"))


def of(events: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == type_]


def test_tier3_profiles_the_kernel_tier2_chose_in_an_hf_generate(
        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    code = main(["run", "local", "-w", f"cmd:python3 {HF} --layers 2 --new-tokens 4",
                 "--tiers", "2,3", "--json", "--no-pull", "--timeout", "600"])
    out = capsys.readouterr().out
    if OUT is not None:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "hf_generate.ndjson").write_text(out)
    events = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    said = [e for e in events if e["type"] in ("diagnosis", "run_finished", "log")]
    assert code == 0, said
    started = of(events, "run_started")[0]
    assert started["gpu"] is not None and isinstance(started["gpu"]["sm_count"], int), started
    table = of(events, "kernel_table")[-1]
    top = table["kernels"][0]["name"]
    profiled = [m["kernel"] for m in of(events, "kernel_metrics")]
    argv = next(e["argv"] for e in of(events, "tier_started") if e["tier"] == 3 and e["argv"])
    retried = [e["message"] for e in of(events, "log") if "ncu names it" in e["message"]]
    fin = [e for e in of(events, "tier_finished") if e["tier"] == 3][-1]
    record("names_hf_generate", tier2_source=table["source"], top=top[:120],
           profiled=(profiled[0] if profiled else "")[:120], tier3=fin["status"],
           regex_chars=len(argv[argv.index("-k") + 1]), retried=len(retried),
           sm_count=started["gpu"]["sm_count"])
    assert not [d for d in of(events, "diagnosis") if d["code"] == "no_kernel_matched"], said
    assert fin["status"] == "ok", fin
    assert profiled, fin
    # The kernel ncu profiled is Tier 2's top one under ncu's spelling, not a sibling.
    assert any(same_kernel(top, name) in (EXACT, TEMPLATE) for name in profiled), (
        top, profiled)
    coverage = of(events, "tier3_coverage")[-1]
    assert top in [r["name"] for r in coverage["profiled"]], coverage
