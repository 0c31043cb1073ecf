"""Text from the pod (or a person) is shown, never interpreted.

Workload names, output lines, artifact names, paths and error messages all come from
places gpuws does not control: a benchmark script prints what it likes, and anything a
workload writes into its run directory reaches the laptop. Shown raw, such text can
move the cursor, retitle the window or clear the screen (ANSI/OSC escape sequences),
forge lines (a newline in a file name), reorder what the reader sees (bidirectional
overrides), or crash a Rich/Textual renderer that takes ``[/]`` for markup.

Every such string goes through :func:`visible` once before it is shown; the Rich and
Textual faces wrap the result in :class:`rich.text.Text` (:func:`text`) or escape it
(:func:`markup_escape`), so no brackets are ever parsed as markup.
"""

from __future__ import annotations

import re

from rich.markup import escape as _rich_escape
from rich.text import Text

#: C0 controls but tab, DEL, C1 controls, and the Unicode format characters that reorder or
#: hide text (bidi embeddings/overrides/isolates, line/paragraph separators, BOM, ZW joiners
#: are left alone: they are harmless in names).
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]")

_NAMED = {"\n": "\\n", "\r": "\\r", "\x1b": "\\e", "\x00": "\\0"}

#: Longest string shown in one place by default; the rest is counted, not printed.
DEFAULT_LIMIT = 4000


def _escape_char(match: re.Match[str]) -> str:
    ch = match.group(0)
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(value: object, limit: int | None = DEFAULT_LIMIT) -> str:
    """``value`` as a string a terminal shows literally.

    Control characters become visible escapes (``\\e[2J``, ``\\n``, ``\\x07``,
    ``\\u202e``); a string longer than ``limit`` is cut with a note of how much was left
    out. Markup brackets are kept as they are: they are only safe once the caller
    wraps the result in :func:`text` or :func:`markup_escape`.
    """
    s = value if isinstance(value, str) else str(value)
    if limit is not None and len(s) > limit:
        s = s[:limit] + f"… ({len(s) - limit} more characters)"
    return _UNSAFE.sub(_escape_char, s) if _UNSAFE.search(s) else s


def text(value: object, style: str = "", limit: int | None = DEFAULT_LIMIT) -> Text:
    """A Rich ``Text`` of ``visible(value)``: styled, never parsed for markup."""
    return Text(visible(value, limit), style=style)


def markup_escape(value: object, limit: int | None = DEFAULT_LIMIT) -> str:
    """``visible(value)`` escaped for a place that insists on markup strings."""
    return _rich_escape(visible(value, limit))
