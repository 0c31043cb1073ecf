"""What the pod is: host, container, GPUs, driver, toolkits, profilers, counter permission.

Standard library only (runs on the pod's python3 >= 3.8). :func:`probe` returns a dict
shaped exactly like :class:`gpuws.protocol.Probe`; every other public function takes the
text of the ``/proc`` or ``/sys`` file it reads (or its path) so tests can feed it real
samples. Nothing here needs a GPU: on a machine without one the GPU fields say so.
"""

from __future__ import annotations

import concurrent.futures
import os
import platform
import re
import site
import socket
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ..safefiles import read_regular
from . import gpuinfo, tools

PARAMS_PATH = "/proc/driver/nvidia/params"
STATUS_PATH = "/proc/self/status"

# Linux capability bits (include/uapi/linux/capability.h).
CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
#: First driver branch that lets CAP_PERFMON (not only CAP_SYS_ADMIN) read counters.
PERFMON_DRIVER = 565


def _read(path: str, limit: int = 1 << 20) -> str | None:
    """A small text file's contents, or None if it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(limit)
    except OSError:
        return None


# ----------------------------------------------------------------------------- host
#: Where systemd (and, before it, D-Bus) keep the machine's id; a container has its own
#: or none, a VM its own, and the same machine reached over SSH the same one.
MACHINE_ID_PATHS = ("/etc/machine-id", "/var/lib/dbus/machine-id")
#: The running kernel's id, new at every boot: equal on two ends, they share one kernel.
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
_HOST_ID = re.compile(r"[0-9a-f-]{1,64}")


def host_id(text: str | None) -> str | None:
    """A machine id or boot id as read (lowercased, stripped), or None for anything that
    is not 1-64 hex digits and dashes (the laptop refuses other values in a probe)."""
    if text is None:
        return None
    value = text.strip().lower()
    return value if _HOST_ID.fullmatch(value) else None


def machine_ids(paths: Iterable[str] = MACHINE_ID_PATHS,
                boot_path: str = BOOT_ID_PATH) -> dict[str, str | None]:
    """This machine's ``machine_id`` (the first readable of ``paths``) and ``boot_id``;
    the laptop reads its own with the same function to compare."""
    machine = None
    for path in paths:
        machine = host_id(_read(path, limit=256))
        if machine is not None:
            break
    return {"machine_id": machine, "boot_id": host_id(_read(boot_path, limit=256))}


def parse_os_release(text: str) -> str | None:
    """``PRETTY_NAME`` from ``/etc/os-release`` text (else ``NAME VERSION``)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip("\"'")
    if values.get("PRETTY_NAME"):
        return values["PRETTY_NAME"]
    name = " ".join(v for v in (values.get("NAME"), values.get("VERSION")) if v)
    return name or None


def parse_meminfo_total_mib(text: str) -> float | None:
    """``MemTotal`` from ``/proc/meminfo`` text, in MiB."""
    m = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.M)
    return int(m.group(1)) / 1024.0 if m else None


def parse_proc_driver_version(text: str) -> str | None:
    """The kernel module's version from ``/proc/driver/nvidia/version``.

    ``"NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu ..."`` →
    ``"580.159.04"``; also the ``Open Kernel Module`` wording.
    """
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else None


def _cpu_count() -> int | None:
    # A container's CPU set is what a workload gets; os.cpu_count() shows the host's.
    if hasattr(os, "sched_getaffinity"):
        try:
            return len(os.sched_getaffinity(0))
        except OSError:
            pass
    return os.cpu_count()


def _user(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        # Containers often run an arbitrary uid that /etc/passwd does not know.
        return os.environ.get("USER") or os.environ.get("LOGNAME") or f"uid {uid}"


# ----------------------------------------------------------------------------- container / VM
_CGROUP_MARKERS = ("docker", "kubepods", "containerd", "libpod", "crio", "lxc")
_CONTAINER_ENV = (
    "RUNPOD_POD_ID", "KUBERNETES_SERVICE_HOST", "VAST_CONTAINERLABEL",
    "SINGULARITY_CONTAINER", "APPTAINER_CONTAINER", "MODAL_TASK_ID",
)
_OVERLAY_FS = ("overlay", "aufs", "fuse-overlayfs")


def container_hints(cgroup_text: str | None, mountinfo_text: str | None,
                    environ: Mapping[str, str], existing: Iterable[str] = ()) -> list[str]:
    """Signs that this process runs in a container.

    Args:
        cgroup_text: ``/proc/1/cgroup`` (cgroup v1 paths name the runtime; v2 shows
            only ``0::/`` inside a container).
        mountinfo_text: ``/proc/self/mountinfo`` (an overlay root filesystem).
        environ: The environment (RunPod, Kubernetes, vast.ai, Apptainer variables).
        existing: Which of ``/.dockerenv`` and ``/run/.containerenv`` exist.

    Returns:
        Hints such as ``"file:/.dockerenv"``, ``"cgroup:kubepods"``,
        ``"mountinfo:overlay-root"``, ``"env:RUNPOD_POD_ID"``; empty on bare metal.
    """
    hints = [f"file:{p}" for p in existing]
    if cgroup_text:
        hints += [f"cgroup:{m}" for m in _CGROUP_MARKERS if m in cgroup_text]
    if mountinfo_text:
        for line in mountinfo_text.splitlines():
            fields = line.split()
            if len(fields) > 4 and fields[4] == "/" and " - " in line:
                fstype = line.split(" - ", 1)[1].split()[0]
                if fstype in _OVERLAY_FS:
                    hints.append(f"mountinfo:{fstype}-root")
                break
    hints += [f"env:{k}" for k in _CONTAINER_ENV if environ.get(k)]
    if environ.get("container"):
        # systemd-nspawn, podman and LXC set container=<runtime>.
        hints.append(f"env:container={environ['container']}")
    return hints


_VIRTUAL_DMI = (
    "qemu", "kvm", "vmware", "virtualbox", "innotek", "xen", "microsoft corporation",
    "hyper-v", "amazon ec2", "google compute engine", "openstack", "bochs", "parallels",
    "cloud hypervisor", "firecracker", "nutanix", "oracle cloud", "alibaba cloud",
)


def virtualization_hints(cpuinfo_text: str | None, sys_vendor: str | None,
                         product_name: str | None, hypervisor_type: str | None = None
                         ) -> list[str]:
    """Signs that this machine is a virtual machine.

    Args:
        cpuinfo_text: ``/proc/cpuinfo`` (the ``hypervisor`` CPU flag).
        sys_vendor: ``/sys/class/dmi/id/sys_vendor``.
        product_name: ``/sys/class/dmi/id/product_name``.
        hypervisor_type: ``/sys/hypervisor/type`` (Xen).

    Returns:
        Hints such as ``"cpuinfo:hypervisor"`` and ``"dmi:QEMU Standard PC (Q35 + ICH9,
        2009)"``; the DMI names are listed only when they name a hypervisor or cloud VM or
        the hypervisor flag is set, so bare metal gives an empty list.
    """
    hints: list[str] = []
    flagged = bool(cpuinfo_text and re.search(r"^flags\s*:.*\bhypervisor\b", cpuinfo_text,
                                               re.M))
    if flagged:
        hints.append("cpuinfo:hypervisor")
    dmi = " ".join(x.strip() for x in (sys_vendor, product_name) if x and x.strip())
    if dmi and (flagged or any(v in dmi.lower() for v in _VIRTUAL_DMI)):
        hints.append(f"dmi:{dmi}")
    if hypervisor_type and hypervisor_type.strip():
        hints.append(f"hypervisor:{hypervisor_type.strip()}")
    return hints


# ----------------------------------------------------------------------------- counters
def parse_rm_profiling_admin_only(params_text: str) -> bool | None:
    """``RmProfilingAdminOnly`` from ``/proc/driver/nvidia/params`` text."""
    m = re.search(r"^RmProfilingAdminOnly:\s*(\d+)", params_text, re.M)
    return None if m is None else m.group(1) != "0"


def parse_cap_eff(status_text: str) -> int | None:
    """The effective capability mask (``CapEff``) from ``/proc/self/status`` text."""
    m = re.search(r"^CapEff:\s*([0-9a-fA-F]+)", status_text, re.M)
    return int(m.group(1), 16) if m else None


def has_cap(cap_eff: int, bit: int) -> bool:
    """Whether capability ``bit`` is set in a ``CapEff`` mask."""
    return bool((cap_eff >> bit) & 1)


def driver_major(driver: str | None) -> int | None:
    """``"580.159.04"`` → 580."""
    m = re.match(r"\s*(\d+)", driver or "")
    return int(m.group(1)) if m else None


def counters_verdict(admin_only: bool | None, cap_eff: int | None, uid: int | None,
                     driver: str | None) -> dict[str, Any]:
    """Predict whether ncu may read GPU performance counters.

    The driver lets a process read them when ``RmProfilingAdminOnly`` is 0, or when the
    process holds CAP_SYS_ADMIN, or (from driver R565) CAP_PERFMON. Being root is not
    enough by itself: a default container's root lacks CAP_SYS_ADMIN and gets
    ``ERR_NVGPUCTRPERM``; uid 0 counts only where ``CapEff`` could not be read.

    Args:
        admin_only: ``RmProfilingAdminOnly`` (None: the params file is missing).
        cap_eff: The ``CapEff`` mask (None: unreadable).
        uid: The process's uid.
        driver: The driver version, for the CAP_PERFMON rule.

    Returns:
        A dict shaped like ``protocol.Counters`` with ``verdict`` ``allowed``,
        ``blocked`` or ``unknown`` and a one-sentence ``reason``.
    """
    sys_admin = None if cap_eff is None else has_cap(cap_eff, CAP_SYS_ADMIN)
    perfmon = None if cap_eff is None else has_cap(cap_eff, CAP_PERFMON)
    major = driver_major(driver)
    caps = "" if cap_eff is None else f" (CapEff {cap_eff:016x})"
    if admin_only is None:
        verdict, reason = "unknown", (
            f"{PARAMS_PATH} is missing (no NVIDIA kernel driver visible here), so whether "
            "the driver restricts performance counters to admins cannot be read.")
    elif not admin_only:
        verdict, reason = "allowed", (
            "RmProfilingAdminOnly is 0, so the driver lets every user read GPU "
            "performance counters.")
    elif sys_admin:
        verdict, reason = "allowed", (
            "RmProfilingAdminOnly is 1 but this process holds CAP_SYS_ADMIN, which the "
            "driver accepts.")
    elif perfmon and major is not None and major >= PERFMON_DRIVER:
        verdict, reason = "allowed", (
            f"RmProfilingAdminOnly is 1 but this process holds CAP_PERFMON, which driver "
            f"{driver} accepts (R{PERFMON_DRIVER} and newer).")
    elif perfmon and major is None:
        verdict, reason = "unknown", (
            f"RmProfilingAdminOnly is 1 and this process holds CAP_PERFMON, which only "
            f"drivers from R{PERFMON_DRIVER} accept, but the driver version is unknown.")
    elif cap_eff is None and uid == 0:
        verdict, reason = "allowed", (
            "RmProfilingAdminOnly is 1; CapEff could not be read and the process runs as "
            "root, which outside a restricted container holds CAP_SYS_ADMIN.")
    elif uid == 0:
        perfmon_note = (f" (its CAP_PERFMON needs driver R{PERFMON_DRIVER}+, this is "
                        f"{driver})" if perfmon else "")
        verdict, reason = "blocked", (
            f"RmProfilingAdminOnly is 1 and this process runs as root but without "
            f"CAP_SYS_ADMIN{caps}{perfmon_note}, as in a default container, so ncu will "
            "fail with ERR_NVGPUCTRPERM.")
    else:
        perfmon_note = (f" (its CAP_PERFMON needs driver R{PERFMON_DRIVER}+, this is "
                        f"{driver})" if perfmon else "")
        verdict, reason = "blocked", (
            f"RmProfilingAdminOnly is 1 and this process (uid {uid}) holds no "
            f"CAP_SYS_ADMIN{caps}{perfmon_note}, so ncu will fail with ERR_NVGPUCTRPERM.")
    return {
        "rm_profiling_admin_only": admin_only,
        "cap_sys_admin": sys_admin,
        "cap_perfmon": perfmon,
        "uid": uid,
        "verdict": verdict,
        "reason": reason,
    }


#: ``GPUWS_COUNTERS=blocked`` in the agent's environment: Tier 3 takes the counters as
#: blocked whatever the driver allows, so a person (or tests/gpu/test_gpu_verdicts.py)
#: sees on a GPU with counters what a pod without them gives (Tier 1, NVML GPM, static).
COUNTERS_ENV = "GPUWS_COUNTERS"


def read_counters(driver: str | None, params_path: str = PARAMS_PATH,
                  status_path: str = STATUS_PATH, uid: int | None = None) -> dict[str, Any]:
    """:func:`counters_verdict` from the files of this machine (paths overridable), or
    ``blocked`` where :data:`COUNTERS_ENV` asks for it."""
    params = _read(params_path)
    status = _read(status_path)
    if os.environ.get(COUNTERS_ENV) == "blocked":
        found = counters_verdict(
            None if params is None else parse_rm_profiling_admin_only(params),
            None if status is None else parse_cap_eff(status),
            os.getuid() if uid is None else uid, driver)
        return dict(found, verdict="blocked", reason=(
            "treated as blocked because %s=blocked is set in the agent's environment (what "
            "the driver allows: %s)" % (COUNTERS_ENV, found["verdict"])))
    return counters_verdict(
        None if params is None else parse_rm_profiling_admin_only(params),
        None if status is None else parse_cap_eff(status),
        os.getuid() if uid is None else uid,
        driver)


# ----------------------------------------------------------------------------- python packages
def cupy_cuda_from_dist(name: str) -> str | None:
    """The CUDA version a CuPy wheel is built for, from its distribution name.

    ``cupy-cuda12x`` → ``"12"``, ``cupy-cuda117`` → ``"11.7"``, ``cupy-cuda102`` →
    ``"10.2"``; ``cupy`` (a source build) and ``cupy-rocm-*`` → None.
    """
    m = re.match(r"^cupy[-_]cuda(\d+)(x?)$", name.strip().lower())
    if not m:
        return None
    digits, wildcard = m.groups()
    if wildcard or len(digits) < 2:
        return digits
    return f"{digits[:-1]}.{digits[-1]}"


def parse_torch_cuda(version_py: str) -> str | None:
    """``cuda`` from the text of an installed ``torch/version.py`` (None: CPU/ROCm build)."""
    m = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*(?:(['\"])(.*?)\1|None)", version_py, re.M)
    if m is None or m.group(1) is None:
        return None
    return m.group(2)


def pyvenv_cfg(executable: str) -> tuple[str, dict[str, str]] | None:
    """The venv ``executable`` belongs to and the keys of its ``pyvenv.cfg`` (lower-cased);
    None outside a venv.

    The file is looked for next to or one level above the interpreter's directory (the
    interpreter path is not resolved: a venv's python is a symlink) and read without
    blocking or following a link, so a FIFO left there cannot hang the probe.
    """
    bindir = os.path.dirname(os.path.abspath(executable))
    for venv in (bindir, os.path.dirname(bindir)):
        try:
            raw = read_regular(os.path.join(venv, "pyvenv.cfg"), 1 << 16)
        except OSError:
            continue
        values: dict[str, str] = {}
        for line in raw.decode("utf-8", "replace").splitlines():
            key, sep, value = line.partition("=")
            if sep:
                values[key.strip().lower()] = value.strip()
        return venv, values
    return None


def venv_site_packages(executable: str, version: tuple[int, int] | None = None
                       ) -> tuple[list[str], bool] | None:
    """The site-packages of the venv ``executable`` belongs to, and whether it also sees
    the system's (``include-system-site-packages``); None outside a venv.

    Python learns it runs in a venv from ``site.py``, which ``python3 -S`` skips, so the
    agent reads ``pyvenv.cfg`` itself (:func:`pyvenv_cfg`). ``version`` (major, minor)
    names the ``lib/pythonX.Y`` to look in; default: this interpreter's.
    """
    found = pyvenv_cfg(executable)
    if found is None:
        return None
    venv, values = found
    system = values.get("include-system-site-packages", "").lower() == "true"
    major, minor = version or (sys.version_info[0], sys.version_info[1])
    ver = f"python{major}.{minor}"
    dirs = [os.path.join(venv, lib, ver, "site-packages") for lib in ("lib", "lib64")]
    return [d for d in dirs if os.path.isdir(d)], system


def _search_paths() -> list[str]:
    # Under `python3 -I -S` site-packages are not on sys.path, yet workloads run with the
    # normal interpreter see them; ask `site` and pyvenv.cfg where they are.
    paths = list(sys.path)
    venv = venv_site_packages(sys.executable)
    if venv is not None:
        paths += venv[0]
    if venv is None or venv[1]:
        try:
            paths += site.getsitepackages()
        except AttributeError:  # pragma: no cover - old virtualenv's site.py
            pass
        if hasattr(site, "getusersitepackages"):
            paths.append(site.getusersitepackages())
    out: list[str] = []
    for p in paths:
        if p and p not in out and os.path.isdir(p):
            out.append(p)
    return out


#: Metadata directories that may be torch's or CuPy's (``torch-2.11.0.dist-info``,
#: ``cupy_cuda13x-14.2.0.dist-info``, a legacy ``.egg-info``); no other is read.
_DIST_DIR = re.compile(r"^(torch|cupy)([-_.][^-]*)?-.*\.(dist-info|egg-info)$", re.I)


def _distributions(paths: list[str]) -> Iterator[Any]:
    """The installed distributions in ``paths`` that may be torch or CuPy.

    Only metadata directories whose name fits :data:`_DIST_DIR` are read: a torch venv
    holds a hundred others, and reading every METADATA took ~35 ms per site-packages, paid
    for each interpreter :mod:`.pythons` looks at. Entries that are not directories (a
    zip or an egg on ``sys.path``) go through ``importlib.metadata`` whole.
    """
    import pathlib
    from importlib import metadata  # 3.8+; imported here so the module loads anywhere

    for path in paths:
        if not os.path.isdir(path):
            yield from metadata.distributions(path=[path])
            continue
        try:
            names = sorted(os.listdir(path))
        except OSError:
            continue
        for name in names:
            if _DIST_DIR.match(name):
                yield metadata.PathDistribution(pathlib.Path(path, name))


def python_packages(paths: list[str] | None = None) -> list[dict[str, Any]]:
    """CuPy and torch as ``protocol.PyPackage`` dicts, without importing them.

    Importing torch takes seconds and CuPy may initialise CUDA, so versions come from
    the installed metadata, torch's CUDA from its ``torch/version.py`` and CuPy's from
    the wheel's name. A package that is absent is listed with ``error`` "not installed".

    Args:
        paths: Directories to search; default: ``sys.path`` plus the site directories.
    """
    found: dict[str, dict[str, Any]] = {}
    for dist in _distributions(_search_paths() if paths is None else paths):
        try:
            # Distribution.name only exists from 3.10.
            md = dist.metadata
            raw = md["Name"] if md is not None else None
        except (TypeError, ValueError, OSError):
            # Metadata that cannot be parsed (3.12 raises TypeError for a dist-info
            # without METADATA): not a package we can report on.
            continue
        if not raw:
            continue
        name = re.sub(r"[-_.]+", "-", str(raw)).lower()
        if name in found or not (name == "torch" or name == "cupy"
                                 or name.startswith("cupy-")):
            continue
        entry: dict[str, Any] = {"name": name, "version": dist.version, "cuda": None,
                                 "error": None}
        if name == "torch":
            version_py = dist.locate_file("torch/version.py")
            text = _read(str(version_py))
            if text is None:
                entry["error"] = f"{version_py} not found"
            else:
                # The wheel's metadata may say "2.11.0" where torch reports "2.11.0+cu130".
                full = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
                if full:
                    entry["version"] = full.group(1)
                entry["cuda"] = parse_torch_cuda(text)
                if entry["cuda"] is None:
                    entry["error"] = "a CPU-only or ROCm build (torch.version.cuda is None)"
        else:
            entry["cuda"] = cupy_cuda_from_dist(name)
        found[name] = entry
    out = sorted(found.values(), key=lambda e: str(e["name"]))
    for missing in ("cupy", "torch"):
        if not any(e["name"] == missing or e["name"].startswith(missing + "-") for e in out):
            out.append({"name": missing, "version": None, "cuda": None,
                        "error": "not installed"})
    return out


# ----------------------------------------------------------------------------- the probe
def probe() -> dict[str, Any]:
    """Everything the agent can learn about the pod without a GPU context.

    Tool ``--version`` runs and the choice of the workloads' Python
    (:func:`.pythons.choose`, bounded at about a second) go on in threads while the GPUs
    and the host are read, so the probe takes about as long as the slowest of them (well
    under 2 s normally); so does the GPUs' SM count, asked of the CUDA driver in a child
    (:func:`.gpuinfo.sm_counts`: cuInit, no context). ``python_path``/``python_version``
    are the agent's own interpreter; ``python_packages`` are those of the interpreter
    workloads run under (``python_choice``), which is what decides whether they can
    import CuPy and torch.

    Returns:
        A dict that ``msgspec.convert(d, protocol.Probe)`` accepts strictly.
    """
    from . import pythons  # it imports this module: import it here, not at the top

    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        installs = pool.submit(tools.all_installs)
        python = pool.submit(pythons.choose)
        gpus = gpuinfo.list_gpus()
        # The SM count (the CUDA driver's, in a child) while the rest is read; only where
        # there are GPUs, so a machine without one starts no child for it.
        sms = pool.submit(gpuinfo.sm_counts) if gpus.gpus else None
        driver = gpus.driver
        if driver is None:
            # The kernel module may be loaded even where NVML/nvidia-smi are not mounted.
            version_text = _read("/proc/driver/nvidia/version")
            driver = None if version_text is None else parse_proc_driver_version(version_text)
        uid = os.getuid()
        existing = [p for p in ("/.dockerenv", "/run/.containerenv") if os.path.exists(p)]
        os_release = _read("/etc/os-release") or _read("/usr/lib/os-release")
        meminfo = _read("/proc/meminfo")
        result: dict[str, Any] = {
            "hostname": socket.gethostname(),
            "os": (parse_os_release(os_release) if os_release else None)
            or platform.platform(),
            "kernel": platform.release(),
            "arch": platform.machine(),
            "container": container_hints(_read("/proc/1/cgroup"),
                                         _read("/proc/self/mountinfo"), os.environ,
                                         existing),
            "virtualization": virtualization_hints(
                _read("/proc/cpuinfo", limit=1 << 16),
                _read("/sys/class/dmi/id/sys_vendor"),
                _read("/sys/class/dmi/id/product_name"),
                _read("/sys/hypervisor/type")) + gpuinfo.gpu_virtualization(),
            "python_path": sys.executable,
            "python_version": platform.python_version(),
            "uid": uid,
            "user": _user(uid),
            "home": os.path.expanduser("~"),
            "cpu_count": _cpu_count(),
            "memory_total_mib": parse_meminfo_total_mib(meminfo) if meminfo else None,
            "gpus": gpus.gpus,
            "gpu_source": gpus.source,
            "gpu_error": gpus.error,
            "driver": driver,
            "cuda_driver": gpus.cuda_driver,
            "counters": read_counters(driver, uid=uid),
        }
        result.update(machine_ids())
        found = installs.result()
        if sms is not None:
            gpuinfo.add_sm_counts(gpus.gpus, sms.result())
        result["python_choice"], result["python_packages"] = python.result()
    result["toolkits"] = found["toolkits"]
    result["ncu"] = found["ncu"]
    result["nsys"] = found["nsys"]
    result["probe_s"] = round(time.monotonic() - start, 3)
    return result
