"""ncu's console, fed as it arrives: pass progress, outcomes, and what they mean."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import msgspec

from gpuws import protocol
from gpuws.remote_agent.profilers.ncu_output import (
    NcuConsoleParser,
    progress_event,
    regex_escape,
    suggest_regex,
)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "ncu-2025.3.1-h200"
PERM = ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
        "Performance Counters on the target device 0. For instructions on enabling permissions "
        "and to get more information see https://developer.nvidia.com/ERR_NVGPUCTRPERM\n")

# The chunks os.read returned while ncu 2025.3.1 profiled four launches on an H200 with
# --kernel-name-base demangled (first run) and with -c 4 and the default names (second):
# progress arrives a few characters at a time.
DEMANGLED_CHUNKS = [
    ('stdout', '==PROF== Connected to process 941 (/work/main/build/ncu-probe/tmpl)\n'),
    ('stdout', '==PROF== Profiling "saxpy(int, float, const float *, float *)": '),
    ('stdout', '0%'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '50%'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '100% - 20 passes\n'),
    ('stdout', '==PROF== Profiling "saxpy(int, float, const float *, float *)": '),
    ('stdout', '0%'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '50%'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '100% - 20 passes\n'),
    ('stdout', '==PROF== Profiling "saxpy(int, float, const float *, float *)": '),
    ('stdout', '0%'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '50%'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '100% - 20 passes\n'),
    ('stdout',
     '==PROF== Profiling "void gpuws::detail::scale_kernel<float, (int)4, gp'
     'uws::detail::MulAdd>(gpuws::detail::Pair<int, T1>, T1 *, T3)": '),
    ('stdout', '0%'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '50%'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '.'),
    ('stdout', '100% - 20 passes\n'),
    ('stdout', 'done\n'),
    ('stdout', '==PROF== Disconnected from process 941\n'),
    ('stdout', '==PROF== Report: /root/out/tmpl.ncu-rep\n'),
]

LAUNCH_ID_CHUNKS = [
    ('stdout', '==WARNING== No metrics to collect found in sections.\n'),
    ('stdout', '==PROF== Connected to process 1175 (/work/main/build/ncu-probe/tmpl)\n'),
    ('stdout', '==PROF== Profiling "saxpy" - 0: '),
    ('stdout', '0%...'),
    ('stdout', '.50%'),
    ('stdout', '.'),
    ('stdout', '...100% - 1 pass\n'),
    ('stdout', '==PROF== Profiling "saxpy" - 1: '),
    ('stdout', '0%...'),
    ('stdout', '.50%'),
    ('stdout', '.'),
    ('stdout', '..'),
    ('stdout', '.100% - 1 pass\n'),
    ('stdout', '==PROF== Profiling "saxpy" - 2: '),
    ('stdout', '0%...'),
    ('stdout', '.50%'),
    ('stdout', '.'),
    ('stdout', '..'),
    ('stdout', '.100% - 1 pass\n'),
    ('stdout', '==PROF== Profiling "scale_kernel" - 3: '),
    ('stdout', '0%...'),
    ('stdout', '.50%'),
    ('stdout', '.'),
    ('stdout', '...100% - 1 pass\n'),
    ('stdout', 'done\n'),
    ('stdout', '==PROF== Disconnected from process 1175\n'),
    ('stdout', '==PROF== Report: /root/out/badset.ncu-rep\n'),
]


def feed_all(parser: NcuConsoleParser, chunks: list[tuple[str, str]]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for stream, data in chunks:
        items += parser.feed(data, stream)
    return items + parser.close()


def kinds(items: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [i for i in items if i["kind"] == kind]


def test_gemm_log_char_by_char() -> None:
    text = (FIXTURES / "gemm_full.log").read_text()
    parser = NcuConsoleParser("nvjet|gemm|sm90")
    items = feed_all(parser, [("stdout", c) for c in text])
    progress = kinds(items, "progress")
    # Every dot is ten percent; "100%" shows before the pass count ends the line.
    assert [p["percent"] for p in progress] == [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 100]
    assert all(p["kernel"] == "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT" for p in progress)
    assert progress[-1]["passes"] == 38 and progress[-1]["done"] is True
    assert not any(p["done"] for p in progress[:-1])
    (missing,) = kinds(items, "unavailable_metrics")
    assert missing["count"] == 6 and len(missing["metrics"]) == 6
    assert missing["metrics"][0] == "ctc__rx_bytes_data_user.sum"
    assert missing["metrics"][-1] == "ctc__tx_bytes_data_user.sum.per_second"
    assert kinds(items, "report") == [{"kind": "report", "path": "/root/out/fx/gemm_full.ncu-rep"}]
    assert kinds(items, "connected")[0]["pid"] == 747
    summary = parser.summary()
    assert summary["reports"] == ["/root/out/fx/gemm_full.ncu-rep"]
    assert summary["profiled"] == [{"kernel": "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT",
                                    "launch": None, "passes": 38}]
    assert not summary["errors"] and not summary["perm_error"] and not summary["no_kernels"]


def test_any_chunking_gives_the_same_outcome() -> None:
    text = (FIXTURES / "gemm_full.log").read_text() + (FIXTURES / "saxpy_human.txt").read_text()
    whole = NcuConsoleParser()
    expected = [i for i in feed_all(whole, [("stdout", text)]) if i["kind"] != "progress"]
    rng = random.Random(7)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), 40))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        parser = NcuConsoleParser()
        items = feed_all(parser, [("stdout", p) for p in pieces])
        assert [i for i in items if i["kind"] != "progress"] == expected
        done = [i for i in items if i["kind"] == "progress" and i["done"]]
        assert [(d["kernel"], d["passes"]) for d in done] == [
            ("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT", 38), ("saxpy", 20)]
        assert parser.summary() == whole.summary()


def test_real_chunks_with_demangled_names() -> None:
    parser = NcuConsoleParser()
    items = feed_all(parser, DEMANGLED_CHUNKS)
    done = [p for p in kinds(items, "progress") if p["done"]]
    assert [d["kernel"] for d in done] == ["saxpy(int, float, const float *, float *)"] * 3 + [
        "void gpuws::detail::scale_kernel<float, (int)4, gpuws::detail::MulAdd>"
        "(gpuws::detail::Pair<int, T1>, T1 *, T3)"]
    assert all(d["passes"] == 20 and d["percent"] == 100 for d in done)
    # Each launch reports its partial progress before it is done, in order.
    per_kernel = [p["percent"] for p in kinds(items, "progress")][:11]
    assert per_kernel == sorted(per_kernel) and per_kernel[0] == 0
    assert parser.reports == ["/root/out/tmpl.ncu-rep"]
    assert not parser.errors and not parser.warnings


# ncu 2025.3.1 on an H200, `--set full` on tiled_matmul (n=4096, 16 ms a launch), stdout as
# bench/tier3.py captured it: a warning cuts the progress bar, which goes on on the next line.
INTERRUPTED = (Path(__file__).parents[2] / "fixtures" / "recorded"
               / "ncu_full_tiled_matmul_h200.log").read_text()
LONG_LAUNCH_WARNING = next(line for line in INTERRUPTED.splitlines()
                           if "taking more time than expected" in line)


def test_a_warning_inside_the_progress_bar_does_not_lose_the_pass_count() -> None:
    parser = NcuConsoleParser("tiled_matmul")
    cut = INTERRUPTED.index("....50%") + len("....50%")
    items = feed_all(parser, [("stdout", INTERRUPTED[:cut]), ("stdout", INTERRUPTED[cut:])])
    progress = kinds(items, "progress")
    assert [p["percent"] for p in progress] == [0, 50, 100]
    assert all(p["kernel"] == "tiled_matmul" for p in progress)
    assert progress[-1]["passes"] == 38 and progress[-1]["done"]
    assert parser.profiled == [{"kernel": "tiled_matmul", "launch": None, "passes": 38}]
    assert LONG_LAUNCH_WARNING.removeprefix("==WARNING== ") in parser.warnings
    assert parser.reports and parser.reports[0].endswith(".ncu-rep")
    # Any chunking gives the same outcome.
    text = INTERRUPTED
    for size in (1, 3, 7, 64):
        again = NcuConsoleParser("tiled_matmul")
        feed_all(again, [("stdout", text[i:i + size]) for i in range(0, len(text), size)])
        assert again.profiled == parser.profiled and again.warnings == parser.warnings
    # A bare number on a later line, with no bar cut short before it, is not progress.
    other = NcuConsoleParser()
    assert kinds(feed_all(other, [("stdout", "42%\n")]), "progress") == []


def test_launch_ids_single_pass_and_empty_set_warning() -> None:
    parser = NcuConsoleParser()
    items = feed_all(parser, LAUNCH_ID_CHUNKS)
    done = [p for p in kinds(items, "progress") if p["done"]]
    assert [(d["kernel"], d["launch"], d["passes"]) for d in done] == [
        ("saxpy", 0, 1), ("saxpy", 1, 1), ("saxpy", 2, 1), ("scale_kernel", 3, 1)]
    # An unknown --set collects nothing and says so only as a warning.
    assert parser.warnings == ["No metrics to collect found in sections."]


def test_no_kernels_lists_them_and_suggests_a_regex() -> None:
    text = (FIXTURES / "no_kernels.txt").read_text()
    parser = NcuConsoleParser("no_such_kernel_xyz")
    items = feed_all(parser, [("stdout", text[i:i + 5]) for i in range(0, len(text), 5)])
    (found,) = kinds(items, "no_kernels")
    names = ["cupy_random_x_mod_1", "gen_sequenced", "generate_seed_pseudo", "saxpy"]
    assert found["kernels"] == names
    assert found["suggested_regex"] == "|".join(names)  # nothing close: all of them
    assert parser.no_kernels and parser.available_kernels == names
    assert suggest_regex(names, "saxp.*") == "saxpy"
    assert suggest_regex(names, "regex:gen_") == "gen_sequenced|generate_seed_pseudo"
    assert suggest_regex([]) is None


def test_counter_permission_error() -> None:
    parser = NcuConsoleParser()
    items = feed_all(parser, [("stdout", "==PROF== Connected to process 9 (/usr/bin/python3)\n"),
                              ("stderr", PERM[:40]), ("stderr", PERM[40:])])
    (perm,) = kinds(items, "perm_error")
    assert perm["url"] == "https://developer.nvidia.com/ERR_NVGPUCTRPERM"
    assert perm["message"].startswith("ERR_NVGPUCTRPERM - The user does not have permission")
    assert parser.perm_error and not parser.errors


def test_driver_not_compatible_and_other_errors() -> None:
    parser = NcuConsoleParser()
    items = feed_all(parser, [("stdout",
                               "==ERROR== Cuda driver is not compatible with Nsight Compute.\n"
                               "==ERROR== Option '--section NoSuchSection' did not match any "
                               "section.\n==ERROR== The application returned an error code (9)."
                               "\n")])
    assert kinds(items, "driver_incompatible")[0]["message"].startswith("Cuda driver")
    assert parser.driver_incompatible
    assert parser.errors == ["Option '--section NoSuchSection' did not match any section.",
                             "The application returned an error code (9)."]


def test_streams_are_buffered_apart_and_bytes_accepted() -> None:
    parser = NcuConsoleParser()
    items = parser.feed(b'==PROF== Profiling "k": 0%..', "stdout")
    items += parser.feed("program output on stderr\n", "stderr")
    items += parser.feed(b"..50%....100% - 7 passes\r\n", "stdout")
    done = [i for i in items if i.get("done")]
    assert done == [{"kind": "progress", "kernel": "k", "launch": None, "percent": 100,
                     "passes": 7, "done": True}]
    assert [i["percent"] for i in items if i["kind"] == "progress"] == [20, 100]


def test_names_holding_quotes_and_colons() -> None:
    line = '==PROF== Profiling "void f<S<": ">>(int)" - 12: 0%....50%....100% - 2 passes\n'
    (item,) = NcuConsoleParser().feed(line)
    assert item["kernel"] == 'void f<S<": ">>(int)' and item["launch"] == 12
    assert item["passes"] == 2


def test_progress_event_is_the_protocol_event() -> None:
    items = NcuConsoleParser().feed('==PROF== Profiling "saxpy": 0%....50%..')
    events = [msgspec.convert(progress_event(i), protocol.NcuProgress) for i in items]
    assert events[-1] == protocol.NcuProgress(kernel="saxpy", percent=70, passes=None,
                                              done=False)


def test_regex_escape() -> None:
    name = "void ns::k<float, 4>(float const*, int) [clone .kd]"
    assert regex_escape(name) == r"void ns::k<float, 4>\(float const\*, int\) \[clone \.kd\]"
