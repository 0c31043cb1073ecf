"""What Tier 3 will cost, said before ncu starts, and the cheaper plans when it is too much.

ncu replays each profiled launch once per pass, and each pass costs far more than the
kernel: ncu saves and restores the memory the kernel touches, flushes the caches and
reprograms the counters. So the estimate is

    start + launches × passes × (kernel time + pass overhead) + reading the report

with every input measured where it can be (a ``protocol.Tier3Estimate`` dict, each figure
with its basis):

- *passes* for the chosen sections: what ncu said on this pod for the same sections and
  GPU architecture (learnt from its ``==PROF==`` lines, :func:`remember_passes`), else
  ncu 2025.3.1 on an H200 (docs/performance.md,
  ``bench/tier3_sections.py``): gpuws's default sections 27, the six the design names 20,
  ``--set full`` 38; SpeedOfLight 10, ComputeWorkloadAnalysis 11, MemoryWorkloadAnalysis 9,
  WarpStateStats 9 alone (Occupancy and LaunchStats read launch attributes, no pass of
  their own). A list never measured is given full's 38, the most any measured plan took.
- *launches*: ``--launch-count``, fewer when Tier 2 saw fewer matching launches (after
  ``--launch-skip``).
- *kernel time*: the mean of the matching kernels in Tier 2's table, else Tier 1's median
  call.
- *start*: the workload's own start and setup as an earlier tier measured it on this pod
  (the Tier-1 child's time to its first timed round; a ``cmd:``'s whole run), plus ncu's
  own start; with neither, Tier 2's whole run, else the recorded one-pass floor.

Standard library only (Python 3.8). Pure: no process runs here.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..safefiles import read_json_dict, write_json_best_effort

#: Replay passes measured per section list (ncu 2025.3.1, H200; docs/performance.md).
DEFAULT_PASSES = 27
DESIGN_SIX_PASSES = 20
FULL_PASSES = 38
SECTION_PASSES = {"SpeedOfLight": 10, "ComputeWorkloadAnalysis": 11,
                  "MemoryWorkloadAnalysis": 9, "WarpStateStats": 9}
#: Sections that read launch attributes only (no replay pass of their own).
NO_PASS_SECTIONS = frozenset({"Occupancy", "LaunchStats"})
#: The six sections the design names (20 passes together).
DESIGN_SIX = frozenset({"SpeedOfLight", "Occupancy", "LaunchStats", "ComputeWorkloadAnalysis",
                        "MemoryWorkloadAnalysis", "WarpStateStats"})
PASSES_SOURCE = "ncu 2025.3.1 on an H200 (docs/performance.md)"

#: Seconds each replay pass costs beyond the kernel: (default − one pass) / 26 extra
#: passes of the whole ncu process, docs/performance.md: saxpy (3.57 − 2.42) / 26 = 44 ms,
#: gemm fp16 (3.87 − 2.75) / 26 = 43 ms (both 0.18 ms kernels).
PASS_OVERHEAD_S = 0.044
#: ncu's own start beyond the workload's: saxpy's one-pass ncu process (2.42 s) less
#: saxpy's whole Tier-1 child (1.0 s; docs/performance.md, both on an H200).
NCU_START_S = 1.4
#: The one-pass floor (the whole ncu process of saxpy), used when no tier measured setup.
ONE_PASS_FLOOR_S = 2.42
#: Reading the report after the last pass: 0.35 s in tests/fixtures/recorded/saxpy_h200
#: (last ncu_progress to tier_finished).
READ_S = 0.35

#: ncu's replay modes that rerun the whole application once per pass.
APPLICATION_REPLAY = ("application", "app-range")
#: Where the pod keeps the pass counts its ncu runs said (in its cache), and how many.
LEARNT_FILE = "ncu_passes.json"
MAX_LEARNT = 256


def plan_key(cc: Optional[str], ncu_set: Optional[str], sections: Optional[Sequence[str]],
             default_sections: Sequence[str]) -> str:
    """What a pass count depends on: the GPU's architecture and the sections or set."""
    what = ("set:%s" % ncu_set) if ncu_set else "sections:" + ",".join(
        sorted(sections or default_sections))
    return "%s|%s" % (cc or "?", what)


def _learnt_path(cache: str) -> str:
    return os.path.join(cache, LEARNT_FILE)


def learnt(cache: str) -> Dict[str, int]:
    """``{plan key: passes ncu said}`` as this pod learnt them (empty if none)."""
    data = read_json_dict(_learnt_path(cache))
    return {str(k): int(v) for k, v in list(data.items())[:MAX_LEARNT]
            if isinstance(v, int) and 0 < v <= 10_000}


def remember_passes(cache: str, key: str, passes: int) -> None:
    """Record the passes ncu took for a plan (the latest wins; at most MAX_LEARNT kept)."""
    if not 0 < passes <= 10_000:
        return
    data = learnt(cache)
    if data.get(key) == passes:
        return
    data.pop(key, None)
    data[key] = passes
    while len(data) > MAX_LEARNT:
        data.pop(next(iter(data)))
    # A full or read-only cache costs only the next estimate's accuracy.
    write_json_best_effort(_learnt_path(cache), dict(data))


def passes_for(ncu_set: Optional[str], sections: Optional[Sequence[str]],
               default_sections: Sequence[str]) -> Tuple[int, str]:
    """``(passes, basis)`` for a section choice (None sections and set: the default)."""
    if ncu_set:
        if ncu_set == "full":
            return FULL_PASSES, "--set full: %d passes, %s" % (FULL_PASSES, PASSES_SOURCE)
        return FULL_PASSES, ("--set %s was never measured: taken as full's %d passes, the "
                             "most any measured plan took" % (ncu_set, FULL_PASSES))
    chosen = list(sections) if sections else list(default_sections)
    names = set(chosen)
    if names == set(default_sections):
        return DEFAULT_PASSES, "gpuws's default sections: %d passes, %s" % (
            DEFAULT_PASSES, PASSES_SOURCE)
    if names == DESIGN_SIX:
        return DESIGN_SIX_PASSES, "the six focused sections: %d passes, %s" % (
            DESIGN_SIX_PASSES, PASSES_SOURCE)
    counted = names - NO_PASS_SECTIONS
    if not counted:
        return 1, "launch attributes only: 1 pass"
    if len(counted) == 1 and next(iter(counted)) in SECTION_PASSES:
        name = next(iter(counted))
        return SECTION_PASSES[name], "%s: %d passes, %s" % (name, SECTION_PASSES[name],
                                                            PASSES_SOURCE)
    return FULL_PASSES, ("this section list was never measured: taken as --set full's %d "
                         "passes, the most any measured plan took" % FULL_PASSES)


def matching(table: Optional[List[Dict[str, Any]]], regex: Optional[str]
             ) -> Optional[List[Dict[str, Any]]]:
    """Tier 2's rows whose name the kernel regex matches (None: no table to look in)."""
    if not table:
        return None
    pattern = (regex or ".*")
    if pattern.startswith("regex:"):
        pattern = pattern[len("regex:"):]
    try:
        rx = re.compile(pattern or ".*")
    except re.error:
        return None
    return [row for row in table if rx.search(str(row.get("name") or ""))]


def estimate(spec: Dict[str, Any], table: Optional[List[Dict[str, Any]]],
             regex: Optional[str], *, default_sections: Sequence[str],
             setup_s: Optional[float] = None, setup_basis: str = "",
             tier2_wall_s: Optional[float] = None,
             tier1_median_ms: Optional[float] = None,
             passes_here: Optional[int] = None) -> Dict[str, Any]:
    """The ``protocol.Tier3Estimate`` dict of the plan ``spec`` describes.

    Args:
        spec: the run's spec (launch skip/count, set, sections, replay mode, budget).
        table: Tier 2's ranked rows, or None.
        regex: the kernel filter Tier 3 will use (None: every kernel).
        default_sections: the sections used when the spec names none.
        setup_s: the workload's start and setup as an earlier tier measured it.
        setup_basis: where ``setup_s`` came from, for people.
        tier2_wall_s: Tier 2's whole wall time (an upper bound on start and setup).
        tier1_median_ms: Tier 1's median call, for the kernel time without Tier 2.
        passes_here: the passes ncu took for this plan on this pod before (:func:`learnt`).
    """
    if passes_here:
        passes, passes_basis = passes_here, (
            "%d passes: what ncu took for these sections on this pod before" % passes_here)
    else:
        passes, passes_basis = passes_for(spec.get("ncu_set"), spec.get("ncu_sections"),
                                          default_sections)
    skip = max(0, int(spec.get("launch_skip") or 0))
    count = max(1, int(spec.get("launch_count") or 1))
    rows = matching(table, regex)
    kernel_s: Optional[float] = None
    if rows:
        calls = sum(int(r.get("calls") or 0) for r in rows)
        total_ns = sum(float(r.get("total_ns") or 0.0) for r in rows)
        launches = max(0, min(count, calls - skip))
        launches_basis = ("--launch-count %d; Tier 2 saw %d matching launch(es)%s"
                          % (count, calls, ", %d skipped" % skip if skip else ""))
        if calls:
            kernel_s = total_ns / calls / 1e9
            kernel_basis = "Tier 2's mean of the matching kernel(s)"
        else:
            kernel_basis = "Tier 2 saw no call of the matching kernel(s)"
    else:
        launches = count
        launches_basis = "--launch-count %d%s" % (count, "" if rows is None else
                                                  "; Tier 2 saw no kernel matching the filter")
        if tier1_median_ms is not None:
            kernel_s = tier1_median_ms / 1000.0
            kernel_basis = "Tier 1's median call (it may hold several kernels)"
        else:
            kernel_basis = "not measured by an earlier tier: counted as 0"
    if setup_s is not None:
        start_s = max(0.0, setup_s) + NCU_START_S
        start_basis = "%s (%.1f s) + ncu's own start (%.1f s)" % (
            setup_basis or "the workload's setup", setup_s, NCU_START_S)
    elif tier2_wall_s is not None:
        start_s = max(0.0, tier2_wall_s)
        start_basis = "Tier 2's whole run (%.1f s; an upper bound)" % tier2_wall_s
    else:
        start_s = ONE_PASS_FLOOR_S
        start_basis = ("no earlier tier measured the setup: the one-pass floor of a small "
                       "CuPy workload under ncu (%.2f s on an H200)" % ONE_PASS_FLOOR_S)
    per_pass = (kernel_s or 0.0) + PASS_OVERHEAD_S
    if spec.get("replay_mode") in APPLICATION_REPLAY:
        # Each pass runs the whole application again.
        seconds = passes * (start_s + launches * per_pass) + READ_S
    else:
        seconds = start_s + launches * passes * per_pass + READ_S
    budget = spec.get("max_tier3_s")
    return {
        "seconds": seconds, "passes": passes, "passes_basis": passes_basis,
        "launches": launches, "launches_basis": launches_basis, "kernel_s": kernel_s,
        "kernel_basis": kernel_basis, "pass_overhead_s": PASS_OVERHEAD_S,
        "start_s": start_s, "start_basis": start_basis, "read_s": READ_S,
        "budget_s": None if budget is None else float(budget), "cheaper": [],
    }


def cheaper_plans(spec: Dict[str, Any], est: Dict[str, Any],
                  table: Optional[List[Dict[str, Any]]], regex: Optional[str], *,
                  default_sections: Sequence[str], **inputs: Any) -> List[str]:
    """Plans that cost less than ``est``, each a flag to add and its estimate, cheapest
    last: one launch, one section, kernel replay, the top kernel alone."""
    out: List[str] = []

    def seconds(**change: Any) -> float:
        changed = dict(spec, **change)
        same = dict(inputs)
        if "ncu_sections" in change or "ncu_set" in change:
            same.pop("passes_here", None)  # learnt for the plan's sections, not these
        return float(estimate(changed, table, change.get("_regex", regex),
                              default_sections=default_sections, **same)["seconds"])

    if est["launches"] > 1:
        out.append("--launch-count 1: about %.0f s" % seconds(launch_count=1))
    if spec.get("replay_mode") in APPLICATION_REPLAY:
        out.append("--replay-mode kernel: about %.0f s" % seconds(replay_mode="kernel"))
    if est["passes"] > SECTION_PASSES["SpeedOfLight"]:
        out.append("--ncu-sections SpeedOfLight (%d passes): about %.0f s" % (
            SECTION_PASSES["SpeedOfLight"],
            seconds(ncu_set=None, ncu_sections=["SpeedOfLight"])))
    rows = matching(table, regex)
    if table and rows is not None and len({r.get("name") for r in rows}) > 1:
        top = str(table[0].get("name") or "").split("(")[0]
        narrow = "^" + re.escape(top)
        out.append("--kernel-regex '%s' (Tier 2's top kernel alone): about %.0f s" % (
            narrow, seconds(_regex=narrow)))
    return out


def over_budget(est: Dict[str, Any]) -> bool:
    """Whether the plan's estimate exceeds its ``--max-tier3-seconds``."""
    budget = est.get("budget_s")
    return budget is not None and float(est["seconds"]) > float(budget)
