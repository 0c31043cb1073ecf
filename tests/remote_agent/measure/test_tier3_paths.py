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

    def nsys(self) -> None:
        return None

    def nsys_passed_over(self) -> str | None:
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
