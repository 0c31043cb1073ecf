"""Every name pair recorded on the H200 (tests/fixtures/kernel-names-h200/names.json).

torch.profiler's names of each kernel family and of an HF ``generate`` against ncu's
demangled (as its CSV prints it, and as its filter listing spells it), mangled and
function names of the same kernels: each torch name finds its ncu twins, and nothing
else of the same base name; each ncu launch's three names are one kernel.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpuws.remote_agent.verdicts.kernelnames import (
    BASE,
    EXACT,
    TEMPLATE,
    base_name,
    best_match,
    is_mangled,
    ncu_regex,
    same_kernel,
)

NAMES = json.loads((Path(__file__).parents[2] / "fixtures" / "kernel-names-h200" /
                    "names.json").read_text())
#: Families whose kernel both torch.profiler and ncu (its first 120 launches) saw.
FAMILIES = {"distribution_elementwise_grid_stride_kernel", "unrolled_elementwise_kernel",
            "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "softmax_warp_forward",
            "vectorized_layer_norm_kernel", "_scale_kernel", "saxpy", "gen_sequenced",
            "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_"
            "4x1x1_cga1x1x1_kernel0_0", "elementwise_kernel", "reduce_kernel",
            "CatArrayBatchedCopy_vectorized", "index_elementwise_kernel",
            "_scatter_gather_elementwise_kernel", "vectorized_elementwise_kernel",
            "generate_seed_pseudo", "cupy_random_x_mod_1"}


def twins(torch: str, program: str) -> list[dict[str, str]]:
    return [k for k in NAMES[f"ncu_{program}"] if same_kernel(torch, k["demangled"]) == EXACT]


@pytest.mark.parametrize("program", ["families", "hf"])
def test_each_ncu_launch_is_one_kernel_in_its_three_names(program: str) -> None:
    kernels = NAMES[f"ncu_{program}"]
    for k in kernels:
        dem, mangled = k["demangled"], k["mangled"]
        assert same_kernel(dem, mangled) in ((TEMPLATE,) if is_mangled(mangled) else (EXACT,)), k
        if "function" in k:
            assert base_name(dem) == base_name(mangled) == k["function"]
            assert same_kernel(dem, k["function"]) in (EXACT, BASE)
    # No false twin: a demangled name is another launch's mangled kernel only where both
    # are one kernel (the same canonical name).
    for a in kernels:
        for b in kernels:
            if a is not b and is_mangled(b["mangled"]):
                grade = same_kernel(a["demangled"], b["mangled"])
                assert grade != TEMPLATE or same_kernel(a["demangled"], b["demangled"]) == EXACT


@pytest.mark.parametrize("program", ["families", "hf"])
def test_each_torch_name_finds_its_ncu_twin_and_no_sibling(program: str) -> None:
    found = set()
    demangled = [k["demangled"] for k in NAMES[f"ncu_{program}"]]
    for torch in NAMES[f"torch_{program}"]:
        pair = twins(torch, program)
        if not pair:
            continue  # launched where ncu's first launches did not reach
        assert len(pair) == 1, (torch, pair)
        (twin,) = pair
        found.add(base_name(torch))
        # … under every name ncu has for it …
        if is_mangled(twin["mangled"]):
            assert same_kernel(torch, twin["mangled"]) == TEMPLATE
            assert best_match(torch, [k["mangled"] for k in NAMES[f"ncu_{program}"]]) == (
                twin["mangled"], TEMPLATE)
        # … and ncu's filter written from torch's name takes it and none of its siblings.
        regex = ncu_regex(torch)
        assert [d for d in demangled if re.search(regex, d)] == [twin["demangled"]], torch
    if program == "families":
        assert found == FAMILIES
    else:
        assert len(found) >= 20


def test_the_listing_of_the_issues_miss_holds_the_top_kernel() -> None:
    listed = NAMES["ncu_hf_miss_listed"]
    for torch in NAMES["torch_hf"]:
        regex = ncu_regex(torch)
        hits = [n for n in listed if re.search(regex, n)]
        match = best_match(torch, listed)
        assert hits == ([match[0]] if match[0] else []), torch
        if hits:
            assert match[1] == EXACT
    top = NAMES["torch_hf"][0]
    assert best_match(top, listed)[0] is not None


def test_coverage_counts_the_twin_and_not_a_sibling() -> None:
    """Tier 3 checked against Tier 2: ncu's spelling of Tier 2's top kernel is that kernel;
    another instance of the same function (same short name) is not."""
    from gpuws.remote_agent.verdicts.kernel import coverage

    top = NAMES["torch_hf"][0]
    twin = best_match(top, NAMES["ncu_hf_miss_listed"])[0]
    sibling = next(n for n in NAMES["ncu_hf_miss_listed"]
                   if base_name(n) == "elementwise_kernel" and same_kernel(top, n) == BASE)
    table = {"kernels": [{"name": top, "share_pct": 30.0}]}
    hit = coverage(table, [str(twin)], regex=ncu_regex(top), launch_skip=0, launch_count=1)
    assert [r["name"] for r in hit["profiled"]] == [top] and hit["others"] == []
    miss = coverage(table, [sibling], regex=ncu_regex(top), launch_skip=0, launch_count=1)
    assert miss["profiled"] == [] and miss["others"] == [sibling]
    assert miss["missed"][0]["why"].startswith("matched, but --launch-count 1")


def test_a_missed_kernels_why_shows_the_long_filter_cut() -> None:
    from gpuws.remote_agent.verdicts.kernel import coverage

    top, other = NAMES["torch_hf"][0], NAMES["torch_hf"][1]
    regex = ncu_regex(top)
    table = {"kernels": [{"name": top, "share_pct": 30.0}, {"name": other, "share_pct": 9.0}]}
    got = coverage(table, [top], regex=regex, launch_skip=0, launch_count=1)
    why = got["missed"][0]["why"]
    assert why.startswith("not matched by the filter regex:(^|") and why.endswith("…")
    assert len(why) < 160 and got["regex"] == regex
