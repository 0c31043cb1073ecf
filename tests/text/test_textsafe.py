"""``textsafe``: any string a pod sends becomes visible text, and inert markdown.

Properties over arbitrary strings (biased towards what markup and terminals react to),
checked with GitHub's own renderer (cmark-gfm): ``md_text`` renders as exactly one
paragraph whose text is ``visible(s)``, with no element of its own; ``md_code`` as exactly
one code span; neither holds a control character.
"""

from __future__ import annotations

import html
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuws.text.textsafe import md_code, md_code_block, md_text, visible, visible_lines

cmarkgfm = pytest.importorskip("cmarkgfm", reason="GitHub's renderer (the dev extra)")

#: Pieces markdown, Rich and terminals react to, mixed with anything at all.
_PIECES = ["[", "]", "(", ")", "!", "<", ">", "&", "*", "_", "`", "~", "#", "|", "\\", "-",
           "+", "=", ".", ":", "/", "@", "$", "^", "{", "}", " ", "  ", "\t", "\n", "\r",
           "http", "www", "://", "www.", "a", "1", "1.", "x@y.z", "<img src=x>", "<details>",
           "&#60;", "&lt;", "![", "](", "---", "```", "\x1b", "\x1b]0;t\x07", "\x9b", "\x9d",
           "\x00", "\x7f", "\u202e", "\u2066", "\u2028", "\ufeff", "é", "日本"]
hostile = st.one_of(st.lists(st.sampled_from(_PIECES), max_size=30).map("".join), st.text())

_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                     "\u2066-\u2069\ufeff]")


def _gfm(md: str) -> str:
    from cmarkgfm.cmark import Options

    return str(cmarkgfm.github_flavored_markdown_to_html(md, options=Options.CMARK_OPT_UNSAFE))


def test_visible_shows_what_terminals_obey() -> None:
    assert visible("a\x1b]0;t\x07b\x9b2J\u202ec\nd\x7f") == "a\\e]0;t\\x07b\\x9b2J\\u202ec\\nd\\x7f"
    assert visible("[/] ok\ttab") == "[/] ok\ttab"
    assert visible_lines("one\x1b[2J\ntwo\t\u202e") == "one\\e[2J\ntwo\t\\u202e"
    assert visible("x" * 10, limit=4) == "xxxx… (6 more characters)"


@settings(max_examples=400, deadline=None)
@given(hostile)
def test_md_text_renders_as_the_characters_and_nothing_else(s: str) -> None:
    md = md_text(s, limit=None)
    assert not _UNSAFE.search(md)
    shown = visible(s, limit=None)
    out = _gfm(md)
    if not shown.strip():
        return
    # One paragraph, no element inside it...
    assert out.startswith("<p>") and out.endswith("</p>\n") and out.count("<") == 2, (md, out)
    # ...whose text is the pod's characters (made visible), but for the word joiners
    # after @ and # and the whitespace a paragraph trims.
    text = html.unescape(out[3:-5]).replace("\u2060", "")
    assert text.strip() == shown.strip(), (md, out)


@settings(max_examples=300, deadline=None)
@given(hostile)
def test_md_text_and_md_code_stay_in_their_table_cell(s: str) -> None:
    row = f"| {md_text(s, limit=None)} | {md_code(s, limit=None)} |"
    out = _gfm("| a | b |\n|---|---|\n" + row + "\n")
    assert out.count("<tr>") == 2 and out.count("<td>") + out.count("<td ") == 2, (row, out)
    assert out.count("<code>") == 1, (row, out)
    assert not re.search(r"<(?:a|img|em|strong|del|details|h\d|hr|pre|li)\b", out), (row, out)


@settings(max_examples=200, deadline=None)
@given(hostile)
def test_md_code_block_cannot_be_closed_by_its_text(s: str) -> None:
    out = _gfm("\n".join(["before", "", *md_code_block(s, "sh"), "", "after"]))
    assert out.count("<pre") == 1 and out.rstrip().endswith("<p>after</p>"), out
