"""A small SVG writer whose every piece of text is inert.

The export's pictures show names that came from the pod (kernels, streams, phases), so
the writer has one door for text, :func:`text_of`: control and bidi characters become
visible escapes (as in the terminal, :func:`gpuws.text.textsafe.visible`), characters
XML 1.0 forbids (lone surrogates, U+FFFE/U+FFFF) likewise, and ``& < > " '`` become
entities. Attribute values are made the same way. The writer emits only a fixed set of
elements (``svg g rect line polyline text title``), never ``script``, ``foreignObject``,
``image``, ``a``, ``style`` or an ``href``: a picture opened in a browser runs nothing
and fetches nothing.

Numbers are written with fixed decimals so the same input gives the same bytes.
"""

from __future__ import annotations

import re

from ..text.textsafe import visible

#: Characters of one label drawn (the rest is counted by ``visible``'s note).
LABEL_LIMIT = 120
_XML_FORBIDDEN = re.compile("[\ud800-\udfff\ufffe\uffff]")
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}
_SPECIAL = re.compile("[&<>\"']")


def text_of(value: object, limit: int = LABEL_LIMIT) -> str:
    """``value`` as XML character data (or an attribute value) that shows, never acts."""
    s = value if isinstance(value, str) else str(value)
    # Cut before the escapes (a cut escape would show half of itself), with a bare
    # ellipsis: a picture's label has no room for a count.
    s = visible(s[:limit] + "…" if len(s) > limit else s, None)
    s = _XML_FORBIDDEN.sub(lambda m: f"\\u{ord(m.group(0)):04x}", s)
    return _SPECIAL.sub(lambda m: _ENTITIES[m.group(0)], s)


def num(x: float) -> str:
    """A coordinate: two decimals, no ``-0.00``."""
    s = f"{x:.2f}"
    return "0.00" if s == "-0.00" else s


class Svg:
    """Elements appended in order; :meth:`document` gives the whole file."""

    def __init__(self, width: float, height: float, title: str) -> None:
        self.width = width
        self.height = height
        self._title = title
        self._parts: list[str] = []

    def rect(self, x: float, y: float, w: float, h: float, fill: str, *,
             opacity: float | None = None, stroke: str | None = None,
             tip: str | None = None) -> None:
        """A rectangle; ``fill``/``stroke`` are our own colours (``#RRGGBB`` or ``none``),
        ``tip`` a hover title (pod text allowed: it goes through :func:`text_of`)."""
        attrs = (f'x="{num(x)}" y="{num(y)}" width="{num(max(w, 0.0))}" '
                 f'height="{num(max(h, 0.0))}" fill="{_colour(fill)}"')
        if opacity is not None:
            attrs += f' fill-opacity="{opacity:.2f}"'
        if stroke is not None:
            attrs += f' stroke="{_colour(stroke)}"'
        if tip is None:
            self._parts.append(f"<rect {attrs}/>")
        else:
            self._parts.append(f"<rect {attrs}><title>{text_of(tip)}</title></rect>")

    def line(self, x1: float, y1: float, x2: float, y2: float, stroke: str, *,
             width: float = 1.0, dash: str | None = None) -> None:
        attrs = (f'x1="{num(x1)}" y1="{num(y1)}" x2="{num(x2)}" y2="{num(y2)}" '
                 f'stroke="{_colour(stroke)}" stroke-width="{num(width)}"')
        if dash is not None:
            attrs += f' stroke-dasharray="{_dash(dash)}"'
        self._parts.append(f"<line {attrs}/>")

    def polyline(self, points: list[tuple[float, float]], stroke: str, *,
                 width: float = 1.0) -> None:
        pts = " ".join(f"{num(x)},{num(y)}" for x, y in points)
        self._parts.append(f'<polyline points="{pts}" fill="none" stroke="{_colour(stroke)}" '
                           f'stroke-width="{num(width)}"/>')

    def circle(self, x: float, y: float, r: float, fill: str, tip: str | None = None) -> None:
        attrs = f'cx="{num(x)}" cy="{num(y)}" r="{num(r)}" fill="{_colour(fill)}"'
        if tip is None:
            self._parts.append(f"<circle {attrs}/>")
        else:
            self._parts.append(f"<circle {attrs}><title>{text_of(tip)}</title></circle>")

    def text(self, x: float, y: float, value: object, *, size: float = 11.0,
             anchor: str = "start", fill: str = "#222222", bold: bool = False,
             limit: int = LABEL_LIMIT) -> None:
        """A label (pod text allowed: it goes through :func:`text_of`)."""
        if anchor not in ("start", "middle", "end"):
            raise ValueError(f"bad text-anchor {anchor!r}")
        weight = ' font-weight="bold"' if bold else ""
        self._parts.append(f'<text x="{num(x)}" y="{num(y)}" font-size="{num(size)}" '
                           f'text-anchor="{anchor}" fill="{_colour(fill)}"{weight}>'
                           f"{text_of(value, limit)}</text>")

    def document(self) -> str:
        """The SVG file's text: one root, a title, the elements, a trailing newline."""
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{num(self.width)}" '
                f'height="{num(self.height)}" viewBox="0 0 {num(self.width)} '
                f'{num(self.height)}" font-family="sans-serif">')
        body = "\n".join(self._parts)
        return (f"{head}\n<title>{text_of(self._title)}</title>\n"
                f'<rect x="0" y="0" width="{num(self.width)}" height="{num(self.height)}" '
                f'fill="#ffffff"/>\n{body}\n</svg>\n')


_COLOUR = re.compile(r"#[0-9A-Fa-f]{6}|none")
_DASH = re.compile(r"[0-9]+(?: [0-9]+)*")


def _colour(value: str) -> str:
    # Colours are ours, never the pod's; a slip that passed anything else would be a
    # way into an attribute, so it is refused loudly.
    if not _COLOUR.fullmatch(value):
        raise ValueError(f"not a colour: {value!r}")
    return value


def _dash(value: str) -> str:
    if not _DASH.fullmatch(value):
        raise ValueError(f"not a dash pattern: {value!r}")
    return value
