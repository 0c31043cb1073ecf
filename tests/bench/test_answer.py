"""bench/answer.py without a GPU: its arguments, its commands, its table and JSON on a
canned result, a failing and a hanging step, and its workloads' syntax. The figures
themselves come from the GPU machine (the lead runs it there)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from gpuws.kernels.workload import load_file_workload

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _answer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpuws_bench_answer", BENCH / "answer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


answer = _answer()


def test_arguments() -> None:
    args = answer.parse_args(["--workloads", "saxpy,transformer", "--repeats", "2",
                              "--timeout", "30", "--out", "x.json"])
    assert args.cases == ["saxpy", "transformer"] and args.repeats == 2 and args.timeout == 30
    for bad in (["--workloads", "saxpy,nope"], ["--repeats", "0"]):
        with pytest.raises(SystemExit):
            answer.parse_args(bad)


def test_dry_run_prints_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert answer.main(["--dry-run", "--ncu", "/opt/ncu/ncu", "--python", "py3"]) == 0
    out = capsys.readouterr().out
    assert out.count("run local -w") == 3
    assert "-w 'cmd:py3 " in out and "file:" in out and "builtin:saxpy" in out
    # Tier 2 by hand: one gpu__time_duration pass; Tier 3: the default sections, 1 launch.
    assert out.count("/opt/ncu/ncu --metrics gpu__time_duration.sum") == 3
    assert out.count("--section SpeedOfLight ") == 3 and "--launch-count 1" in out
    assert "regex:saxpy" in out and "regex:softmax_rows" in out
    assert "do_bench" in out


def test_a_failing_and_a_hanging_step_are_reported_not_raised() -> None:
    failed = answer.run_step("fails", [sys.executable, "-c", "import sys; sys.exit('boom')"],
                             10)
    assert not failed["ok"] and failed["rc"] == 1 and "boom" in failed["error"]
    t0 = time.monotonic()
    hung = answer.run_step("hangs", ["sh", "-c", "sleep 30 & sleep 30"], 0.5)
    assert not hung["ok"] and hung["error"] == "timed out after 0.5 s"
    assert time.monotonic() - t0 < 10  # the whole process group was killed
    missing = answer.run_step("missing", ["/nonexistent/ncu"], 10)
    assert not missing["ok"] and "cannot start" in missing["error"]


def _step(wall: float | None, ok: bool = True, error: str | None = None) -> dict:
    return {"name": "x", "argv": ["x"], "ok": ok, "wall_s": wall, "error": error}


def _rep(scale: float) -> dict:
    tiers = {"0": {"wall_s": 5.0 * scale, "status": "ok", "source": None, "answer_at_s": 6.0},
             "2": {"wall_s": 7.5 * scale, "status": "fallback",
                   "source": "torch.profiler (injected)", "answer_at_s": 14.0},
             "3": {"wall_s": 3.0 * scale, "status": "ok", "source": None, "answer_at_s": 17.0}}
    g = dict(_step(18.0 * scale), tiers=tiers, kernel_table_source="torch.profiler (injected)",
             top_kernel="sm90_xmma_gemm")
    hand = {"tier1": _step(5.0 * scale), "ncu_pass": _step(8.0 * scale),
            "tier3": _step(None, False, "exit 1: ==ERROR== no kernels were profiled")}
    hand["tier2"] = hand["ncu_pass"]
    return {"gpuws": g, "by_hand": hand}


def test_table_and_json_on_a_canned_result() -> None:
    raw = {"transformer": [_rep(1.0), _rep(1.2), _rep(0.9)]}
    machine = {"gpu": "NVIDIA H200", "driver": "580.95.05", "ncu": "Version 2025.3.1.0",
               "nsys": "absent: only ncu's bundled nsys"}
    summary = answer.summarize(raw, machine, {"repeats": 3})
    w = summary["workloads"]["transformer"]
    assert w["gpuws"]["wall_s"] == 18.0 and w["gpuws"]["tiers"]["2"]["wall_s"] == 7.5
    assert w["by_hand"]["tier3"]["ok"] is False
    assert w["by_hand_sum_s"] is None and w["ratio"] is None and not w["met"]
    goals = summary["goals"]
    assert goals["transformer_tier2_s"] == {"value": 7.5, "goal": 10.0, "met": True}
    assert goals["transformer_whole_s"]["met"] is False
    text = answer.table(summary)
    assert "NVIDIA H200" in text and "nsys absent" in text
    assert "torch.profiler (injected)" in text
    assert "Tier 2 7.5 s (goal ≤ 10 s: met), whole run 18.0 s (goal ≤ 15 s: NOT met)" in text
    assert "no kernels were profiled" in text  # the failing step is named
    json.dumps(summary)  # the JSON is plain data

    raw["transformer"][0]["by_hand"]["tier3"] = _step(4.0)  # one repeat: all steps ok
    one = answer.summarize({"transformer": raw["transformer"][:1]}, machine, {"repeats": 1})
    w = one["workloads"]["transformer"]
    assert w["by_hand_sum_s"] == 17.0 and w["ratio"] == pytest.approx(18 / 17)
    assert w["met"] and "1.06× (goal ≤ 1.2×: met)" in answer.table(one)


def test_the_workloads_parse_without_a_gpu() -> None:
    w = load_file_workload(str(BENCH / "workloads" / "softmax.py"))
    assert w.kernel_regex == "softmax_rows" and w.bytes_moved == 2 * 4 * 4096 * 4096
    out = subprocess.run([sys.executable, str(BENCH / "workloads" / "transformer.py"), "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "--layers" in out and "--iters" in out  # no torch needed to read it


def test_a_command_run_once_for_tier_0_and_tier_2_is_counted_in_tier_2() -> None:
    """Where the command's own run (Tier 0, under the injected profiler) gave Tier 2's
    table, Tier 2's time is that run plus the reading; a plain Tier 0 changes nothing."""
    def events(tier0_name: str) -> list[dict]:
        return [{"type": "tier_started", "tier": 0, "name": tier0_name},
                {"type": "tier_finished", "tier": 0, "status": "ok", "wall_s": 4.0, "ts": 5.0},
                {"type": "tier_started", "tier": 2, "name": "kernel timeline"},
                {"type": "kernel_table", "source": "torch.profiler (injected)",
                 "kernels": [{"name": "k"}]},
                {"type": "tier_finished", "tier": 2, "status": "fallback", "wall_s": 0.25,
                 "source": "torch.profiler (injected)", "ts": 5.3},
                {"type": "run_finished", "status": "ok", "wall_s": 9.0}]
    step = {"ok": True, "error": None}
    got = answer.read_events(events("workload, under torch.profiler for Tier 2"), 1.0, step)
    assert got["tiers"]["2"]["wall_s"] == 4.25 and got["tiers"]["2"]["folded"]
    assert got["tiers"]["2"]["own_wall_s"] == 0.25 and got["top_kernel"] == "k"
    plain = answer.read_events(events("workload"), 1.0, step)
    assert plain["tiers"]["2"]["wall_s"] == 0.25 and "folded" not in plain["tiers"]["2"]
    failed = [*events("workload")[:-1],
              {"type": "run_finished", "status": "failed", "error": "boom"}]
    answer.read_events(failed, 1.0, step)
    assert not step["ok"] and step["error"] == "run failed: boom"
