"""The MCP server: gpuws's tools and resources for a coding agent, over stdio.

Each tool drives the laptop engine (:class:`gpuws.live.engine.Engine`) the way the CLI's
commands do, and answers with structured content (the output schemas are
:mod:`.schemas`'s). The numbers are gpuws's own: Tier 1's timer and the statistics run in
gpuws's processes, never in the files the agent edits, and each run's result carries its
provenance. Every call is recorded with its arguments (:mod:`.actions`); every refusal and
failure is a tool error whose text is the one ``gpuws: …`` line a person would read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, cast

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from .. import __version__, protocol, runspec
from ..errors import GpuwsError, RunError, UsageError
from ..gpu import gpus
from ..live.engine import Engine
from ..live.feed import Batch
from ..live.link import Target
from ..live.storeio import StoreHandle
from ..sessions import agent_actions as actions
from ..sessions.export import export_session
from ..sessions.runlist import list_runs
from ..sessions.store import Store
from ..text.textsafe import visible
from . import results
from .policy import AgentPolicy, AgentRefused, Held
from .schemas import (
    ActionOut,
    CompareOut,
    ExportOut,
    HistoryOut,
    HistoryRun,
    HostEntry,
    HostsOut,
    PowerOut,
    RunOut,
    SyncOut,
)

#: How long a cancelled run may take to report its end before the tool gives up waiting.
CANCEL_GRACE_S = 30.0
#: How much longer than --max-run-seconds the pod lets a workload process run: the
#: laptop cancels at the cap; the pod's timeout is for a laptop that is gone by then.
POD_TIMEOUT_MARGIN_S = 30.0
#: The resources' URI templates.
REPORT_URI = "gpuws://report/{session_id}"
TRACE_URI = "gpuws://trace/{run_id}"


@dataclass
class _Call:
    """What one tool call touched, filled in by the tool, recorded when it ends."""

    host: str | None = None
    run_id: str | None = None
    session_id: str | None = None
    cost_usd: float | None = None
    provenance: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


_CALL: contextvars.ContextVar[_Call] = contextvars.ContextVar("gpuws_mcp_call")


def _call() -> _Call:
    """This tool call's record (a fresh one outside a call, e.g. in a direct test)."""
    try:
        return _CALL.get()
    except LookupError:
        call = _Call()
        _CALL.set(call)
        return call


def _gpuws_error(exc: BaseException) -> GpuwsError | None:
    """The GpuwsError behind a tool failure (the SDK wraps what a tool raises)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, GpuwsError):
            return seen
        seen = seen.__cause__
    return None


def error_line(error: GpuwsError) -> str:
    """The line a person would see on stderr for the same failure."""
    return "gpuws: " + visible(error.one_line(), None)


class GpuwsServer(MCPServer[Any]):
    """:class:`MCPServer` that records every call and answers failures with gpuws's line."""

    def __init__(self, policy: AgentPolicy) -> None:
        super().__init__(
            name="gpuws", version=__version__,
            # stderr is the person's log: asyncssh's INFO lines (a dozen per connection)
            # would bury gpuws's own warnings.
            log_level="WARNING",
            instructions=(
                "gpuws measures GPU code on rented pods. Typical loop: sync a workspace, run "
                "a workload (file:PATH inside it, tiers '1' for timing), read results, edit, "
                "run again, compare the two run ids. Numbers come from gpuws's timer, never "
                "from the workload's files; a file: workload may define check(state) to "
                "prove its output is right before it is timed."))
        self.policy = policy

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Context[Any, Any] | None = None) -> Any:
        call = _Call()
        token = _CALL.set(call)
        outcome, detail = "ok", ""
        try:
            result = await super().call_tool(name, arguments, context)
            return result
        except asyncio.CancelledError:
            outcome, detail = "cancelled", "the client cancelled the call"
            raise
        except ToolError as exc:
            error = _gpuws_error(exc)
            if error is None:
                if isinstance(exc.__cause__, Exception) and not str(exc).startswith(
                        "Error executing tool"):
                    raise
                # The arguments did not fit the schema, or the tool crashed: the SDK's text
                # (a crash's is only the tool's name; the traceback is on stderr).
                outcome, detail = "error", f"gpuws: {visible(str(exc), 2000)}"
            else:
                outcome = "refused" if isinstance(error, AgentRefused) else "error"
                detail = error_line(error)
            return CallToolResult(content=[TextContent(type="text", text=detail)],
                                  is_error=True)
        finally:
            _CALL.reset(token)
            # Shielded: a cancelled call is recorded too (the SDK cancels through anyio,
            # which cancels every await of the task again until its scope is left).
            with anyio.CancelScope(shield=True):
                await asyncio.to_thread(_record, name, arguments, outcome, detail, call)


def _record(tool: str, arguments: dict[str, Any], outcome: str, detail: str,
            call: _Call) -> None:
    with Store() as store:
        actions.record(store, tool, arguments, outcome, detail=detail, host=call.host,
                       run_id=call.run_id, session_id=call.session_id,
                       cost_usd=call.cost_usd, provenance=call.provenance)


# ----------------------------------------------------------------------------- helpers
def _target(policy: AgentPolicy, host: str) -> Target:
    return Target(host, ssh_config=policy.ssh_config)


def _args(policy: AgentPolicy, host: str, **more: Any) -> argparse.Namespace:
    """The connection arguments the CLI's helpers take, for ``host``."""
    return argparse.Namespace(host=host, ssh_config=policy.ssh_config, port=None, user=None,
                              accept_new=False, python="python3", pty=False, **more)


async def _in_store(fn: Any) -> Any:
    def work() -> Any:
        with Store() as store:
            return fn(store)
    return await asyncio.to_thread(work)


class _Progress:
    """Tier starts and ends as MCP progress notifications, in order."""

    def __init__(self, ctx: Context[Any, Any], tiers: int) -> None:
        self.ctx = ctx
        self.total = float(tiers + 1)
        self.done = 0.0
        self.queue: asyncio.Queue[tuple[float, str] | None] = asyncio.Queue()
        self.task = asyncio.create_task(self._send())

    def batch(self, batch: Batch) -> None:
        """The engine's ``on_batch``."""
        for ev in batch.events:
            if isinstance(ev, protocol.RunStarted):
                self.queue.put_nowait((self.done, f"run {ev.run_id} started on "
                                                  f"{visible(ev.hostname, 80)}"))
            elif isinstance(ev, protocol.TierStarted):
                self.queue.put_nowait((self.done, f"tier {ev.tier} ({visible(ev.name, 80)}) "
                                                  "started"))
            elif isinstance(ev, protocol.TierFinished):
                self.done += 1
                self.queue.put_nowait((self.done, f"tier {ev.tier} {visible(ev.status, 40)} "
                                                  f"in {ev.wall_s:.1f} s"))
            elif isinstance(ev, protocol.RunFinished):
                self.queue.put_nowait((self.total, f"run {visible(ev.status, 40)}"))

    async def _send(self) -> None:
        while (item := await self.queue.get()) is not None:
            with contextlib.suppress(Exception):  # a client gone away loses no run
                await self.ctx.report_progress(item[0], self.total, item[1])

    async def close(self) -> None:
        self.queue.put_nowait(None)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.task, 5)


# ----------------------------------------------------------------------------- tools
def build_server(policy: AgentPolicy) -> GpuwsServer:
    """The server with its tools and resources, bounded by ``policy``."""
    server = GpuwsServer(policy)
    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    syncs: dict[Path, Any] = {}

    @server.tool(description="The hosts in the person's config, which an agent may use, and "
                             "what this session has spent of its budget.",
                 annotations=read_only)
    def hosts() -> HostsOut:
        from ..config import host_config

        cfg = policy.config()
        entries: list[HostEntry] = []
        for name in sorted(cfg.hosts):
            h = host_config(cfg, name)
            entries.append(HostEntry(host=name, agent=bool(h.agent),
                                     agent_may_start_stop=bool(h.agent_may_start_stop),
                                     rate_usd_per_hour=h.rate_usd_per_hour,
                                     has_start=h.start is not None, has_stop=h.stop is not None))
        return HostsOut(hosts=entries, budget_usd=policy.budget_usd,
                        spent_usd=policy.spent_usd, device_s=policy.device_s,
                        max_run_seconds=policy.max_run_seconds)

    @server.tool(description="Deploy gpuws's agent on a host and report what the pod has: "
                             "GPUs, driver, CUDA, Python packages, profilers (doctor --json).")
    async def doctor(host: Annotated[str, Field(description="a host from the hosts tool")]
                     ) -> dict[str, Any]:
        from ..commands.common import connect
        from ..commands.doctor import doctor_report

        policy.allow(host)
        policy.afford(host, 120.0, "doctor")
        _call().host = host
        t0 = time.monotonic()
        with Held(policy, host) as held:
            client = await connect(_args(policy, host))
            try:
                probe = await client.probe()
                report = doctor_report(host, client, probe, time.monotonic() - t0)
            finally:
                await client.close()
        _call().cost_usd = held.cost_usd
        return report

    @server.tool(description="Bring a project directory to the host (only changed files "
                             "travel); run's workspace argument does it before a run.")
    async def sync(host: Annotated[str, Field(description="a host from the hosts tool")],
                   workspace: Annotated[str, Field(description="a directory on this machine")]
                   ) -> SyncOut:
        from ..commands.common import connect
        from ..workspace.sync import WorkspaceSync

        policy.allow(host)
        policy.afford(host, 120.0, "a sync")
        _call().host = host
        root = Path(workspace).expanduser().resolve()
        ws = syncs.get(root) or syncs.setdefault(root, WorkspaceSync(root))
        manifest = await asyncio.to_thread(ws.scan)
        code = await asyncio.to_thread(ws.code, manifest)
        with Held(policy, host) as held:
            client = await connect(_args(policy, host))
            try:
                synced = await ws.sync(client, manifest)
            finally:
                await client.close()
        _call().cost_usd = held.cost_usd
        return SyncOut(host=host, name=synced.name, root=synced.root,
                       files=len(manifest.entries), tree_sha256=manifest.tree_sha256,
                       git_commit=code.git_commit, git_dirty=code.git_dirty,
                       blobs_sent=synced.blobs_sent, bytes_sent=synced.bytes_sent,
                       seconds=synced.seconds)

    @server.tool(description="Run a workload through gpuws's tiers on a host and return its "
                             "result (as the results tool). Progress comes as notifications; "
                             "cancelling the call cancels the run on the pod.")
    async def run(
        host: Annotated[str, Field(description="a host from the hosts tool")],
        workload: Annotated[str, Field(description="builtin:NAME[?k=v&...], file:PATH (inside "
                                                   "the workspace when one is given) or "
                                                   "cmd:COMMAND")],
        ctx: Context[Any, Any],
        tiers: Annotated[str, Field(description="comma-separated tiers: 1 times (CUDA "
                                                "events), 2 traces kernels (nsys), 3 "
                                                "profiles (ncu)")] = "1",
        gpu: Annotated[str | None, Field(description="GPU index or UUID (prefix)")] = None,
        workspace: Annotated[str | None, Field(
            description="a project directory on this machine, synced first; the run "
                        "executes in it and records its tree hash and commit")] = None,
        target_ci: Annotated[str, Field(description="stop Tier 1 when the median's 95% CI "
                                                    "is within ± this, e.g. 1%")] = "1%",
        max_seconds: Annotated[float, Field(gt=0, le=3600, description="Tier 1's sampling "
                                                                       "time budget")] = 10.0,
        timing: Annotated[str, Field(description="auto, cold or hot")] = "auto",
    ) -> RunOut:
        policy.allow(host)
        call = _call()
        call.host = host
        opts = runspec.LaunchOptions(
            workload=workload, tiers=tiers, target_ci=runspec.parse_target_ci(target_ci),
            max_seconds=max_seconds, timing=timing, gpu=gpu, workspace=workspace,
            # The pod's own stop, should the laptop's cancel at the cap never reach it.
            timeout=policy.max_run_seconds + POD_TIMEOUT_MARGIN_S)
        spec = runspec.build_spec(opts)  # a mistake in the run is named before the budget
        policy.afford(host, policy.max_run_seconds, "a run")
        ws = None
        manifest = None
        if workspace is not None:
            from ..workspace.sync import WorkspaceSync

            root = Path(workspace).expanduser().resolve()
            ws = syncs.get(root) or syncs.setdefault(root, WorkspaceSync(root))
            manifest = await asyncio.to_thread(ws.scan)
        progress = _Progress(ctx, len(spec.tiers))
        engine = Engine(StoreHandle(), on_batch=progress.batch, auto_pull=True)
        run_id: str | None = None
        held = Held(policy, host)
        try:
            with held:
                try:
                    await engine.connect(_target(policy, host))
                    assert engine.link is not None
                    gpus.check_on_pod(spec.gpu, engine.link.probe)
                    call.session_id = engine.session_id
                    if ws is not None and manifest is not None:
                        await ws.sync(engine.link.client, manifest)
                        code = await asyncio.to_thread(ws.code, manifest)
                        info = await engine.start_run(spec, code, manifest.entries)
                    else:
                        info = await engine.start_run(spec)
                    run_id = call.run_id = info.run_id
                    await _follow(engine, run_id, policy.max_run_seconds)
                    await engine.settled(run_id)
                finally:
                    with anyio.CancelScope(shield=True):  # ended and stored, even cancelled
                        await progress.close()
                        await engine.close()
                        await engine.store.close()
            call.cost_usd = held.cost_usd
        except asyncio.CancelledError:
            call.cost_usd = held.cost_usd
            raise
        rid = run_id

        def read(s: Store) -> dict[str, Any]:
            call.provenance = results.provenance_now(s, rid)
            out = results.run_result(s, rid)
            # Not yet in the store (recorded as the call ends): this process made it.
            out["provenance"] = call.provenance
            return out

        out = await _in_store(read)
        return cast(RunOut, out)

    async def results_(run_id: Annotated[str, Field(description="a run id or unique prefix")]
                       ) -> RunOut:
        out = await _in_store(lambda s: results.run_result(s, run_id))
        _call().run_id = out["run_id"]
        return cast(RunOut, out)

    @server.tool(description="Compare run B with run A: the time ratio with its 95% CI and "
                             "the verdict (faster, slower, no difference), as gpuws watch "
                             "decides it; refused when their provenance differs (another GPU "
                             "model, clocks far apart, another timing mode).",
                 annotations=read_only)
    async def compare(run_a: Annotated[str, Field(description="the reference run")],
                      run_b: Annotated[str, Field(description="the run compared with it")]
                      ) -> CompareOut:
        out = await _in_store(lambda s: results.comparison(s, run_a, run_b))
        _call().run_id = out["run_b"]
        return cast(CompareOut, out)

    @server.tool(description="The stored runs (all, or one session's), each marked by who "
                             "made it (agent or person), and the agent's recorded actions.",
                 annotations=read_only)
    async def history(session: Annotated[str | None, Field(
            description="a session id or prefix (default: all)")] = None,
                      limit: Annotated[int, Field(ge=1, le=1000)] = 50) -> HistoryOut:
        def read(s: Store) -> HistoryOut:
            sid = None
            if session is not None:
                try:
                    sid = s.session(session).id
                except GpuwsError as exc:
                    raise UsageError(exc.message, remedy="the history tool without a session "
                                                         "lists every run") from None
            by_agent = actions.agent_runs(s)
            runs = [HistoryRun(run_id=r.run_id, session_id=r.session_id, host=r.host,
                               workload=r.workload, status=r.status, started=r.started,
                               tier1_median_ms=r.tier1_median_ms, tier1_ci_pct=r.tier1_ci_pct,
                               by="agent" if r.run_id in by_agent else "person")
                    for r in list_runs(s, sid)][-limit:]
            acts = [ActionOut(at=a.at, tool=a.tool, arguments=a.arguments, outcome=a.outcome,
                              detail=a.detail, host=a.host, run_id=a.run_id,
                              cost_usd=a.cost_usd)
                    for a in actions.actions(s, sid)][-limit:]
            return HistoryOut(runs=runs, agent_actions=acts)
        out: HistoryOut = await _in_store(read)
        return out

    @server.tool(description="A session as gpuws export writes it (markdown), with the "
                             "agent's actions in it.", annotations=read_only)
    async def export(session: Annotated[str, Field(description="a session id or prefix")]
                     ) -> ExportOut:
        def read(s: Store) -> ExportOut:
            try:
                sid = s.session(session).id
            except GpuwsError as exc:
                raise UsageError(exc.message, remedy="the history tool lists the sessions of "
                                                     "each run") from None
            text = export_session(s, sid) + actions.agent_section(actions.actions(s, sid))
            _call().session_id = sid
            return ExportOut(session_id=sid, markdown=text)
        out: ExportOut = await _in_store(read)
        return out

    for which in ("start", "stop"):
        server.add_tool(_power_tool(policy, which), name=which,
                        description=f"{which.capitalize()} the pod with the host's `{which}` "
                                    "command from the config (only where the config allows "
                                    "an agent to, and within the budget).")

    @server.resource(REPORT_URI, name="report", mime_type="text/markdown",
                     description="A session's report (gpuws export)")
    async def report(session_id: str) -> str:
        def read(s: Store) -> str:
            sid = s.session(session_id).id
            return export_session(s, sid) + actions.agent_section(actions.actions(s, sid))
        text: str = await _in_store(read)
        return text

    @server.resource(TRACE_URI, name="trace", mime_type="application/x-ndjson",
                     description="A run's recorded events, one JSON object a line")
    async def trace(run_id: str) -> str:
        def read(s: Store) -> str:
            rid = s.run(run_id).run_id
            return b"\n".join(protocol.encode(ev).rstrip(b"\n")
                              for ev in s.events(rid)).decode() + "\n"
        text: str = await _in_store(read)
        return text

    # The tool is "results" to the agent; the function is named apart from the module.
    server.add_tool(results_, name="results", annotations=read_only,
                    description="A stored run's figures: Tier-1 median with its 95% CI, "
                                "verdicts, kernel table, diagnoses, the code it ran, the end "
                                "of its output and its provenance.")
    return server


def _power_tool(policy: AgentPolicy, which: str) -> Any:
    async def power(host: Annotated[str, Field(description="a host from the hosts tool")],
                    wait_s: Annotated[float, Field(gt=0, le=3600)] = 300.0) -> PowerOut:
        from ..commands import lease
        from ..live.uptime.power import answers

        policy.allow(host, start_stop=True)
        policy.afford(host, wait_s + 300.0, f"`{which}`")
        _call().host = host
        args = _args(policy, host, wait=wait_s, timeout=300.0)
        with Held(policy, host) as held:
            await (lease.start(args) if which == "start" else lease.stop(args))
            up = await answers(_target(policy, host))
        _call().cost_usd = held.cost_usd
        return PowerOut(host=host, action=which, answers=up,
                        detail=f"{host} {'answers' if up else 'does not answer'}")
    power.__name__ = which
    return power


async def _follow(engine: Engine, run_id: str, limit_s: float) -> protocol.RunFinished:
    """Wait for the run's end; past ``limit_s`` or on the client's cancel, cancel it."""
    try:
        return await asyncio.wait_for(engine.wait_finished(run_id), limit_s)
    except TimeoutError:
        await _cancel(engine, run_id)
        raise RunError(f"run {run_id} passed --max-run-seconds {limit_s:g} and was cancelled "
                       "on the pod", remedy="a person raises --max-run-seconds, or ask for "
                       "less (fewer tiers, a smaller max_seconds)") from None
    except asyncio.CancelledError:
        # The client cancelled the call: the run is cancelled on the pod, and its end
        # stored, before the call ends.
        with anyio.CancelScope(shield=True):
            await _cancel(engine, run_id)
        raise


async def _cancel(engine: Engine, run_id: str) -> None:
    with contextlib.suppress(GpuwsError, TimeoutError):
        await engine.cancel(run_id)
        await asyncio.wait_for(engine.wait_finished(run_id), CANCEL_GRACE_S)


async def serve(args: argparse.Namespace) -> int:
    """``gpuws mcp``: serve the tools on stdin/stdout until the client closes them."""
    if args.budget_usd is not None and not (math.isfinite(args.budget_usd)
                                            and args.budget_usd >= 0):
        raise UsageError(f"--budget-usd {args.budget_usd}: give dollars, zero or more")
    if not (math.isfinite(args.max_run_seconds) and args.max_run_seconds > 0):
        raise UsageError(f"--max-run-seconds {args.max_run_seconds}: give seconds above 0")
    policy = AgentPolicy(budget_usd=args.budget_usd, max_run_seconds=args.max_run_seconds,
                         ssh_config=args.ssh_config)
    policy.config()  # a broken config is refused now, in one line, not at the first call
    await build_server(policy).run_stdio_async()
    return 0
