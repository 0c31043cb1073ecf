"""nsys's spellings of a kernel against torch.profiler's and ncu's (issue 32).

Where Tier 2 comes from nsys, its table names kernels as nsys does, and Tier 3 builds
ncu's filter from that name. The nsys names here are real: the reports of
tests/fixtures/nsys-2023.4.4-h100 (nsys 2023.4.4 on an H100, torch 2.11+cu130 and CuPy;
that README says how), read the way Tier 2 reads them (``nsys stats``'s
``cuda_gpu_kern_sum`` CSV and the SQLite export's ``demangledName``, ``shortName`` and
``mangledName``). The torch and ncu names are those recorded on an H200 with the same
torch (tests/fixtures/kernel-names-h200): the torch capture's one kernel is
``torch.randn``'s ``distribution_elementwise_grid_stride_kernel<float, 4, …normal…>``,
which the H200 recording holds too, next to its bfloat16 and ``unsigned int`` siblings
(the same function, other template arguments).

nsys writes ``at::native::<unnamed>::…<float, (int)4, …>`` and ``[lambda() (instance 1)]``
(ncu's filter listing's style), torch ``(anonymous namespace)`` and ``4``, ncu's CSV
``at::<unnamed>::…``: one kernel to :mod:`kernelnames`, and none of its siblings.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from gpuws.remote_agent.measure.tier2_parse import (
    parse_nsys_kern_sum_csv,
    parse_nsys_sqlite,
    rank_kernels,
)
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

FIXTURES = Path(__file__).parents[2] / "fixtures"
NSYS = FIXTURES / "nsys-2023.4.4-h100"
NAMES = json.loads((FIXTURES / "kernel-names-h200" / "names.json").read_text())


def nsys_names(program: str) -> list[tuple[str, str, str]]:
    """(demangled, short, mangled) of each kernel of an nsys SQLite export, as stored."""
    con = sqlite3.connect(f"file:{NSYS / f'nsys_{program}.sqlite'}?mode=ro", uri=True)
    try:
        return [(str(d), str(s), str(m)) for d, s, m in con.execute(
            "SELECT DISTINCT d.value, s.value, m.value FROM CUPTI_ACTIVITY_KIND_KERNEL AS k "
            "JOIN StringIds AS d ON d.id = k.demangledName "
            "JOIN StringIds AS s ON s.id = k.shortName "
            "JOIN StringIds AS m ON m.id = k.mangledName ORDER BY 1")]
    finally:
        con.close()


def tier2_names(program: str) -> list[str]:
    """The names of Tier 2's table from nsys, by both of its ways (stats CSV, SQLite)."""
    csv_rows = parse_nsys_kern_sum_csv(
        (NSYS / f"stats_{program}_cuda_gpu_kern_sum.csv").read_text())
    sql_rows = parse_nsys_sqlite(str(NSYS / f"nsys_{program}.sqlite"))["kernels"]
    from_csv = [r["name"] for r in rank_kernels(csv_rows)]
    assert sorted(from_csv) == sorted(r["name"] for r in sql_rows)
    return from_csv


def test_nsys_names_torchs_normal_kernel_as_torch_and_ncu_do() -> None:
    ((dem, short, mangled),) = nsys_names("torch")
    assert tier2_names("torch") == [dem]
    assert "(int)4" in dem and "<unnamed>" in dem and "(instance 2)" in dem  # nsys's own style
    ncu = NAMES["ncu_families"]
    twins = [k for k in ncu if same_kernel(dem, k["demangled"]) == EXACT]
    assert len(twins) == 1
    (twin,) = twins
    # Every name ncu gives it: demangled (CSV), mangled (the same symbol on both
    # machines), function base; and nsys's mangled and short names are the same kernel.
    assert mangled == twin["mangled"] and same_kernel(mangled, twin["mangled"]) == EXACT
    assert same_kernel(dem, twin["mangled"]) == same_kernel(mangled, twin["demangled"]) == TEMPLATE
    assert short == base_name(dem) == base_name(mangled) == twin["function"]
    # torch.profiler's spelling of it: the first of the families torch recorded.
    torch = [t for t in NAMES["torch_families"] if same_kernel(dem, t) == EXACT]
    assert torch == [NAMES["torch_families"][0]] and canonical(torch[0]) == canonical(dem)


def test_the_siblings_of_nsys_s_kernel_are_other_kernels() -> None:
    ((dem, _short, mangled),) = nsys_names("torch")
    siblings = [k for k in NAMES["ncu_families"] if base_name(k["demangled"]) == base_name(dem)
                and k["mangled"] != mangled]
    assert len(siblings) == 2  # bfloat16's normal and unsigned int's random_
    for k in siblings:
        assert same_kernel(dem, k["demangled"]) == BASE
        assert same_kernel(dem, k["mangled"]) == BASE
    torch_siblings = [t for t in NAMES["torch_families"]
                      if base_name(t) == base_name(dem) and same_kernel(dem, t) != EXACT]
    assert len(torch_siblings) == 2 and all(same_kernel(dem, t) == BASE for t in torch_siblings)


def test_tier3s_filter_from_nsys_s_name_takes_ncus_twin_and_no_sibling() -> None:
    """Tier 2 from nsys, Tier 3 from ncu: the filter written from nsys's name."""
    (dem,) = tier2_names("torch")
    regex = ncu_regex(dem)
    ncu = NAMES["ncu_families"]
    hits = [k["demangled"] for k in ncu if re.search(regex, k["demangled"])]
    assert len(hits) == 1 and same_kernel(dem, hits[0]) == EXACT
    assert best_match(dem, [k["demangled"] for k in ncu])[1] == EXACT
    assert best_match(dem, [k["mangled"] for k in ncu]) == (ncu[0]["mangled"], TEMPLATE)
    # And the other way: torch's name (Tier 2 without nsys) finds nsys's spelling.
    assert re.search(ncu_regex(NAMES["torch_families"][0]), dem)
    for sibling in NAMES["torch_families"][1:]:
        if base_name(sibling) == base_name(dem):
            assert not re.search(ncu_regex(sibling), dem), sibling


@pytest.mark.parametrize("kernel", ["saxpy", "cupy_fill", "cupy_arange__float_float_float32"])
def test_cupy_kernels_are_their_own_names_in_every_tool(kernel: str) -> None:
    """An ``extern "C"`` kernel has one name: nsys's three columns agree, and ncu's
    recorded CuPy saxpy is the same kernel."""
    names = {d: (s, m) for d, s, m in nsys_names("cupy")}
    assert names[kernel] == (kernel, kernel) and kernel in tier2_names("cupy")
    assert re.search(ncu_regex(kernel), kernel)
    if kernel == "saxpy":
        (ncu,) = [k for k in NAMES["ncu_families"] if k["function"] == "saxpy"]
        assert same_kernel(kernel, ncu["demangled"]) == EXACT
        assert re.search(ncu_regex(kernel), ncu["demangled"])
    assert not re.search(ncu_regex("saxpy"), "cupy_saxpy_2") and not re.search(
        ncu_regex("cupy_fill"), "cupy_fill_2")
