"""The dashboard offers the pod's Nsight Systems install plan like the ncu one: shown once
the agent answers, run only after the person confirms (issue 13, item 3). No pod: the plan
is the agent's own ``plan_nsys`` for an Ubuntu pod as root."""

from __future__ import annotations

import time

import msgspec
import pytest
from textual.widgets import Button, Static

from gpuws import protocol
from gpuws.live.telemetry import TelemetryHistory
from gpuws.remote_agent.profilers.nsys_provision import plan_nsys
from gpuws.tui import workers
from gpuws.tui.app import GpuwsApp, StartHome
from gpuws.tui.messages import NsysPlanReady
from gpuws.tui.screens.confirm import ConfirmScreen
from gpuws.tui.screens.dashboard import DashboardScreen
from gpuws.tui.widgets.pod.nsys_panel import NsysPanel
from tui.tuikit import h200_probe, until  # type: ignore[import-not-found]

UBUNTU = 'ID=ubuntu\nVERSION_ID="24.04"\n'
BUNDLED = {"path": "/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys",
           "version": None, "error": "the nsys bundled inside Nsight Compute cannot profile"}


def _plan(**changes: object) -> protocol.NsysPlan:
    plan = dict(plan_nsys([BUNDLED], "13.0", UBUNTU, True, "x86_64"), ts=time.time())
    plan.update(changes)
    return msgspec.convert(plan, protocol.NsysPlan)


async def test_the_nsys_plan_asks_first_and_cancel_changes_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    installs: list[GpuwsApp] = []

    async def install_nsys(app: GpuwsApp) -> None:  # records instead of reaching a pod
        installs.append(app)

    monkeypatch.setattr(workers, "install_nsys", install_nsys)
    plan = _plan(reason="found only: ncu's bundled nsys \x1b[2J[/]")  # pod text, shown as is
    app = GpuwsApp(StartHome(), ssh_config="/nonexistent/gpuws-test/ssh_config")
    async with app.run_test(size=(120, 60)) as pilot:
        screen = DashboardScreen("pod", h200_probe(), "ssh+sftp", TelemetryHistory())
        await app.push_screen(screen)
        panel = screen.query_one(NsysPanel)
        # Until the agent answers, a placeholder of the usual size holds the place.
        assert "asking the agent" in str(screen.query_one("#nsys-text", Static).render())
        assert not screen.query_one("#nsys-install", Button).display
        screen.post_message(NsysPlanReady(plan))
        await until(pilot, lambda: panel.display and screen.query_one("#nsys-install",
                                                                      Button).display)
        text = str(screen.query_one("#nsys-text", Static).render())
        assert "\\e[2J[/]" in text and "cuda-nsight-systems-13-0" in text
        await pilot.click("#nsys-install")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        body = " ".join(str(w.render()) for w in app.screen.query(Static))
        assert "apt-get" in body and "Install cuda-nsight-systems-13-0" in body
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is screen)
        await pilot.pause(0.2)
        assert installs == []  # nothing was installed
        await pilot.click("#nsys-install")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await until(pilot, lambda: installs == [app])  # confirmed: the install worker ran
        await app.shutdown()


async def test_a_working_nsys_offers_no_install() -> None:
    plan = _plan(selected="/opt/nvidia/nsight-systems/2025.1.3/bin/nsys",
                 selected_version="2025.1.3", install_plan=None)
    app = GpuwsApp(StartHome(), ssh_config="/nonexistent/gpuws-test/ssh_config")
    async with app.run_test(size=(120, 60)) as pilot:
        screen = DashboardScreen("pod", h200_probe(), "ssh+sftp", TelemetryHistory())
        await app.push_screen(screen)
        screen.post_message(NsysPlanReady(plan))
        panel = screen.query_one(NsysPanel)
        await until(pilot, lambda: panel.display)
        assert not screen.query_one("#nsys-install", Button).display
        assert "nsys 2025.1.3" in str(screen.query_one("#nsys-text", Static).render())
        await app.shutdown()
