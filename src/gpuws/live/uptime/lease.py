"""The pod's lease from the laptop (issue 22): arm it from the host's config, say how it
stands.

The lease itself runs on the pod (``remote_agent/lease.py``); every face arms it the same
way when it connects to a host with ``idle_stop_minutes``, and reads it back for
``doctor`` and the dashboard. A host without the setting only has its lease read: another
laptop may have armed one.

A host that is the laptop itself (``local``, or an alias whose probe carries the laptop's
machine id or boot id) arms it only from its own ``[hosts.NAME]`` table
(:func:`gpuws.config.host_config`): a ``[defaults]`` ``shutdown -h now`` meant for pods
must never power off the person's workstation.
"""

from __future__ import annotations

import time

import msgspec

from ... import protocol
from ...client import AgentClient
from ...config import host_config, load_config, withheld_defaults
from ...errors import GpuwsError
from ...remote_agent.pod.probe import machine_ids
from ...text.textsafe import visible
from .observed import to_laptop_clock
from .power import clock


def is_this_machine(probe: protocol.Probe | None) -> bool:
    """Whether the probed host is the laptop itself: the same machine id, or the same boot
    id (one running kernel: also a container on the laptop, which a ``[defaults]`` stop
    must not reach either). An older agent's probe, without either, is not."""
    if probe is None:
        return False
    mine = machine_ids()
    return any(theirs is not None and theirs == mine[key]
               for key, theirs in (("machine_id", probe.machine_id),
                                   ("boot_id", probe.boot_id)))


async def arm(client: AgentClient, host: str, *,
              this_machine: bool = False) -> protocol.LeaseStatus:
    """Arm (or renew) the pod's lease as the host's config says, or read it; never raises:
    a lease that cannot be armed comes back unarmed with its reason. Its times come back
    on the laptop's clock (:func:`observed.to_laptop_clock`).

    Args:
        client: the connected agent.
        host: the host as given to the command.
        this_machine: the host is the laptop (:func:`is_this_machine`): only its own table
            arms a lease.

    Returns:
        The lease as the pod says it stands.
    """
    config = load_config()
    cfg = host_config(config, host, this_machine=this_machine)
    try:
        if cfg.idle_stop_minutes is None:
            status = await client.lease()
            if not status.armed and "idle_stop_minutes" in withheld_defaults(
                    config, host, this_machine=this_machine):
                # Why there is none, short: the note (said once by the face) has the rest.
                status = msgspec.structs.replace(
                    status, reason=f"off on this machine: only [hosts.{host}] arms a "
                                   "lease here, not [defaults]")
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

