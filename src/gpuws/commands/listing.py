"""How ``gpuws history`` and ``gpuws sessions`` lay their listings out for people.

Apart from the commands (history.py) so that ``--json`` and ``--help`` never import Rich.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from ..sessions.runlist import RunSummary
from ..text import humanfmt
from ..text.textsafe import text as safe
from ..text.textsafe import visible


def sessions_table(rows: list[dict[str, Any]]) -> Table:
    """The sessions as ``gpuws sessions`` prints them (``rows``: its JSON items)."""
    t = Table(title="sessions", title_justify="left",
              caption="`gpuws history SESSION` lists a session's runs and their ids",
              caption_justify="left")
    for col in ("id", "host", "GPU", "started", "duration", "runs", "cost"):
        t.add_column(col, justify="right" if col in ("runs", "cost", "duration") else "left")
    for r in rows:
        # The GPU's name is the pod's word, the host may be a recorded one: shown, never
        # read as markup or sent to the terminal as a control sequence.
        t.add_row(safe(r["id"]), safe(r["host"], limit=200),
                  safe(r["gpu"] or humanfmt.DASH, limit=200),
                  humanfmt.when(r["started"]),
                  humanfmt.duration(r["duration_s"]), str(r["runs"]),
                  humanfmt.usd(r["cost_usd"]))
    return t


#: Below this many columns the table drops "started" (the run id holds the start time).
NARROW = 100
#: The fewest columns the workload keeps, however narrow the terminal.
_MIN_WORKLOAD = 8


def history_block(rows: list[RunSummary], width: int,
                  by_agent: Container[str] = frozenset()) -> Text:
    """One session's runs as a table: a title line, a header, a rule, then the runs.

    Each row is at most three lines at any width: the run id whole, the workload, its
    reason and its code on one line each, cut with an ellipsis (before, a row folded to
    13-17 lines at 80 columns). Laid out here, with widths known from the rows, rather
    than by a Rich ``Table`` per session: measuring every cell made ``history`` of
    2,000 runs take 5 s, of 20,000 runs 50 s.
    """
    first = rows[0]
    narrow = width < NARROW
    # One list of lines per cell, per column: (header, right-justified, max width, cells).
    columns: list[tuple[str, bool, int | None, list[list[Text]]]] = [
        ("run id", False, None, [[safe(r.run_id)] for r in rows])]
    if not narrow:
        columns.append(("started", False, None,
                        [[Text(humanfmt.when(r.started)[11:])] for r in rows]))
    columns += [("status", False, 12, [_status(r, r.run_id in by_agent) for r in rows]),
                ("Tier-1 median", True, None, [[Text(_median(r))] for r in rows])]
    workload = [_workload(r) for r in rows]
    widths = [_natural(header, cells, most) for header, _, most, cells in columns]
    # The one column that gives way: the others keep their width, this one is cut.
    room = width - sum(widths) - 3 * (len(widths) + 1) + 1
    widths.append(max(_MIN_WORKLOAD, min(_natural("workload", workload, None), room)))
    columns.append(("workload", False, None, workload))
    rule = "─" * (sum(widths) + 3 * len(widths) - 1)
    lines = [Text.assemble("session ", (visible(first.session_id), "bold"),
                           f" · {visible(first.host, 200)} · ",
                           humanfmt.when(first.started)[:10]),
             _line([Text(c[0], "bold") for c in columns], columns, widths), Text(rule)]
    for i in range(len(rows)):
        cells = [c[3][i] for c in columns]
        for k in range(max(len(cell) for cell in cells)):
            lines.append(_line([cell[k] if k < len(cell) else Text() for cell in cells],
                               columns, widths))
    for line in lines:
        line.truncate(width, overflow="ellipsis")
    return Text("\n").join(lines)


def _natural(header: str, cells: list[list[Text]], most: int | None) -> int:
    """A column's width: its widest line (or header), at most ``most``."""
    wide = max([cell_len(header), *(line.cell_len for cell in cells for line in cell)])
    return wide if most is None else min(wide, most)


def _line(parts: list[Text], columns: list[tuple[str, bool, int | None, list[list[Text]]]],
          widths: list[int]) -> Text:
    line = Text(" ")
    for j, (part, width) in enumerate(zip(parts, widths, strict=True)):
        part = part.copy()
        part.truncate(width, overflow="ellipsis")
        part.align("right" if columns[j][1] else "left", width)
        if j:
            line.append("   ")
        line.append(part)
    line.rstrip()
    return line


def _workload(r: RunSummary) -> list[Text]:
    # Text, not str: a workload may hold "[...]", which must never be read as markup, and
    # made visible: "\x1b]0;…" must not retitle the terminal. Each line is cut, not
    # folded: the lines are ours, a reason's own newlines are shown as \n.
    lines = [safe(r.workload)]
    if r.why:
        # "cancelled during tier 1" beside "cancelled" reads as "during tier 1".
        why = r.why.removeprefix(r.status).strip() or r.why
        lines.append(Text(visible(why), "dim"))
    if r.code is not None:
        # Which code gave the number: tree, commit, dirty files.
        lines.append(Text(visible(r.code.short(), 300), "dim"))
    return lines


def _status(r: RunSummary, by_agent: bool = False) -> list[Text]:
    colour = {"ok": "green", "running": "cyan", "cancelled": "yellow"}.get(r.status, "red")
    lines = [safe(r.status, colour, 40)]
    if r.is_baseline:
        lines.append(Text("baseline", "magenta"))
    if by_agent:  # made by a coding agent through `gpuws mcp`
        lines.append(Text("by agent", "cyan"))
    return lines


def _median(r: RunSummary) -> str:
    if r.tier1_median_ms is None:
        return humanfmt.DASH if 1 in r.tiers or not r.tiers else "not run"
    ci = f" ±{r.tier1_ci_pct:.1f}%" if r.tier1_ci_pct is not None else ""
    return f"{humanfmt.ms(r.tier1_median_ms)}{ci}"
