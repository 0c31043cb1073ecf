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
  own start, attach and exit: what it took on this pod in the latest Tier 3 runs
  (:func:`remember_start`), else the H100 recordings' 2.2 s; with neither setup figure,
  Tier 2's whole run, else the recorded one-pass floor.
- *reading*: ncu writing its report and the agent reading it.

Standard library only (Python 3.8). Pure: no process runs here (the pod's cache files
are read and written by the caller's choice of directory).
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..safefiles import read_json_dict, write_json_best_effort
from ..verdicts import kernelnames

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
#: ncu's own start, attach and exit beyond the workload's own run, where this pod has not
#: shown its own yet (:func:`learnt_start`). The H100 recordings of
#: tests/fixtures/verdict-h100 (ncu 2025.3.1, `cmd:` runs, each phase on its events):
#: ncu's process until its report line, less the pass loop (0% → 100% progress), the
#: command's own run and the report's write, took 2.70 s (decode), 1.72 s (GEMM) and
#: 2.22 s (tiny grid): their median (tests/remote_agent/measure/
#: test_tier3_estimate_recorded.py computes it from the events). An H200 took 1.4 s
#: (saxpy's one-pass ncu process, 2.42 s, less its whole Tier-1 child, 1.0 s), the figure
#: used before, which left the estimate 16–26% low on the H100 (docs/gpu-validation.md,
#: run 13): the machine matters, hence what each pod learns.
NCU_START_S = 2.22
#: The one-pass floor (the whole ncu process of saxpy), used when no tier measured setup.
ONE_PASS_FLOOR_S = 2.42
#: After the workload exits: ncu writes its report ("Disconnected" to "Report" on its
#: console: 0.21–0.24 s in the four H100 recordings, median 0.22) and the agent reads it
#: ("Report" to Tier 3's end: 0.27–0.35 s, median 0.30). Before, 0.35 s (last pass to the
#: end on the H200) stood for both.
READ_S = 0.52
#: Where the pod keeps what ncu's start took beyond the workload (its cache), how many of
#: the latest it keeps, and the range believed (a read outside it is a broken file).
START_FILE = "ncu_start.json"
MAX_STARTS = 5
START_RANGE_S = (0.0, 600.0)

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


def learnt_start(cache: str) -> Optional[float]:
    """What ncu's own start took beyond the workload on this pod: the median of the
    latest Tier 3 runs here (:func:`remember_start`), or None before the first."""
    seen = read_json_dict(os.path.join(cache, START_FILE)).get("start_s")
    values = sorted(float(v) for v in (seen if isinstance(seen, list) else [])[-MAX_STARTS:]
                    if isinstance(v, (int, float)) and not isinstance(v, bool)
                    and START_RANGE_S[0] <= v <= START_RANGE_S[1])
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2.0


def start_seen(wall_s: float, est: Dict[str, Any], setup_s: Optional[float],
               passes: int, launches: int) -> Optional[float]:
    """What ncu's own start took in a finished Tier 3: its whole time less the workload's
    own run, the replay passes ncu said it made and reading the report; None where the
    run does not tell (no setup figure, application replay, a figure out of range)."""
    if setup_s is None or passes <= 0 or launches <= 0:
        return None
    per_pass = float(est.get("kernel_s") or 0.0) + PASS_OVERHEAD_S
    seen = wall_s - setup_s - launches * passes * per_pass - READ_S
    return seen if START_RANGE_S[0] <= seen <= START_RANGE_S[1] else None


def remember_start(cache: str, seen: Optional[float]) -> None:
    """Keep one more figure of ncu's start on this pod (the latest :data:`MAX_STARTS`)."""
    if seen is None:
        return
    path = os.path.join(cache, START_FILE)
    old = read_json_dict(path).get("start_s")
    kept = [v for v in (old if isinstance(old, list) else [])
            if isinstance(v, (int, float)) and not isinstance(v, bool)
            and START_RANGE_S[0] <= v <= START_RANGE_S[1]]
    # A full or read-only cache costs only the next estimate's accuracy.
    write_json_best_effort(path, {"start_s": [*kept, round(seen, 3)][-MAX_STARTS:]})


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
             passes_here: Optional[int] = None,
             start_here: Optional[float] = None) -> Dict[str, Any]:
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
        start_here: what ncu's own start took on this pod before (:func:`learnt_start`).
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
        ncu_start = NCU_START_S if start_here is None else start_here
        start_s = max(0.0, setup_s) + ncu_start
        start_basis = "%s (%.1f s) + ncu's own start (%.1f s%s)" % (
            setup_basis or "the workload's setup", setup_s, ncu_start,
            ", as on H100 recordings" if start_here is None else
            ", what it took on this pod before")
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
        # Written as Tier 3 writes its own filter: ncu spells the kernel otherwise than
        # Tier 2 does (``elementwise_kernel<(int)128, …`` for torch's ``<128, …``), so
        # Tier 2's name taken literally would match nothing ncu lists.
        narrow = kernelnames.ncu_regex(str(table[0].get("name") or ""))
        out.append("--kernel-regex %s (Tier 2's top kernel alone): about %.0f s" % (
            shlex.quote(narrow), seconds(_regex=narrow)))
    return out


def over_budget(est: Dict[str, Any]) -> bool:
    """Whether the plan's estimate exceeds its ``--max-tier3-seconds``."""
    budget = est.get("budget_s")
    return budget is not None and float(est["seconds"]) > float(budget)
