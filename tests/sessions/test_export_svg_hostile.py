"""A hostile pod's session exported with its pictures: the report keeps the honest twin's
shape (the pictures' links and captions included) and every picture is inert XML.

The sessions are recorded through the real engine and store by ``security/hostile_text``
(a lying agent replaying the real H200 recording with the pod's worst text in every
free-text field, and its honest twin); ``test_hostile_text_export`` checks the report
without pictures, this the same with them.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from gpuws.sessions.export import export_session
from gpuws.sessions.export_images import Figures
from gpuws.sessions.store import Store
from security.hostile_text import PIECES, hostile_store, unsafe_chars  # type: ignore[import-not-found]

ALLOWED = {"svg", "title", "rect", "line", "polyline", "circle", "text"}


def _export(text: str) -> tuple[str, dict[str, str]]:
    session_id, _ = hostile_store(text)
    figures = Figures("report")
    with Store() as s:
        md = export_session(s, session_id, figures=figures)
    return md, figures.files


def _shape(md: str) -> list[str]:
    """What markdown-it sees, less text: block tokens and the inline ones that draw."""
    out = []
    for t in MarkdownIt("gfm-like").enable("linkify").parse(md):
        out.append(t.type)
        # An image's file names its run, whose id differs between the twins.
        out += [c.type for c in t.children or [] if c.type not in ("text", "softbreak")]
    return out


def test_a_hostile_sessions_pictures_and_captions_draw_nothing_of_the_pods(
        home: Path) -> None:
    honest_md, honest_files = _export("plain")
    hostile_md, hostile_files = _export(" ".join(PIECES.values()))
    def kinds(files: dict[str, str]) -> list[str]:
        return sorted(name.rsplit(".", 2)[1] for name in files)

    assert kinds(honest_files) == kinds(hostile_files) and honest_files
    images = [c.attrGet("src") for t in MarkdownIt("gfm-like").parse(hostile_md)
              for c in t.children or [] if c.type == "image"]
    assert images and set(images) == set(hostile_files)
    full = re.compile(r"<details><summary>Full kernel names</summary>.*?\n</details>\n", re.S)
    assert _shape(full.sub("", hostile_md)) == _shape(full.sub("", honest_md))
    assert unsafe_chars(hostile_md) == []
    for name, svg in hostile_files.items():
        root = ET.fromstring(svg)
        for el in root.iter():
            assert el.tag.split("}")[1] in ALLOWED, (name, el.tag)
            assert not any("href" in k or k.startswith("on") for k in el.attrib), el.attrib
        assert unsafe_chars(svg) == [], name
        assert "<script" not in svg and "foreignObject" not in svg


@pytest.mark.parametrize("piece", sorted(PIECES))
def test_each_piece_is_text_in_a_picture(piece: str) -> None:
    from gpuws.timeline.overview import timeline_svg

    value = PIECES[piece]
    events = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "ts": 0, "dur": 0,
               "args": {"name": value}},
              {"ph": "X", "cat": "kernel", "name": value, "ts": 0.0, "dur": 900.0, "pid": 0,
               "tid": value},
              {"ph": "X", "cat": "gpuws", "name": "judged window: " + value, "ts": 0.0,
               "dur": 500.0, "pid": 0, "tid": "verdict"}]
    pic = timeline_svg(events, value)
    assert pic is not None
    root = ET.fromstring(pic.svg)
    assert {el.tag.split("}")[1] for el in root.iter()} <= ALLOWED
    assert unsafe_chars(pic.svg) == []
