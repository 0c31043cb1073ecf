"""The Rich console every command prints people's text through (``common.console``)."""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment

from ..text.textsafe import visible_lines


class TerminalSafeConsole(Console):
    """A Rich console whose text never carries a control character to the terminal.

    Each field from the pod is already made visible where it is printed (that is also
    what keeps its newlines from drawing rows); this is the net under all of them: every
    text segment passes :func:`~gpuws.text.textsafe.visible_lines` on its way out. Rich's
    own escape sequences (colours, cursor moves) are made from styles and control
    segments after this, so they are untouched.
    """

    def render(self, renderable: RenderableType,
               options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for seg in super().render(renderable, options):
            if seg.control is None and seg.text:
                safe = visible_lines(seg.text)
                if safe is not seg.text:
                    seg = Segment(safe, seg.style)
            yield seg
