"""`gpuws export -o FILE` writes each run's pictures beside the report (issue 33, point 3).

Real parts throughout: the CLI's ``main`` over a real SQLite store; the timeline trace is
built by the agent's own merger (``timeline_trace.Merger`` through ``read_results``) from
the torch.profiler traces recorded on H200s (tests/fixtures/real-programs-h200: a
two-rank DDP run and an HF generate), pulled as ``gpuws pull`` records it; the Tier 3
point is the real H200 bf16 GEMM's ncu metrics (``gemm_raw.csv`` read by the agent's
``ncu_reader``); the saxpy run is the recorded H200 stream (tests/sessions/recorded.py).
A hostile trace is the same file shape with the pod's worst names and 10^5 events.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpuws.cli import main
from gpuws.remote_agent.measure import timeline_trace as tt
from gpuws.remote_agent.measure.torch_profile import read_results
from gpuws.remote_agent.profilers import ncu_reader
from gpuws.sessions.store import Store
from gpuws.text.textsafe import md_text
from gpuws.timeline import overview, roofline_svg

REAL = Path(__file__).parents[1] / "fixtures" / "real-programs-h200"
NCU = Path(__file__).parents[1] / "fixtures" / "ncu-2025.3.1-h200"
#: Every element a picture may hold; nothing that runs, embeds or fetches.
ALLOWED = {"svg", "title", "g", "rect", "line", "polyline", "circle", "text"}
SVG_NS = "{http://www.w3.org/2000/svg}"


def real_trace(tmp: Path, *files: str) -> bytes:
    """The agent's ``timeline.trace.json.gz`` from real torch.profiler traces."""
    out, art = tmp / "profile-out", tmp / "profile-art"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(art, ignore_errors=True)
    out.mkdir()
    art.mkdir()
    for rank, name in enumerate(files):
        with gzip.open(REAL / name, "rb") as src, \
                open(out / f"torch-trace-{100 + rank}-r{rank}.json", "wb") as dst:
            shutil.copyfileobj(src, dst)
    merger = tt.Merger()
    read_results(str(out), merger=merger)
    path = merger.write(str(art))
    assert path is not None
    return Path(path).read_bytes()


def gemm_metrics(run_id: str, seq: int, ts: float) -> bytes:
    """The real H200 GEMM's kernel_metrics event, as the agent's reader makes it."""
    (launch,) = ncu_reader.read_raw_csv((NCU / "gemm_raw.csv").read_text())
    event = ncu_reader.kernel_metrics_event(launch)
    event.update(run_id=run_id, seq=seq, ts=ts)
    return json.dumps(event).encode() + b"\n"


def store_run(recorded: ModuleType, tmp: Path, trace: bytes | None, *, pulled: bool = True,
              run_id: str = "r1", gemm: bool = True) -> str:
    """A session with the recorded saxpy run (plus the GEMM's Tier 3 launch), and its
    trace artifact recorded (and pulled) when ``trace`` is given; returns the session."""
    lines = recorded.saxpy_run(run_id)
    if gemm:
        last = json.loads(lines[-1])
        lines = [*lines[:-1], gemm_metrics(run_id, last["seq"], last["ts"] - 0.01),
                 json.dumps({**last, "seq": last["seq"] + 1}).encode() + b"\n"]
    with Store() as store:
        sid = store.open_session("h200-pod", "local", None, 3.99, started=recorded.T0)
        store.ingest_many(sid, lines)
        if trace is not None:
            local = tmp / f"{run_id}-pulled.trace.json.gz"
            local.write_bytes(trace)
            store.record_artifact(run_id, tt.FILE_NAME, "/pod/art/" + tt.FILE_NAME,
                                  len(trace), hashlib.sha256(trace).hexdigest())
            if pulled:
                store.mark_pulled(run_id, tt.FILE_NAME, local)
        # Ended, so its economics (and so the whole report) do not move with the clock.
        store.end_session(sid, recorded.T0 + 60.0)
    return str(sid)


def svg_tree(text: str) -> ET.Element:
    """The picture parsed as XML, with only the allowed elements and no reference out."""
    root = ET.fromstring(text)
    for el in root.iter():
        assert el.tag.startswith(SVG_NS), el.tag
        assert el.tag[len(SVG_NS):] in ALLOWED, el.tag
        for key, value in el.attrib.items():
            assert "href" not in key and not key.startswith("on"), (key, value)
            assert "url(" not in value and "javascript" not in value.lower(), value
    return root


def texts(root: ET.Element) -> list[str]:
    return [el.text or "" for el in root.iter() if el.tag in (SVG_NS + "text", SVG_NS + "title")]


def links(md: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)


def test_export_writes_the_timeline_and_roofline_it_links(recorded: ModuleType, home: Path,
                                                          tmp_path: Path) -> None:
    trace = real_trace(tmp_path, "ddp-rank0.trace.json.gz", "ddp-rank1.trace.json.gz")
    sid = store_run(recorded, tmp_path, trace)
    out = tmp_path / "report dir"
    out.mkdir()
    assert main(["export", sid, "-o", str(out / "report.md")]) == 0
    md = (out / "report.md").read_text()
    names = links(md)
    assert names == ["report.r1.timeline.svg", "report.r1.roofline.svg"]
    for name in names:  # relative links that resolve beside the report
        assert (out / name).is_file()
    assert sorted(p.name for p in out.iterdir()) == ["report.md", *sorted(names)]

    timeline = svg_tree((out / "report.r1.timeline.svg").read_text())
    words = texts(timeline)
    assert "rank 0 · stream 7" in words and "rank 1 · stream 7" in words
    assert any(w.startswith("rank 0: judged window: steps") for w in words)
    assert any("left out: before the first kernel" in w for w in words)
    assert "time since the first GPU event (s)" in words  # the axis has its unit
    assert {"GEMM", "copy/memset", "idle (no GPU work)", "judged steady window"} <= set(words)
    assert "### Timeline (Tier 2 trace)" in md
    assert "409 GPU events on 66 GPU track(s)" in md  # the real DDP run's streams
    assert "The 32 busiest tracks are drawn (34 more are in the trace)" in md

    roof = svg_tree((out / "report.r1.roofline.svg").read_text())
    words = texts(roof)
    assert "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT" in words
    assert "memory roof 4,800 GB/s" in words and "compute roof 67.0 TFLOP/s" in words
    assert "Roofs as the run's Tier 1 recorded them (datasheet)" in md
    # saxpy's ncu pass counted no FLOPs: no point, and the caption says so.
    assert "2 profiled launch(es) from Nsight Compute, 1 with a point" in md
    assert "0: ncu measured no FLOP count, so it has no point" in md  # saxpy #0
    assert "A point above the compute roof ran at another precision" in md  # bf16 GEMM

    # The same session gives the same bytes.
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(["export", sid, "-o", str(out / "report.md")]) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first


def test_no_images_leaves_the_pictures_and_their_links_out(recorded: ModuleType, home: Path,
                                                          tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    trace = real_trace(tmp_path, "hf-generate-2layers-last8steps.trace.json.gz")
    sid = store_run(recorded, tmp_path, trace)
    out = tmp_path / "plain"
    out.mkdir()
    assert main(["export", sid, "-o", str(out / "r.md"), "--no-images"]) == 0
    md = (out / "r.md").read_text()
    assert [p.name for p in out.iterdir()] == ["r.md"]
    assert links(md) == [] and ".svg" not in md and "### Timeline" not in md
    # On stdout a report has nowhere to put pictures: none, and no links.
    capsys.readouterr()
    assert main(["export", sid]) == 0
    assert ".svg" not in capsys.readouterr().out
    # With pictures, the same report is the one above plus the picture sections.
    assert main(["export", sid, "-o", str(out / "r.md")]) == 0
    with_images = (out / "r.md").read_text()
    assert links(with_images) == ["r.r1.timeline.svg", "r.r1.roofline.svg"]
    assert "1,470 GPU events on 1 GPU track(s) over 48.067 ms" in with_images
    assert "decode steps" in (out / "r.r1.timeline.svg").read_text()


def test_without_a_pulled_trace_the_kernel_table_is_drawn_and_the_pull_named(
        recorded: ModuleType, home: Path, tmp_path: Path) -> None:
    trace = real_trace(tmp_path, "hf-generate-2layers-last8steps.trace.json.gz")
    sid = store_run(recorded, tmp_path, trace, pulled=False)
    assert main(["export", sid, "-o", str(tmp_path / "x.md")]) == 0
    md = (tmp_path / "x.md").read_text()
    assert "### Kernel time by family (Tier 2 table)" in md
    assert "still on the pod (remote): gpuws pull r1 brings it home" in md
    assert "keeps each kernel's total time, not when it ran" in md
    root = svg_tree((tmp_path / "x.r1.timeline.svg").read_text())
    assert "elementwise 100%" in texts(root)  # saxpy, the one kernel: a·x + y


def test_a_run_without_any_trace_gets_the_table_picture(recorded: ModuleType, home: Path,
                                                        tmp_path: Path) -> None:
    sid = store_run(recorded, tmp_path, None, gemm=False)
    assert main(["export", sid, "-o", str(tmp_path / "y.md")]) == 0
    md = (tmp_path / "y.md").read_text()
    assert links(md) == ["y.r1.timeline.svg"]  # saxpy alone has no FLOP count: no roofline
    assert md_text("No roofline: saxpy #0: ncu measured no FLOP count.") in md
    assert "still on the pod" not in md


def test_a_broken_pulled_trace_is_one_sentence_not_a_failed_export(
        recorded: ModuleType, home: Path, tmp_path: Path) -> None:
    sid = store_run(recorded, tmp_path, b"\x1f\x8bnot gzip at all")
    assert main(["export", sid, "-o", str(tmp_path / "z.md")]) == 0
    md = (tmp_path / "z.md").read_text()
    assert "The timeline trace was not drawn: the run's timeline trace is not valid gzip" in md
    assert "### Kernel time by family (Tier 2 table)" in md


def test_a_picture_that_cannot_be_written_is_one_line_and_no_report(
        recorded: ModuleType, home: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    sid = store_run(recorded, tmp_path, None)
    (tmp_path / "w.r1.timeline.svg").mkdir()  # a directory where the picture goes
    assert main(["export", sid, "-o", str(tmp_path / "w.md")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpuws: ") and "--no-images" in err[0], err
    assert not (tmp_path / "w.md").exists()
    assert not list(tmp_path.glob("*.tmp"))


# ----------------------------------------------------------------------------- hostile
HOSTILE = ["</svg><script>alert(1)</script>", "a & b <c> \"d\" 'e'", "\x1b]0;pwned\x07\x00\r\n",
           "\ud800 lone surrogate \ufffe", "<foreignObject><iframe src=http://evil/>",
           "x" * 100_000]


def hostile_trace(events: int = 100_000) -> dict[str, Any]:
    """The pod's worst: hostile names on kernels, streams, ranks and marks, 10^5 events."""
    evs: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "ts": 0, "dur": 0,
         "args": {"name": HOSTILE[0]}},
        {"ph": "X", "cat": "gpuws", "name": "judged window: " + HOSTILE[1], "ts": 10.0,
         "dur": 5000.0, "pid": 0, "tid": "verdict"},
        {"ph": "i", "s": "p", "cat": "gpuws", "name": "left out: " + HOSTILE[2], "ts": 0.0,
         "dur": 0, "pid": 0, "tid": "verdict"}]
    for i in range(events):
        # The 100 KB name on every 10,000th event only: on all of them the trace would
        # decompress past the checker's 1 GiB and be refused before any drawing.
        name = HOSTILE[5] if i % 10_000 == 0 else HOSTILE[i % 5]
        evs.append({"ph": "X", "cat": "kernel", "name": name,
                    "ts": i * 0.1, "dur": 0.05 if i % 1000 else 2000.0, "pid": 0,
                    "tid": HOSTILE[(i // 2) % 4] if i % 2 else "stream 7"})
    return {"traceEvents": evs}


def test_hostile_names_and_10e5_events_make_a_bounded_inert_picture(
        recorded: ModuleType, home: Path, tmp_path: Path) -> None:
    raw = json.dumps(hostile_trace()).encode()
    sid = store_run(recorded, tmp_path, gzip.compress(raw))
    assert main(["export", sid, "-o", str(tmp_path / "h.md")]) == 0
    text = (tmp_path / "h.r1.timeline.svg").read_text()
    root = svg_tree(text)
    assert "<script" not in text and "<foreignObject" not in text and "<iframe" not in text
    assert "\x1b" not in text and "\x00" not in text
    words = "\n".join(texts(root))
    assert "</svg><script>alert(1)</script>" in words  # shown, as text
    assert "\\e]0;pwned\\x07\\0" in words
    assert "\\ud800 lone surroga…" in words  # a stream name, cut to 14 characters
    # Bounded: one block per pixel column per track at most, labels cut.
    assert len(text.encode()) < 400_000
    assert text.count("<rect") <= 5 * overview.PLOT_WIDTH + 50
    assert max(len(t) for t in texts(root)) < 200
    md = (tmp_path / "h.md").read_text()
    assert "100,000 GPU events on 5 GPU track(s)" in md
    assert "blocks narrower than a column are merged" in md
    # The checker cut the 100 KB names (10 of them) before drawing, and the caption says so.
    assert "The trace as pulled: 10 name(s) cut to 1024 characters." in md


def test_the_drawing_itself_bounds_a_100kb_name_and_is_deterministic() -> None:
    # Straight to the drawing (the trace checker cuts names to 1 KiB first): its own
    # bound holds for what a future caller might hand it.
    evs = hostile_trace(2000)["traceEvents"]
    for e in evs:
        if e.get("cat") == "kernel":
            e["name"] = HOSTILE[5] + HOSTILE[0]
            e["dur"] = 50.0
    pic = overview.timeline_svg(evs, "run </title><script>")
    assert pic is not None and pic == overview.timeline_svg(evs, "run </title><script>")
    svg_tree(pic.svg)
    assert len(pic.svg) < 200_000 and "<script" not in pic.svg


def test_the_roofline_draws_no_roof_that_was_not_recorded() -> None:
    (launch,) = ncu_reader.read_raw_csv((NCU / "gemm_raw.csv").read_text())
    m = ncu_reader.kernel_metrics_event(launch)["metrics"]
    point = roofline_svg.point_of(HOSTILE[0] + launch.get("kernel", "gemm"), 0, m["flops"],
                                  m["dram_bytes"], m["duration_ns"])
    assert isinstance(point, roofline_svg.Point)
    assert point.ai == pytest.approx(808.98, rel=1e-3)  # 1.117e12 FLOP / 1.380e9 B
    assert point.tflops == pytest.approx(681.3, rel=1e-3)  # over 1.639 ms
    pic = roofline_svg.roofline_svg([point], roofline_svg.Roofs(4800.0, None, "measured copy"),
                                    "r")
    assert pic is not None
    words = texts(svg_tree(pic.svg))
    assert "memory roof 4,800 GB/s" in words
    assert not any("compute roof" in w for w in words)
    assert "No compute peak was recorded, so no compute roof is drawn." in pic.caption
    assert any(w.startswith("</svg><script>") for w in words)  # the name, as text
    none = roofline_svg.roofline_svg([point], roofline_svg.Roofs(None, None, "x"), "r")
    assert none is not None and "roof" not in " ".join(texts(svg_tree(none.svg)))
    assert "no memory roof" in none.caption and "no compute roof" in none.caption
    # A stored figure no GPU has is no roof, and no point.
    assert roofline_svg.usable(1e308, roofline_svg.GBPS_RANGE) is None
    assert isinstance(roofline_svg.point_of("k", 0, 1e300, 1e-300, 1.0), str)


def test_worst_times_neither_raise_nor_escape_the_picture() -> None:
    """Times the checker lets through (finite, not negative) at their extremes."""
    evs: list[dict[str, Any]] = [
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 0.0, "dur": 0.0, "pid": 0, "tid": 1},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 1.7e308, "dur": 1.7e308, "pid": 0,
         "tid": 1},  # its end overflows: left out
        {"ph": "X", "cat": "memcpy", "name": "Memcpy HtoD", "ts": 1e300, "dur": 5e-324,
         "pid": "p", "tid": "stream 2"},
        {"ph": "X", "cat": "gpuws", "name": "judged window: w", "ts": 0.0, "dur": 1e308,
         "pid": 0, "tid": "verdict"}]
    pic = overview.timeline_svg(evs, "t")
    assert pic is not None
    root = svg_tree(pic.svg)
    for el in root.iter():
        for key in ("x", "width", "x1", "x2"):
            if key in el.attrib:
                assert 0.0 <= float(el.attrib[key]) <= 1300.0, (key, el.attrib)
    assert "2 GPU events on 2 GPU track(s)" in pic.caption
    only_zero = overview.timeline_svg(evs[:1], "t")  # one kernel of no duration
    assert only_zero is not None and "1 GPU events on 1 GPU track(s)" in only_zero.caption


def test_a_report_name_with_spaces_and_brackets_still_links_its_pictures(
        recorded: ModuleType, home: Path, tmp_path: Path) -> None:
    from urllib.parse import unquote

    sid = store_run(recorded, tmp_path, None)
    report = tmp_path / "my report (v2) [final].md"
    assert main(["export", sid, "-o", str(report)]) == 0
    targets = links(report.read_text())
    assert targets == ["my%20report%20%28v2%29%20%5Bfinal%5D.r1.timeline.svg",
                       "my%20report%20%28v2%29%20%5Bfinal%5D.r1.roofline.svg"]
    for target in targets:  # a relative link a viewer resolves beside the report
        assert (report.parent / unquote(target)).is_file()
