"""The profiling tiers, run by the worker in order for one workload."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from . import procs, wire

if TYPE_CHECKING:
    from .worker import RunContext


class WorkloadError(Exception):
    """The workload cannot run as given; the message is written for people."""

    for_people = True


def execute(ctx: "RunContext") -> None:
    kind, _, rest = str(ctx.spec["workload"]).partition(":")
    if kind == "cmd":
        run_command(ctx, rest)
    else:
        raise WorkloadError("unknown workload kind %r: use builtin:NAME, file:PATH or cmd:COMMAND"
                            % kind)


def run_command(ctx: "RunContext", command: str) -> None:
    """A ``cmd:`` workload: run it once as asked, output streamed, exit code and wall kept."""
    if not command.strip():
        raise WorkloadError("empty command: give cmd:COMMAND")
    tiers = [int(t) for t in ctx.spec.get("tiers") or []]
    if 1 in tiers:
        ctx.emit(wire.make("tier_started", tier=1, name="CUDA events"))
        ctx.emit(wire.make("tier_finished", tier=1, status="skipped", wall_s=0.0,
                           reason="Tier 1 times a Python workload's run(); a command has none"))
    argv = ["/bin/sh", "-c", command]
    ctx.emit(wire.make("tier_started", tier=0, name="workload", argv=argv))
    t0 = time.time()
    result = procs.run_streaming(argv, emit=ctx.emit, tier=0, cwd=ctx.run_dir, env=ctx.env,
                                 timeout_s=ctx.spec.get("timeout_s"))
    ctx.exit_code = result.returncode
    status = "ok" if result.returncode == 0 else "failed"
    reason = "" if status == "ok" else "exit code %d" % result.returncode
    if result.timed_out:
        reason = "killed after the %.0f s timeout" % float(ctx.spec.get("timeout_s") or 0)
    ctx.emit(wire.make("tier_finished", tier=0, status=status, wall_s=time.time() - t0,
                       reason=reason))
    ctx.announce_artifacts()
