"""Workload strings, the bundled-workload table and what each workload declares.

Nothing here needs a GPU: constructors only validate and compute the declared work;
CuPy/torch are touched by ``setup()`` alone (tested on a GPU by the lead).
"""

from __future__ import annotations

import csv
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuws.kernels import builtin
from gpuws.kernels.registry import (
    BUILTINS,
    WorkloadError,
    WorkloadRef,
    make_builtin,
    parse_workload,
    validate,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "ncu-2025.3.1-h200"


def _ncu_kernel_name(csv_name: str) -> str:
    """The profiled kernel's name from an ``ncu --csv --page raw`` fixture."""
    text = (FIXTURES / csv_name).read_text(encoding="utf-8")
    # ncu mixes its ==PROF== progress lines into stdout ahead of the CSV.
    rows = list(csv.reader(line for line in text.splitlines() if not line.startswith("==")))
    header = rows[0]
    return rows[2][header.index("Kernel Name")]


# ---------------------------------------------------------------------------- parsing
def test_builtin_params_are_typed() -> None:
    ref = parse_workload("builtin:saxpy?n=2**20&a=3.5")
    assert ref == WorkloadRef("builtin", "saxpy", {"n": 1 << 20, "a": 3.5})
    ref = parse_workload(" builtin:sdpa?B=2&causal=true&dtype=BF16 ")
    assert ref.params == {"B": 2, "causal": True, "dtype": "bf16"}


@pytest.mark.parametrize("text,value", [
    ("4096", 4096), ("1_000_000", 1_000_000), ("2**26", 1 << 26), ("2^10", 1024),
    ("1<<26", 1 << 26), ("1e6", 1_000_000), (" 64 ", 64),
])
def test_int_spellings(text: str, value: int) -> None:
    assert parse_workload(f"builtin:copy?n={text}").params["n"] == value


def test_canonical_string_round_trips() -> None:
    ref = parse_workload("builtin:gemm?m=1024&dtype=fp32&k=2**9")
    assert str(ref) == "builtin:gemm?m=1024&dtype=fp32&k=512"
    assert parse_workload(str(ref)) == ref
    assert str(parse_workload("builtin:saxpy")) == "builtin:saxpy"
    assert str(parse_workload("builtin:sdpa?causal=1")) == "builtin:sdpa?causal=true"


def test_cmd_is_kept_verbatim() -> None:
    command = "  python3 train.py --name 'a b' && echo done?x=1&y  "
    ref = parse_workload("cmd:" + command)
    assert ref.kind == "cmd" and ref.target == command and ref.params == {}
    assert str(ref) == "cmd:" + command


def test_file_path() -> None:
    assert parse_workload("file: bench/my bench.py ") == WorkloadRef(
        "file", "bench/my bench.py", {})


@pytest.mark.parametrize("text,expected", [
    ("saxpy", "must start with builtin:, file: or cmd:"),
    ("docker:thing", "must start with builtin:, file: or cmd:"),
    ("cmd:   ", "cmd: needs a command"),
    ("file:", "file: needs a path"),
    ("builtin:nope", "valid: copy (device-to-device"),
    ("builtin:saxpy?m=3", "saxpy has no parameter 'm'; valid: n (int, default 67108864), "
                          "a (float, default 2.0), block (int, default 256)"),
    ("builtin:saxpy?n=abc", "n='abc': expected an integer"),
    ("builtin:saxpy?n=1.5", "expected an integer"),
    ("builtin:saxpy?a=inf", "expected a finite number"),
    ("builtin:gemm?dtype=fp8", "expected one of fp32, fp16, bf16"),
    ("builtin:sdpa?causal=maybe", "expected true or false"),
    ("builtin:saxpy?n=1&n=2", "given twice"),
    ("builtin:saxpy?n", "has no value"),
])
def test_mistakes_say_what_is_valid(text: str, expected: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_workload(text)
    assert expected in str(info.value)


def test_mistakes_separate_the_problem_from_what_is_valid() -> None:
    """The laptop shows ``problem`` as the error and ``valid`` as its remedy."""
    with pytest.raises(WorkloadError) as info:
        parse_workload("builtin:saxpy?bogus=1")
    assert info.value.problem == "saxpy has no parameter 'bogus'"
    assert info.value.valid == ("valid: n (int, default 67108864), a (float, default 2.0), "
                                "block (int, default 256)")
    assert str(info.value) == f"{info.value.problem}; {info.value.valid}"  # what the pod logs


@pytest.mark.parametrize("text,problem", [
    ("builtin:saxpy?block=33", "saxpy: block=33: must be a multiple of 32"),
    ("builtin:copy?n=0", "copy: n=0: must be at least 1"),
    ("builtin:tiled_matmul?n=40000", "tiled_matmul: n=40000: must be between 1 and 32768"),
    ("builtin:nope", "unknown builtin workload 'nope'"),
    ("builtin:gemm?m=abc", "gemm: m='abc': expected an integer"),
])
def test_validate_runs_the_constructor_checks_without_a_gpu(text: str, problem: str) -> None:
    with pytest.raises(WorkloadError) as info:
        validate(text)
    assert info.value.problem.startswith(problem)
    assert info.value.valid.startswith("valid: ")


def test_validate_passes_what_only_the_pod_can_judge() -> None:
    # bf16 needs torch and every builtin a GPU: that is the pod's to say, not the laptop's.
    assert validate("builtin:gemm?dtype=bf16&m=2**10").params == {"dtype": "bf16", "m": 1024}
    assert validate("cmd:nvidia-smi").kind == "cmd"
    assert validate("file:bench.py").target == "bench.py"  # the laptop reads it, not this


def test_unknown_builtin_lists_every_name() -> None:
    with pytest.raises(ValueError) as info:
        parse_workload("builtin:matmul")
    for name in BUILTINS:
        assert name in str(info.value)


# ---------------------------------------------------------------------------- the table
def test_builtins_table() -> None:
    assert list(BUILTINS) == ["copy", "saxpy", "reduce", "naive_matmul", "tiled_matmul",
                              "gemm", "sdpa"]
    for spec in BUILTINS.values():
        assert spec.summary
        for p in spec.params:
            assert p.type in ("int", "float", "bool", "str") and p.help
            assert p.choices is None or p.default in p.choices
    defaults = {name: {p.name: p.default for p in spec.params} for name, spec in BUILTINS.items()}
    assert defaults["saxpy"]["n"] == 2**26
    assert defaults["tiled_matmul"]["n"] == defaults["naive_matmul"]["n"] == 4096
    assert set(defaults["sdpa"]) == {"B", "H", "S", "D", "dtype", "causal"}
    gemm_dtype = next(p for p in BUILTINS["gemm"].params if p.name == "dtype")
    assert gemm_dtype.choices == ("fp32", "fp16", "bf16")


# ---------------------------------------------------------------------------- declared work
def test_saxpy_declares_the_fixture_run() -> None:
    w = make_builtin("saxpy")
    n = 2**26  # the fixture's saxpy: grid 262144 x 256 threads = 2^26 elements
    assert (w.bytes_moved, w.flops, w.flops_kind) == (12.0 * n, 2.0 * n, "fp32")
    assert w.kernel_regex is not None
    assert re.search(w.kernel_regex, _ncu_kernel_name("saxpy_raw.csv"))
    human = (FIXTURES / "saxpy_human.txt").read_text(encoding="utf-8")
    assert "saxpy (262144, 1, 1)x(256, 1, 1)" in human
    assert w.describe().startswith("saxpy a=2.0 block=256 n=67108864")


def test_gemm_and_sdpa_regexes_match_real_kernel_names() -> None:
    gemm = make_builtin("gemm", {"dtype": "bf16"})
    assert gemm.kernel_regex is not None
    assert re.search(gemm.kernel_regex, _ncu_kernel_name("gemm_raw.csv"))  # nvjet_sm90_…
    sdpa = make_builtin("sdpa")
    profile = (FIXTURES / "torch_profiler_key_averages.txt").read_text(encoding="utf-8")
    kernel_line = next(line for line in profile.splitlines() if "fprop" in line)
    assert sdpa.kernel_regex is not None
    assert re.search(sdpa.kernel_regex, kernel_line.split()[0])


@pytest.mark.parametrize("params,nbytes,flops,kind", [
    ({"m": 128, "n": 256, "k": 64, "dtype": "fp16"},
     2 * (128 * 64 + 64 * 256 + 128 * 256), 2 * 128 * 256 * 64, "tensor"),
    ({"m": 8, "n": 8, "k": 8, "dtype": "fp32"}, 4 * 3 * 64, 2 * 512, "fp32"),
])
def test_gemm_declares(params: dict[str, object], nbytes: int, flops: int, kind: str) -> None:
    w = make_builtin("gemm", params)
    assert (w.bytes_moved, w.flops, w.flops_kind) == (nbytes, flops, kind)


def test_sdpa_declares_and_causal_halves() -> None:
    # The fixture's shape: 32 x 8 x 512 x 64, fp16.
    w = make_builtin("sdpa")
    assert w.flops == 4 * 32 * 8 * 512**2 * 64
    assert w.bytes_moved == 4 * 32 * 8 * 512 * 64 * 2
    assert w.flops_kind == "tensor"
    causal = make_builtin("sdpa", {"causal": "yes"})
    assert causal.flops == w.flops / 2 and causal.bytes_moved == w.bytes_moved


def test_other_builtins_declare() -> None:
    assert make_builtin("copy", {"n": 1000}).bytes_moved == 8000
    assert make_builtin("copy").kernel_regex is None  # a memcpy is no kernel for ncu
    assert make_builtin("copy", {"impl": "kernel"}).kernel_regex == "copy_kernel"
    reduce = make_builtin("reduce", {"n": 1000})
    assert (reduce.bytes_moved, reduce.flops) == (4000, 1000)
    for name in ("naive_matmul", "tiled_matmul"):
        w = make_builtin(name, {"n": 100})
        assert (w.bytes_moved, w.flops, w.kernel_regex) == (12 * 100**2, 2 * 100**3, name)


def test_kernel_names_exist_in_the_cuda_sources() -> None:
    sources = builtin._STREAM_SRC + builtin._REDUCE_SRC + builtin._MATMUL_SRC
    for name in ("copy_kernel", "saxpy", "reduce_sum", "naive_matmul", "tiled_matmul"):
        assert re.search(rf'extern "C" __global__ void {name}\(', sources), name
    # The tiled kernel really uses 32x32 shared tiles.
    assert "#define TILE 32" in builtin._MATMUL_SRC
    assert builtin.TiledMatmul.BLOCK == (32, 32)


@pytest.mark.parametrize("name,params,expected", [
    ("saxpy", {"block": 33}, "multiple of 32"),
    ("saxpy", {"block": 2048}, "multiple of 32"),
    ("copy", {"n": 0}, "n=0: must be at least 1"),
    ("tiled_matmul", {"n": 40000}, "between 1 and 32768"),
    ("sdpa", {"S": -1}, "S=-1"),
    ("gemm", {"bogus": 1}, "gemm has no parameter 'bogus'"),
    ("nope", {}, "unknown builtin workload 'nope'"),
])
def test_make_builtin_rejects(name: str, params: dict[str, object], expected: str) -> None:
    with pytest.raises(ValueError) as info:
        make_builtin(name, params)
    assert expected in str(info.value)


def test_make_builtin_accepts_strings_and_typed_values() -> None:
    a = make_builtin("gemm", {"m": "2**10", "dtype": "FP32"})
    b = make_builtin("gemm", {"m": 1024, "dtype": "fp32"})
    assert a.params == b.params and a.params["n"] == 4096


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_torch_workloads_say_torch_is_missing() -> None:
    with pytest.raises(ValueError) as info:
        make_builtin("gemm", {"dtype": "bf16"}).setup()
    assert "needs torch" in str(info.value) and "no bfloat16" in str(info.value)
    with pytest.raises(ValueError, match="sdpa needs torch"):
        make_builtin("sdpa").setup()


def test_import_is_gpu_free() -> None:
    code = ("import sys, gpuws.kernels.registry, gpuws.remote_agent.measure.tier1; "
            "bad = [m for m in ('cupy', 'numpy', 'torch') if m in sys.modules]; "
            "sys.exit(str(bad) if bad else 0)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
