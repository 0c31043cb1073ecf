"""The shared family classifier on real kernel names recorded on an H200."""

from __future__ import annotations

import json
from pathlib import Path

from gpuws.remote_agent.verdicts.program import family
from gpuws.timeline.families import FAMILY_COLOURS, FAMILY_ORDER, kernel_family

NAMES = Path(__file__).parents[1] / "fixtures" / "kernel-names-h200" / "names.json"


def _torch_names() -> list[str]:
    data = json.loads(NAMES.read_text())
    return [n for key in ("torch_families", "torch_hf", "torch_ddp")
            for n in data[key] if isinstance(n, str)]


def test_every_real_name_gets_the_verdicts_family_and_a_colour() -> None:
    names = _torch_names()
    assert len(names) > 50
    for name in names:
        fam = kernel_family(name)
        assert fam == family(name)  # one classifier: the picture agrees with the verdict
        assert fam in FAMILY_ORDER and fam in FAMILY_COLOURS
    seen = {kernel_family(n) for n in names}
    assert {"GEMM", "attention", "elementwise", "reduction", "copy/memset",
            "normalisation"} <= seen


def test_real_names_of_each_family() -> None:
    names = _torch_names()
    nvjet = next(n for n in names if n.startswith("nvjet_sm90"))
    sdpa = next(n for n in names if "sdpa" in n)
    assert kernel_family(nvjet) == "GEMM"
    assert kernel_family(sdpa) == "attention"
    assert kernel_family("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)") \
        == "communication"
    assert kernel_family("cupy_random_x_mod_1") == "other"


def test_the_category_of_a_trace_event_wins_for_copies() -> None:
    # torch.profiler names a copy "Memcpy HtoD (Pageable -> Device)" but a memset may
    # be named anything; the category says what the GPU did.
    assert kernel_family("Memset (Device)", "gpu_memset") == "copy/memset"
    assert kernel_family("x", "memcpy") == "copy/memset"
    assert kernel_family("x", "MEMSET") == "copy/memset"
    assert kernel_family("nvjet_sm90_tst", "kernel") == "GEMM"


def test_worst_names_are_classified_not_raised() -> None:
    for name in ("", "\x00\x1b[31m", "</svg><script>&", "a" * 100_000):
        assert kernel_family(name) in FAMILY_ORDER


def test_colours_are_distinct_and_cover_every_family() -> None:
    assert set(FAMILY_COLOURS) == set(FAMILY_ORDER)
    assert len(set(FAMILY_COLOURS.values())) == len(FAMILY_COLOURS)
