"""The pod's lease on the dashboard (issue 22): the cost ticker says when the pod stops
itself, who holds it, or why a lease the config asks for could not be armed; a host
without a lease shows nothing of it."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult

from gpuws import protocol
from gpuws.sessions.cost import Economics
from gpuws.tui.widgets.pod.cost_ticker import CostTicker


class _One(App[None]):
    def compose(self) -> ComposeResult:
        yield CostTicker()


def econ() -> Economics:
    return Economics(session_id="s", rate_usd_per_hour=2.0, budget_usd=None,
                     connected_s=600.0, busy_s=120.0, idle_s=480.0, gpu_s=60.0, rows=[],
                     idle_cost_usd=0.27, total_cost_usd=0.33, live=True,
                     budget_warning=False, over_budget=False, idle_warning=True)


@pytest.mark.parametrize(("lease", "shown"), [
    (protocol.LeaseStatus(armed=True, idle_s=1800.0, connections=1),
     "auto-stop 30:00 after the last laptop and run (1 laptop(s) connected)"),
    (protocol.LeaseStatus(armed=True, idle_s=1800.0, deadline_ts=10_000.0 + 462.0),
     "auto-stop in 7:4"),
    (protocol.LeaseStatus(armed=False, reason="idle_stop_minutes is set for pod but "
                                              "stop_on_pod is not: add \x1b]0;x\x07 it"),
     "no auto-stop: idle_stop_minutes is set for pod but stop_on_pod is not"),
    (protocol.LeaseStatus(armed=False, reason="no lease: gpuws has not armed one"), None),
    (None, None),
])
async def test_the_cost_ticker_says_how_the_lease_stands(
        lease: protocol.LeaseStatus | None, shown: str | None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("time.time", lambda: 10_000.0)
    async with _One().run_test() as pilot:
        ticker = pilot.app.query_one(CostTicker)
        ticker.show(econ(), lease)
        await pilot.pause()
        text = ticker.render().plain
        assert "\x1b" not in text
        if shown is None:
            assert "auto-stop" not in text and text.count("\n") == 2
        else:
            assert shown in text, text
