"""The verdicts the worker states as the tiers end (:mod:`..verdicts` does the thinking).

After Tier 2: the program verdict, with whether Tier 3's target is worth profiling.
After Tier 3: a kernel verdict per profiled kernel and the check of Tier 3 against
Tier 2. When counters are blocked: a kernel verdict from Tier 1, NVML GPM (Tier 1's
window, else a ``cmd:``'s run) and static analysis, read back from the run's own event
log (the events are the one record of what each tier found; the log is durable and
already holds them).
"""

from __future__ import annotations

import functools
import json
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, TypeVar

from .. import wire
from ..safefiles import read_regular
from ..verdicts.kernel import (
    coverage,
    gpm_window,
    kernel_verdict_without_counters,
    kernel_verdicts,
)
from ..verdicts.program import program_verdict, tier3_advice

if TYPE_CHECKING:
    from ..worker import RunContext

#: Most of the run's own log read back for the fallback verdict (Tier 1's events come
#: early; a run that printed more than this before them gets no fallback verdict).
LOG_READ_LIMIT = 64 << 20
F = TypeVar("F", bound=Callable[..., None])
#: The event types the fallback verdict reads back.
_WANTED = ("tier1_result", "static_analysis", "kernel_table", "tier_finished")


def stated(what: str) -> Callable[[F], F]:
    """A verdict is a reading of numbers already recorded: if stating one fails, the run
    says so in its log and goes on (its figures are whole without it)."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def guarded(ctx: "RunContext", *args: Any, **kwargs: Any) -> None:
            try:
                fn(ctx, *args, **kwargs)
            except (ValueError, TypeError, KeyError, AttributeError, ZeroDivisionError) as exc:
                ctx.emit(wire.make("log", level="warning", message="the %s verdict was not "
                                   "stated: %s: %s" % (what, type(exc).__name__, exc)))
        return guarded  # type: ignore[return-value]
    return wrap


@stated("program")
def after_tier2(ctx: "RunContext", table: Dict[str, Any], regex: Optional[str],
                tier3: bool) -> None:
    """Emit the program verdict of Tier 2's ``kernel_table`` event."""
    verdict = program_verdict(table)
    if tier3:
        verdict["tier3_advice"] = tier3_advice(verdict, list(table.get("kernels") or []),
                                               regex)
    ctx.emit(wire.make("program_verdict", **verdict))


@stated("kernel")
def after_tier3(ctx: "RunContext", launches: List[Dict[str, Any]],
                table: Optional[List[Dict[str, Any]]], regex: Optional[str],
                sm_count: Optional[int], launch_skip: Optional[int] = None) -> None:
    """Emit a kernel verdict per profiled kernel (its first launch) and the coverage
    (``launch_skip``: the one ncu was given, where not the spec's)."""
    for verdict in kernel_verdicts(launches, sm_count):
        ctx.emit(wire.make("kernel_verdict", **verdict))
    ctx.emit(wire.make("tier3_coverage", **coverage(
        {"kernels": table or []}, [str(x.get("kernel")) for x in launches], regex=regex,
        launch_skip=int(ctx.spec.get("launch_skip") or 0) if launch_skip is None
        else launch_skip,
        launch_count=int(ctx.spec.get("launch_count") or 1))))


@stated("kernel")
def without_counters(ctx: "RunContext", target: Optional[str]) -> None:
    """Emit the kernel verdict from Tier 1, NVML GPM and static analysis (counters
    blocked)."""
    seen = own_events(ctx)
    tier1 = seen.get("tier1_result")
    static = seen.get("static_analysis")
    table = seen.get("kernel_table")
    gpm = gpm_window((seen.get("tier_finished:1") or {}).get("gpm"),
                     (seen.get("tier_finished:0") or {}).get("gpm"),
                     list((table or {}).get("kernels") or []))
    kernel = (static or {}).get("kernel") or target
    if tier1 is None and static is None and gpm is None:
        return  # nothing to judge by: the diagnosis already says what was not measured
    ctx.emit(wire.make("kernel_verdict", **kernel_verdict_without_counters(
        str(kernel or "the workload"), tier1, static, gpm)))


def own_events(ctx: "RunContext") -> Dict[str, Dict[str, Any]]:
    """The last event of each wanted type in the run's own log (``tier_finished`` by
    tier: ``tier_finished:1``)."""
    try:
        data = read_regular(os.path.join(ctx.run_dir, "events.ndjson"), LOG_READ_LIMIT)
    except OSError:
        return {}
    found: Dict[str, Dict[str, Any]] = {}
    for line in data.splitlines():
        # The log writes ``type`` first: skip the many output lines without parsing them.
        if not any(line.startswith(b'{"type":"%s"' % t.encode()) for t in _WANTED):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            kind = str(event.get("type"))
            if kind == "tier_finished":
                kind = "tier_finished:%s" % event.get("tier")
            found[kind] = event
    return found


def sm_count_of(facts: Dict[str, Any], index: Optional[int]) -> Optional[int]:
    """The SM count of the run's GPU where the probe knows it."""
    for gpu in facts.get("gpus") or []:
        if index is None or gpu.get("index") == index:
            value = gpu.get("sm_count")
            return int(value) if isinstance(value, int) else None
    return None
