"""Tier 3 profiles the instance of a kernel Tier 2 chose, not just any launch of its name.

An HF ``generate`` recorded on an H200 (tests/fixtures/real-programs-h200, gpuws's own
injected torch.profiler) launches its top kernel, ``elementwise_kernel<128, 4, …>``, with
two grids: ``(4, 1, 1)`` and, for most of its time, ``(8, 1, 1)``; its first launch is of
the small one. Tier 2's row carries the configuration that took most of the time and the
launches before the first of it (kineto's ``args.grid``/``args.block``), and Tier 3 gives
ncu that ``--launch-skip`` (ncu counts only the launches its ``-k`` filter matched; the
Nsight Compute CLI's filter examples: ``--launch-skip-before-match`` is the option that
counts every launch).

ncu is a stand-in script (this machine has no GPU) that does what ncu does with
``-k regex:`` and ``--launch-skip``: it walks the recorded launches in order, spelled as
ncu's listing spells the kernel (tests/fixtures/kernel-names-h200), skips that many
matches and profiles the next one, handing back the one real report this machine has
(saxpy's), or prints ncu's "No kernels were profiled" listing. The trace analysis, the
tier logic, the parser and the event log are the real code.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuws import protocol
from gpuws.remote_agent.measure import tiers
from gpuws.remote_agent.measure.trace_analysis import analyse, dims
from gpuws.remote_agent.verdicts import kernelnames
from gpuws.remote_agent.worker import RunContext
from remote_agent.measure.test_tier3_paths import (  # type: ignore[import-not-found]
    FakePod,
    ctx,  # noqa: F401
    events,
)

FIXTURES = Path(__file__).parents[2] / "fixtures"
NAMES = json.loads((FIXTURES / "kernel-names-h200" / "names.json").read_text())
REPORT = FIXTURES / "recorded" / "saxpy_h200.ncu-rep"
HF = FIXTURES / "real-programs-h200" / "hf-generate-2layers-last8steps.trace.json.gz"

NCU = r'''#!{python}
import json, re, shutil, sys
args = sys.argv[1:]
opt = lambda flag: args[args.index(flag) + 1]
launches = json.load(open({launches!r}))
regex, skip = opt("-k")[len("regex:"):], int(opt("--launch-skip"))
print("==PROF== Connected to process 4242 (/usr/bin/python3)")
for i, launch in enumerate(launches):
    if re.search(regex, launch["name"]):
        if skip:
            skip -= 1
            continue
        with open({calls!r}, "a") as f:
            f.write(json.dumps([opt("--launch-skip"), i, launch["grid"], launch["block"]]) + "\n")
        print('==PROF== Profiling "elementwise_kernel" - 0: 0%%....50%%....100%% - 9 passes')
        shutil.copy({report!r}, opt("-o") + ".ncu-rep")
        print("==PROF== Disconnected from process 4242")
        sys.exit(0)
with open({calls!r}, "a") as f:
    f.write(json.dumps([opt("--launch-skip"), None, None, None]) + "\n")
print("==PROF== Disconnected from process 4242")
print("==WARNING== No kernels were profiled.")
print("Available Kernels:")
seen = []
for launch in launches:
    if launch["name"] not in seen:
        seen.append(launch["name"])
for i, name in enumerate(seen, 1):
    print("%d. %s" % (i, name))
'''


def trace() -> dict[str, Any]:
    with gzip.open(HF, "rt") as f:
        data: dict[str, Any] = json.load(f)
    return data


def recorded_launches(top: str) -> list[dict[str, str]]:
    """The trace's launches in launch order (each host launch call's time), the top
    kernel's spelled as ncu's listing spells it, its grid and block as kineto wrote them."""
    evs = trace()["traceEvents"]
    launch_ts = {e["args"]["correlation"]: e["ts"] for e in evs
                 if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
                 and e["name"].startswith(("cudaLaunch", "cuLaunch"))}
    kernels = sorted((e for e in evs if e.get("cat") == "kernel" and e.get("dur", 0) > 0),
                     key=lambda e: (launch_ts.get(e["args"]["correlation"], e["ts"]), e["ts"]))
    twin = kernelnames.best_match(top, NAMES["ncu_hf_miss_listed"])[0]
    assert twin is not None and twin != top
    return [{"name": twin if e["name"] == top else e["name"],
             "grid": "({}, {}, {})".format(*e["args"]["grid"]),
             "block": "({}, {}, {})".format(*e["args"]["block"])} for e in kernels]


def stand_in_ncu(tmp_path: Path, launches: list[dict[str, str]]) -> tuple[str, Path]:
    (tmp_path / "launches.json").write_text(json.dumps(launches))
    calls = tmp_path / "ncu-calls.ndjson"
    script = tmp_path / "ncu"
    script.write_text(NCU.format(python=sys.executable, launches=str(tmp_path / "launches.json"),
                                 calls=str(calls), report=str(REPORT)))
    script.chmod(0o755)
    return str(script), calls


def test_tier2s_row_carries_the_configuration_that_took_most_of_its_time() -> None:
    rows = analyse(trace())["kernels"]
    top = rows[0]
    assert "elementwise_kernel<128, 4," in top["name"]
    launches = [x for x in recorded_launches(top["name"]) if x["name"] != top["name"]
                and kernelnames.same_kernel(top["name"], x["name"]) == kernelnames.EXACT]
    grids = [x["grid"] for x in launches]
    # The recording: the small grid first, the large one most of the time.
    assert grids[0] == "(4, 1, 1)" and set(grids) == {"(4, 1, 1)", "(8, 1, 1)"}
    assert (top["grid"], top["block"]) == ("(8, 1, 1)", "(128, 1, 1)")
    assert top["launch_skip"] == grids.index("(8, 1, 1)") == 1
    # A kernel launched with one configuration only: its first launch, nothing to skip.
    single = next(r for r in rows if r["name"].startswith("nvjet_sm90_tst_8x64_64x16_2x1"))
    assert single["launch_skip"] == 0 and single["grid"] == "(2, 64, 1)"
    # Every row says its instance: the trace recorded every launch's grid and block.
    assert all(set(r) >= {"grid", "block", "launch_skip"} for r in rows)


def test_a_trace_without_launch_dimensions_gives_no_instance() -> None:
    """An older kineto, or a hostile trace: no grid/block or nonsense ones, no instance
    (and no crash)."""
    data = trace()
    for e in data["traceEvents"]:
        if e.get("cat") == "kernel":
            e["args"].pop("grid", None)
    rows = analyse(data)["kernels"]
    assert rows and not any("launch_skip" in r or "grid" in r for r in rows)
    for bad in (None, [8, 1], [8, 1, 1, 1], [0, 1, 1], [-8, 1, 1], [True, 1, 1], [2**40, 1, 1],
                ["8", 1, 1], [8.0, 1, 1], "8,1,1", {"x": 8}):
        assert dims(bad) is None, bad
    assert dims([2**31 - 1, 65535, 65535]) == "(2147483647, 65535, 65535)"


def test_tier3_profiles_the_launch_of_tier2s_configuration(ctx: RunContext,  # noqa: F811
                                                           tmp_path: Path) -> None:
    rows = analyse(trace())["kernels"]
    ncu, calls = stand_in_ncu(tmp_path, recorded_launches(rows[0]["name"]))
    assert not tiers.tier3(ctx, FakePod([ncu]), ["/bin/true"], rows, None, python=False)
    made = [json.loads(line) for line in calls.read_text().splitlines()]
    # One ncu run, told to skip one launch, and the launch it profiled is of (8, 1, 1).
    assert [(m[0], m[2], m[3]) for m in made] == [("1", "(8, 1, 1)", "(128, 1, 1)")]
    evs = events(ctx)
    started = next(e for e in evs if isinstance(e, protocol.TierStarted) and e.tier == 3
                   and e.argv)
    assert started.argv[started.argv.index("--launch-skip") + 1] == "1"
    assert started.estimate is not None and "1 skipped" in started.estimate.launches_basis
    said = [e.message for e in evs if isinstance(e, protocol.Log)]
    assert any(m.startswith("profiling launch 2 of `at::native::elementwise_kernel<128, 4,")
               and "grid (8, 1, 1), block (128, 1, 1)" in m for m in said), said
    cov = next(e for e in evs if isinstance(e, protocol.Tier3Coverage))
    assert cov.launch_skip == 1
    assert [e for e in evs if isinstance(e, protocol.TierFinished)][-1].status == "ok"


def test_past_a_collective_the_chosen_kernels_own_instance(ctx: RunContext,  # noqa: F811
                                                           tmp_path: Path) -> None:
    """Tier 3 passes over a collective Tier 2 ranked first (its replay would hang the
    ranks) and profiles the top compute kernel: with that kernel's skip, not the
    collective's."""
    rows = analyse(trace())["kernels"]
    nccl = {"name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096>)",
            "calls": 40, "total_ns": 1e12, "mean_ns": 2.5e10, "share_pct": 60.0,
            "grid": "(2, 1, 1)", "block": "(512, 1, 1)", "launch_skip": 7}
    ncu, calls = stand_in_ncu(tmp_path, recorded_launches(rows[0]["name"]))
    assert not tiers.tier3(ctx, FakePod([ncu]), ["/bin/true"], [nccl, *rows], None,
                           python=False)
    made = [json.loads(line) for line in calls.read_text().splitlines()]
    assert [(m[0], m[2]) for m in made] == [("1", "(8, 1, 1)")]


def test_the_persons_launch_skip_wins(ctx: RunContext, tmp_path: Path) -> None:  # noqa: F811
    rows = analyse(trace())["kernels"]
    ncu, calls = stand_in_ncu(tmp_path, recorded_launches(rows[0]["name"]))
    ctx.spec.update(launch_skip=3)
    assert not tiers.tier3(ctx, FakePod([ncu]), ["/bin/true"], rows, None, python=False)
    made = [json.loads(line) for line in calls.read_text().splitlines()]
    assert [m[0] for m in made] == ["3"]
    assert not [e for e in events(ctx) if isinstance(e, protocol.Log)
                and e.message.startswith("profiling launch")]


def test_a_run_with_fewer_launches_profiles_the_first_and_says_so(
        ctx: RunContext, tmp_path: Path) -> None:  # noqa: F811
    """ncu's run launched the kernel fewer times than Tier 2's profile saw (a program whose
    launches differ between runs): the skip passes every launch and ncu profiles nothing;
    the filter took ncu's name, so the same Tier 3 profiles its first launch instead."""
    rows = analyse(trace())["kernels"]
    top = rows[0]["name"]
    launches = recorded_launches(top)
    twin = kernelnames.best_match(top, NAMES["ncu_hf_miss_listed"])[0]
    first = next(i for i, x in enumerate(launches) if x["name"] == twin)
    launches = [x for i, x in enumerate(launches) if x["name"] != twin or i == first]
    ncu, calls = stand_in_ncu(tmp_path, launches)
    assert not tiers.tier3(ctx, FakePod([ncu]), ["/bin/true"], rows, None, python=False)
    made = [json.loads(line) for line in calls.read_text().splitlines()]
    assert [(m[0], m[1]) for m in made] == [("1", None), ("0", first)]
    evs = events(ctx)
    warned = [e.message for e in evs if isinstance(e, protocol.Log) and e.level == "warning"]
    assert any(m.startswith("ncu saw fewer than 2 launches of `at::native::elementwise_kernel")
               for m in warned), warned
    assert not [e for e in evs if isinstance(e, protocol.Diagnosis)]
    assert [e for e in evs if isinstance(e, protocol.TierFinished)][-1].status == "ok"


@pytest.mark.parametrize("launch", [{"grid": "(4, 1, 1)", "block": "(128, 1, 1)"},
                                    {"grid": "(8, 1, 1)", "block": "(128, 1, 1)"},
                                    {"grid": None, "block": None}])
def test_ncus_launch_of_another_configuration_is_said(ctx: RunContext,  # noqa: F811
                                                      launch: dict[str, Any]) -> None:
    row = {"name": "void k<1>(int)", "grid": "(8, 1, 1)", "block": "(128, 1, 1)"}
    tiers.profiled_instance(ctx, row, launch)
    said = [e.message for e in events(ctx) if isinstance(e, protocol.Log)]
    if launch["grid"] == "(4, 1, 1)":
        assert said == ["ncu profiled `k<1>(int)` with grid (4, 1, 1), block (128, 1, 1); "
                        "Tier 2 chose grid (8, 1, 1), block (128, 1, 1): give --launch-skip "
                        "to pick the launch"]
    else:
        assert said == []
