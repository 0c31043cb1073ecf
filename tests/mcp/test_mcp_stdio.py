"""``gpuws mcp`` against the real sshd pod, through the MCP SDK's stdio client.

The client is the SDK's (the one agent hosts use); the server is ``python -m gpuws mcp``
in its own process; the pod is a real OpenSSH sshd on loopback with gpuws's agent
deployed on it. ``cmd:`` workloads need no GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from gpuws.sessions.store import Store

from .mcpclient import mcp_client, write_config

# Each test starts `gpuws mcp` and deploys the agent over SSH: ~10 s on two shared cores.
pytestmark = pytest.mark.timeout(240)

POD = """
[hosts.pod]
agent = true
rate_usd_per_hour = 3.6
"""


def _text(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def test_tools_listed_with_schemas(ssh_config: Path) -> None:
    write_config(POD)
    async with mcp_client("-F", str(ssh_config)) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {"hosts", "doctor", "sync", "run", "results", "compare", "history",
                          "export", "start", "stop"}
    for tool in tools.values():
        assert tool.output_schema is not None and tool.output_schema["type"] == "object"
    assert tools["run"].input_schema["required"] == ["host", "workload"]


async def test_an_agent_runs_reads_and_is_recorded(ssh_config: Path) -> None:
    write_config(POD)
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total, message))

    async with mcp_client("-F", str(ssh_config), "--budget-usd", "5",
                          "--max-run-seconds", "60") as client:
        hosts = await client.call_tool("hosts", {})
        assert not hosts.is_error
        assert hosts.structured_content is not None
        assert hosts.structured_content["hosts"][0] == {
            "host": "pod", "agent": True, "agent_may_start_stop": False,
            "rate_usd_per_hour": 3.6, "has_start": False, "has_stop": False}
        ran = await client.call_tool(
            "run", {"host": "pod", "workload": "cmd:echo hello-agent; echo oops >&2",
                    "tiers": "2"}, progress_callback=on_progress)
        assert not ran.is_error, _text(ran)
        out = ran.structured_content
        assert out is not None
        assert out["status"] == "ok"
        assert "stdout: hello-agent" in out["output_tail"]
        assert "stderr: oops" in out["output_tail"]
        prov = out["provenance"]
        assert prov["host"] == "pod" and prov["gpuws_version"]
        # Progress came as notifications, ending at the total.
        assert progress and progress[-1][0] == progress[-1][1]
        assert any("tier 2" in (m or "") for _, _, m in progress)

        again = await client.call_tool("results", {"run_id": out["run_id"][:15]})
        assert again.structured_content is not None
        assert again.structured_content["run_id"] == out["run_id"]
        assert again.structured_content["provenance"] == prov

        history = await client.call_tool("history", {})
        assert history.structured_content is not None
        runs = history.structured_content["runs"]
        assert [r["by"] for r in runs if r["run_id"] == out["run_id"]] == ["agent"]
        tools = [a["tool"] for a in history.structured_content["agent_actions"]]
        assert tools == ["hosts", "run", "results"]

        exported = await client.call_tool("export", {"session": out["session_id"]})
        assert exported.structured_content is not None
        assert "## Agent actions (gpuws mcp)" in exported.structured_content["markdown"]

        report = await client.read_resource(f"gpuws://report/{out['session_id']}")
        assert "## Agent actions (gpuws mcp)" in report.contents[0].text  # type: ignore[union-attr]
        doctor = await client.call_tool("doctor", {"host": "pod"})
        assert not doctor.is_error, _text(doctor)
        assert doctor.structured_content is not None
        assert doctor.structured_content["host"] == "pod"
        assert doctor.structured_content["python"]["version"]
        trace = await client.read_resource(f"gpuws://trace/{out['run_id']}")
        lines = [json.loads(x) for x in trace.contents[0].text.splitlines()]  # type: ignore[union-attr]
        assert lines[0]["type"] == "run_started" and lines[-1]["type"] == "run_finished"
    with Store() as store:
        from gpuws.sessions import agent_actions as actions

        recorded = actions.actions(store)
    run_call = next(a for a in recorded if a.tool == "run")
    assert run_call.arguments["workload"] == "cmd:echo hello-agent; echo oops >&2"
    assert run_call.run_id == out["run_id"] and run_call.outcome == "ok"
    assert run_call.cost_usd is not None and run_call.cost_usd > 0


async def test_refusals_are_tool_errors_with_one_line(ssh_config: Path) -> None:
    write_config(POD + """
[hosts.other]
rate_usd_per_hour = 1.0
""")
    async with mcp_client("-F", str(ssh_config), "--budget-usd", "0.05",
                          "--max-run-seconds", "60") as client:
        outside = await client.call_tool("run", {"host": "other", "workload": "cmd:true"})
        assert outside.is_error
        assert _text(outside).startswith("gpuws: refused: host 'other' is not open to agents")
        assert "agent = true" in _text(outside)
        # 60 s at $3.60/h could cost $0.06, more than the $0.05 budget.
        past = await client.call_tool("run", {"host": "pod", "workload": "cmd:true"})
        assert past.is_error
        assert "could cost up to $0.0600" in _text(past)
        assert "--budget-usd" in _text(past)
        stop = await client.call_tool("stop", {"host": "pod"})
        assert stop.is_error and "agent_may_start_stop" in _text(stop)
        bad = await client.call_tool("run", {"host": "pod", "workload": "nope"})
        assert bad.is_error and _text(bad).startswith("gpuws: ")
        unknown = await client.call_tool("results", {"run_id": "nosuchrun"})
        assert unknown.is_error and "history tool" in _text(unknown)
        # Worst values an agent can send: a host with a newline and an escape, numbers
        # out of range, a mode that does not exist.
        hostile = await client.call_tool("run", {"host": "pod\n\x1b[2J", "workload": "cmd:true"})
        assert hostile.is_error and "is not open to agents" in _text(hostile)
        negative = await client.call_tool("run", {"host": "pod", "workload": "cmd:true",
                                                  "max_seconds": -1})
        assert negative.is_error and _text(negative).startswith("gpuws: ")
        nan = await client.call_tool("run", {"host": "pod", "workload": "cmd:true",
                                             "max_seconds": float("nan")})
        assert nan.is_error
        mode = await client.call_tool("run", {"host": "pod", "workload": "cmd:true",
                                              "timing": "warm"})
        assert mode.is_error and "warm" in _text(mode)
        for result in (outside, past, stop, bad, unknown, hostile, negative, nan, mode):
            assert "\n" not in _text(result) and "\x1b" not in _text(result)
        history = await client.call_tool("history", {})
    assert history.structured_content is not None
    outcomes = [(a["tool"], a["outcome"]) for a in history.structured_content["agent_actions"]]
    assert outcomes == [("run", "refused"), ("run", "refused"), ("stop", "refused"),
                        ("run", "error"), ("results", "error"), ("run", "refused"),
                        ("run", "error"), ("run", "error"), ("run", "error")]
    # Nothing ran: no session was opened on the pod.
    assert history.structured_content["runs"] == []


async def _wait_for_run(client: Any, status: str) -> dict[str, Any]:
    """The first stored run once it reaches ``status`` (the pod reports ends late)."""
    with anyio.fail_after(60):
        while True:
            history = await client.call_tool("history", {})
            runs = history.structured_content["runs"]
            if runs and runs[0]["status"] == status:
                return dict(runs[0])
            await anyio.sleep(0.2)


async def test_a_run_past_max_run_seconds_is_cancelled_on_the_pod(ssh_config: Path) -> None:
    write_config(POD)
    async with mcp_client("-F", str(ssh_config), "--max-run-seconds", "2") as client:
        ran = await client.call_tool("run", {"host": "pod", "workload": "cmd:sleep 60",
                                             "tiers": "2"})
        assert ran.is_error
        assert "passed --max-run-seconds 2 and was cancelled on the pod" in _text(ran)
        run = await _wait_for_run(client, "cancelled")
        assert run["by"] == "agent"


async def test_cancelling_the_call_cancels_the_run(ssh_config: Path) -> None:
    write_config(POD)
    started = anyio.Event()

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        # A cmd: workload runs as tier 0 (the workload itself), before the tiers asked.
        if message and message.startswith("tier 0") and message.endswith("started"):
            started.set()

    async with mcp_client("-F", str(ssh_config)) as client:
        scope = anyio.CancelScope()

        async def call() -> None:
            with scope:
                await client.call_tool("run", {"host": "pod", "workload": "cmd:sleep 60",
                                               "tiers": "2"}, progress_callback=on_progress)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.fail_after(60):
                await started.wait()
            scope.cancel()
        await _wait_for_run(client, "cancelled")
        with anyio.fail_after(60):
            while True:  # the call is recorded once its run's end is stored
                history = await client.call_tool("history", {})
                outcomes = [a["outcome"] for a in history.structured_content["agent_actions"]
                            if a["tool"] == "run"]
                if outcomes:
                    break
                await anyio.sleep(0.2)
    assert outcomes == ["cancelled"]


async def test_sync_then_run_in_the_workspace_records_the_code(ssh_config: Path,
                                                               tmp_path: Path) -> None:
    write_config(POD)
    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "kernel.txt").write_text("version 1\n")
    async with mcp_client("-F", str(ssh_config)) as client:
        synced = await client.call_tool("sync", {"host": "pod", "workspace": str(ws)})
        assert not synced.is_error, _text(synced)
        s = synced.structured_content
        assert s is not None and s["files"] == 1 and s["blobs_sent"] == 1
        ran = await client.call_tool("run", {"host": "pod", "workload": "cmd:cat kernel.txt",
                                             "workspace": str(ws), "tiers": "2"})
        assert not ran.is_error, _text(ran)
        r = ran.structured_content
        assert r is not None
        assert "stdout: version 1" in r["output_tail"]
        # The run's provenance names the tree the sync sent, as the laptop hashed it.
        assert r["provenance"]["tree_sha256"] == s["tree_sha256"]
        assert r["code"]["tree_sha256"] == s["tree_sha256"]
        again = await client.call_tool("sync", {"host": "pod", "workspace": str(ws)})
        assert again.structured_content is not None
        assert again.structured_content["blobs_sent"] == 0  # nothing changed, nothing sent


async def test_a_host_open_to_start_and_stop_runs_its_own_tools(ssh_config: Path,
                                                                tmp_path: Path) -> None:
    """`start`/`stop` where the config allows the agent to: the host's own commands run
    (scripts writing a marker stand in for a provider's CLI), and each call is recorded.
    The pod (a real sshd on loopback) keeps answering after `stop`: the call says so as a
    tool error rather than claiming a stop it did not see."""
    def tool(name: str) -> Path:
        marker = tmp_path / f"{name}-ran"
        path = tmp_path / f"{name}.sh"
        path.write_text(f"#!/bin/sh\ndate +%s > {marker}\n")
        path.chmod(0o755)
        return path

    start, stop = tool("start"), tool("stop")
    write_config(POD + f'agent_may_start_stop = true\nstart = ["{start}"]\n'
                 f'stop = ["{stop}"]\n')
    async with mcp_client("-F", str(ssh_config), "--budget-usd", "5") as client:
        started = await client.call_tool("start", {"host": "pod", "wait_s": 30})
        assert not started.is_error, _text(started)
        assert started.structured_content is not None
        assert started.structured_content["answers"] is True
        assert (tmp_path / "start-ran").exists()
        stopped = await client.call_tool("stop", {"host": "pod", "wait_s": 1})
        assert (tmp_path / "stop-ran").exists()
        assert stopped.is_error and _text(stopped).startswith("gpuws: ")
        assert "\n" not in _text(stopped)
        history = await client.call_tool("history", {})
    assert history.structured_content is not None
    outcomes = [(a["tool"], a["outcome"]) for a in history.structured_content["agent_actions"]]
    assert outcomes[:2] == [("start", "ok"), ("stop", "error")], outcomes
