"""The exported markdown of a hostile pod's session: safe to paste into a pull request.

Two sessions are recorded through the same real path (``hostile_text.py``: a lying
agent's probe and the real H200 recording through the real engine and store): one whose
pod appends :data:`HOSTILE` to every free-text string (kernel names, rule text, stall
reasons, errors, hostname, GPU names, commands, output…), and its honest twin, whose pod
appends the word ``plain``. Both reports are rendered by GitHub's own renderer
(cmark-gfm, raw HTML let through as a browser would get it) and parsed by markdown-it-py
(with linkify, as GitHub links bare URLs): the hostile report must have exactly the
structure of the honest one (the same headings, table rows, code blocks, links, images,
HTML, emphasis: whatever gpuws draws itself, and nothing the pod drew), while showing
the pod's characters as text. Both must be free of control characters (a report printed
to a terminal).
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
from markdown_it import MarkdownIt

from faults.figures import record  # type: ignore[import-not-found]
from gpuws.sessions.export import export_session
from gpuws.sessions.store import Store
from gpuws.text.textsafe import md_code, md_text
from security.hostile_text import PIECES, hostile_store, unsafe_chars  # type: ignore[import-not-found]

cmarkgfm = pytest.importorskip("cmarkgfm", reason="GitHub's renderer (the dev extra)")

#: What a pod could draw in a report: each counted in the rendered HTML.
HTML_SHAPES = {
    "images": r"<img\b", "links": r"<a\b", "raw html": r"<(?:details|summary|script|iframe)\b",
    "headings": r"<h[1-6]\b", "table rows": r"<tr\b", "tables": r"<table\b",
    "code blocks": r"<pre\b", "rules": r"<hr\b", "emphasis": r"<(?:em|strong|del)\b",
    "list items": r"<li\b", "quotes": r"<blockquote\b",
}


def _report(text: str) -> str:
    session_id, _ = hostile_store(text)
    with Store() as s:
        return export_session(s, session_id)


def _github_html(md: str) -> str:
    from cmarkgfm.cmark import Options

    # UNSAFE: raw HTML passes as it would to GitHub's sanitiser (which keeps <img>,
    # <details>, <a>): the test sees any the pod could slip in.
    return str(cmarkgfm.github_flavored_markdown_to_html(md, options=Options.CMARK_OPT_UNSAFE))


def _without_full_names(md: str) -> str:
    """The report less its "Full kernel names" fold: it lists the names whose short form
    differs, so a pod's long name adds entries there by design (each one code span)."""
    return re.sub(r"<details><summary>Full kernel names</summary>.*?\n</details>\n", "", md,
                  flags=re.S)


def _shapes(md: str) -> Counter[str]:
    md = _without_full_names(md)
    html = _github_html(md)
    shapes = Counter({name: len(re.findall(rx, html)) for name, rx in HTML_SHAPES.items()})
    # markdown-it with linkify: its own view of links, images, HTML and code.
    tokens = MarkdownIt("gfm-like").enable("linkify").parse(md)
    for t in tokens:
        shapes[f"md-it {t.type}"] += 1
        for child in t.children or []:
            if child.type in ("link_open", "image", "html_inline", "code_inline",
                              "strong_open", "em_open", "s_open"):
                shapes[f"md-it {child.type}"] += 1
    return shapes


def test_a_hostile_report_has_the_honest_reports_shape() -> None:
    honest = _report("plain")
    hostile = _report(" ".join(PIECES.values()))
    assert hostile != honest

    want, got = _shapes(honest), _shapes(hostile)
    drawn_by_pod = {k: got[k] - want[k] for k in set(want) | set(got) if got[k] != want[k]}
    assert drawn_by_pod == {}
    # gpuws's own structure is all there (and the honest report has some of each).
    assert want["headings"] >= 8 and want["table rows"] >= 20 and want["code blocks"] >= 2
    assert "<sub>Exported by gpuws" in _github_html(hostile)

    # The pod's characters are shown, as text: nothing was dropped to make it safe.
    shown = _github_html(hostile)
    for piece in ("![](http://evil.example/pixel.png)", "[link=http://evil.example/]",
                  "&lt;img src=http://evil.example/d.png&gt;", "\\e]0;pwned\\x07",
                  "# Forged heading", "| forged | row |"):
        assert piece in shown, piece
    # Printed to a terminal, the report sends no escape; the file is the same text.
    assert unsafe_chars(hostile) == []
    record("test_a_hostile_report_has_the_honest_reports_shape", hostile_pieces=len(PIECES),
           report_bytes=len(hostile.encode()), shapes_compared=len(want),
           images_from_pod=got["images"] - want["images"],
           links_from_pod=got["links"] - want["links"],
           html_from_pod=got["raw html"] - want["raw html"],
           forged_headings=got["headings"] - want["headings"],
           forged_rows=got["table rows"] - want["table rows"],
           unsafe_chars=len(unsafe_chars(hostile)))


@pytest.mark.parametrize("piece", sorted(PIECES))
def test_each_piece_is_inert_in_text_and_code(piece: str) -> None:
    """Each hostile piece alone, as prose, in a table cell and as a code span: one
    paragraph (or one row) of text, no element of its own."""
    value = PIECES[piece]
    doc = "\n".join([f"before {md_text(value)} after", "",
                     "| a | b |", "|---|---|", f"| {md_text(value)} | {md_code(value)} |", ""])
    html = _github_html(doc)
    assert html.count("<p>") == 1 and html.count("<tr>") == 2, html
    assert html.count("<code>") == 1, html  # the code span's, no other
    for rx in ("<img", "<a ", "<details", "<h1", "<hr", "<em>", "<strong>", "<del>", "<pre",
               "<li", "<blockquote"):
        assert not re.search(rx, html), (rx, html)
    assert not unsafe_chars(doc)
