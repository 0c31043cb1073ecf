"""Tier 3's cost said before ncu starts, and ``--max-tier3-seconds`` stopping a plan.

The inputs are recorded real figures: Tier 2's table and Tiers 1-3 of the saxpy run
recorded on an H200 (tests/fixtures/recorded/saxpy_h200.ndjson: torch.profiler's table,
Tier 2's wall, the ncu pass count and Tier 3's measured wall). ncu is a stand-in script
that leaves a mark when it runs (ours have no GPU), as in test_tier3_paths.py; the
worker's tier logic, the estimate and the durable event log are the real code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuws import protocol
from gpuws.remote_agent import runs
from gpuws.remote_agent.measure import tier3_cost, tiers
from gpuws.remote_agent.pod import gpusel
from gpuws.remote_agent.profilers.ncu_cmd import DEFAULT_SECTIONS
from gpuws.remote_agent.verdicts import kernelnames
from gpuws.remote_agent.worker import RunContext
from remote_agent.measure.test_tier3_paths import (  # type: ignore[import-not-found]
    PERM,
    FakePod,
    fake_ncu,
)

RECORDED = Path(__file__).parents[2] / "fixtures" / "recorded" / "saxpy_h200.ndjson"
SIX = ["SpeedOfLight", "Occupancy", "LaunchStats", "ComputeWorkloadAnalysis",
       "MemoryWorkloadAnalysis", "WarpStateStats"]


def recorded() -> dict[str, Any]:
    """The recorded run's Tier-2 table and walls, and Tier 3's sections and passes."""
    out: dict[str, Any] = {}
    for line in RECORDED.read_text().splitlines():
        ev = json.loads(line)
        if ev["type"] == "kernel_table":
            out["table"] = ev["kernels"]
        elif ev["type"] == "tier1_result":
            out["median_ms"] = ev["stats"]["median_ms"]
        elif ev["type"] == "tier_finished":
            out[f"wall{ev['tier']}"] = ev["wall_s"]
        elif ev["type"] == "tier_started" and ev["tier"] == 3 and ev.get("argv"):
            argv = ev["argv"]
            out["sections"] = [argv[i + 1] for i, a in enumerate(argv) if a == "--section"]
        elif ev["type"] == "ncu_progress" and ev.get("passes"):
            out["passes"] = ev["passes"]
    return out


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunContext:
    monkeypatch.setenv("GPUWS_POD_CACHE", str(tmp_path / "pod"))
    spec: dict[str, Any] = {"workload": "builtin:saxpy", "tiers": [1, 2, 3]}
    runs.ensure_private_dir(runs.cache_root())
    runs.ensure_private_dir(runs.runs_root())
    rdir = Path(runs.run_dir("r-est"))
    (rdir / "artifacts").mkdir(parents=True)
    (rdir / "spec.json").write_text(json.dumps(spec))
    log = runs.EventLog("r-est", str(rdir / "events.ndjson"))
    return RunContext("r-est", spec, log.append)


def events(ctx: RunContext) -> list[protocol.Events]:
    out = []
    for line in (Path(ctx.run_dir) / "events.ndjson").read_bytes().splitlines():
        ev = protocol.decode_event(line)
        assert not isinstance(ev, protocol.BadLine), ev  # strictly, estimate included
        out.append(ev)
    return out


def test_the_recorded_run_passes_and_arithmetic() -> None:
    rec = recorded()
    # The recorded run used the six focused sections, and ncu took 20 passes: the table
    # the estimate uses says the same.
    assert sorted(rec["sections"]) == sorted(SIX) and rec["passes"] == 20
    assert tier3_cost.passes_for(None, rec["sections"], DEFAULT_SECTIONS)[0] == rec["passes"]
    assert tier3_cost.passes_for(None, None, DEFAULT_SECTIONS)[0] == 27
    assert tier3_cost.passes_for("full", None, DEFAULT_SECTIONS)[0] == 38
    spec = {"ncu_sections": rec["sections"], "launch_count": 1}
    est = tier3_cost.estimate(spec, rec["table"], "saxpy", default_sections=DEFAULT_SECTIONS,
                              setup_s=1.2, setup_basis="the Tier-1 child's start and setup")
    kernel_s = rec["table"][0]["total_ns"] / rec["table"][0]["calls"] / 1e9
    assert est["kernel_s"] == pytest.approx(kernel_s)
    assert est["launches"] == 1 and est["passes"] == 20
    assert est["seconds"] == pytest.approx(
        1.2 + tier3_cost.NCU_START_S + 20 * (kernel_s + tier3_cost.PASS_OVERHEAD_S)
        + tier3_cost.READ_S)
    assert "Tier-1 child" in est["start_basis"]
    msgspec.convert(est, protocol.Tier3Estimate, strict=True)


def test_tier2_wall_is_an_upper_bound_of_the_recorded_tier3() -> None:
    """Without a Tier-1 setup figure, Tier 2's whole run stands for start and setup: the
    estimate then lies above what Tier 3 measured in the same recorded run."""
    rec = recorded()
    spec = {"ncu_sections": rec["sections"]}
    est = tier3_cost.estimate(spec, rec["table"], "saxpy", default_sections=DEFAULT_SECTIONS,
                              tier2_wall_s=rec["wall2"])
    assert est["start_s"] == rec["wall2"] and "upper bound" in est["start_basis"]
    assert est["seconds"] >= rec["wall3"]


def test_launches_are_capped_by_what_tier2_saw_and_application_replay_repeats_start() -> None:
    rec = recorded()  # saxpy: 10 calls in Tier 2
    est = tier3_cost.estimate({"launch_count": 50, "launch_skip": 4}, rec["table"], "saxpy",
                              default_sections=DEFAULT_SECTIONS, setup_s=1.0)
    assert est["launches"] == 6 and "10 matching" in est["launches_basis"]
    kernel = tier3_cost.estimate({}, rec["table"], "saxpy", default_sections=DEFAULT_SECTIONS,
                                 setup_s=1.0)
    app = tier3_cost.estimate({"replay_mode": "application"}, rec["table"], "saxpy",
                              default_sections=DEFAULT_SECTIONS, setup_s=1.0)
    assert app["seconds"] > 20 * kernel["start_s"] > kernel["seconds"]
    none = tier3_cost.estimate({}, rec["table"], "no_such", default_sections=DEFAULT_SECTIONS)
    assert "no kernel matching" in none["launches_basis"]
    assert none["start_s"] == tier3_cost.ONE_PASS_FLOOR_S  # no tier measured the setup


def test_an_estimate_rides_on_tier3s_start(ctx: RunContext, tmp_path: Path) -> None:
    ncu = fake_ncu(tmp_path / "ncu", PERM, 1)
    rec = recorded()
    tiers.tier3(ctx, FakePod([ncu]), ["/bin/true"], rec["table"], "saxpy", python=False,
                measured={"setup_s": 0.9, "setup_basis": "the Tier-1 child's start and setup"})
    started = [e for e in events(ctx) if isinstance(e, protocol.TierStarted) and e.argv]
    est = started[0].estimate
    assert est is not None and est.passes == 27 and est.launches == 1
    assert est.budget_s is None and est.seconds > est.start_s > 0.9


def test_a_plan_over_budget_stops_before_ncu_with_cheaper_plans(ctx: RunContext,
                                                                 tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    ncu = tmp_path / "ncu"
    ncu.write_text(f"#!/bin/sh\ntouch {marker}\n")
    ncu.chmod(0o755)
    rec = recorded()
    two = [*rec["table"], {"name": "other_kernel", "calls": 10, "total_ns": 1e6,
                           "mean_ns": 1e5, "share_pct": 30.0}]
    ctx.spec.update(max_tier3_s=3.0, launch_count=5)
    with pytest.raises(tiers.WorkloadError) as err:
        tiers.tier3(ctx, FakePod([str(ncu)]), ["/bin/true"], two, ".*", python=True,
                    measured={"setup_s": 1.0, "setup_basis": "the Tier-1 child's setup"})
    assert not marker.exists()  # ncu never started
    assert "over --max-tier3-seconds 3" in str(err.value) and "try --launch-count 1" in str(
        err.value)
    evs = events(ctx)
    started = next(e for e in evs if isinstance(e, protocol.TierStarted))
    assert started.estimate is not None and started.estimate.budget_s == 3.0
    diag = next(e for e in evs if isinstance(e, protocol.Diagnosis))
    assert diag.code == "tier3_over_budget" and diag.severity == "error"
    plans = diag.remedies
    assert plans[0].startswith("--launch-count 1: about ")
    assert any(p.startswith("--ncu-sections SpeedOfLight (10 passes)") for p in plans)
    assert any(p.startswith("--kernel-regex '(^|[^A-Za-z0-9_])saxpy([^A-Za-z0-9_]|$)' "
                            "(Tier 2's top kernel alone)") for p in plans)
    assert plans[-1].startswith("or raise --max-tier3-seconds above ")
    fin = [e for e in evs if isinstance(e, protocol.TierFinished)][-1]
    assert (fin.tier, fin.status) == (3, "skipped") and "over --max-tier3-seconds" in fin.reason


def test_the_top_kernel_plan_matches_what_ncu_lists_on_recorded_names() -> None:
    """The cheaper plan "Tier 2's top kernel alone" on an HF ``generate`` recorded on the
    H200 (tests/fixtures/kernel-names-h200): Tier 2 spells the top kernel as torch does,
    ncu lists it as ``elementwise_kernel<(int)128, (int)4, …`` with ``<unnamed>``; the
    plan's regex must select that listing, and only it, and count Tier 2's launches of it.
    Before, it was ``'^' + re.escape(torch's name)``: nothing ncu lists matched it."""
    import re
    import shlex

    names = json.loads((Path(__file__).parents[2] / "fixtures" / "kernel-names-h200" /
                        "names.json").read_text())
    table = [{"name": n, "calls": 10 + i, "total_ns": 1e6 * (70 - i)}
             for i, n in enumerate(names["torch_hf"])]
    listed = names["ncu_hf_miss_listed"]
    spec = {"launch_count": 5}
    est = tier3_cost.estimate(spec, table, ".*", default_sections=DEFAULT_SECTIONS)
    plans = tier3_cost.cheaper_plans(spec, est, table, ".*", default_sections=DEFAULT_SECTIONS)
    (plan,) = [p for p in plans if p.startswith("--kernel-regex ")]
    regex = shlex.split(plan.split(" (Tier 2's top kernel")[0])[1]
    twin = kernelnames.best_match(table[0]["name"], listed)[0]
    assert twin is not None
    assert [n for n in listed if re.search(regex, n)] == [twin]
    assert [r["name"] for r in tier3_cost.matching(table, regex) or []] == [table[0]["name"]]
    narrowed = tier3_cost.estimate(spec, table, regex, default_sections=DEFAULT_SECTIONS)
    assert narrowed["launches_basis"].startswith("--launch-count 5; Tier 2 saw 10 matching")
    assert plan.endswith(f"about {narrowed['seconds']:.0f} s")


def test_a_plan_within_budget_runs(ctx: RunContext, tmp_path: Path) -> None:
    ncu = fake_ncu(tmp_path / "ncu", PERM, 1)
    ctx.spec.update(max_tier3_s=600.0)
    tiers.tier3(ctx, FakePod([ncu]), ["/bin/true"], recorded()["table"], "saxpy",
                python=False, measured={"setup_s": 1.0})
    assert not any(isinstance(e, protocol.Diagnosis) and e.code == "tier3_over_budget"
                   for e in events(ctx))


def test_a_cmd_run_carries_gpm_or_says_why(ctx: RunContext) -> None:
    """Tier 0 of a ``cmd:`` brackets the command with NVML GPM; this machine has no NVML,
    so the tier says why, in one line, and the run goes on."""
    ctx.spec.update(workload="cmd:true", tiers=[])
    tiers.run_command(ctx, "true", FakePod([]))  # type: ignore[arg-type]
    fin = next(e for e in events(ctx) if isinstance(e, protocol.TierFinished) and e.tier == 0)
    assert fin.status == "ok" and fin.gpm is not None
    assert fin.gpm.window_s is None and fin.gpm.reason and "\n" not in fin.gpm.reason


def test_tier1s_gpm_says_how_much_of_its_window_the_timed_calls_took() -> None:
    """The recorded run's Tier-1 GPU time over a window as long as its Tier 1."""
    rec = [json.loads(x) for x in RECORDED.read_text().splitlines()]
    fin1 = next(e for e in rec if e["type"] == "tier_finished" and e["tier"] == 1)
    got = tiers.with_timed_share({"window_s": fin1["wall_s"], "dram_bw_pct": 40.0},
                                 fin1["gpu_s"])
    assert got["timed_share_pct"] == pytest.approx(100 * fin1["gpu_s"] / fin1["wall_s"])
    assert got["dram_bw_pct"] == 40.0
    assert tiers.with_timed_share({"window_s": 0.5}, 9.0)["timed_share_pct"] == 100.0
    assert "timed_share_pct" not in tiers.with_timed_share({"reason": "no GPM"}, 1.0)


def test_the_pod_learns_the_passes_ncu_took_for_a_plan(ctx: RunContext, tmp_path: Path) -> None:
    """ncu's own count (its ==PROF== line, as tests/fixtures/recorded's saxpy run printed
    it: 20 passes for the six focused sections) is what the next estimate uses."""
    rec = recorded()
    said = (f'==PROF== Connected to process 671 (/usr/bin/python3.12)\n'
            f'==PROF== Profiling "saxpy": 0%....50%....100% - {rec["passes"]} passes\n'
            f'==PROF== Disconnected from process 671\n')
    ncu = fake_ncu(tmp_path / "ncu", said, 0, report=True)
    ctx.gpu = gpusel.Choice({"index": 0, "compute_capability": "9.0"}, True, [])
    ctx.spec.update(ncu_sections=SIX[::-1])  # the same sections in another order
    first = tier3_cost.learnt(runs.cache_root())
    tiers.tier3(ctx, FakePod([ncu]), ["/bin/true"], rec["table"], "saxpy", python=False,
                measured={"setup_s": 1.0})
    learnt = tier3_cost.learnt(runs.cache_root())
    assert first == {} and learnt == {"9.0|sections:" + ",".join(sorted(SIX)): 20}
    ctx.spec.update(ncu_sections=SIX)
    tiers.tier3(ctx, FakePod([ncu]), ["/bin/true"], rec["table"], "saxpy", python=False,
                measured={"setup_s": 1.0})
    ests = [e.estimate for e in events(ctx) if isinstance(e, protocol.TierStarted)
            and e.estimate is not None]
    assert ests[-1] is not None and ests[-1].passes == 20
    assert "on this pod before" in ests[-1].passes_basis
    # A cheaper plan with other sections does not borrow this plan's count.
    assert any(p.startswith("--ncu-sections SpeedOfLight (10 passes)")
               for p in ests[-1].cheaper)
    # Another GPU architecture has learnt nothing.
    ctx.gpu = gpusel.Choice({"index": 0, "compute_capability": "8.0"}, True, [])
    other = tiers.tier3_estimate(ctx, rec["table"], "saxpy", {})
    assert "on this pod" not in other["passes_basis"]
    assert tier3_cost.PASSES_SOURCE in other["passes_basis"]


def test_a_broken_or_hostile_learnt_file_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / tier3_cost.LEARNT_FILE
    path.write_text("{not json")
    assert tier3_cost.learnt(str(tmp_path)) == {}
    path.write_text(json.dumps({"a": 2**40, "b": -1, "c": "27", "d": 27}))
    assert tier3_cost.learnt(str(tmp_path)) == {"d": 27}
    for i in range(tier3_cost.MAX_LEARNT + 5):
        tier3_cost.remember_passes(str(tmp_path), f"k{i}", 10)
    kept = tier3_cost.learnt(str(tmp_path))
    assert len(kept) == tier3_cost.MAX_LEARNT and f"k{tier3_cost.MAX_LEARNT + 4}" in kept
