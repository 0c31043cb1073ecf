"""A radio button and a checkbox whose state shows in their shape, not only in a colour.

Textual draws both with the same mark on and off (``●``, ``X``), told apart by colour
alone: on a monochrome terminal, to a colour-blind person, or in a screenshot read as
text, "bundled kernel" and "command" looked equally chosen.
"""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Checkbox, RadioButton


class MarkedRadioButton(RadioButton):
    """``●`` when chosen, ``○`` when not."""

    def render(self) -> Content:
        self.BUTTON_INNER = "●" if self.value else "○"
        return super().render()


class MarkedCheckbox(Checkbox):
    """``✓`` when ticked, blank when not."""

    def render(self) -> Content:
        self.BUTTON_INNER = "✓" if self.value else " "
        return super().render()
