"""Command palette entries for every action the current screen offers.

Entries are read from the screen's active bindings (the same ones the footer shows), so
anything a key does can also be found by name, and nothing is listed that would not
work where the palette was opened. Actions without a key are added by the app.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from textual.command import DiscoveryHit, Hit, Hits, Provider


class ActionsProvider(Provider):
    """The current screen's bound actions, by their descriptions."""

    def _actions(self) -> list[tuple[str, str, Callable[[], Any]]]:
        seen: set[str] = set()
        out: list[tuple[str, str, Callable[[], Any]]] = []
        for key, active in self.screen.active_bindings.items():
            binding = active.binding
            if not binding.description or not active.enabled or binding.action in seen:
                continue
            if binding.action in ("quit", "app.quit", "command_palette"):
                continue  # the system commands already offer these
            seen.add(binding.action)
            keys = self.app.get_key_display(binding) or key
            out.append((binding.description, f"key: {keys}",
                        partial(self.app.run_action, binding.action, active.node)))
        return out

    async def discover(self) -> Hits:
        for name, help_text, callback in self._actions():
            yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text, callback in self._actions():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)
