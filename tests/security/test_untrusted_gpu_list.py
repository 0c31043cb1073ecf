"""A pod announcing thousands of GPUs: the list is cut at the boundary, the dashboard stays
bounded and answers keys.

Before, 1,000 announced GPUs froze the dashboard for 10 s (a row of gauges each) and 5,000
crashed it. No real agent lies about its GPUs, so a lying agent (a stand-in speaking the
protocol, ``test_untrusted_lying_agent.LyingAgent``) answers the probe through the real
``AgentClient``, whose answers go through ``boundary.check_answer``; the checked probe then
opens the real dashboard in Textual's test harness.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec

from faults.figures import record  # type: ignore[import-not-found]
from gpuws import protocol
from gpuws.client import AgentClient
from gpuws.deploy import DeployResult
from gpuws.live.boundary import MAX_GPUS
from gpuws.tui.app import GpuwsApp, StartHome
from gpuws.tui.screens.dashboard import DashboardScreen
from gpuws.tui.widgets.pod.gpu_row import GpuRow
from gpuws.tui.widgets.pod.pod_info import PodInfo
from security.test_untrusted_lying_agent import (  # type: ignore[import-not-found]
    NOW,
    LyingAgent,
    _NoTransport,
)
from tui.tuikit import h200_probe, until  # type: ignore[import-not-found]

ANNOUNCED = 5_000


def _lying_probe() -> protocol.Probe:
    """The H200 pod's probe with 5,000 GPUs, asked for through the real client."""
    real = h200_probe()
    gpus = [msgspec.structs.replace(real.gpus[0], index=i, uuid=f"GPU-{i:08x}")
            for i in range(ANNOUNCED)]
    lie = msgspec.to_builtins(msgspec.structs.replace(real, gpus=gpus))

    def script(agent: LyingAgent, req: dict[str, Any]) -> None:
        agent.send({"type": "probe_result", "req": req["req"], "ts": NOW, "probe": lie})

    async def go() -> protocol.Probe:
        hello = protocol.Hello(agent_version="0", agent_sha256="0" * 64, protocol_version=1)
        client = AgentClient(_NoTransport(), LyingAgent(script),
                             DeployResult("0" * 64, 0, "cached", 0, 0.0, hello), b"", "py")
        try:
            return await asyncio.wait_for(client.probe(), 30)
        finally:
            await client.close()

    return asyncio.run(go())


def test_five_thousand_gpus_are_cut_to_the_bound_with_a_notice() -> None:
    probe = _lying_probe()
    assert len(probe.gpus) == MAX_GPUS == 64
    assert [g.index for g in probe.gpus] == list(range(64))  # the first ones, in order
    assert probe.gpu_error is not None and "listed 5,000 GPUs" in probe.gpu_error


async def test_the_dashboard_of_a_5000_gpu_pod_is_bounded_and_answers_keys() -> None:
    probe = await asyncio.to_thread(_lying_probe)
    app = GpuwsApp(StartHome(), ssh_config="/nonexistent/gpuws-test/ssh_config")
    async with app.run_test(size=(160, 45)) as pilot:
        started = time.perf_counter()
        await app.push_screen(DashboardScreen("liar", probe, "ssh", app.telemetry))
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen)
                    and bool(app.screen.query(GpuRow)))
        shown_s = time.perf_counter() - started
        screen = app.screen
        rows = len(screen.query(GpuRow))
        widgets = len(list(screen.walk_children()))
        assert rows == MAX_GPUS
        notice = str(screen.query_one(PodInfo).render())
        assert "listed 5,000 GPUs" in notice
        # It answers a key: the help screen opens over it, and esc closes it again.
        await pilot.press("question_mark")
        await until(pilot, lambda: not isinstance(app.screen, DashboardScreen))
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
    assert app._exception is None
    record("test_the_dashboard_of_a_5000_gpu_pod_is_bounded_and_answers_keys",
           gpus_announced=ANNOUNCED, gpus_kept=len(probe.gpus), gpu_rows=rows,
           widgets=widgets, dashboard_shown_s=round(shown_s, 2))
