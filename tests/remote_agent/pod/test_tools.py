"""Discovery of ncu / nsys / nvcc and their version parsers."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import msgspec
import pytest

from gpuws.protocol import ToolInstall
from gpuws.remote_agent.pod import tools

FIXTURES = Path(__file__).parents[2] / "fixtures" / "ncu-2025.3.1-h200"
NCU_VERSION = (FIXTURES / "ncu_version.txt").read_text()

# `nvcc --version` of the CUDA 13.0 toolkit (run on the gpuws dev machine, /usr/local/cuda-13.0).
NVCC_13 = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:58:59_PM_PDT_2025
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0
"""
# The CUDA 11.8 toolkit's answer (same layout, older release).
NVCC_11 = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2022 NVIDIA Corporation
Built on Wed_Sep_21_10:33:58_PDT_2022
Cuda compilation tools, release 11.8, V11.8.89
Build cuda_11.8.r11.8/compiler.31833905_0
"""
# `nsys --version` lines as printed by real installs (Nsight Systems 2024.5 and 2025.1).
NSYS_2024 = "NVIDIA Nsight Systems version 2024.5.1.113-245134619542v0\n"
NSYS_2025 = "NVIDIA Nsight Systems version 2025.1.1.0\n"


def test_parse_ncu_version_of_real_output() -> None:
    assert tools.parse_ncu_version(NCU_VERSION) == "2025.3.1.0"
    assert tools.parse_ncu_version("ncu: command not found") is None


def test_parse_nsys_version_drops_build_suffix() -> None:
    assert tools.parse_nsys_version(NSYS_2024) == "2024.5.1.113"
    assert tools.parse_nsys_version(NSYS_2025) == "2025.1.1.0"
    assert tools.parse_nsys_version(NCU_VERSION) is None


def test_parse_nvcc_version() -> None:
    assert tools.parse_nvcc_version(NVCC_13) == "13.0.88"
    assert tools.parse_nvcc_version(NVCC_11) == "11.8.89"
    assert tools.parse_nvcc_version("Cuda compilation tools, release 10.2") == "10.2"
    assert tools.parse_nvcc_version("") is None


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _printer(path: Path, output: str, exit_code: int = 0) -> Path:
    """An executable that prints ``output`` (a real tool's answer) and exits."""
    return _script(path, f"#!{sys.executable}\nimport sys\nsys.stdout.write({output!r})\n"
                         f"sys.exit({exit_code})\n")


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """A small real install tree: two ncu under opt, a toolkit with launchers, a home."""
    local, opt, home, bin_dir = (tmp_path / d for d in ("local", "opt", "home", "bin"))
    new = _printer(opt / "nsight-compute" / "2025.3.1" / "ncu", NCU_VERSION)
    old = _printer(opt / "nsight-compute" / "2024.1.1" / "ncu",
                   NCU_VERSION.replace("2025.3.1.0", "2024.1.1.0"))
    _printer(opt / "nsight-compute" / "2025.3.1" / "host" / "target-linux-x64" / "nsys",
             "should never run")
    nvcc = _printer(local / "cuda-13.0" / "bin" / "nvcc", NVCC_13)
    (local / "cuda").symlink_to(local / "cuda-13.0")
    # The toolkit's bin/ncu is a script that runs the newest /opt/nvidia/nsight-compute/*.
    _script(local / "cuda-13.0" / "bin" / "ncu",
            '#!/bin/sh\nfor d in /opt/nvidia/nsight-compute/*; do :; done\n'
            'exec "$LATEST_NSIGHT_COMPUTE_TOOL_DIR/ncu" "$@"\n')
    _script(bin_dir / "nvcc", f'#!/bin/sh\nexec {nvcc} "$@"\n')
    home_ncu = _printer(home / "NVIDIA-Nsight-Compute-2024.3" / "ncu",
                        NCU_VERSION.replace("2025.3.1.0", "2024.3.2.0"))
    nsys = _printer(opt / "nsight-systems" / "2024.5.1" / "bin" / "nsys", NSYS_2024)
    return {"local": local, "opt": opt, "home": home, "bin": bin_dir, "new": new, "old": old,
            "nvcc": nvcc, "home_ncu": home_ncu, "nsys": nsys}


def test_find_ncu_dedupes_launcher_and_orders_newest_first(tree: dict[str, Path]) -> None:
    found = tools.find_ncu(path_env=str(tree["local"] / "cuda" / "bin"), home=str(tree["home"]),
                           roots=(str(tree["local"]), str(tree["opt"])))
    # The toolkit launcher on PATH is reported as the install it runs (the newest).
    assert found == [str(tree["new"]), str(tree["old"]), str(tree["home_ncu"])]
    installs = tools.ncu_installs(found)
    assert [i["version"] for i in installs] == ["2025.3.1.0", "2024.1.1.0", "2024.3.2.0"]
    for item in installs:
        msgspec.convert(item, ToolInstall)


def test_find_nvcc_follows_symlinks_and_exec_wrappers(tree: dict[str, Path]) -> None:
    found = tools.find_nvcc(path_env=str(tree["bin"]), environ={"CUDA_HOME": str(
        tree["local"] / "cuda")}, local=str(tree["local"]))
    assert found == [str(tree["nvcc"])]
    # What all_installs (the probe's) runs for each nvcc found.
    assert [tools.run_version(p, tools.parse_nvcc_version) for p in found] == [
        {"path": str(tree["nvcc"]), "version": "13.0.88", "error": None}]


def test_bundled_nsys_is_marked_and_never_run(tree: dict[str, Path]) -> None:
    bundled_dir = tree["opt"] / "nsight-compute" / "2025.3.1" / "host" / "target-linux-x64"
    found = tools.find_nsys(path_env=str(bundled_dir), home=str(tree["home"]),
                            roots=(str(tree["local"]), str(tree["opt"])))
    assert found == [str(bundled_dir / "nsys"), str(tree["nsys"])]
    installs = tools.nsys_installs(found)
    assert installs[0]["version"] is None
    assert "bundled inside Nsight Compute" in installs[0]["error"]
    assert installs[1] == {"path": str(tree["nsys"]), "version": "2024.5.1.113", "error": None}
    assert tools.is_ncu_bundled_nsys(
        "/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys")
    assert not tools.is_ncu_bundled_nsys("/opt/nvidia/nsight-systems/2024.5.1/bin/nsys")


def test_run_version_records_failures(tmp_path: Path) -> None:
    broken = _printer(tmp_path / "ncu",
                      "==ERROR== Cuda driver is not compatible with Nsight Compute.\n", 1)
    result = tools.run_version(str(broken), tools.parse_ncu_version)
    assert result["version"] is None
    assert result["error"] == ("--version exited 1: ==ERROR== Cuda driver is not compatible "
                               "with Nsight Compute.")
    hung = _script(tmp_path / "hung", "#!/bin/sh\nexec sleep 5\n")
    result = tools.run_version(str(hung), tools.parse_ncu_version, timeout=0.3)
    assert result["error"] == "--version did not answer within 0.3 s"
    missing = tools.run_version(str(tmp_path / "nope"), tools.parse_ncu_version)
    assert missing["error"] is not None and missing["error"].startswith("cannot run:")
    msgspec.convert(missing, ToolInstall)


def test_all_installs_on_this_machine_decode() -> None:
    found = tools.all_installs()
    assert set(found) == {"ncu", "nsys", "toolkits"}
    for items in found.values():
        paths = [os.path.realpath(i["path"]) for i in items]
        assert len(paths) == len(set(paths))
        for item in items:
            msgspec.convert(item, ToolInstall)
