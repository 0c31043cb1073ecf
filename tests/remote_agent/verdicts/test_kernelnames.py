"""One kernel under every tool's spelling (:mod:`gpuws.remote_agent.verdicts.kernelnames`).

The spellings of the issue (torch.profiler's ``elementwise_kernel<128, 4, …>`` against
ncu's ``elementwise_kernel<(int)128, (int)4, …>``, ``(anonymous namespace)`` against
``<unnamed>``, ``{lambda(int)#1}`` against ``[lambda(int) (instance 1)]``) here; the
pairs recorded on the H200 in test_kernelnames_h200.py.
"""

from __future__ import annotations

import re

import pytest

from gpuws.remote_agent.verdicts.kernelnames import (
    BASE,
    EXACT,
    TEMPLATE,
    base_name,
    best_match,
    canonical,
    ncu_regex,
    same_kernel,
)

TORCH = ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<"
         "at::native::(anonymous namespace)::copy_kernel(at::TensorIteratorBase&)::"
         "{lambda()#3}::operator()() const::{lambda(c10::Half)#1}>(at::TensorIteratorBase&, "
         "at::native::(anonymous namespace)::copy_kernel(at::TensorIteratorBase&)::"
         "{lambda()#3}::operator()() const::{lambda(c10::Half)#1} const&)::{lambda(int)#1}>"
         "(int, at::native::gpu_kernel_impl_nocast<at::native::(anonymous namespace)::"
         "copy_kernel(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::"
         "{lambda(c10::Half)#1}>(at::TensorIteratorBase&, at::native::(anonymous namespace)::"
         "copy_kernel(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::"
         "{lambda(c10::Half)#1} const&)::{lambda(int)#1})")
NCU = ("void at::native::elementwise_kernel<(int)128, (int)4, void at::native::"
       "gpu_kernel_impl_nocast<void at::native::<unnamed>::copy_kernel(at::TensorIteratorBase &)"
       "::[lambda() (instance 3)]::operator ()() const::[lambda(c10::Half) (instance 1)]>"
       "(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)")
#: The same kernel's lambda #4: another dispatch case, another kernel.
SIBLING = NCU.replace("instance 3", "instance 4")
MANGLED = ("_ZN2at6native18elementwise_kernelILi128ELi4EZNS0_22gpu_kernel_impl_nocastIZZNS0_"
           "12_GLOBAL__N_111copy_kernelERNS_18TensorIteratorBaseEENKUlvE1_clEvEUlN3c104HalfEE_"
           "EEvS5_RKT_EUliE_EEviT1_")


def test_every_spelling_of_one_kernel_has_one_key() -> None:
    assert canonical(TORCH) == canonical(NCU)
    assert canonical(TORCH).startswith("elementwise_kernel 128 4 gpu_kernel_impl_nocast")
    # ncu 2025.3 leaves out a namespace torch writes: qualifiers are no part of the key.
    assert canonical(NCU.replace("at::native::", "at::")) == canonical(TORCH)
    assert canonical(SIBLING) != canonical(NCU)
    assert {base_name(n) for n in (TORCH, NCU, MANGLED, "elementwise_kernel")} == {
        "elementwise_kernel"}


@pytest.mark.parametrize(("a", "b", "grade"), [
    (TORCH, NCU, EXACT),
    (TORCH, MANGLED, TEMPLATE),
    (NCU, MANGLED, TEMPLATE),
    (TORCH, "elementwise_kernel", BASE),
    (TORCH, SIBLING, BASE),
    (TORCH, "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>,"
            " std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, "
            "std::array<char*, 1ul>)", None),
    ("saxpy", "saxpy", EXACT),
    ("triton_poi_fused_add_0", "triton_poi_fused_mul_0", None),
    # A tool that cuts long names short (Kineto's table, nsys's) still names the kernel.
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wg...",
     "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_kernel0",
     EXACT),
    ("", "saxpy", None),
])
def test_same_kernel_grades(a: str, b: str, grade: str | None) -> None:
    assert same_kernel(a, b) == grade
    assert same_kernel(b, a) == grade


def test_literal_spellings() -> None:
    torch = "void k<true, 1ul, 4u>(float*)"
    ncu = "void k<(bool)1, (unsigned long)1, (unsigned int)4>(float *)"
    assert canonical(torch) == canonical(ncu) == "k 1 1 4"
    assert same_kernel("void k<false>(int)", "void k<(bool)1>(int)") == BASE


def test_the_regex_matches_every_spelling_and_no_sibling() -> None:
    regex = ncu_regex(TORCH)
    for spelling in (TORCH, NCU):
        assert re.search(regex, spelling), spelling
    assert not re.search(regex, SIBLING)
    # A longer name ending in the same words is another function.
    assert not re.search(ncu_regex("elementwise_kernel"), "vectorized_elementwise_kernel")
    assert re.search(ncu_regex("elementwise_kernel"), "void at::native::elementwise_kernel<1>")
    # Only what any regex engine reads alike: no lookaround, no lazy quantifier, no \w.
    assert "(?" not in regex and "*?" not in regex and "\\w" not in regex


def test_the_regex_of_a_name_cut_short_ends_before_the_cut() -> None:
    cut = TORCH[:120] + "..."
    regex = ncu_regex(cut)
    assert re.search(regex, NCU) and re.search(regex, TORCH)


def test_best_match_prefers_the_surest_and_refuses_a_guess() -> None:
    listed = ["void at::native::vectorized_elementwise_kernel<4>(int)", SIBLING, NCU]
    assert best_match(TORCH, listed) == (NCU, EXACT)
    # Two instances of the base and no better grade: which one would be a guess.
    assert best_match(TORCH, [SIBLING, SIBLING.replace("instance 4", "instance 5")]) == (
        None, None)
    assert best_match(TORCH, ["elementwise_kernel", "saxpy"]) == ("elementwise_kernel", BASE)


@pytest.mark.parametrize("hostile", [
    "(" * 5000, ")" * 5000, "<" * 5000 + "k", "_Z" + "9" * 50, "_ZN" + "I" * 5000,
    "void " + "a::" * 3000 + "k<" + "1, " * 3000 + ">", "\x00\x1b[31m", "#" * 100,
], ids=lambda h: repr(h[:12]))
def test_names_that_are_no_names_never_break_it(hostile: str) -> None:
    canonical(hostile)
    base_name(hostile)
    same_kernel(hostile, TORCH)
    regex = ncu_regex(hostile)
    re.compile(regex)
    assert len(regex) <= 2600
