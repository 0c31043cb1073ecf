"""The canonical ncu metrics, grouped by the report section they come from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rich.text import Text
from textual.widgets import DataTable

from .... import protocol
from ....live import verdicts
from ....text.textsafe import visible
from ... import fmt

#: Report sections and the canonical metrics (key, label) each holds, in display order.
SECTIONS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("Speed of light", (("duration_ns", "duration"), ("sm_throughput_pct", "SM throughput"),
                        ("memory_throughput_pct", "memory throughput"),
                        ("dram_throughput_pct", "DRAM throughput"))),
    ("Occupancy", (("achieved_occupancy_pct", "achieved occupancy"),
                   ("theoretical_occupancy_pct", "theoretical occupancy"))),
    ("Launch statistics", (("registers_per_thread", "registers / thread"),
                           ("shared_mem_per_block", "shared memory / block"))),
    ("Memory workload", (("l1_hit_pct", "L1 hit rate"), ("l2_hit_pct", "L2 hit rate"),
                         ("dram_bytes", "DRAM bytes"))),
    ("Compute workload", (("tensor_pipe_active_pct", "tensor pipe active"),
                          ("flops", "FLOPs"), ("arithmetic_intensity", "arithmetic intensity"))),
)


class ProfiledLaunch(Protocol):
    """A profiled kernel launch (a ``KernelMetrics`` event or a stored row)."""

    @property
    def kernel(self) -> str: ...
    @property
    def launch(self) -> int: ...
    @property
    def metrics(self) -> dict[str, float | None]: ...
    @property
    def stalls(self) -> list[protocol.Stall]: ...


class MetricsTable(DataTable[str | Text]):
    """Rows: metrics under section headings, then warp stalls; a column per profiled launch."""

    DEFAULT_CSS = """
    MetricsTable { height: 1fr; }
    """

    def on_mount(self) -> None:
        self.cursor_type = "row"

    def show(self, launches: Sequence[ProfiledLaunch], empty: str | None = None) -> None:
        """Rebuild for these launches (``—`` marks what was not measured).

        Args:
            launches: the profiled launches, one column each.
            empty: why there are none, once there will be none (default: "… yet").
        """
        self.clear(columns=True)
        if not launches:
            self.add_column("metric")
            self.add_row(Text(visible(empty), "yellow") if empty
                         else Text("no Tier-3 metrics yet", "dim"))
            return
        self.add_column("metric", key="metric")
        for i, launch in enumerate(launches):
            short = verdicts.short(launch.kernel)
            name = short if len(short) <= 28 else short[:27] + "…"
            self.add_column(Text(f"{visible(name)} #{launch.launch}"), key=f"k{i}")
        for section, rows in SECTIONS:
            self.add_row(Text(section, "bold magenta"), *["" for _ in launches])
            for key, label in rows:
                cells = [Text(fmt.metric(key, m.metrics.get(key)), justify="right")
                         for m in launches]
                self.add_row(Text("  " + label), *cells)
        reasons: list[str] = []
        for launch in launches:
            reasons += [s.reason for s in launch.stalls if s.reason not in reasons]
        if reasons:
            self.add_row(Text("Warp stalls (% of cycles)", "bold magenta"), *["" for _ in launches])
            for reason in reasons:
                cells = []
                for launch in launches:
                    pct = next((s.pct for s in launch.stalls if s.reason == reason), None)
                    cells.append(Text(fmt.pct(pct), justify="right"))
                self.add_row(Text("  " + visible(reason.replace("_", " "), 80)), *cells)
