"""What the pod has cost so far: rate, total, idle time, budget."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ....live.uptime.lease import describe
from ....protocol import LeaseStatus
from ....sessions.cost import Economics
from ... import fmt


class CostTicker(Static):
    """``$3.99/h · $0.42 so far · idle 6 min 05 s (55%) · budget $20.00 (2% used)``, with
    warnings."""

    DEFAULT_CSS = """
    /* Three lines from the start: "no session yet" becomes the rate, the times and the
       idle share without moving what is below. */
    CostTicker { height: auto; min-height: 3; padding: 0 1; }
    """

    def show(self, econ: Economics | None, lease: LeaseStatus | None = None) -> None:
        """Redraw from the session's economics (``None`` before a session exists) and the
        pod's lease, shown where the host has one or was meant to (issue 22)."""
        if econ is None:
            self.update(Text("no session yet", "dim"))
            return
        text = Text()
        if econ.rate_usd_per_hour is None:
            text.append("rate unknown", "yellow")
            text.append(" (pass --rate or set rate_usd_per_hour in the config)", "dim")
        else:
            text.append(f"{fmt.usd(econ.rate_usd_per_hour)}/h", "bold")
            text.append(" · ")
            text.append(f"{fmt.usd(econ.total_cost_usd)} so far", "bold green")
        text.append(f"\nconnected {fmt.duration(econ.connected_s)} · busy "
                    f"{fmt.duration(econ.busy_s)} · GPU {fmt.duration(econ.gpu_s)}")
        idle_style = "bold yellow" if econ.idle_warning else ""
        text.append("\nidle ")
        text.append(f"{fmt.duration(econ.idle_s)} ({fmt.pct(econ.idle_pct, 0)})", idle_style)
        if econ.idle_cost_usd is not None:
            text.append(f" = {fmt.usd(econ.idle_cost_usd)}", idle_style)
        if econ.budget_usd is not None:
            used = (100 * econ.total_cost_usd / econ.budget_usd
                    if econ.total_cost_usd is not None and econ.budget_usd else 0.0)
            style = "bold red" if econ.over_budget else "yellow" if econ.budget_warning else ""
            text.append(" · budget ")
            text.append(f"{fmt.usd(econ.budget_usd)} ({fmt.pct(used, 0)} used)", style)
        if lease is not None and (lease.armed or (lease.reason or "").startswith(
                ("idle_stop_minutes is set", "the lease could not"))):
            text.append("\n")
            text.append(describe(lease), "green" if lease.armed else "bold yellow")
        self.update(text)
