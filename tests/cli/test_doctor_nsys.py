"""The Nsight Systems plan from the laptop: asked by ``gpuws doctor``, over the real sshd,
and installed only after the person confirms (issue 13, item 3).

The plan itself comes from the real agent on this machine (no GPU driver and no nsys
here: no plan, and the reason says why). The confirm and refuse paths need a plan with
steps, which this machine cannot produce without a GPU driver, and must never run its
steps (they would apt-get install on this machine): those tests put a stand-in for the
agent's ``nsys_plan`` answer in place of the real one and say so; everything else
(connecting, deploying, probing, the prompt, printing) is real.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuws import protocol
from gpuws.cli import main
from gpuws.client import AgentClient
from gpuws.commands import doctor as doctor_cmd
from gpuws.errors import GpuwsError, ProtocolError, UsageError
from gpuws.live.boundary import check_answer
from gpuws.remote_agent.profilers.nsys_provision import plan_nsys
from gpuws.transport.ssh import SSHTransport

UBUNTU = 'NAME="Ubuntu"\nVERSION_ID="24.04"\nID=ubuntu\nID_LIKE=debian\n'
BUNDLED = {"path": "/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys",
           "version": None, "error": "the nsys bundled inside Nsight Compute cannot profile"}


def test_doctor_shows_the_real_agents_nsys_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "local", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    plan = msgspec.convert(report["nsys"]["plan"], protocol.NsysPlan)
    assert plan.selected is None  # no nsys on this machine
    assert plan.install_plan or plan.reason  # a plan, or why there is none
    assert report["timings"]["nsys_plan_s"] >= 0
    assert main(["doctor", "local"]) == 0
    out = capsys.readouterr().out
    assert "nsys plan" in out and "none works" in out


def test_the_nsys_plan_request_over_the_real_sshd(ssh_config: Path) -> None:
    async def go() -> protocol.NsysPlan:
        client = await AgentClient.connect(SSHTransport("pod", config_file=str(ssh_config)))
        try:
            return await client.nsys_plan()
        finally:
            await client.close()

    import asyncio

    plan = asyncio.run(go())
    assert isinstance(plan, protocol.NsysPlan) and plan.req is not None
    assert check_answer(plan) is plan  # a sane answer passes the boundary's checks
    assert plan.selected is None and (plan.install_plan or plan.reason)


def test_a_forged_answer_is_refused() -> None:
    plan = msgspec.convert(plan_nsys([BUNDLED], "13.0", UBUNTU, True, "x86_64"),
                           protocol.NsysPlan)
    with pytest.raises(ProtocolError, match="timestamp"):
        check_answer(plan)  # ts 0: not a time near now
    huge = msgspec.structs.replace(plan, ts=time.time(), reason="x" * (1 << 20))
    with pytest.raises(ProtocolError, match="string"):
        check_answer(huge)


# ---------------------------------------------------------------------- confirm / refuse
class PlanStandIn:
    """Stands in for the agent's ``nsys_plan`` answer (see the module docstring)."""

    def __init__(self, with_plan: bool = True) -> None:
        base = plan_nsys([BUNDLED], "13.0", UBUNTU, True, "x86_64") if with_plan else \
            plan_nsys([BUNDLED], None, UBUNTU, True, "x86_64")
        self.plan = msgspec.convert(dict(base, ts=time.time()), protocol.NsysPlan)
        self.installs = 0

    def put_in_place(self, monkeypatch: pytest.MonkeyPatch) -> PlanStandIn:
        async def nsys_plan(client: AgentClient, install: bool = False) -> protocol.NsysPlan:
            return await self.answer(install)

        monkeypatch.setattr(AgentClient, "nsys_plan", nsys_plan)
        return self

    async def answer(self, install: bool) -> protocol.NsysPlan:
        if not install:
            return self.plan
        self.installs += 1
        return msgspec.structs.replace(
            self.plan, selected="/opt/nvidia/nsight-systems/2025.1.3/bin/nsys",
            selected_version="2025.1.3", installed=True, ts=time.time(),
            verified="NVIDIA Nsight Systems version 2025.1.3; smoke profile wrote a report "
                     "in 2.1 s")


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> PlanStandIn:
    return PlanStandIn().put_in_place(monkeypatch)


def _stdin(monkeypatch: pytest.MonkeyPatch, text: str, tty: bool) -> io.StringIO:
    stdin = io.StringIO(text)
    stdin.isatty = lambda: tty  # type: ignore[method-assign]
    monkeypatch.setattr("sys.stdin", stdin)
    return stdin


def test_install_asks_and_no_changes_nothing(stand_in: PlanStandIn,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    _stdin(monkeypatch, "n\n", tty=True)
    assert main(["doctor", "local", "--install-nsys"]) == 0
    captured = capsys.readouterr()
    assert stand_in.installs == 0
    assert "[y/N]" in captured.err and "cuda-nsight-systems-13-0" in captured.err
    assert "apt-get" in captured.out and "Nothing was installed." in captured.out


def test_install_asks_and_yes_installs_then_shows_the_verification(
        stand_in: PlanStandIn, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _stdin(monkeypatch, "y\n", tty=True)
    assert main(["doctor", "local", "--install-nsys"]) == 0
    out = capsys.readouterr().out
    assert stand_in.installs == 1
    assert "installed" in out and "smoke profile wrote a report" in out


def test_without_a_terminal_it_needs_yes(stand_in: PlanStandIn,
                                         monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    stdin = _stdin(monkeypatch, "y\n", tty=False)

    async def no_connect(args: Any) -> AgentClient:
        raise AssertionError("refused before connecting")

    monkeypatch.setattr(doctor_cmd, "connect", no_connect)
    assert main(["doctor", "local", "--install-nsys"]) == UsageError.exit_code
    assert "--yes" in capsys.readouterr().err
    assert stand_in.installs == 0 and stdin.tell() == 0  # nothing read, nothing run


def test_yes_installs_without_asking(stand_in: PlanStandIn, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    stdin = _stdin(monkeypatch, "", tty=False)
    assert main(["doctor", "local", "--install-nsys", "--yes", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # stdout stays JSON; the steps go to stderr
    assert report["nsys"]["plan"]["installed"] is True
    assert stand_in.installs == 1 and stdin.tell() == 0 and "[y/N]" not in captured.err


def test_no_plan_is_one_clear_line(monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    fake = PlanStandIn(with_plan=False).put_in_place(monkeypatch)
    assert main(["doctor", "local", "--install-nsys", "--yes"]) == GpuwsError.exit_code
    err = capsys.readouterr().err
    assert "CUDA version is unknown" in err and fake.installs == 0
