"""A Static that repaints only when what it shows changed.

Under a flood of events most updates would redraw the same content; skipping those,
and skipping the layout pass when the height cannot have changed, keeps the event loop
free for the events themselves.
"""

from __future__ import annotations

from collections.abc import Hashable

from rich.console import RenderableType
from rich.text import Text
from textual.widgets import Static


class QuietStatic(Static):
    """``show_if_changed`` instead of ``update``.

    A string is shown as the characters it is, never parsed as markup: captions here are
    built from the pod's words (a kernel table's source of ``[link=…]`` crashed every
    view of its run). Callers make pod text visible (``textsafe.visible``) first.
    """

    def __init__(self, content: RenderableType = "", *, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(Text(content) if isinstance(content, str) else content, id=id,
                         classes=classes)
        self._shown_key: Hashable = object()
        self._shown_rows = -1

    def show_if_changed(self, key: Hashable, make: RenderableType, rows: int | None = None) -> bool:
        """Show ``make`` unless ``key`` equals the key shown last.

        Args:
            key: what the content depends on (equal keys mean equal content).
            make: the content.
            rows: its height in lines, when it cannot wrap; the layout pass is skipped
                while that stays the same. ``None``: always lay out (wrapping text).
        """
        if key == self._shown_key:
            return False
        self._shown_key = key
        self.update(Text(make) if isinstance(make, str) else make,
                    layout=rows is None or rows != self._shown_rows)
        self._shown_rows = -1 if rows is None else rows
        return True
