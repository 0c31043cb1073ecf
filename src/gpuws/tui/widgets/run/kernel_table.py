"""Tier 2's ranked kernel table: which kernels take the GPU's time."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from .... import protocol
from ....live import verdicts
from ....text.textsafe import visible
from ... import fmt


class KernelTablePane(DataTable[str | Text]):
    """Kernels by total GPU time, with calls, mean and share (Tier 3's filter comes from it)."""

    DEFAULT_CSS = """
    KernelTablePane { height: auto; max-height: 14; }
    """

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        self.add_column("kernel", key="kernel")
        for col in ("calls", "total", "mean", "share"):
            self.add_column(col, key=col)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        #: The full demangled name behind each row's short one (``full_name``).
        self._full: dict[str, str] = {}

    def show(self, table: protocol.KernelTable | None) -> None:
        """Replace the rows with this table's: short names, the top rows, one "others"."""
        self.clear()
        self._full = {}
        if table is None:
            return
        shown = verdicts.top_rows(table.kernels)
        # The code that launched each kernel, where the profile had Python stacks: a
        # column only then, so a table without it keeps its shape.
        code = any(k.code for k in shown.rows)
        if code and "from" not in self.columns:
            self.add_column("from", key="from")
        extra = "from" in self.columns
        for i, k in enumerate(shown.rows):
            self._full[str(i)] = k.name
            self.add_row(Text(visible(verdicts.short(k.name)), overflow="ellipsis",
                              no_wrap=True),
                         Text(fmt.num(k.calls), justify="right"),
                         Text(fmt.ms(k.total_ns / 1e6), justify="right"),
                         Text(fmt.ms(k.mean_ns / 1e6), justify="right"),
                         Text(fmt.pct(k.share_pct), justify="right"),
                         *((Text(visible(k.code or "", 200), "dim", no_wrap=True),)
                           if extra else ()), key=str(i))
        if shown.others:
            self.add_row(Text(f"{shown.others} others", "dim"),
                         Text(fmt.num(shown.others_calls), justify="right"),
                         Text(fmt.ms(shown.others_total_ns / 1e6), justify="right"), Text(""),
                         Text(fmt.pct(shown.others_share_pct), justify="right"),
                         *((Text(""),) if extra else ()), key="others")

    def full_name(self, key: str | None) -> str | None:
        """The full demangled name of the row with ``key`` (None for "others" or none)."""
        return self._full.get(key or "")


def kernel_table_caption(table: protocol.KernelTable | None, empty: str | None = None) -> str:
    """Where the table came from and what else Tier 2 saw (idle gaps, memcpy); without a
    table, ``empty`` (why there will be none) or "… yet"."""
    if table is None:
        return visible(empty) if empty else "Tier 2 has not reported kernels yet"
    parts = [f"source: {visible(table.source, 200)}"]
    if table.gpu_idle_pct is not None:
        parts.append(f"GPU idle {fmt.pct(table.gpu_idle_pct)}")
    if table.memcpy_pct is not None:
        parts.append(f"memcpy {fmt.pct(table.memcpy_pct)}")
    window = verdicts.window_caption(table.window, table.comm)
    if window:
        parts.append(visible(window, 300))
    for r in table.ranks or []:
        parts.append(f"{verdicts.rank_name(r)}: GPU idle {fmt.pct(r.gpu_idle_pct)}" + (
            f", communication {fmt.pct(r.comm.comm_pct, 0)} ({fmt.pct(r.comm.exposed_pct, 0)}"
            " exposed)" if r.comm is not None else ""))
    noun = "kernel" if len(table.kernels) == 1 else "kernels"
    ranks = f" ({len(table.ranks)} ranks merged)" if table.ranks else ""
    return f"{len(table.kernels)} {noun}{ranks} · " + " · ".join(parts)
