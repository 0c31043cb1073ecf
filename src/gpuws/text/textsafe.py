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

The exported markdown is a surface too: a report is pasted into a pull request, where
``![](http://…)`` from a kernel name would load a tracking pixel, a ``|`` or a newline
would forge a table row, and ``<details>`` would hide the report. :func:`md_text`,
:func:`md_code` and :func:`md_code_block` make pod text inert there (and visible, so the
same report is safe printed to a terminal); :func:`visible_lines` is the last pass over
a whole report.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text

#: C0 controls but tab, DEL, C1 controls (0x9b is a one-byte CSI to many terminals), and
#: the Unicode format characters that reorder or hide text (bidi marks, embeddings,
#: overrides and isolates, line/paragraph separators, BOM; ZW joiners are left alone:
#: they are harmless in names).
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                     "\u2066-\u2069\ufeff]")
#: The same, but a newline (and tab) kept: for a whole report gpuws laid out in lines.
_UNSAFE_IN_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029"
                              "\u202a-\u202e\u2066-\u2069\ufeff]")

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
    # Rich is imported where it is used: the core checks text with visible() on paths
    # (`gpuws sync --json`, the agent link) that never print through Rich.
    from rich.text import Text

    return Text(visible(value, limit), style=style)


def markup_escape(value: object, limit: int | None = DEFAULT_LIMIT) -> str:
    """``visible(value)`` escaped for a place that insists on markup strings."""
    from rich.markup import escape

    return escape(visible(value, limit))


def visible_lines(text: str) -> str:
    """A multi-line text gpuws laid out (a report) with every control character but the
    newline and tab made visible: the last pass before it reaches a file or a terminal,
    so a section that forgot to escape a pod string still cannot send an escape."""
    return _UNSAFE_IN_LINES.sub(_escape_char, text) if _UNSAFE_IN_LINES.search(text) else text


#: What JSON may carry raw but a terminal obeys or reorders: DEL, C1 (0x9b is a CSI), bidi.
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
                          "\ufeff]")


def json_visible(encoded: str) -> str:
    """JSON text (msgspec's, which writes these raw) with DEL, C1 and bidi characters as
    ``\\uXXXX`` escapes: the same JSON value, safe to print on a terminal. They can only
    stand inside strings (JSON's own syntax is ASCII), where the escape means the same."""
    if not _JSON_UNSAFE.search(encoded):
        return encoded
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", encoded)


# ----------------------------------------------------------------------------- markdown
#: What makes pod text markup in GitHub-flavoured markdown, each escaped where it can act
#: (CommonMark lets any ASCII punctuation be backslash-escaped, and an escaped character
#: is text): links and images (``[``, ``]``, ``!``), raw HTML and ``<…>`` autolinks
#: (``<``, ``>``, ``&``), code spans, emphasis, strikethrough and math (`` ` ``, ``*``,
#: ``~``, ``$``), table cells (``|``), the escape itself (``\\``); ``_`` only at a word's
#: edge (inside a word it is no emphasis, and names are full of it); bare URL autolinks
#: by their ``://`` and ``www.``; ``@`` and ``#`` get an invisible U+2060 WORD JOINER as
#: well, since GitHub links e-mail addresses, ``@mentions`` and ``#123`` references after
#: parsing, where no escape reaches. Everything else is harmless inside a line, and a
#: newline is already the two characters ``\\n``.
_MD_INLINE = re.compile(r"[\\`*\[\]!<>&~$|]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|://|(?i:www)\.|[@#]")
#: What makes the start of a line a block: a heading, a list item, a rule, a setext
#: underline, a quote (``#`` and ``>`` are escaped anywhere).
_MD_LINE_START = re.compile(r"^(\s*)([-+=])(?=\s|$|[-=])|^(\s*\d{1,9})([.)])(?=\s|$)")
_WORD_JOINER = "\u2060"


def _md_escape(match: re.Match[str]) -> str:
    s = match.group(0)
    if s == "://":
        return "\\://"
    if s[-1] == ".":  # www.
        return s[:-1] + "\\."
    if s in "@#":
        return "\\" + s + _WORD_JOINER
    return "\\" + s


def _md_escape_start(match: re.Match[str]) -> str:
    lead, mark = (match.group(1), match.group(2)) if match.group(2) else match.group(3, 4)
    return f"{lead}\\{mark}"


def md_text(value: object, limit: int | None = DEFAULT_LIMIT) -> str:
    """``visible(value)`` as inert markdown text: safe in a paragraph, a list item, a
    heading or a table cell, wherever on its line it lands.

    Rendered, it reads as the pod's characters (with an invisible joiner after ``@`` and
    ``#``): no image, link, autolink, raw HTML, emphasis, heading, list, rule or table
    cell can come of it, and no newline to forge a row with.
    """
    # Leading blanks would make an indented code block at a line's start; a paragraph or
    # a cell drops them anyway.
    s = _MD_INLINE.sub(_md_escape, visible(value, limit)).lstrip(" \t")
    # A backslash before a digit is no escape: "1." is broken by escaping its dot.
    return _MD_LINE_START.sub(_md_escape_start, s, count=1)


def md_code(value: object, cell: bool = True, limit: int | None = DEFAULT_LIMIT) -> str:
    """``visible(value)`` as an inline code span (nothing in a code span is a link, an
    image or HTML); backticks inside are fenced around.

    In a table cell a pipe must be escaped even inside code; elsewhere the backslash would
    show, so ``cell=False`` leaves pipes alone.
    """
    s = visible(value, limit)
    if cell:
        s = s.replace("|", "\\|")
    longest = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or not s.strip() else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def md_code_block(value: object, lang: str = "") -> list[str]:
    """``value`` as a fenced code block (its lines): each line made visible, the fence
    longer than any run of backticks inside, so the text cannot close it early."""
    lines = [visible(line, None) for line in str(value).split("\n")]
    longest = max((len(m) for line in lines for m in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + lang, *lines, fence]
