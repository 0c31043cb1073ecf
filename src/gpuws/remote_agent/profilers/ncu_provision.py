"""``gpuws ncu HOST``: which ncu fits the pod, and installing one when none does.

The install plan runs only when the person asked for it (``--install --yes``); every
line of its output is streamed as a log event, and the result is verified with
``ncu --version`` plus a one-pass smoke profile before it is called installed.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional

from .. import wire

Send = Callable[[Dict[str, Any]], None]

SMOKE = ("import cupy; x = cupy.arange(1 << 20, dtype=cupy.float32); "
         "(x * 2).sum(); cupy.cuda.runtime.deviceSynchronize()")


def plan_for(installs: List[Dict[str, Any]], driver: Optional[str], cc: Optional[str],
             cuda_driver: Optional[str], exclude: List[str]) -> Dict[str, Any]:
    """``select_ncu`` with this pod's OS, user and home filled in."""
    from .ncu_select import select_ncu

    try:
        with open("/etc/os-release") as f:
            os_release: Optional[str] = f.read()
    except OSError:
        os_release = None
    return select_ncu(installs, driver, cc, exclude, cuda_driver=cuda_driver,
                      os_release=os_release, is_root=os.getuid() == 0,
                      home=os.path.expanduser("~"))


def current_plan(exclude: Optional[List[str]] = None) -> Dict[str, Any]:
    """The plan from a fresh look at the GPUs and the installed ncus."""
    from ..pod.gpuinfo import list_gpus
    from ..pod.tools import ncu_installs

    gpus, driver, cuda_driver, _source, _error = list_gpus()
    cc = gpus[0].get("compute_capability") if gpus else None
    return plan_for(ncu_installs(), driver, cc, cuda_driver, exclude or [])


def _stream(argv: List[str], send: Send, req: Optional[int]) -> int:
    send(wire.make("log", level="info", message="$ " + " ".join(argv)))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    for raw in proc.stdout:
        send(wire.make("log", level="info", message=raw.decode("utf-8", "replace").rstrip()))
    return proc.wait()


def verify(ncu: str, send: Send) -> str:
    """``ncu --version`` and a one-pass profile of a tiny CuPy kernel; what each said."""
    ver = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    if ver.returncode != 0:
        raise RuntimeError("%s --version failed: %s" % (ncu, ver.stderr.strip()[-300:]))
    version = ver.stdout.strip().splitlines()[-1]
    t0 = time.time()
    from ..pod.pythons import workload_python  # CuPy lives where the workloads' Python is

    smoke = subprocess.run([ncu, "--metrics", "gpu__time_duration.sum", "-c", "1",
                            workload_python(), "-c", SMOKE], capture_output=True, text=True,
                           timeout=600, stdin=subprocess.DEVNULL)
    out = smoke.stdout + smoke.stderr
    if smoke.returncode != 0 or "==PROF== Profiling" not in out:
        raise RuntimeError("smoke profile failed: %s" % out.strip()[-400:])
    return "%s; smoke profile of one kernel passed in %.1f s" % (version, time.time() - t0)


def plan_event(install: bool, req: Optional[int], send: Send) -> Dict[str, Any]:
    plan = current_plan()
    if install and not plan.get("selected") and plan.get("install_plan"):
        for step in plan["install_plan"]:
            code = _stream([str(a) for a in step], send, req)
            if code != 0:
                raise RuntimeError("install step failed (exit %d): %s" % (code, " ".join(step)))
        after = current_plan()
        if not after.get("selected"):
            raise RuntimeError("the install finished but no compatible ncu was found after it: "
                               + str(after.get("reason")))
        after["installed"] = True
        after["verified"] = verify(str(after["selected"]), send)
        plan = after
    elif install and plan.get("selected"):
        plan["verified"] = verify(str(plan["selected"]), send)
    plan["type"] = "ncu_plan"
    plan["ts"] = time.time()
    if req is not None:
        plan["req"] = req
    return plan
