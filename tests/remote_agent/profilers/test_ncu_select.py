"""Choosing the ncu that fits the pod's driver and GPU, and the install plan when none does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuws import protocol
from gpuws.remote_agent.profilers.ncu_select import (
    KEYRING_INSTALL_PY,
    install_path_for,
    parse_ncu_version,
    parse_os_release,
    release_for,
    select_ncu,
    supports_arch,
    user_install_path_for,
)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "ncu-2025.3.1-h200"
UBUNTU_2404 = 'PRETTY_NAME="Ubuntu 24.04.3 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\nID=ubuntu\n' \
              "ID_LIKE=debian\n"

#: A pod with many ncu releases side by side (as CUDA toolkits leave them).
MANY = ["2022.3.0", "2023.2.2", "2024.1.1", "2024.3.2", "2025.1.1", "2025.3.1", "2025.4.1"]


def installs(versions: list[str]) -> list[dict[str, Any]]:
    return [{"path": f"/opt/nvidia/nsight-compute/{v}/ncu", "version": v, "error": None}
            for v in versions]


def as_plan(d: dict[str, Any]) -> protocol.NcuPlan:
    """The agent writes this dict by hand: it must decode strictly as the event."""
    return msgspec.convert(d, protocol.NcuPlan)


# Driver → newest of MANY that it runs, for GPUs every listed release supports (sm_80..sm_90).
EXPECTED_MODERN = {
    "520.61.05": "2022.3.0",
    "525.60.13": "2022.3.0",
    "535.104.05": "2023.2.2",
    "545.23.08": "2023.2.2",
    "550.54.15": "2024.1.1",
    "555.42.06": "2024.1.1",
    "560.35.05": "2024.3.2",
    "570.172.08": "2025.1.1",
    "575.57.08": "2025.1.1",
    "580.159.04": "2025.3.1",
    "590.44.01": "2025.4.1",
}
# Volta: nothing after 2024.x.
EXPECTED_VOLTA = {
    "520.61.05": "2022.3.0",
    "535.104.05": "2023.2.2",
    "550.54.15": "2024.1.1",
    "560.35.05": "2024.3.2",
    "570.172.08": "2024.3.2",
    "580.159.04": "2024.3.2",
    "590.44.01": "2024.3.2",
}
# Blackwell: 2025.1 or newer, so older drivers have nothing.
EXPECTED_BLACKWELL = {
    "520.61.05": None,
    "550.54.15": None,
    "560.35.05": None,
    "570.172.08": "2025.1.1",
    "575.57.08": "2025.1.1",
    "580.159.04": "2025.3.1",
    "590.44.01": "2025.4.1",
}


@pytest.mark.parametrize("cc", ["8.0", "8.6", "8.9", "9.0"])
@pytest.mark.parametrize(("driver", "expected"), sorted(EXPECTED_MODERN.items()))
def test_newest_compatible_for_modern_gpus(driver: str, expected: str, cc: str) -> None:
    plan = select_ncu(installs(MANY), driver, cc)
    assert plan["selected_version"] == expected
    assert plan["selected"] == install_path_for(expected)
    assert expected in plan["reason"] and driver in plan["reason"]
    assert plan["install_plan"] is None
    as_plan(plan)


@pytest.mark.parametrize(("driver", "expected"), sorted(EXPECTED_VOLTA.items()))
def test_volta_stops_at_2024(driver: str, expected: str) -> None:
    plan = select_ncu(installs(MANY), driver, "7.0")
    assert plan["selected_version"] == expected
    dropped = [c for c in plan["choices"] if c["version"].startswith("2025")]
    assert all(not c["compatible"] and "Volta" in c["reason"] for c in dropped)


@pytest.mark.parametrize("cc", ["10.0", "12.0", "sm_120"])
@pytest.mark.parametrize(("driver", "expected"), sorted(EXPECTED_BLACKWELL.items()))
def test_blackwell_needs_2025_1(driver: str, expected: str | None, cc: str) -> None:
    plan = select_ncu(installs(MANY), driver, cc, os_release=UBUNTU_2404)
    assert plan["selected_version"] == expected
    old = [c for c in plan["choices"] if c["version"] < "2025.1"]
    assert all(not c["compatible"] and "needs ncu 2025.1" in c["reason"] for c in old)
    if expected is None:
        # No release fits both the driver and the GPU: the driver must be upgraded.
        assert plan["install_plan"] is None
        assert "upgrade the driver" in plan["reason"]
    as_plan(plan)


def test_field_report_570_steps_back_from_2025_3() -> None:
    # Driver 570.172.08 fails with ncu 2025.3.1 and works with 2024.1.1 (reference notes).
    found = [{"path": "/usr/local/cuda/bin/ncu", "version": "2025.3.1.0", "error": None},
             {"path": "/usr/local/cuda-12.4/nsight-compute-2024.1.1/ncu", "version": "2024.1.1",
              "error": None}]
    plan = select_ncu(found, "570.172.08", "9.0", cuda_driver="12.8")
    assert plan["selected"] == "/usr/local/cuda-12.4/nsight-compute-2024.1.1/ncu"
    assert plan["cuda_driver"] == "12.8" and plan["arch"] == "sm_90"
    first = plan["choices"][0]
    assert first["version"] == "2025.3.1" and not first["compatible"]
    assert "580" in first["reason"] and "13.0" in first["reason"]
    assert as_plan(plan).selected_version == "2024.1.1"


def test_exclude_steps_back_one_release() -> None:
    found = installs(["2025.3.1", "2025.3.0", "2024.3.2"])
    first = select_ncu(found, "580.65.06", "9.0")
    assert first["selected_version"] == "2025.3.1"
    second = select_ncu(found, "580.65.06", "9.0", exclude={first["selected"]})
    assert second["selected_version"] == "2025.3.0"
    third = select_ncu(found, "580.65.06", "9.0", exclude=["2025.3.1", "2025.3.0"])
    assert third["selected_version"] == "2024.3.2"
    refused = [c for c in third["choices"] if not c["compatible"]]
    assert {c["version"] for c in refused} == {"2025.3.1", "2025.3.0"}
    assert all("excluded" in c["reason"] for c in refused)


def test_unknown_newer_release_assumes_the_newest_known_driver() -> None:
    found = installs(["2026.1.0", "2025.3.1"])
    new_driver = select_ncu(found, "595.10", "9.0")
    assert new_driver["selected_version"] == "2026.1.0"
    assert "assumed" in new_driver["choices"][0]["reason"]
    old_driver = select_ncu(found, "580.159.04", "9.0")
    assert old_driver["selected_version"] == "2025.3.1"
    newest = old_driver["choices"][0]
    assert not newest["compatible"] and "590" in newest["reason"] and "assumed" in newest["reason"]


def test_broken_and_unversioned_installs() -> None:
    found = [
        {"path": "/usr/bin/ncu", "version": None, "error": "exec format error"},
        {"path": "/opt/nvidia/nsight-compute/2024.3.2/ncu", "version": None, "error": None},
        {"path": "/opt/nvidia/nsight-compute/2024.3.2/ncu", "version": None, "error": None},
    ]
    plan = select_ncu(found, "560.35.05", "8.0")
    assert len(plan["choices"]) == 2  # the same path once
    broken = next(c for c in plan["choices"] if c["path"] == "/usr/bin/ncu")
    assert not broken["compatible"] and "exec format error" in broken["reason"]
    # The version is read from the install path when `ncu --version` gave none.
    assert plan["selected_version"] == "2024.3.2"


def test_unknown_driver_is_assumed_compatible_and_said_so() -> None:
    plan = select_ncu(installs(["2025.3.1", "2024.1.1"]), None, "9.0")
    assert plan["selected_version"] == "2025.3.1"
    assert "unknown" in plan["reason"]
    assert plan["driver"] is None
    as_plan(plan)


def test_no_gpu_and_no_driver_plans_no_install() -> None:
    # A laptop or CI machine: no driver, no GPU. Installing ncu there would not help.
    plan = select_ncu([], None, None, os_release=UBUNTU_2404, is_root=True)
    assert plan["install_plan"] is None and plan["install_target_version"] is None
    assert plan["selected"] is None
    assert "no NVIDIA GPU or driver was found" in plan["reason"]
    assert plan["reason"].startswith("no ncu installed, and none is needed yet")
    as_plan(plan)
    # An ncu that is installed anyway is still listed and chosen (compatibility assumed).
    plan = select_ncu(installs(["2025.3.1"]), None, None)
    assert plan["selected_version"] == "2025.3.1"


def test_root_plan_uses_the_pinned_apt_package() -> None:
    plan = select_ncu([], "580.159.04", "9.0", os_release=UBUNTU_2404, is_root=True)
    steps = plan["install_plan"]
    assert plan["install_target_version"] == "2025.3.1"
    assert steps[0][:3] == ["python3", "-c", KEYRING_INSTALL_PY]
    assert steps[0][3:] == ["https://developer.download.nvidia.com/compute/cuda/repos/"
                            "ubuntu2404/x86_64/cuda-keyring_1.1-1_all.deb", "dpkg", "-i"]
    # No fixed path another user could plant: the package lives in a private mkdtemp.
    assert not any("/tmp" in arg for step in steps for arg in step[3:])
    assert steps[-1][-1] == "nsight-compute-2025.3.1"
    assert "apt-get" in steps[-1] and "install" in steps[-1]
    # Never the unversioned meta-package: it resolves to an old release.
    assert all("nsight-compute" not in step[-1:] for step in steps)
    assert install_path_for("2025.3.1") in plan["reason"]
    assert as_plan(plan).install_plan == steps


@pytest.mark.parametrize(("driver", "target"), [
    ("520.61.05", "2022.3.0"), ("535.104.05", "2023.2.2"), ("550.54.15", "2024.1.1"),
    ("560.35.05", "2024.3.2"), ("570.172.08", "2025.1.1"), ("580.82.07", "2025.3.1"),
    ("590.44.01", "2025.4.1"),
])
def test_install_target_is_the_newest_release_the_driver_runs(driver: str, target: str) -> None:
    plan = select_ncu([], driver, "8.9", os_release=UBUNTU_2404)
    assert plan["install_target_version"] == target
    assert plan["install_plan"][-1][-1] == f"nsight-compute-{target}"


def test_install_target_skips_a_release_the_driver_refused() -> None:
    plan = select_ncu(installs(["2025.3.1"]), "580.65.06", "9.0", exclude=["2025.3.1"],
                      os_release=UBUNTU_2404)
    assert plan["selected"] is None
    assert plan["install_target_version"] == "2025.3.0"


@pytest.mark.parametrize(("os_release", "machine", "expected"), [
    ('ID=debian\nVERSION_ID="12"\n', "x86_64",
     "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"
     "cuda-keyring_1.1-1_all.deb"),
    ('ID=ubuntu\nVERSION_ID="22.04"\n', "aarch64",
     "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/sbsa/"
     "cuda-keyring_1.1-1_all.deb"),
])
def test_apt_repository_follows_os_and_machine(os_release: str, machine: str,
                                               expected: str) -> None:
    plan = select_ncu([], "580.95.05", "9.0", os_release=os_release, machine=machine)
    assert plan["install_plan"][0][3] == expected


def test_dnf_repository_for_rhel_family() -> None:
    text = 'NAME="Rocky Linux"\nID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.4"\n'
    plan = select_ncu([], "575.57.08", "9.0", os_release=text)
    assert plan["install_plan"][0][-2:] == [
        "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64/cuda-rhel9.repo",
        "/etc/yum.repos.d/cuda-rhel9.repo"]
    assert plan["install_plan"][-1] == ["dnf", "install", "-y", "nsight-compute-2025.2.1"]


def test_non_root_plan_uses_the_standalone_installer_in_home() -> None:
    plan = select_ncu([], "580.159.04", "9.0", is_root=False, home="/home/ada")
    steps = plan["install_plan"]
    assert plan["install_target_version"] == "2025.3.1"
    url = steps[1][-2]
    assert url == ("https://developer.nvidia.com/downloads/assets/tools/secure/nsight-compute/"
                   "2025_3_1/nsight-compute-linux-2025.3.1.4-36398880.run")
    assert steps[2][:2] == ["sh", "/home/ada/nsight-compute/nsight-compute-linux-2025.3.1.4-"
                                  "36398880.run"]
    assert "-targetpath=/home/ada/nsight-compute/2025.3.1" in steps[2]
    assert user_install_path_for("2025.3.1", "/home/ada") in plan["reason"]
    assert "download centre" in plan["reason"]  # says where the URL pattern comes from


def test_non_root_falls_back_to_a_release_with_a_known_installer() -> None:
    # 2025.4.x fits driver 590 but its standalone installer's file name is not known.
    plan = select_ncu([], "590.44.01", "12.0", is_root=False, home="/home/ada")
    assert plan["install_target_version"] == "2025.3.1"


def test_no_plan_when_nothing_can_be_installed() -> None:
    plan = select_ncu([], "580.159.04", "9.0", is_root=False, home="/h", machine="aarch64")
    assert plan["install_plan"] is None
    assert plan["install_target_version"] == "2025.3.1"
    assert "by hand" in plan["reason"]
    as_plan(plan)


def test_versions_and_support() -> None:
    text = (FIXTURES / "ncu_version.txt").read_text()
    assert parse_ncu_version(text) == "2025.3.1"
    assert parse_ncu_version("/usr/local/cuda-12.4/nsight-compute-2024.1.1/ncu") == "2024.1.1"
    assert parse_ncu_version("/usr/local/cuda/bin/ncu") is None
    assert supports_arch("2024.3.2", "7.0") == (True, "")
    assert supports_arch("2025.1.0", "sm_70")[0] is False
    assert supports_arch("2022.3.0", "9.0") == (True, "")
    assert supports_arch("2022.2.1", "9.0")[0] is False
    assert supports_arch("2025.1.0", "12.0") == (True, "")
    rel, note = release_for("2025.3.1")
    assert rel is not None and rel.branch == 580 and rel.cuda == "13.0" and note == ""
    assert parse_os_release(UBUNTU_2404)["VERSION_ID"] == "24.04"
