"""The pod's lease from the laptop (issue 22): arm it from the host's config, say how it
stands.

The lease itself runs on the pod (``remote_agent/lease.py``); every face arms it the same
way when it connects to a host with ``idle_stop_minutes``, and reads it back for
``doctor`` and the dashboard. A host without the setting only has its lease read: another
laptop may have armed one.
"""

from __future__ import annotations

import time

from ... import protocol
from ...client import AgentClient
from ...config import host_config, load_config
from ...errors import GpuwsError
from ...text.textsafe import visible
from .observed import to_laptop_clock
from .power import clock


async def arm(client: AgentClient, host: str) -> protocol.LeaseStatus:
    """Arm (or renew) the pod's lease as the host's config says, or read it; never raises:
    a lease that cannot be armed comes back unarmed with its reason. Its times come back
    on the laptop's clock (:func:`observed.to_laptop_clock`)."""
    cfg = host_config(load_config(), host)
    try:
        if cfg.idle_stop_minutes is None:
            status = await client.lease()
        elif not cfg.stop_on_pod:
            return protocol.LeaseStatus(
                armed=False, reason=f"idle_stop_minutes is set for {host} but stop_on_pod is "
                                    f"not: nothing could stop the pod; add stop_on_pod = "
                                    f"[\"…\"] under [hosts.{host}]")
        else:
            status = await client.lease(idle_s=float(cfg.idle_stop_minutes) * 60.0,
                                        stop_argv=list(cfg.stop_on_pod),
                                        stop_running=cfg.may_stop_running)
    except GpuwsError as exc:
        return protocol.LeaseStatus(armed=False,
                                    reason=f"the lease could not be installed: {exc.one_line()}")
    return to_laptop_clock(status, time.time())


def describe(status: protocol.LeaseStatus, now: float | None = None) -> str:
    """``auto-stop in 7:42``, who holds the pod, or why there is no lease; one line."""
    if not status.armed and (status.reason or "no lease").startswith("no lease"):
        return ("off: idle_stop_minutes and stop_on_pod in the host's config make the pod "
                "stop itself when nobody uses it")
    if not status.armed:
        return "no auto-stop: " + visible(status.reason or "no lease", 300)
    idle = clock(status.idle_s or 0.0)
    if status.deadline_ts is not None:
        left = max(0.0, status.deadline_ts - (time.time() if now is None else now))
        return f"auto-stop in {clock(left)} (after {idle} with no laptop and no run)"
    held = []
    if status.connections:
        held.append(f"{status.connections} laptop(s) connected")
    if status.runs:
        held.append(f"{status.runs} run(s) going")
    return f"auto-stop {idle} after the last laptop and run ({', '.join(held) or 'held'})"

