"""What an agent may do, set by the person: hosts from the config, a budget, a run cap.

The agent names hosts and runs; the person decides which hosts (``agent = true`` in the
host's config table, ``agent_may_start_stop = true`` for ``start``/``stop``), how many
dollars the whole MCP session may spend (``--budget-usd``) and how long one run may take
(``--max-run-seconds``). Each refusal is a :class:`AgentRefused` with the one line a
person would read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..config import Config, host_config, load_config
from ..errors import GpuwsError
from ..locations import config_path

#: The longest a run may take when the person gave no --max-run-seconds.
DEFAULT_MAX_RUN_SECONDS = 600.0


class AgentRefused(GpuwsError):
    """A tool call the person's bounds do not allow (nothing was sent to a pod)."""

    title = "refused"
    exit_code = 2


@dataclass
class AgentPolicy:
    """The bounds of one ``gpuws mcp`` process and what it has spent so far.

    Attributes:
        budget_usd: the most the session may cost, in US dollars (None: no cap).
        max_run_seconds: the longest one run may take before it is cancelled.
        ssh_config: ``-F FILE`` for every host the agent reaches.
        spent_usd: what the session's connected time has cost so far (each host's rate
            × the seconds a tool held a connection to it).
        device_s: those seconds.
    """

    budget_usd: float | None = None
    max_run_seconds: float = DEFAULT_MAX_RUN_SECONDS
    ssh_config: str | None = None
    spent_usd: float = 0.0
    device_s: float = 0.0
    _config: Config | None = field(default=None, repr=False)

    def config(self) -> Config:
        """The config file, read once per process (an edit needs a restart, as the CLI)."""
        if self._config is None:
            self._config = load_config()
        return self._config

    def allow(self, host: str, *, start_stop: bool = False) -> None:
        """Refuse a host the config does not open to agents.

        Raises:
            AgentRefused: no ``agent = true`` (or ``agent_may_start_stop`` for start/stop).
        """
        cfg = host_config(self.config(), host)
        key = "agent_may_start_stop" if start_stop else "agent"
        allowed = cfg.agent_may_start_stop if start_stop else cfg.agent
        if not allowed:
            raise AgentRefused(
                f"host {host!r} is not open to agents ({key} is not true for it)",
                remedy=f"a person adds `{key} = true` under [hosts.{host}] in {config_path()}")

    def rate(self, host: str) -> float | None:
        """The host's price in USD per hour, from the config."""
        return host_config(self.config(), host).rate_usd_per_hour

    def afford(self, host: str, seconds: float, what: str) -> None:
        """Refuse work that could take the session past its budget.

        ``seconds`` is the most the work may hold the pod (a run: --max-run-seconds).

        Raises:
            AgentRefused: the budget cannot cover it, or the host has no price to bound.
        """
        if self.budget_usd is None:
            return
        rate = self.rate(host)
        if rate is None:
            raise AgentRefused(
                f"{what} on {host!r} cannot be bounded by --budget-usd: the host has no "
                "rate_usd_per_hour", remedy=f"a person sets rate_usd_per_hour under "
                f"[hosts.{host}] in {config_path()}")
        worst = rate * seconds / 3600.0
        left = self.budget_usd - self.spent_usd
        if worst > left + 1e-12:
            raise AgentRefused(
                f"{what} could cost up to ${worst:.4f} ({seconds:g} s at ${rate:g}/h) and "
                f"${max(left, 0.0):.4f} of the session's ${self.budget_usd:g} budget is left",
                remedy="a person restarts `gpuws mcp` with a larger --budget-usd or a "
                       "smaller --max-run-seconds")

    def charge(self, host: str, seconds: float) -> float:
        """Count ``seconds`` of connected time on ``host``; returns what they cost."""
        rate = self.rate(host) or 0.0
        cost = rate * seconds / 3600.0
        self.spent_usd += cost
        self.device_s += seconds
        return cost


class Held:
    """Times one tool's hold on a host and charges it to the policy when it ends."""

    def __init__(self, policy: AgentPolicy, host: str) -> None:
        self.policy = policy
        self.host = host
        self.cost_usd = 0.0
        self._t0 = 0.0

    def __enter__(self) -> Held:
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cost_usd = self.policy.charge(self.host, time.monotonic() - self._t0)
