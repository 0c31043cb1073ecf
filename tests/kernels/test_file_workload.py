"""``file:`` workloads: a person's Python file executed as a module and wrapped.

The files written here do plain Python work in ``run`` (no GPU exists on CI machines);
what is tested is the contract: which names are read, when, and what a broken file says.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpuws.kernels.workload import FileWorkload, load_file_workload


def _write(tmp_path: Path, source: str, name: str = "bench.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return str(path)


def test_setup_state_reaches_run_and_declarations(tmp_path: Path) -> None:
    path = _write(tmp_path, """
        N = 1000
        KERNEL_REGEX = "my_kernel"
        FLOPS_KIND = "tensor"
        calls = []

        def setup():
            return {"n": N, "buf": [0.0] * N}

        def run(state):
            calls.append(state["n"])

        def bytes_moved(state):
            return 8 * state["n"]

        def flops():
            return 2 * N
    """)
    w = load_file_workload(path)
    assert isinstance(w, FileWorkload)
    assert w.name == "file:bench.py"
    assert (w.kernel_regex, w.flops_kind) == ("my_kernel", "tensor")
    before: tuple[Any, Any] = (w.bytes_moved, w.flops)
    assert before == (None, None)  # functions wait for setup()
    w.setup()
    assert (w.bytes_moved, w.flops) == (8000.0, 2000.0)
    w.run()
    w.run()
    assert w.module.calls == [1000, 1000]
    assert w.static_kernels() == [] and w.check() is None
    assert "bytes=8000" in w.describe() and path in w.describe()


def test_constants_and_run_without_setup(tmp_path: Path) -> None:
    path = _write(tmp_path, """
        BYTES = 3 * 4 * 2**20
        FLOPS = 2.0 * 2**20
        count = 0

        def run():
            global count
            count += 1
    """)
    w = load_file_workload(path)
    assert (w.bytes_moved, w.flops, w.kernel_regex) == (12 * 2**20, 2.0 * 2**20, None)
    w.setup()
    w.run()
    assert w.module.count == 1


def test_helpers_beside_the_file_import(tmp_path: Path) -> None:
    _write(tmp_path, "SCALE = 7\n", name="helper_for_bench.py")
    path = _write(tmp_path, """
        import helper_for_bench

        def run():
            return helper_for_bench.SCALE
    """)
    before = list(sys.path)
    try:
        w = load_file_workload(path)
        assert w.module.helper_for_bench.SCALE == 7
        assert sys.path == before  # the folder is added only while the file executes
    finally:
        sys.modules.pop("helper_for_bench", None)


def test_missing_run(tmp_path: Path) -> None:
    path = _write(tmp_path, "def setup():\n    return 1\n")
    with pytest.raises(ValueError) as info:
        load_file_workload(path)
    assert str(info.value).startswith(f"{path}: defines no run() function")


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "import math\n\ndef run(:\n    pass\n")
    with pytest.raises(ValueError) as info:
        load_file_workload(path)
    assert str(info.value).startswith(f"{path}:3: syntax error")


def test_error_while_executing_names_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "x = 1\ny = undefined_name + x\n\ndef run():\n    pass\n")
    with pytest.raises(ValueError) as info:
        load_file_workload(path)
    assert str(info.value) == f"{path}:2: NameError: name 'undefined_name' is not defined"


def test_sys_exit_at_top_level_is_an_error_not_an_exit(tmp_path: Path) -> None:
    path = _write(tmp_path, "import sys\nsys.exit(3)\n")
    with pytest.raises(ValueError) as info:
        load_file_workload(path)
    assert str(info.value) == f"{path}:2: SystemExit: 3"


def test_main_guard_does_not_run(tmp_path: Path) -> None:
    path = _write(tmp_path, """
        ran = []

        def run():
            ran.append(1)

        if __name__ == "__main__":
            raise RuntimeError("executed as a script")
    """)
    assert load_file_workload(path).module.ran == []


def test_error_in_setup_names_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path, """
        def setup():
            return 1 / 0

        def run(state):
            pass
    """)
    w = load_file_workload(path)
    with pytest.raises(ValueError) as info:
        w.setup()
    assert str(info.value) == f"{path}:3: ZeroDivisionError: division by zero"


def test_run_must_take_the_setup_state(tmp_path: Path) -> None:
    path = _write(tmp_path, "def setup():\n    return 1\n\n\ndef run():\n    pass\n")
    with pytest.raises(ValueError) as info:
        load_file_workload(path)
    assert str(info.value).startswith(f"{path}:5: run() takes no argument")


@pytest.mark.parametrize("source,expected", [
    ("run = 3\n", "run is a int, not a function"),
    ("BYTES = 'lots'\ndef run():\n    pass\n", "BYTES = 'lots'; it must be a number"),
    ("FLOPS = True\ndef run():\n    pass\n", "FLOPS = True; it must be a number"),
])
def test_bad_declarations(tmp_path: Path, source: str, expected: str) -> None:
    path = _write(tmp_path, source)
    with pytest.raises(ValueError) as info:
        load_file_workload(path)
    assert expected in str(info.value)


def test_bad_function_declaration_after_setup(tmp_path: Path) -> None:
    path = _write(tmp_path, "def run():\n    pass\n\ndef flops():\n    return 'many'\n")
    w = load_file_workload(path)
    with pytest.raises(ValueError, match=r"flops\(\) returned 'many'"):
        w.setup()


def test_missing_file(tmp_path: Path) -> None:
    path = str(tmp_path / "absent.py")
    with pytest.raises(ValueError) as info:
        load_file_workload(path)
    assert str(info.value).startswith(f"{path}: cannot read the workload file")
