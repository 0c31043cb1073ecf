"""How ``gpuws history`` and ``gpuws sessions`` lay their listings out for people.

Apart from the commands (history.py) so that ``--json`` and ``--help`` never import Rich.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from rich.cells import cell_len, set_cell_size
from rich.table import Table
from rich.text import Span, Text

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

#: A cell's lines, each shown text (made visible) and its style ("" for none).
_Cell = list[tuple[str, str]]


def history_block(rows: list[RunSummary], width: int,
                  by_agent: Container[str] = frozenset()) -> Text:
    """One session's runs as a table: a title line, a header, a rule, then the runs."""
    return SessionTable(width, by_agent).add(rows)


class SessionTable:
    """One session's runs as a table, laid out a chunk of runs at a time.

    Each row is at most three lines at any width: the run id whole, the workload, its
    reason and its code on one line each, cut with an ellipsis (before, a row folded to
    13-17 lines at 80 columns). Laid out on plain strings, with widths known from the
    rows, rather than by a Rich ``Table`` per session (measuring every cell made
    ``history`` of 2,000 runs take 5 s, of 20,000 runs 50 s) or a Rich ``Text`` per cell
    (most of the 9.7 s of 20,000 runs).

    The first :meth:`add` gives the title, the header and the rule; each later one only
    its rows, so a session of thousands of runs is printed as it is read. Widths come
    from the rows seen so far and only grow: a later, wider cell widens its column from
    there on (a session within one chunk is laid out exactly as a whole).

    Args:
        width: the terminal's columns.
        by_agent: the ids of runs a coding agent made through ``gpuws mcp``.
    """

    def __init__(self, width: int, by_agent: Container[str] = frozenset()) -> None:
        self.width = width
        self.by_agent = by_agent
        self.narrow = width < NARROW
        self._widths: list[int] | None = None

    def add(self, rows: list[RunSummary]) -> Text:
        """The next rows' lines (the title, header and rule first, on the first call)."""
        # One list of cells per column: (header, right-justified, max width, cells).
        columns: list[tuple[str, bool, int | None, list[_Cell]]] = [
            ("run id", False, None, [[(visible(r.run_id), "")] for r in rows])]
        if not self.narrow:
            columns.append(("started", False, None,
                            [[(humanfmt.when(r.started)[11:], "")] for r in rows]))
        columns += [("status", False, 12,
                     [_status(r, r.run_id in self.by_agent) for r in rows]),
                    ("Tier-1 median", True, None, [[(_median(r), "")] for r in rows])]
        workload = [_workload(r) for r in rows]
        widths = [_natural(header, cells, most) for header, _, most, cells in columns]
        if self._widths is not None:
            widths = [max(a, b) for a, b in zip(widths, self._widths, strict=False)]
        # The one column that gives way: the others keep their width, this one is cut.
        room = self.width - sum(widths) - 3 * (len(widths) + 1) + 1
        natural = _natural("workload", workload, None)
        if self._widths is not None:
            natural = max(natural, self._widths[-1])
        widths.append(max(_MIN_WORKLOAD, min(natural, room)))
        columns.append(("workload", False, None, workload))
        right = [c[1] for c in columns]
        lines: list[tuple[str, list[tuple[int, int, str]]]] = []
        title: Text | None = None
        if self._widths is None:
            title = Text.assemble("session ", (visible(rows[0].session_id), "bold"),
                                  f" · {visible(rows[0].host, 200)} · ",
                                  humanfmt.when(rows[0].started)[:10])
            title.truncate(self.width, overflow="ellipsis")
            lines.append(_line([(c[0], "bold") for c in columns], right, widths, self.width))
            lines.append((_fit("─" * (sum(widths) + 3 * len(widths) - 1), self.width), []))
        self._widths = widths
        for i in range(len(rows)):
            cells = [c[3][i] for c in columns]
            for k in range(max(len(cell) for cell in cells)):
                lines.append(_line([cell[k] if k < len(cell) else ("", "") for cell in cells],
                                   right, widths, self.width))
        return _join(title, lines)


def _join(title: Text | None, lines: list[tuple[str, list[tuple[int, int, str]]]]) -> Text:
    """One ``Text`` of the lines, their styles as spans (Rich's ``Text.join`` of thousands
    of small ``Text`` cost more than laying them out)."""
    plain: list[str] = []
    spans: list[Span] = []
    at = 0
    if title is not None:
        plain.append(title.plain)
        spans.extend(title.spans)
        at = len(title.plain) + 1
    for text, styles in lines:
        plain.append(text)
        spans.extend(Span(at + a, at + b, style) for a, b, style in styles)
        at += len(text) + 1
    return Text("\n".join(plain), spans=spans)


def _natural(header: str, cells: list[_Cell], most: int | None) -> int:
    """A column's width: its widest line (or header), at most ``most``."""
    wide = max([_cells(header), *(_cells(text) for cell in cells for text, _ in cell)])
    return wide if most is None else min(wide, most)


def _cells(text: str) -> int:
    """Rich's ``cell_len``; printable ASCII (most of a listing) is one cell a character,
    counted without a call into Rich (400,000 calls for 20,000 runs)."""
    return len(text) if text.isascii() and text.isprintable() else cell_len(text)


def _fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` cells with an ellipsis, as Rich's ``truncate`` does."""
    if _cells(text) > width:
        return set_cell_size(text, width - 1) + "…"
    return text


def _line(parts: _Cell, right: list[bool], widths: list[int], width: int
          ) -> tuple[str, list[tuple[int, int, str]]]:
    """One line: the parts cut and padded to their columns, three spaces apart, cut to
    the terminal's ``width``; its text and its styles' (start, end, style)."""
    out = [" "]
    at = 1
    styles: list[tuple[int, int, str]] = []
    for j, ((text, style), most) in enumerate(zip(parts, widths, strict=True)):
        text = _fit(text, most)
        pad = " " * (most - _cells(text))
        if j:
            out.append("   ")
            at += 3
        if right[j]:
            out.append(pad)
            at += len(pad)
        if style and text:
            styles.append((at, at + len(text), style))
        out.append(text)
        at += len(text)
        if not right[j]:
            out.append(pad)
            at += len(pad)
    line = "".join(out).rstrip()
    if _cells(line) > width:
        line = set_cell_size(line, width - 1) + "…"
    return line, [(a, min(b, len(line)), style) for a, b, style in styles if a < len(line)]


def _workload(r: RunSummary) -> _Cell:
    # Made visible: "\x1b]0;…" must not retitle the terminal (and a Text, not markup, is
    # printed: "[...]" is shown as it is). Each line is cut, not folded: the lines are
    # ours, a reason's own newlines are shown as \n.
    lines = [(visible(r.workload), "")]
    if r.why:
        # "cancelled during tier 1" beside "cancelled" reads as "during tier 1".
        why = r.why.removeprefix(r.status).strip() or r.why
        lines.append((visible(why), "dim"))
    if r.code is not None:
        # Which code gave the number: tree, commit, dirty files.
        lines.append((visible(r.code.short(), 300), "dim"))
    return lines


def _status(r: RunSummary, by_agent: bool = False) -> _Cell:
    colour = {"ok": "green", "running": "cyan", "cancelled": "yellow"}.get(r.status, "red")
    lines = [(visible(r.status, 40), colour)]
    if r.is_baseline:
        lines.append(("baseline", "magenta"))
    if by_agent:  # made by a coding agent through `gpuws mcp`
        lines.append(("by agent", "cyan"))
    return lines


def _median(r: RunSummary) -> str:
    if r.tier1_median_ms is None:
        return humanfmt.DASH if 1 in r.tiers or not r.tiers else "not run"
    ci = f" ±{r.tier1_ci_pct:.1f}%" if r.tier1_ci_pct is not None else ""
    return f"{humanfmt.ms(r.tier1_median_ms)}{ci}"
