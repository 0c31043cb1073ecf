"""Find Nsight Compute, Nsight Systems and CUDA toolkits on the pod, with their versions.

Standard library only (runs on the pod's python3 >= 3.8). Every install is reported
once (deduplicated by real path) as a dict shaped like ``protocol.ToolInstall``:
``{"path", "version", "error"}``. Versions come from running ``TOOL --version`` (10 s
limit each, run in parallel so a probe stays fast); a tool that cannot be run or whose
output cannot be read keeps its path and says why in ``error``.

Where the installs live (``find_*`` take the places as arguments so tests can build
small real trees):

- ``ncu``: PATH, ``/usr/local/cuda*/bin`` (a toolkit's wrapper),
  ``/usr/local/cuda*/nsight-compute*/``, ``/opt/nvidia/nsight-compute/<ver>/`` (NVIDIA's
  apt packages), ``/usr/local/NVIDIA-Nsight-Compute*/`` and, in the home directory,
  ``~/nsight-compute*``, ``~/.local/nsight-compute*``, ``~/NVIDIA-Nsight-Compute*``
  (the standalone ``.run`` installer's defaults).
- ``nsys``: PATH, ``/usr/local/cuda*/bin``, ``/usr/local/cuda*/nsight-systems*/bin``,
  ``/opt/nvidia/nsight-systems/<ver>/bin`` and the home directory. Nsight Compute ships
  its own ``nsys`` under ``<ncu>/host/*/nsys``, which cannot produce reports; one found
  on PATH is reported with an ``error`` saying so and never run.
- ``nvcc``: PATH, ``$CUDA_HOME``/``$CUDA_PATH``, ``/usr/local/cuda*/bin``.
"""

from __future__ import annotations

import concurrent.futures
import glob
import os
import re
import subprocess
from collections.abc import Callable, Iterable, Sequence
from typing import Any

VERSION_TIMEOUT_S = 10.0

# ncu: "Version 2025.3.1.0 (build 36398880) (public-release)"
_NCU_VERSION = re.compile(r"\bVersion\s+(\d{4}\.\d+(?:\.\d+)*)")
# nsys: "NVIDIA Nsight Systems version 2024.5.1.113-245134619542v0"
_NSYS_VERSION = re.compile(r"Nsight Systems version\s+(\d{4}\.\d+(?:\.\d+)*)", re.I)
# nvcc: "Cuda compilation tools, release 13.0, V13.0.88"
_NVCC_V = re.compile(r"release\s+(\d+\.\d+)\s*,\s*V(\d+\.\d+(?:\.\d+)*)")
_NVCC_RELEASE = re.compile(r"release\s+(\d+\.\d+)")
# A one-line wrapper such as /usr/local/bin/nvcc: exec /usr/local/cuda-13.0/bin/nvcc "$@"
_EXEC_WRAPPER = re.compile(r"^\s*exec\s+(/\S+)\s", re.M)
# <...>/nsight-compute[-ver]/[<ver>/]host/<platform>/nsys
_BUNDLED_NSYS_PATH = re.compile(r"nsight-compute[^/]*/(?:[^/]+/)?host/[^/]+/nsys$", re.I)
_BUNDLED_NSYS = ("the nsys bundled inside Nsight Compute (host/*/nsys) cannot profile or "
                 "make reports; install Nsight Systems")


def parse_ncu_version(text: str) -> str | None:
    """The version in ``ncu --version`` output, e.g. ``"2025.3.1.0"``; None if absent."""
    m = _NCU_VERSION.search(text)
    return m.group(1) if m else None


def parse_nsys_version(text: str) -> str | None:
    """The version in ``nsys --version`` output, without the build suffix.

    ``"NVIDIA Nsight Systems version 2024.5.1.113-245134619542v0"`` → ``"2024.5.1.113"``.
    """
    m = _NSYS_VERSION.search(text)
    return m.group(1) if m else None


def parse_nvcc_version(text: str) -> str | None:
    """The toolkit version in ``nvcc --version`` output: ``"13.0.88"`` (else ``"13.0"``)."""
    m = _NVCC_V.search(text)
    if m:
        return m.group(2)
    m = _NVCC_RELEASE.search(text)
    return m.group(1) if m else None


# ----------------------------------------------------------------------------- discovery
def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _glob_sorted(patterns: Iterable[str]) -> list[str]:
    """Matches of every pattern, newest-looking version first within each pattern."""
    out: list[str] = []
    for pattern in patterns:
        out.extend(sorted(glob.glob(pattern), key=_version_key, reverse=True))
    return out


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", path))


def _on_path(name: str, path_env: str | None) -> list[str]:
    """Every ``name`` in the PATH directories, in PATH order (not only the first)."""
    if not path_env:
        return []
    return [os.path.join(d, name) for d in path_env.split(os.pathsep) if d]


def _small_script(path: str) -> str | None:
    """The text of ``path`` if it is a short ``#!`` script, else None."""
    try:
        if os.path.getsize(path) > 16384:
            return None
        with open(path, "rb") as fh:
            head = fh.read(16384)
    except OSError:
        return None
    return head.decode("utf-8", "replace") if head.startswith(b"#!") else None


def _launcher_target(path: str, opt_root: str) -> str | None:
    """The program a launcher script at ``path`` runs, if it is one we can follow.

    Two kinds exist: one-line ``exec /abs/path "$@"`` wrappers, and the CUDA toolkit's
    ``bin/ncu``/``bin/nsys`` scripts, which run the newest of
    ``/opt/nvidia/nsight-compute/*/ncu`` and ``<toolkit>/nsight-compute-*/ncu``
    (likewise ``nsight-systems``), so they are not installs of their own.
    """
    text = _small_script(path)
    if text is None:
        return None
    m = _EXEC_WRAPPER.search(text)
    if m:
        return m.group(1)
    toolkit = os.path.dirname(os.path.dirname(os.path.realpath(path)))
    for product, tool in (("nsight-compute", "ncu"), ("nsight-systems", "bin/nsys")):
        if product not in text or os.path.basename(path) != os.path.basename(tool):
            continue
        installs = glob.glob(os.path.join(opt_root, product, "*")) + glob.glob(
            os.path.join(toolkit, product + "-*"))
        found = [d for d in installs if _executable(os.path.join(d, tool))]
        if found:
            newest = max(found, key=lambda d: _version_key(os.path.basename(d)))
            return os.path.join(newest, tool)
    return None


def dedupe(candidates: Iterable[str], opt_root: str = "/opt/nvidia") -> list[str]:
    """Existing executables among ``candidates``, one per real program, first seen wins.

    Symlinks (``/usr/local/cuda`` → ``cuda-13.0``) count once under the first path seen.
    A launcher script (see :func:`_launcher_target`) is replaced by the program it runs,
    so the reported path is the install's own (ncu's ``extras/python`` lies beside it).
    """
    seen: set[str] = set()
    out: list[str] = []
    for path in candidates:
        if not _executable(path):
            continue
        target = _launcher_target(os.path.realpath(path), opt_root)
        if target is not None and _executable(target):
            path = target
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        out.append(path)
    return out


def find_ncu(path_env: str | None = None, home: str | None = None,
             roots: tuple[str, ...] = ("/usr/local", "/opt/nvidia")) -> list[str]:
    """Every distinct ``ncu`` executable.

    Args:
        path_env: The PATH to search; default ``$PATH``.
        home: The home directory; default ``~``.
        roots: ``/usr/local`` and ``/opt/nvidia`` (other roots in tests).
    """
    path_env = os.environ.get("PATH", "") if path_env is None else path_env
    home = os.path.expanduser("~") if home is None else home
    local, opt = roots
    return dedupe(opt_root=opt, candidates=_on_path("ncu", path_env) + _glob_sorted([
        os.path.join(opt, "nsight-compute", "*", "ncu"),
        os.path.join(local, "cuda*", "bin", "ncu"),
        os.path.join(local, "cuda*", "nsight-compute*", "ncu"),
        os.path.join(local, "NVIDIA-Nsight-Compute*", "ncu"),
        os.path.join(home, "nsight-compute*", "ncu"),
        os.path.join(home, "nsight-compute*", "*", "ncu"),
        os.path.join(home, ".local", "nsight-compute*", "ncu"),
        os.path.join(home, ".local", "nsight-compute*", "*", "ncu"),
        os.path.join(home, "NVIDIA-Nsight-Compute*", "ncu"),
    ]))


def is_ncu_bundled_nsys(path: str) -> bool:
    """Whether ``path`` is the ``nsys`` inside an Nsight Compute install (not usable).

    E.g. ``/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys``.
    """
    real = os.path.realpath(path).replace(os.sep, "/")
    return _BUNDLED_NSYS_PATH.search(real) is not None


def find_nsys(path_env: str | None = None, home: str | None = None,
              roots: tuple[str, ...] = ("/usr/local", "/opt/nvidia")) -> list[str]:
    """Every distinct ``nsys`` executable, including ncu-bundled ones found on PATH.

    Callers mark those with :func:`is_ncu_bundled_nsys`; :func:`nsys_installs` does.
    """
    path_env = os.environ.get("PATH", "") if path_env is None else path_env
    home = os.path.expanduser("~") if home is None else home
    local, opt = roots
    return dedupe(opt_root=opt, candidates=_on_path("nsys", path_env) + _glob_sorted([
        os.path.join(opt, "nsight-systems", "*", "bin", "nsys"),
        os.path.join(local, "cuda*", "bin", "nsys"),
        os.path.join(local, "cuda*", "nsight-systems*", "bin", "nsys"),
        os.path.join(home, "nsight-systems*", "bin", "nsys"),
        os.path.join(home, ".local", "nsight-systems*", "bin", "nsys"),
    ]))


def find_nvcc(path_env: str | None = None, environ: dict[str, str] | None = None,
              local: str = "/usr/local") -> list[str]:
    """Every distinct ``nvcc``: PATH, ``$CUDA_HOME``/``$CUDA_PATH``, ``/usr/local/cuda*``."""
    env = dict(os.environ) if environ is None else environ
    path_env = env.get("PATH", "") if path_env is None else path_env
    homes = [env[k] for k in ("CUDA_HOME", "CUDA_PATH") if env.get(k)]
    return dedupe(_on_path("nvcc", path_env)
                  + [os.path.join(h, "bin", "nvcc") for h in homes]
                  + _glob_sorted([os.path.join(local, "cuda*", "bin", "nvcc")]))


# ----------------------------------------------------------------------------- versions
def run_version(path: str, parser: Callable[[str], str | None],
                timeout: float = VERSION_TIMEOUT_S) -> dict[str, Any]:
    """Run ``path --version`` and parse it into a ``protocol.ToolInstall`` dict."""
    try:
        proc = subprocess.run([path, "--version"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"path": path, "version": None,
                "error": f"--version did not answer within {timeout:g} s"}
    except OSError as exc:
        return {"path": path, "version": None, "error": f"cannot run: {exc}"}
    version = parser(proc.stdout)
    if version is not None and proc.returncode == 0:
        return {"path": path, "version": version, "error": None}
    first = next((ln.strip() for ln in proc.stdout.splitlines() if ln.strip()), "no output")
    return {"path": path, "version": version,
            "error": f"--version exited {proc.returncode}: {first[:200]}"}


def _versions(jobs: Sequence[tuple[str, Callable[[str], str | None]]],
              max_workers: int = 8) -> list[dict[str, Any]]:
    if not jobs:
        return []
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(max_workers, len(jobs))) as ex:
        futures = [ex.submit(run_version, path, parser) for path, parser in jobs]
        return [f.result() for f in futures]


def ncu_installs(paths: list[str] | None = None) -> list[dict[str, Any]]:
    """``protocol.ToolInstall`` dicts for every ncu (default: :func:`find_ncu`)."""
    paths = find_ncu() if paths is None else paths
    return _versions([(p, parse_ncu_version) for p in paths])


def nsys_installs(paths: list[str] | None = None) -> list[dict[str, Any]]:
    """``protocol.ToolInstall`` dicts for every nsys; ncu-bundled ones are marked, not run."""
    paths = find_nsys() if paths is None else paths
    usable = [p for p in paths if not is_ncu_bundled_nsys(p)]
    return _mark_bundled(paths, _versions([(p, parse_nsys_version) for p in usable]))


def all_installs() -> dict[str, list[dict[str, Any]]]:
    """ncu, nsys and nvcc installs at once, every ``--version`` run in parallel.

    Returns:
        ``{"ncu": [...], "nsys": [...], "toolkits": [...]}``.
    """
    ncu, nsys, nvcc = find_ncu(), find_nsys(), find_nvcc()
    usable = [p for p in nsys if not is_ncu_bundled_nsys(p)]
    results = _versions([(p, parse_ncu_version) for p in ncu]
                        + [(p, parse_nsys_version) for p in usable]
                        + [(p, parse_nvcc_version) for p in nvcc])
    n1, n2 = len(ncu), len(ncu) + len(usable)
    return {"ncu": results[:n1], "nsys": _mark_bundled(nsys, results[n1:n2]),
            "toolkits": results[n2:]}


def _mark_bundled(paths: list[str], ran: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """nsys results in ``paths`` order, with an error entry for each one not run."""
    by_path = {r["path"]: r for r in ran}
    return [by_path.get(p) or {"path": p, "version": None, "error": _BUNDLED_NSYS}
            for p in paths]
