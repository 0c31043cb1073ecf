"""The pod probe: /proc parsers, counter verdicts, package discovery, the whole probe."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from gpuws.protocol import Counters, Probe, PyPackage
from gpuws.remote_agent.pod import probe

SRC = Path(__file__).parents[3] / "src"

# CapEff values seen on real machines.
ROOT_HOST = "000001ffffffffff"  # root on a host: every capability up to CAP_CHECKPOINT_RESTORE
DOCKER_DEFAULT = "00000000a80425fb"  # root in `docker run` without --cap-add
GPU_VM = "000001fffeffffff"  # the H200 test VM: all but CAP_SYS_RESOURCE

# The layout of /proc/self/status (Linux 6.x), abridged.
STATUS = """Name:\tpython3
Umask:\t0022
State:\tR (running)
Tgid:\t4242
Uid:\t0\t0\t0\t0
Gid:\t0\t0\t0\t0
CapInh:\t0000000000000000
CapPrm:\t{cap}
CapEff:\t{cap}
CapBnd:\t{cap}
CapAmb:\t0000000000000000
NoNewPrivs:\t0
Seccomp:\t2
"""

# /proc/driver/nvidia/params of an R580 driver, abridged.
PARAMS = """ResmanDebugLevel: 4294967295
RmLogonRC: 1
ModifyDeviceFiles: 1
DeviceFileUID: 0
DeviceFileGID: 0
DeviceFileMode: 438
EnableMSI: 1
NvLinkDisable: 0
RmProfilingAdminOnly: {value}
PreserveVideoMemoryAllocations: 0
DynamicPowerManagement: 3
RegistryDwords: ""
"""


def _status(cap: str) -> str:
    return STATUS.format(cap=cap)


def test_cap_eff_bits_of_real_values() -> None:
    root = probe.parse_cap_eff(_status(ROOT_HOST))
    docker = probe.parse_cap_eff(_status(DOCKER_DEFAULT))
    vm = probe.parse_cap_eff(_status(GPU_VM))
    assert root is not None and docker is not None and vm is not None
    assert probe.has_cap(root, probe.CAP_SYS_ADMIN) and probe.has_cap(root, probe.CAP_PERFMON)
    assert not probe.has_cap(docker, probe.CAP_SYS_ADMIN)
    assert not probe.has_cap(docker, probe.CAP_PERFMON)
    assert probe.has_cap(docker, 18)  # CAP_SYS_CHROOT is in Docker's default set
    assert probe.has_cap(vm, probe.CAP_SYS_ADMIN) and not probe.has_cap(vm, 24)
    assert probe.parse_cap_eff("Name:\tx\n") is None


def test_rm_profiling_admin_only() -> None:
    assert probe.parse_rm_profiling_admin_only(PARAMS.format(value=1)) is True
    assert probe.parse_rm_profiling_admin_only(PARAMS.format(value=0)) is False
    assert probe.parse_rm_profiling_admin_only("EnableMSI: 1\n") is None


@pytest.mark.parametrize(
    ("admin_only", "cap", "uid", "driver", "verdict", "says"),
    [
        (False, DOCKER_DEFAULT, 1000, "580.159.04", "allowed", "RmProfilingAdminOnly is 0"),
        (True, ROOT_HOST, 0, "580.159.04", "allowed", "CAP_SYS_ADMIN"),
        # A capability set with CAP_PERFMON (bit 38) but not CAP_SYS_ADMIN.
        (True, f"{1 << 38:016x}", 1000, "550.54.14", "blocked", "needs driver R565+"),
        (True, f"{1 << 38:016x}", 1000, "565.57.01", "allowed", "R565 and newer"),
        (True, f"{1 << 38:016x}", 1000, "580.159.04", "allowed", "CAP_PERFMON"),
        (True, f"{1 << 38:016x}", 1000, None, "unknown", "driver version is unknown"),
        (True, DOCKER_DEFAULT, 0, "580.159.04", "blocked", "root but without CAP_SYS_ADMIN"),
        (True, DOCKER_DEFAULT, 1000, "580.159.04", "blocked", "uid 1000"),
        (True, None, 0, "580.159.04", "allowed", "runs as root"),
        (True, None, 1000, "580.159.04", "blocked", "ERR_NVGPUCTRPERM"),
        (None, ROOT_HOST, 0, None, "unknown", "/proc/driver/nvidia/params is missing"),
    ],
)
def test_verdict_table(admin_only: bool | None, cap: str | None, uid: int, driver: str | None,
                       verdict: str, says: str) -> None:
    cap_eff = None if cap is None else probe.parse_cap_eff(_status(cap))
    result = probe.counters_verdict(admin_only, cap_eff, uid, driver)
    counters = msgspec.convert(result, Counters)
    assert counters.verdict == verdict
    assert says in counters.reason
    assert counters.reason.endswith(".") and counters.reason.count(". ") == 0
    assert counters.rm_profiling_admin_only is admin_only and counters.uid == uid


def test_read_counters_from_files(tmp_path: Path) -> None:
    params = tmp_path / "params"
    status = tmp_path / "status"
    params.write_text(PARAMS.format(value=1))
    status.write_text(_status(DOCKER_DEFAULT))
    result = probe.read_counters("580.159.04", str(params), str(status), uid=0)
    assert (result["verdict"], result["cap_sys_admin"], result["cap_perfmon"]) == (
        "blocked", False, False)
    gone = probe.read_counters(None, str(tmp_path / "missing"), str(status), uid=0)
    assert gone["verdict"] == "unknown" and gone["rm_profiling_admin_only"] is None


def test_host_file_parsers() -> None:
    ubuntu = ('PRETTY_NAME="Ubuntu 24.04.3 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\n'
              'VERSION="24.04.3 LTS (Noble Numbat)"\nID=ubuntu\n')
    assert probe.parse_os_release(ubuntu) == "Ubuntu 24.04.3 LTS"
    assert probe.parse_os_release('NAME="Alpine Linux"\nVERSION="3.20"\n') == "Alpine Linux 3.20"
    meminfo = "MemTotal:       131981020 kB\nMemFree:        125069452 kB\n"
    assert probe.parse_meminfo_total_mib(meminfo) == pytest.approx(128887.71484375)
    # /proc/driver/nvidia/version of the open and the proprietary kernel modules.
    open_km = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release "
               "Build  (nixbld@)  \nGCC version:  gcc version 15.3.0 (GCC) \n")
    closed_km = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 "
                 "19:39:15 UTC 2024\n"
                 "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n")
    assert probe.parse_proc_driver_version(open_km) == "580.159.04"
    assert probe.parse_proc_driver_version(closed_km) == "535.183.01"
    assert probe.driver_major("580.159.04") == 580 and probe.driver_major(None) is None


def test_container_hints() -> None:
    cgroup_v1 = ("12:pids:/docker/3f1c0d6e9b2a4c\n11:memory:/docker/3f1c0d6e9b2a4c\n"
                 "1:name=systemd:/docker/3f1c0d6e9b2a4c\n")
    k8s = "0::/kubepods.slice/kubepods-burstable.slice/cri-containerd-ab12.scope\n"
    mountinfo = ("1234 1100 0:52 / / rw,relatime master:1 - overlay overlay rw,lowerdir=/var/"
                 "lib/docker/overlay2/l/X:/var/lib/docker/overlay2/l/Y,upperdir=/u,workdir=/w\n"
                 "1235 1234 0:55 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n")
    hints = probe.container_hints(cgroup_v1, mountinfo, {"RUNPOD_POD_ID": "abc123"},
                                  ["/.dockerenv"])
    assert hints == ["file:/.dockerenv", "cgroup:docker", "mountinfo:overlay-root",
                     "env:RUNPOD_POD_ID"]
    assert probe.container_hints(k8s, None, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}) == [
        "cgroup:kubepods", "cgroup:containerd", "env:KUBERNETES_SERVICE_HOST"]
    bare = "1 0 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n"
    assert probe.container_hints("0::/init.scope\n", bare, {}) == []
    assert probe.container_hints(None, None, {"container": "podman"}) == ["env:container=podman"]


def test_virtualization_hints() -> None:
    cpuinfo = ("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu vme de pse tsc msr "
               "pae mce cx8 apic sep mtrr pge mca cmov hypervisor lahf_lm\n")
    assert probe.virtualization_hints(cpuinfo, "QEMU\n", "Standard PC (Q35 + ICH9, 2009)\n") == [
        "cpuinfo:hypervisor", "dmi:QEMU Standard PC (Q35 + ICH9, 2009)"]
    metal = cpuinfo.replace(" hypervisor", "")
    assert probe.virtualization_hints(metal, "Supermicro\n", "SYS-821GE-TNHR\n") == []
    assert probe.virtualization_hints(metal, "Amazon EC2", "p5.48xlarge") == [
        "dmi:Amazon EC2 p5.48xlarge"]
    assert probe.virtualization_hints(None, None, None, "xen\n") == ["hypervisor:xen"]


TORCH_VERSION_PY = """from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'rocm', 'xpu']
__version__ = '2.11.0+cu130'
debug = False
cuda: Optional[str] = '13.0'
git_version = '70d99e998b4955e0049d13a98d77ae1b14db1f45'
hip: Optional[str] = None
rocm: Optional[str] = None
xpu: Optional[str] = None
"""


def test_cuda_of_packages_without_importing() -> None:
    assert probe.parse_torch_cuda(TORCH_VERSION_PY) == "13.0"
    cpu_build = TORCH_VERSION_PY.replace("cuda: Optional[str] = '13.0'",
                                         "cuda: Optional[str] = None")
    assert probe.parse_torch_cuda(cpu_build) is None
    assert probe.parse_torch_cuda("cuda = '11.8'\n") == "11.8"
    assert probe.cupy_cuda_from_dist("cupy-cuda13x") == "13"
    assert probe.cupy_cuda_from_dist("cupy_cuda12x") == "12"
    assert probe.cupy_cuda_from_dist("cupy-cuda117") == "11.7"
    assert probe.cupy_cuda_from_dist("cupy-cuda102") == "10.2"
    assert probe.cupy_cuda_from_dist("cupy") is None
    assert probe.cupy_cuda_from_dist("cupy-rocm-5-0") is None


def _dist(site: Path, dirname: str, name: str, version: str) -> None:
    info = site / dirname
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_python_packages_from_a_site_dir(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    _dist(site, "torch-2.11.0.dist-info", "torch", "2.11.0")
    (site / "torch").mkdir()
    (site / "torch" / "version.py").write_text(TORCH_VERSION_PY)
    _dist(site, "cupy_cuda13x-14.2.0.dist-info", "cupy-cuda13x", "14.2.0")
    _dist(site, "numpy-2.1.0.dist-info", "numpy", "2.1.0")
    found = probe.python_packages([str(site)])
    assert found == [
        {"name": "cupy-cuda13x", "version": "14.2.0", "cuda": "13", "error": None},
        {"name": "torch", "version": "2.11.0+cu130", "cuda": "13.0", "error": None},
    ]
    for item in found:
        msgspec.convert(item, PyPackage)
    empty = probe.python_packages([str(tmp_path / "nothing")])
    assert [(p["name"], p["error"]) for p in empty] == [("cupy", "not installed"),
                                                       ("torch", "not installed")]


def test_venv_site_packages(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    (venv / "lib" / ver / "site-packages").mkdir(parents=True)
    (venv / "bin").mkdir()
    # What uv/venv write (the H200 test image's /opt/torch/.venv/pyvenv.cfg).
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nimplementation = CPython\n"
                                     "uv = 0.11.15\nversion_info = 3.12.3\n"
                                     "include-system-site-packages = false\n")
    found = probe.venv_site_packages(str(venv / "bin" / "python3"))
    assert found == ([str(venv / "lib" / ver / "site-packages")], False)
    assert probe.venv_site_packages(str(tmp_path / "python3")) is None


def test_probe_on_this_machine_decodes_strictly() -> None:
    result = probe.probe()
    decoded = msgspec.convert(result, Probe)
    assert decoded.uid == os.getuid() and decoded.python_version
    assert decoded.counters.verdict in ("allowed", "blocked", "unknown")
    if not decoded.gpus:
        assert decoded.gpu_error and decoded.gpu_source is None
    assert decoded.probe_s > 0  # its speed is bench/connect.py's business
    assert {p.name.split("-")[0] for p in decoded.python_packages} >= {"cupy", "torch"}


def _oldest_supported_pythons() -> list[str]:
    """Python 3.8 interpreters on this machine (the oldest the agent supports), wherever
    they are: a system python3.8, pyenv's versions, anything python3.8 on PATH."""
    found = [str(p) for p in sorted(Path.home().glob(".pyenv/versions/3.8.*/bin/python3.8"))]
    for name in ("/usr/bin/python3.8", "/usr/local/bin/python3.8", shutil.which("python3.8")):
        if name and os.path.exists(name) and ".pyenv/shims" not in name:
            found.append(os.path.realpath(name))
    return sorted(set(found))[:1]


@pytest.mark.parametrize("python", [sys.executable, *_oldest_supported_pythons()])
def test_probe_under_isolated_stdlib_only_python(python: str) -> None:
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); "
            "from gpuws.remote_agent.pod import probe; print(json.dumps(probe.probe()))")
    out = subprocess.run([python, "-I", "-S", "-c", code, str(SRC)], capture_output=True,
                         text=True, timeout=30, check=True)
    decoded = msgspec.convert(json.loads(out.stdout), Probe)
    assert decoded.python_path == python
