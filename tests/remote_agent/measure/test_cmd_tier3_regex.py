"""A ``cmd:`` workload's Tier 3 takes the person's ``--kernel-regex`` (it took Tier 2's top
kernel whatever was asked: the recorded H100 GEMM script, run with ``--kernel-regex
'nvjet|gemm|sm90'``, shows ncu's ``-k regex:nvjet_sm90_tst_…``), and with counters
blocked the fallback verdict is asked for (there was none for a command).

ncu is test_tier3_paths.py's stand-in script printing ncu's ERR_NVGPUCTRPERM words (no
pod here can block counters); the worker's command path and its log are the real code.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuws import protocol
from gpuws.remote_agent.measure import findings, tiers
from gpuws.remote_agent.worker import RunContext
from remote_agent.measure.test_tier3_paths import (  # type: ignore[import-not-found]
    PERM,
    FakePod,
    ctx,  # noqa: F401
    events,
    fake_ncu,
)


def test_a_commands_tier3_takes_the_kernel_regex(ctx: RunContext,  # noqa: F811
                                                 tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    ctx.spec.update(tiers=[3], kernel_regex="my_kernel|other")
    calls: list[str | None] = []
    # Which kernel the fallback verdict is asked about (what it then says is
    # tests/live/test_verdicts_without_counters.py's).
    monkeypatch.setattr(findings, "without_counters", lambda c, target: calls.append(target))
    tiers.run_command(ctx, "true", FakePod([fake_ncu(tmp_path / "ncu", PERM, 1)]))
    evs = events(ctx)
    argv = next(e.argv for e in evs if isinstance(e, protocol.TierStarted) and e.tier == 3
                and e.argv)
    assert argv is not None and argv[argv.index("-k") + 1] == "regex:my_kernel|other"
    fin = [e for e in evs if isinstance(e, protocol.TierFinished) and e.tier == 3]
    assert fin[-1].status == "fallback"
    # No Tier 2 table: the verdict names the regex as the kernel it meant.
    assert calls == ["my_kernel|other"]
