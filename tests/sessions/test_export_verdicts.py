"""The export's verdict section (first in a run's section) and its kernel tables: short
names, the top rows and one "others" row, the full names folded in ``<details>``."""

from __future__ import annotations

import json
from types import ModuleType

from gpuws.sessions.export import export_session
from gpuws.sessions.store import Store

CUTLASS = ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>("
           "cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)")
FLASH = ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
         "cutlass::half_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::half_t> >, false, "
         "true, false, false, true, true, false>(Flash_fwd_params)")
#: A pod may name a kernel anything: this one tries to close the details block and a
#: code span, and to start a table row.
HOSTILE = "void evil<`x`>(int)</details>\n| x | y |"


def _launch_bound_run(recorded: ModuleType, run_id: str) -> list[bytes]:
    lines = []
    for raw in recorded.saxpy_run(run_id):
        event = json.loads(raw)
        if event["type"] == "kernel_table":
            names = [CUTLASS, FLASH, HOSTILE] + [f"triton_poi_fused_add_{i}" for i in range(11)]
            event.update(source="nsys", gpu_idle_pct=97.0, memcpy_pct=0.5, kernels=[
                {"name": n, "calls": 100, "total_ns": 4e5 - i * 1e4, "mean_ns": 4e3 - i * 100,
                 "share_pct": 100.0 / 14} for i, n in enumerate(names)])
        lines.append(json.dumps(event).encode() + b"\n")
    return lines


def test_the_verdict_leads_and_long_names_fold_away(store: Store, recorded: ModuleType) -> None:
    sid = store.open_session("pod", "local", None, 2.0, started=recorded.T0)
    store.ingest(sid, recorded.probe_line())
    store.ingest_many(sid, _launch_bound_run(recorded, "v1"))
    md = export_session(store, sid, now=recorded.T0 + 100)
    section = md[md.index("## Run `v1`"):]
    assert section.index("### Verdict") < section.index("### Commands")
    verdict = section[section.index("### Verdict"):section.index("### Commands")]
    assert verdict.split("\n")[2].startswith(
        "**Launch-bound: the GPU is idle 97% of the time between 1400 short kernels**")
    assert "- Try: capture the steady state in a CUDA graph" in verdict
    assert "GPU busy share of the kernel span 3.0% (nsys)" in verdict
    # Tier 3 kept its own filter (regex:saxpy), which none of the hot kernels match.
    assert "Tier 3 profiles what regex:saxpy matches, none of which Tier 2 ranked." in verdict
    assert "- missed `Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>` (7.1%): "\
        "not matched by the filter regex:saxpy" in verdict

    table = section[section.index("### Kernels"):section.index("###", section.index(
        "### Kernels") + 4)]
    rows = [line for line in table.split("\n") if line.startswith("| ")]
    assert rows[1] == ("| 1 | `Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>` "
                       "| 100 | 400.00 µs | 4.00 µs | 7.1% |")
    assert rows[2].startswith("| 2 | `flash_fwd_kernel` |")
    assert rows[11].startswith("|  | 4 others | 400 |") and rows[11].endswith("| 28.6% |")
    assert len(rows) == 12  # header, 10 kernels, others
    details = table[table.index("<details>"):table.index("\n</details>")]
    assert f"- `Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>`: `{CUTLASS}`" \
        in details
    assert f"`{FLASH}`" in details
    # The hostile name stays inside one code span on one line: no early </details>, no row.
    # (its newline shown as the two characters \n, as every pod newline is: textsafe)
    assert details.count("</details>") == 1 and "``void evil<`x`>(int)</details>\\n| x | y |``" \
        in details
    assert md.count("\n</details>") == 1
    assert not any(line.startswith("| x | y |") for line in md.split("\n"))


def test_a_counters_blocked_session_exports_its_verdict_with_its_sources(
        store: Store, recorded: ModuleType) -> None:
    """The recorded H200 saxpy run (Tier 1, static analysis) with Tier 3 replaced by the
    counters-blocked fallback and a synthetic GPM window on Tier 1 (the fake and the
    window as tests/live/test_verdicts_without_counters.py makes them)."""
    from live.test_verdicts_without_counters import (  # type: ignore[import-not-found]
        COPY_GPM,
        FIXTURES,
        blocked,
    )

    sid = store.open_session("pod", "local", None, 2.0, started=recorded.T0)
    store.ingest(sid, recorded.probe_line())
    events = blocked(FIXTURES / "recorded" / "saxpy_h200.ndjson", gpm1=COPY_GPM)
    store.ingest_many(sid, [json.dumps(e).encode() + b"\n" for e in events])
    md = export_session(store, sid, now=recorded.T0 + 100)
    verdict = md[md.index("### Verdict"):md.index("###", md.index("### Verdict") + 4)]
    assert ("**`saxpy`**: DRAM bandwidth-bound: 102% of the GPU's peak bandwidth, DRAM "
            "bandwidth 85% utilised (NVML GPM) (from CUDA events, NVML GPM, static analysis, "
            "without hardware counters).") in verdict
    evidence = next(line for line in verdict.split("\n") if line.startswith("Evidence: ach"))
    assert "achieved bandwidth 4,300.4 GB/s (CUDA events)" in evidence
    assert "DRAM bandwidth utilisation 17.0% (NVML GPM)" in evidence
    assert "GPU's work share of the GPM window (Tier 1's timed rounds) 20.0% (CUDA events)" \
        in evidence
    assert "DRAM bandwidth utilisation while the work ran (GPM ÷ work share) 85.0% (NVML " \
        "GPM)" in evidence
    assert "theoretical occupancy 100.0% (static analysis)" in evidence


def _two_rank_run(recorded: ModuleType, run_id: str) -> list[bytes]:
    """The saxpy recording with its kernel table replaced by the two-rank DDP table that
    gpuws reads from the real H200 traces (tests/fixtures/real-programs-h200)."""
    import gzip
    import shutil
    import tempfile
    from pathlib import Path

    from gpuws.remote_agent.measure.torch_profile import read_results

    real = Path(__file__).parents[1] / "fixtures" / "real-programs-h200"
    with tempfile.TemporaryDirectory() as tmp:
        for rank, pid in ((0, 1593), (1, 1594)):
            with gzip.open(real / f"ddp-rank{rank}.trace.json.gz", "rb") as src, \
                    open(Path(tmp) / f"torch-trace-{pid}-r{rank}.json", "wb") as dst:
                shutil.copyfileobj(src, dst)
        got = read_results(tmp)
    got.pop("processes")
    got.pop("problems")
    lines = []
    for raw in recorded.saxpy_run(run_id):
        event = json.loads(raw)
        if event["type"] == "kernel_table":
            event = {k: event[k] for k in ("type", "run_id", "seq", "ts")}
            event.update(source="torch.profiler (injected)", **got)
        lines.append(json.dumps(event).encode() + b"\n")
    return lines


def test_the_judged_window_ranks_and_code_are_exported(store: Store,
                                                       recorded: ModuleType) -> None:
    sid = store.open_session("pod", "local", None, 2.0, started=recorded.T0)
    store.ingest(sid, recorded.probe_line())
    store.ingest_many(sid, _two_rank_run(recorded, "d1"))
    md = export_session(store, sid, now=recorded.T0 + 100)
    section = md[md.index("## Run `d1`"):]
    verdict = section[section.index("### Verdict"):section.index("### Commands")]
    assert "Judged: steps 2\u201339, " in verdict and "set_device" in verdict
    assert "**Communication-bound: collectives not overlapped with compute" in verdict
    table = section[section.index("### Kernels"):]
    assert "| # | kernel | calls | total | mean | share | launched from |" in table
    assert "`ddp_step.py:18 in main`" in table
    assert "Rank 0 (pid 1593)" in table and "Rank 1 (pid 1594)" in table
    assert "Judged: steps 2\u201340" in table  # rank 1's own window
