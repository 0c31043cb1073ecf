"""Tier 3's failure paths, with stand-in `ncu` scripts.

A pod whose counters are locked, an ncu that says the driver is too old, and a regex that
matches nothing cannot be had on our machines (ours have no GPU at all), so each test
puts a small script named ncu on the pod that prints ncu's exact words for that case
(from reference/ncu-compat.md and tests/fixtures/ncu-2025.3.1-h200/no_kernels.txt) and
exits as ncu does. Everything around it — the worker's tier logic, the diagnosis, the
fallback, the durable event log — is the real code.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuws import protocol
from gpuws.remote_agent import runs
from gpuws.remote_agent.measure import tiers
from gpuws.remote_agent.worker import RunContext

FIXTURES = Path(__file__).parents[2] / "fixtures" / "ncu-2025.3.1-h200"
PERM = ("==PROF== Connected to process 4242 (/usr/bin/python3)\n"
        "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
        "Performance Counters on the target device 0. For instructions on enabling permissions "
        "and to get more information see https://developer.nvidia.com/ERR_NVGPUCTRPERM\n"
        "==PROF== Disconnected from process 4242\n")
DRIVER = "==ERROR== Cuda driver is not compatible with Nsight Compute.\n"


def fake_ncu(path: Path, output: str, code: int, report: bool = False) -> str:
    """A script that prints ``output`` like ncu and exits with ``code``."""
    out = path.with_suffix(".txt")
    out.write_text(output)
    make_report = ('for a in "$@"; do if [ "$prev" = "-o" ]; then : > "$a.ncu-rep"; fi; '
                   'prev="$a"; done\n') if report else ""
    path.write_text(f"#!/bin/sh\n{make_report}cat {out}\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


class FakePod:
    """The probe's facts for a pod with one H100-like GPU (stand-in: ours has none)."""

    def __init__(self, ncus: list[str], verdict: str = "allowed") -> None:
        self.ncus = ncus
        self.has_gpu = True
        self.counters = {"verdict": verdict,
                         "reason": "RmProfilingAdminOnly is 1 and the process lacks "
                                   "CAP_SYS_ADMIN/CAP_PERFMON"}
        self.facts: dict[str, Any] = {"gpus": [{"compute_capability": "9.0"}]}

    def select_ncu(self, exclude: list[str]) -> dict[str, Any]:
        left = [n for n in self.ncus if n not in exclude]
        return {"selected": left[0] if left else None, "selected_version": "2025.3.1",
                "reason": "test", "install_plan": None}

    def nsys(self, workload: str | None = None) -> None:
        return None

    def nsys_passed_over(self, workload: str | None = None) -> str | None:
        return None


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunContext:
    monkeypatch.setenv("GPUWS_POD_CACHE", str(tmp_path / "pod"))
    spec = {"workload": "cmd:true", "tiers": [1, 2, 3]}
    runs.ensure_private_dir(runs.cache_root())
    runs.ensure_private_dir(runs.runs_root())
    rdir = Path(runs.run_dir("r-test"))
    (rdir / "artifacts").mkdir(parents=True)
    (rdir / "spec.json").write_text(json.dumps(spec))
    log = runs.EventLog("r-test", str(rdir / "events.ndjson"))
    return RunContext("r-test", spec, log.append)


def events(ctx: RunContext) -> list[protocol.Events]:
    path = Path(ctx.run_dir) / "events.ndjson"
    out = []
    for line in path.read_bytes().splitlines():
        ev = protocol.decode_event(line)
        assert not isinstance(ev, protocol.BadLine), ev  # every event decodes strictly
        out.append(ev)
    return out


def test_counters_blocked_observed_falls_back_with_reason(ctx: RunContext,
                                                          tmp_path: Path) -> None:
    ncu = fake_ncu(tmp_path / "ncu", PERM, 1)
    fell_back = tiers.tier3(ctx, FakePod([ncu]), ["/bin/true"], None, "saxpy", python=False)
    assert fell_back
    evs = events(ctx)
    diag = [e for e in evs if isinstance(e, protocol.Diagnosis)]
    assert diag[0].code == "counters_blocked" and "ERR_NVGPUCTRPERM" in diag[0].cause
    assert any("NVreg_RestrictProfilingToAdminUsers=0" in r for r in diag[0].remedies)
    assert any("SYS_ADMIN" in r for r in diag[0].remedies)
    assert "sm_throughput_pct" in diag[0].unmeasured
    fin = [e for e in evs if isinstance(e, protocol.TierFinished)]
    assert fin[-1].tier == 3 and fin[-1].status == "fallback"
    assert "ERR_NVGPUCTRPERM" in fin[-1].reason
    started = [e for e in evs if isinstance(e, protocol.TierStarted) and e.argv]
    argv = started[0].argv or []
    assert "--kernel-name-base" in argv and "demangled" in argv
    assert argv[argv.index("--clock-control") + 1] == "none"


def test_counters_predicted_blocked_never_runs_ncu(ctx: RunContext, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    ncu = tmp_path / "ncu"
    ncu.write_text(f"#!/bin/sh\ntouch {marker}\n")
    ncu.chmod(0o755)
    assert tiers.tier3(ctx, FakePod([str(ncu)], verdict="blocked"), ["/bin/true"], None, "x",
                       python=False)
    assert not marker.exists()
    diag = next(e for e in events(ctx) if isinstance(e, protocol.Diagnosis))
    assert diag.code == "counters_blocked" and "RmProfilingAdminOnly" in diag.cause


def test_no_kernel_matched_lists_what_ncu_saw(ctx: RunContext, tmp_path: Path) -> None:
    text = (FIXTURES / "no_kernels.txt").read_text().replace("rc=0\n", "")
    ncu = fake_ncu(tmp_path / "ncu", text, 0)
    assert not tiers.tier3(ctx, FakePod([ncu]), ["/bin/true"], None, "no_such_kernel_xyz",
                           python=False)
    diag = next(e for e in events(ctx) if isinstance(e, protocol.Diagnosis))
    assert diag.code == "no_kernel_matched"
    assert diag.details["available_kernels"] == ["cupy_random_x_mod_1", "gen_sequenced",
                                                 "generate_seed_pseudo", "saxpy"]
    assert diag.details["suggested_regex"]
    fin = [e for e in events(ctx) if isinstance(e, protocol.TierFinished)][-1]
    assert fin.status == "failed"


def test_driver_not_compatible_steps_back_one_release(ctx: RunContext, tmp_path: Path) -> None:
    new = fake_ncu(tmp_path / "ncu-new", DRIVER, 1)
    old = fake_ncu(tmp_path / "ncu-old", PERM, 1)
    tiers.tier3(ctx, FakePod([new, old]), ["/bin/true"], None, "saxpy", python=False)
    evs = events(ctx)
    logs = [e.message for e in evs if isinstance(e, protocol.Log)]
    assert any("not compatible" in m and "stepping back" in m for m in logs)
    argvs = [e.argv[0] for e in evs if isinstance(e, protocol.TierStarted) and e.argv]
    assert argvs == [new, old]


def test_every_diagnosis_decodes_strictly(ctx: RunContext, tmp_path: Path) -> None:
    ncu = fake_ncu(tmp_path / "ncu", PERM, 1)
    tiers.tier3(ctx, FakePod([ncu]), ["/bin/true"], None, "saxpy", python=False)
    for ev in events(ctx):
        assert msgspec.convert(msgspec.to_builtins(ev), type(ev)) == ev
    assert os.path.exists(Path(ctx.run_dir) / "events.ndjson")


# ----------------------------------------------------------------------------- verdicts
RECORDED_RUN = FIXTURES.parent / "recorded" / "saxpy_h200.ndjson"


def serving_ncu(path: Path) -> str:
    """An ncu that 'profiles' by copying the report recorded on the H200 (saxpy, the
    default sections) to the report path it is given. Stand-in: the machine has no GPU;
    the tier logic, reading that real report through ncu_report, and the verdicts around
    it are the real code."""
    report = FIXTURES.parent / "recorded" / "saxpy_h200.ncu-rep"
    path.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do if [ "$prev" = "-o" ]; then '
        f'cp {report} "$a.ncu-rep"; fi; prev="$a"; done\n'
        'echo "==PROF== Disconnected from process 1"\n')
    path.chmod(0o755)
    return str(path)


def test_tier3_states_a_kernel_verdict_and_checks_itself_against_tier2(
        ctx: RunContext, tmp_path: Path) -> None:
    # Tier 2's table of the recorded run, with the real cuDNN attention kernel beside it
    # (from the torch.profiler capture) so that one is missed.
    table = [{"name": "saxpy", "calls": 10, "total_ns": 1836964.0, "mean_ns": 183696.4,
              "share_pct": 88.0},
             {"name": "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wg...", "calls": 5,
              "total_ns": 234433.0, "mean_ns": 46886.6, "share_pct": 12.0}]
    assert not tiers.tier3(ctx, FakePod([serving_ncu(tmp_path / "ncu")]), ["/bin/true"],
                           table, "saxpy", python=False)
    evs = events(ctx)
    verdict = next(e for e in evs if isinstance(e, protocol.KernelVerdict))
    assert verdict.kernel == "saxpy" and verdict.bound == "dram" and verdict.counters
    assert verdict.rules[0].rule == "CPIStall"
    assert verdict.rules[0].evidence == "top stall long_scoreboard 86.2% (ncu)"
    cov = next(e for e in evs if isinstance(e, protocol.Tier3Coverage))
    assert [r.name for r in cov.profiled] == ["saxpy"]
    assert cov.missed[0].short_name.startswith("cudnn_generated")
    assert cov.missed[0].why == "not matched by the filter regex:saxpy"
    kinds = [type(e).__name__ for e in evs]
    assert kinds.index("RuleFindings") < kinds.index("KernelVerdict") < kinds.index(
        "Tier3Coverage") < kinds.index("TierFinished")


def test_blocked_counters_still_give_a_verdict_from_tier1_and_static(
        ctx: RunContext, tmp_path: Path) -> None:
    # What the Tier 1 child of the recorded H200 run wrote, through the worker's log.
    for line in RECORDED_RUN.read_text().splitlines():
        event = json.loads(line)
        if event["type"] in ("tier1_result", "static_analysis"):
            ctx.emit({k: v for k, v in event.items() if k not in ("run_id", "seq")})
    ctx.emit({"type": "output", "stream": "stdout", "text": '{"type":"tier1_result"'})
    assert tiers.tier3(ctx, FakePod([fake_ncu(tmp_path / "ncu", PERM, 1)]), ["/bin/true"],
                       None, "saxpy", python=False)
    from gpuws.remote_agent.measure import findings

    findings.without_counters(ctx, "saxpy")
    verdict = [e for e in events(ctx) if isinstance(e, protocol.KernelVerdict)][-1]
    assert verdict.counters is False and verdict.bound == "dram"
    assert verdict.sources == ["CUDA events", "static analysis"]
    assert {e.source for e in verdict.evidence} == {"CUDA events", "static analysis"}


def test_tier2_states_the_program_verdict_before_tier3(ctx: RunContext) -> None:
    rows = [{"name": "saxpy", "calls": 10, "total_ns": 1836964.0, "mean_ns": 183696.4,
             "share_pct": 100.0}]
    ctx.spec["tiers"] = [2, 3]
    tiers.finish_tier2(ctx, 0.0, rows, "torch.profiler", [], {"gpu_idle_pct": None,
                                                              "memcpy_pct": None})
    evs = events(ctx)
    assert [type(e).__name__ for e in evs] == ["KernelTable", "TierFinished", "ProgramVerdict"]
    verdict = evs[-1]
    assert isinstance(verdict, protocol.ProgramVerdict)
    assert verdict.findings[0].code == "dominant_kernel"
    assert verdict.tier3_advice.startswith("Tier 3 profiles saxpy: 100% of kernel time")


def test_a_verdict_that_cannot_be_stated_never_stops_the_run(ctx: RunContext) -> None:
    # A row no parser of ours writes (a share that is not a number): the table and the end
    # of Tier 2 are recorded, the verdict's failure is one warning, and the call returns.
    rows = [{"name": "k", "calls": 1, "total_ns": 1.0, "mean_ns": 1.0, "share_pct": "lots"}]
    assert tiers.finish_tier2(ctx, 0.0, rows, "nsys", []) == rows
    # Read as JSON: the laptop would refuse that table, which is not what is tested here.
    evs = [json.loads(line) for line in
           (Path(ctx.run_dir) / "events.ndjson").read_text().splitlines()]
    assert [e["type"] for e in evs] == ["kernel_table", "tier_finished", "log"]
    assert evs[-1]["message"].startswith("the program verdict was not stated: ValueError")


#: What ncu 2025.3.1 said on this workplace's gVisor-sandboxed H200 (the device notes,
#: KINDS.md, 2026-11-04: «Failed to initialize the profiler: LibraryNotLoaded»), in ncu's
#: ==ERROR== form.
LIBRARY_NOT_LOADED = ("==PROF== Connected to process 4242 (/usr/bin/python3)\n"
                      "==ERROR== Failed to initialize the profiler: LibraryNotLoaded\n"
                      "==PROF== Disconnected from process 4242\n")


def test_a_profiler_that_cannot_start_falls_back_with_its_cause(ctx: RunContext,
                                                                tmp_path: Path) -> None:
    ncu = fake_ncu(tmp_path / "ncu", LIBRARY_NOT_LOADED, 1)
    assert tiers.tier3(ctx, FakePod([ncu]), ["/bin/true"], None, "saxpy", python=False)
    evs = events(ctx)
    diag = next(e for e in evs if isinstance(e, protocol.Diagnosis))
    assert diag.code == "ncu_profiler_unavailable"
    assert diag.cause.endswith("Failed to initialize the profiler: LibraryNotLoaded")
    assert "gVisor" in diag.meaning and diag.unmeasured and diag.remedies
    fin = [e for e in evs if isinstance(e, protocol.TierFinished)][-1]
    assert fin.status == "fallback" and "LibraryNotLoaded" in fin.reason


def test_tier3_of_one_rank_tells_ncu_to_profile_inside_that_rank_s_mark(
        ctx: RunContext, tmp_path: Path) -> None:
    """--rank N: ncu profiles only kernels inside the NVTX range that the injected
    sitecustomize opens in rank N's process (torch_inject.mark_rank); the other ranks of
    torchrun run unprofiled. The stand-in ncu records the environment it was given."""
    seen = tmp_path / "ncu-env.txt"
    ncu = fake_ncu(tmp_path / "ncu", PERM, 1)
    script = Path(ncu).read_text().replace("#!/bin/sh\n", f"#!/bin/sh\nenv > {seen}\n", 1)
    Path(ncu).write_text(script)
    tiers.tier3(ctx, FakePod([ncu]), ["/bin/true"], None, "saxpy", python=False, rank=1)
    started = [e for e in events(ctx) if isinstance(e, protocol.TierStarted) and e.argv]
    argv = started[0].argv or []
    at = argv.index("--nvtx-include")
    assert argv[at - 1] == "--nvtx" and argv[at + 1] == "gpuws_rank1"
    env = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    assert env["GPUWS_NVTX_RANK"] == "1" and "GPUWS_TORCH_TRACE_DIR" not in env
    site = env["PYTHONPATH"].split(os.pathsep)[0]
    assert (Path(site) / "sitecustomize.py").is_file()
