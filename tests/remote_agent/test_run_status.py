"""A run whose every tier failed is a failed run, not an "ok" one with exit status 0.

Found on the H200 (docs/gpu-validation.md run 19): a ``file:`` workload whose ``run()``
did not take the state its ``setup()`` returned raised in Tier 2's torch.profiler child,
in Tier 2's ncu pass and in Tier 3; the run still finished "ok" and ``gpuws run`` exited
0. The worker now notes how each measuring tier ended (Tier 0, a command's own run, is
not a measurement) and calls the run failed when all that ran failed, naming each.
"""

from __future__ import annotations

from typing import Any

from gpuws.remote_agent import wire
from gpuws.remote_agent.worker import RunContext, every_tier_failed


def _ctx() -> tuple[RunContext, list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []
    return RunContext("r-status", {"workload": "builtin:saxpy"}, got.append), got


def test_the_context_notes_each_measuring_tiers_end_and_passes_every_event_on() -> None:
    ctx, got = _ctx()
    ctx.emit(wire.make("tier_finished", tier=0, status="ok", wall_s=1.0, reason=""))
    ctx.emit(wire.make("tier_finished", tier=2, status="failed", wall_s=1.0,
                       reason="torch.profiler: the workload exited with code 1"))
    ctx.emit(wire.make("tier_finished", tier=3, status="failed", wall_s=1.0,
                       reason="ncu failed: The application returned an error code (1)."))
    assert [e["tier"] for e in got] == [0, 2, 3]
    assert ctx.tier_ends == {2: ("failed", "torch.profiler: the workload exited with code 1"),
                             3: ("failed", "ncu failed: The application returned an error "
                                           "code (1).")}
    assert every_tier_failed(ctx.tier_ends)


def test_one_tier_that_measured_or_stood_aside_keeps_the_run_ok() -> None:
    assert not every_tier_failed({})
    assert not every_tier_failed({2: ("failed", "x"), 3: ("ok", "")})
    assert not every_tier_failed({2: ("fallback", "x"), 3: ("failed", "y")})
    assert not every_tier_failed({1: ("skipped", "no GPU on the pod"), 2: ("failed", "x")})
