"""Nsight Systems where it can be had: which nsys works, and installing one when none does.

Real pods rarely have a working nsys (CUDA devel images ship ncu; the nsys inside an
Nsight Compute install cannot write reports), so Tier 2 falls back to torch.profiler or
one ncu pass. This module makes the same offer as the ncu plan (:mod:`.ncu_provision`):
an install plan shown first, run only when the person confirms (``install``), every line
of its output streamed as a log event, and the result verified with ``nsys --version``
and a tiny ``nsys profile`` that must leave a ``.nsys-rep`` behind (the failure seen on
the H200 pod was an nsys that ran and left only a ``.qdstrm``).

The package is pinned by the driver: NVIDIA's CUDA repository (the one the ncu plan adds
through ``cuda-keyring``) carries ``cuda-nsight-systems-<major>-<minor>``, the Nsight
Systems that shipped with that CUDA release, so the driver's own CUDA version names it
(``13.0`` → ``cuda-nsight-systems-13-0``); no build number has to be guessed. It installs
under ``/opt/nvidia/nsight-systems/<version>/``, where the inventory looks. Without root
there is no plan: NVIDIA's standalone installers carry build numbers in their names that
cannot be derived from a version, and a guessed URL is worse than a clear remedy.

Standard library only: this runs on the pod's python3 (>= 3.8).
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import wire

Send = Callable[[Dict[str, Any]], None]

SMOKE = ("import cupy; x = cupy.arange(1 << 20, dtype=cupy.float32); "
         "(x * 2).sum(); cupy.cuda.runtime.deviceSynchronize()")


def package_for(cuda_driver: Optional[str]) -> Optional[str]:
    """The pinned CUDA-repo package for the driver's CUDA version (``"12.4"``)."""
    m = re.match(r"^\s*(\d+)\.(\d+)", cuda_driver or "")
    return "cuda-nsight-systems-%s-%s" % (m.group(1), m.group(2)) if m else None


def plan_nsys(installs: List[Dict[str, Any]], cuda_driver: Optional[str],
              os_release: Optional[str], is_root: bool, machine: str) -> Dict[str, Any]:
    """Which nsys to use, or how to install one (a pure choice; nothing is run).

    Args:
        installs: ``protocol.ToolInstall`` dicts from :func:`.tools.nsys_installs`
            (an ``error`` marks one that cannot run, such as ncu's bundled nsys).
        cuda_driver: the CUDA version the driver supports (``nvidia-smi``), or None.
        os_release: the text of ``/etc/os-release``, or None.
        is_root: whether the agent runs as root (only root can use the repositories).
        machine: ``uname -m``.

    Returns:
        The fields of the ``nsys_plan`` event: ``installs``, ``selected``,
        ``selected_version``, ``reason``, ``install_plan`` (argv lists or None),
        ``install_how``, ``install_target``, ``installed``, ``verified``.
    """
    from .ncu_select import CUDA_REPO_BASE, DOWNLOAD_PY, KEYRING_INSTALL_PY, cuda_repo

    plan: Dict[str, Any] = {"installs": installs, "selected": None, "selected_version": None,
                            "reason": "", "install_plan": None, "install_how": "",
                            "install_target": None, "installed": False, "verified": None}
    working = [i for i in installs if not i.get("error") and i.get("version")]
    if working:
        best = max(working, key=lambda i: _version_key(str(i["version"])))
        plan.update(selected=best["path"], selected_version=best["version"],
                    reason="nsys %s at %s" % (best["version"], best["path"]))
        return plan
    found = ("found only: " + "; ".join("%s (%s)" % (i["path"], i.get("error") or "no version")
                                        for i in installs)) if installs else "no nsys found"
    package = package_for(cuda_driver)
    repo, manager, arch = cuda_repo(os_release, machine)
    if package is None:
        plan["reason"] = "%s, and the driver's CUDA version is unknown (no GPU driver?)" % found
        return plan
    if not is_root:
        plan["reason"] = ("%s; installing Nsight Systems needs root here (NVIDIA's "
                          "repositories; its standalone installer's name cannot be derived "
                          "from a version): ask the pod's owner to apt-get install %s from "
                          "NVIDIA's CUDA repository, or run the agent as root" % (found, package))
        return plan
    if repo is None or arch is None:
        plan["reason"] = ("%s; NVIDIA has no CUDA repository for this OS/architecture (%s); "
                          "install Nsight Systems by hand from developer.nvidia.com/nsight-systems"
                          % (found, machine))
        return plan
    base = "%s/%s/%s" % (CUDA_REPO_BASE, repo, arch)
    if manager == "apt":
        apt = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get"]
        steps = [["python3", "-c", KEYRING_INSTALL_PY, base + "/cuda-keyring_1.1-1_all.deb",
                  "dpkg", "-i"], [*apt, "update"],
                 [*apt, "install", "-y", "--no-install-recommends", package]]
    else:
        steps = [["python3", "-c", DOWNLOAD_PY, "%s/cuda-%s.repo" % (base, repo),
                  "/etc/yum.repos.d/cuda-%s.repo" % repo],
                 ["dnf", "install", "-y", package]]
    plan.update(install_plan=steps, install_target=package, reason=found,
                install_how=("as root from NVIDIA's CUDA %s repository (%s/): %s, the Nsight "
                             "Systems of the driver's CUDA %s" % (manager, base, package,
                                                                 cuda_driver)))
    return plan


def _version_key(version: str) -> Tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:4])


def current_plan() -> Dict[str, Any]:
    """The plan from a fresh look at the driver and the installed nsys."""
    from ..pod.gpuinfo import list_gpus
    from ..pod.tools import nsys_installs

    _gpus, _driver, cuda_driver, _source, _error = list_gpus()
    try:
        with open("/etc/os-release") as f:
            os_release: Optional[str] = f.read()
    except OSError:
        os_release = None
    return plan_nsys(nsys_installs(), cuda_driver, os_release, os.getuid() == 0,
                     platform.machine())


def _stream(argv: List[str], send: Send) -> int:
    send(wire.make("log", level="info", message="$ " + " ".join(argv)))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    for raw in proc.stdout:
        send(wire.make("log", level="info",
                       message=raw.decode("utf-8", "replace").rstrip()[:16384]))
    return proc.wait()


def verify(nsys: str, python: Optional[str] = None, timeout_s: float = 600) -> str:
    """``nsys --version`` and a tiny ``nsys profile`` that must write a report, run by
    ``python`` (default: the workloads' interpreter, where CuPy is).

    Raises:
        RuntimeError: either failed; the message quotes what nsys said.
    """
    ver = subprocess.run([nsys, "--version"], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    if ver.returncode != 0:
        raise RuntimeError("%s --version failed: %s" % (nsys, ver.stderr.strip()[-300:]))
    version = (ver.stdout.strip().splitlines() or ["?"])[-1]
    if python is None:
        from ..pod.pythons import workload_python

        python = workload_python()
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="gpuws-nsys-") as tmp:
        base = os.path.join(tmp, "smoke")
        smoke = subprocess.run([nsys, "profile", "--trace=cuda", "--force-overwrite=true",
                                "-o", base, python, "-c", SMOKE], capture_output=True,
                               text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        if smoke.returncode != 0 or not os.path.exists(base + ".nsys-rep"):
            left = sorted(os.listdir(tmp))
            raise RuntimeError("smoke profile wrote no report (exit %d, left %s): %s" % (
                smoke.returncode, ", ".join(left) or "nothing",
                (smoke.stdout + smoke.stderr).strip()[-400:]))
    return "%s; smoke profile wrote a report in %.1f s" % (version, time.time() - t0)


def plan_event(install: bool, req: Optional[int], send: Send) -> Dict[str, Any]:
    """The ``nsys_plan`` event; with ``install`` the plan is run (or the nsys verified)."""
    plan = current_plan()
    if install and not plan.get("selected") and plan.get("install_plan"):
        for step in plan["install_plan"]:
            code = _stream([str(a) for a in step], send)
            if code != 0:
                raise RuntimeError("install step failed (exit %d): %s" % (code, " ".join(step)))
        after = current_plan()
        if not after.get("selected"):
            raise RuntimeError("the install finished but no working nsys was found after it: "
                               + str(after.get("reason")))
        after["installed"] = True
        after["verified"] = verify(str(after["selected"]))
        after["install_plan"], after["install_how"] = plan["install_plan"], plan["install_how"]
        after["install_target"] = plan["install_target"]
        plan = after
    elif install and plan.get("selected"):
        plan["verified"] = verify(str(plan["selected"]))
    plan["type"] = "nsys_plan"
    plan["ts"] = time.time()
    if req is not None:
        plan["req"] = req
    return plan
