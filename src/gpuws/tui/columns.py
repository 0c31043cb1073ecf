"""Table columns that fit the terminal: the ones that matter least are left out on a narrow
one, never cut mid-value (Home's "durati" and "575.8" for "575.8 ms" at 80 columns, with
the runs and the cost off-screen)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rich.text import Text
from textual.widgets import DataTable

from ..text.textsafe import text as safe_text
from . import fmt
from .hosts import SessionSummary

#: Cells a DataTable adds around each column (one either side).
PADDING = 2


@dataclass(frozen=True)
class Column:
    """A column: its heading, its width, and whether a narrow table may leave it out."""

    label: str
    width: int
    optional: bool = False


def fitting(columns: list[Column], width: int) -> list[Column]:
    """The columns that fit in ``width`` cells: optional ones left out, last first, until
    the rest fit (the others are kept even when they do not: a table scrolls then).

    Args:
        columns: every column, in order.
        width: the cells the table has.
    """
    kept = list(columns)
    for col in reversed(columns):
        if sum(c.width + PADDING for c in kept) <= width:
            break
        if col.optional:
            kept.remove(col)
    return kept


def fill(table: DataTable[Text | str], columns: list[Column],
         rows: Iterable[tuple[str, Mapping[str, Text | str]]]) -> None:
    """Redraw ``table`` with these columns and rows (each row a key and its cells by
    label), keeping the cursor on the same row."""
    cursor = table.cursor_row
    table.clear(columns=True)
    for col in columns:
        table.add_column(col.label, width=col.width, key=col.label)
    for key, cells in rows:
        table.add_row(*(cells[c.label] for c in columns), key=key)
    if table.row_count:
        table.move_cursor(row=min(cursor, table.row_count - 1))


#: A sessions table (Home's recent ones, and the Sessions screen's).
SESSION_COLUMNS = [Column("session", 12), Column("host", 14),
                   Column("GPU", 16, optional=True), Column("started", 16),
                   Column("duration", 11), Column("runs", 4), Column("cost", 8)]


def session_cells(s: SessionSummary) -> dict[str, Text | str]:
    """A session's cells by column (Text of visible(): a GPU's name is the pod's word and
    a host may be a recording's, never markup, never an escape)."""
    return {"session": safe_text(s.row.id), "host": safe_text(s.row.host, limit=200),
            "GPU": safe_text(s.gpu or "—", limit=200), "started": fmt.when(s.row.started),
            "duration": fmt.duration(s.duration_s), "runs": str(s.row.run_count),
            "cost": fmt.usd(s.cost_usd)}
