"""The exported pictures drawn by a real SVG renderer: librsvg (GNOME's, the one many
desktops and image tools use) through cairo, called with ctypes; the test is skipped
where those libraries are not installed. A renderer that loads the file, draws it at its
declared size and leaves the legend's colours on the canvas proves more than an XML parse:
the file is an SVG a viewer shows, not only well-formed text.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gzip
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from gpuws.cli import main
from gpuws.timeline.families import FAMILY_COLOURS


def _lib(name: str) -> ctypes.CDLL:
    path = ctypes.util.find_library(name)
    if path is None:
        pytest.skip(f"lib{name} is not installed (a real SVG renderer)")
    return ctypes.CDLL(path)


def _load_test_helpers() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gpuws_export_svg_tests", Path(__file__).with_name("test_export_svg.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Dims(ctypes.Structure):
    _fields_ = [("width", ctypes.c_int), ("height", ctypes.c_int), ("em", ctypes.c_double),
                ("ex", ctypes.c_double)]


def render(svg: bytes) -> tuple[int, int, set[tuple[int, int, int]]]:
    """(width, height, the opaque colours drawn) of ``svg`` as librsvg renders it."""
    rsvg, cairo = _lib("rsvg-2"), _lib("cairo")
    rsvg.rsvg_handle_new_from_data.restype = ctypes.c_void_p
    rsvg.rsvg_handle_new_from_data.argtypes = [ctypes.c_char_p, ctypes.c_size_t,
                                               ctypes.c_void_p]
    rsvg.rsvg_handle_get_dimensions.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Dims)]
    rsvg.rsvg_handle_render_cairo.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    cairo.cairo_image_surface_create.restype = ctypes.c_void_p
    cairo.cairo_create.restype = ctypes.c_void_p
    cairo.cairo_create.argtypes = [ctypes.c_void_p]
    cairo.cairo_surface_flush.argtypes = [ctypes.c_void_p]
    cairo.cairo_image_surface_get_data.restype = ctypes.POINTER(ctypes.c_ubyte)
    cairo.cairo_image_surface_get_data.argtypes = [ctypes.c_void_p]
    cairo.cairo_image_surface_get_stride.argtypes = [ctypes.c_void_p]
    for fn in ("cairo_destroy", "cairo_surface_destroy"):
        getattr(cairo, fn).argtypes = [ctypes.c_void_p]
    error = ctypes.c_void_p()
    handle = rsvg.rsvg_handle_new_from_data(svg, len(svg), ctypes.byref(error))
    assert handle, "librsvg refused the file"
    dims = _Dims()
    rsvg.rsvg_handle_get_dimensions(handle, ctypes.byref(dims))
    surface = cairo.cairo_image_surface_create(0, dims.width, dims.height)  # ARGB32
    ctx = cairo.cairo_create(surface)
    assert rsvg.rsvg_handle_render_cairo(handle, ctx) == 1
    cairo.cairo_surface_flush(surface)
    stride = cairo.cairo_image_surface_get_stride(surface)
    data = ctypes.string_at(cairo.cairo_image_surface_get_data(surface), stride * dims.height)
    colours = set()
    for y in range(dims.height):
        row = data[y * stride:y * stride + 4 * dims.width]
        for x in range(0, len(row), 4):
            b, g, r, a = row[x:x + 4]  # little-endian ARGB32
            if a == 255:
                colours.add((r, g, b))
    cairo.cairo_destroy(ctx)
    cairo.cairo_surface_destroy(surface)
    return dims.width, dims.height, colours


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return (int(hex_colour[1:3], 16), int(hex_colour[3:5], 16), int(hex_colour[5:7], 16))


def test_the_exported_pictures_render_at_their_size_with_their_colours(
        recorded: ModuleType, home: Path, tmp_path: Path) -> None:
    _lib("rsvg-2")
    helpers = _load_test_helpers()
    trace = helpers.real_trace(tmp_path, "ddp-rank0.trace.json.gz", "ddp-rank1.trace.json.gz")
    sid = helpers.store_run(recorded, tmp_path, trace)
    assert main(["export", sid, "-o", str(tmp_path / "r.md")]) == 0
    timeline = (tmp_path / "r.r1.timeline.svg").read_bytes()
    width, height, colours = render(timeline)
    assert (width, height) == (1240, 946)
    for fam in ("GEMM", "copy/memset"):  # the legend's swatches, drawn opaque
        assert _rgb(FAMILY_COLOURS[fam]) in colours, fam
    width, height, colours = render((tmp_path / "r.r1.roofline.svg").read_bytes())
    assert (width, height) == (1060, 520)
    assert _rgb("#B00020") in colours and _rgb(FAMILY_COLOURS["GEMM"]) in colours


def test_a_hostile_picture_renders_too(recorded: ModuleType, home: Path,
                                       tmp_path: Path) -> None:
    _lib("rsvg-2")
    helpers = _load_test_helpers()
    raw = json.dumps(helpers.hostile_trace(20_000)).encode()
    sid = helpers.store_run(recorded, tmp_path, gzip.compress(raw))
    assert main(["export", sid, "-o", str(tmp_path / "h.md")]) == 0
    width, height, colours = render((tmp_path / "h.r1.timeline.svg").read_bytes())
    assert width == 1240 and height > 100
    assert _rgb(FAMILY_COLOURS["other"]) in colours
