"""The run's output pane: a log whose long lines wrap to its width, again on a resize.

It had no horizontal scroll and cut lines at its edge (at 160x45, beside the tabs, a
path was cut at ~55 characters). Continuation rows start with :data:`WRAP_MARK`, so a
wrapped line still reads as one.
"""

from __future__ import annotations

from collections import deque

from rich.cells import cell_len, chop_cells
from textual import events
from textual.widgets import Log

#: Continuation rows of a wrapped output line start with this.
WRAP_MARK = "      ↳ "


def wrapped(line: str, width: int) -> list[str]:
    """``line`` as rows of at most ``width`` cells, the rest marked as its continuation
    (a width too narrow to read anyway, or not laid out yet, leaves it whole)."""
    if width < 3 * len(WRAP_MARK) or cell_len(line) <= width:
        return [line]
    first, *rest = chop_cells(line, width)
    return [first, *(WRAP_MARK + part
                     for part in chop_cells("".join(rest), width - len(WRAP_MARK)))]


class OutputLog(Log):
    """A :class:`Log` of whole lines, drawn wrapped to its width."""

    def __init__(self, *, max_lines: int, id: str | None = None) -> None:
        super().__init__(max_lines=max_lines, id=id)
        #: The lines as written (the newest ``max_lines``), to wrap again on a resize.
        self.whole: deque[str] = deque(maxlen=max_lines)
        self._wrapped_at = 0

    def add_lines(self, lines: list[str]) -> None:
        """Append whole lines (each one line: no newline inside)."""
        self.whole.extend(lines)
        width = self.scrollable_content_region.width
        at_end = self.is_vertical_scroll_end
        self.write_lines(row for line in lines for row in wrapped(line, width))
        if at_end and self.auto_scroll:
            # Again once laid out: the log's own scroll came one row short of a line's
            # last continuation row.
            self.call_after_refresh(self.scroll_end, animate=False)

    def on_resize(self, _: events.Resize) -> None:
        # After the refresh: the region (and so the width to wrap at) is the new one then.
        self.call_after_refresh(self._rewrap)

    def _rewrap(self) -> None:
        width = self.scrollable_content_region.width
        if width == self._wrapped_at or not self.whole:
            self._wrapped_at = width
            return
        self._wrapped_at = width
        at_end = self.is_vertical_scroll_end
        self.clear()
        self.write_lines((row for line in self.whole for row in wrapped(line, width)),
                         scroll_end=False)
        if at_end:  # the newest lines stay in view, as they were
            self.call_after_refresh(self.scroll_end, animate=False)
