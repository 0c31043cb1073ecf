"""Which Nsight Compute fits this pod: a pure choice over the installs the probe found.

The facts come from ``shared/reference/ncu-compat.md``: an ncu needs about the *driver
branch* of the CUDA release it shipped with (driver 570.172.08 fails with ncu 2025.3.1 and
works with 2024.1.1), Volta is gone after 2024.x, Blackwell needs 2025.1 or newer, Hopper
works from 2022.3. Nothing here runs a process; :func:`select_ncu` returns the fields of
``protocol.NcuPlan`` as a plain dict and, when nothing installed fits, the argv lists of
an install plan that the agent runs only after the person confirms.

Standard library only: this runs on the pod's python3 (>= 3.8).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

__all__ = [
    "CUDA_REPO_BASE",
    "DOWNLOAD_PY",
    "KEYRING_INSTALL_PY",
    "RELEASES",
    "Release",
    "cuda_repo",
    "install_path_for",
    "parse_ncu_version",
    "parse_os_release",
    "release_for",
    "select_ncu",
    "step_text",
    "supports_arch",
    "user_install_path_for",
]


class Release:
    """One Nsight Compute release line (``YYYY.N``) and what it needs.

    Attributes:
        line: ``(year, minor)``, e.g. ``(2025, 3)``.
        patches: the patch versions NVIDIA shipped, newest last (``"2025.3.1"``).
        cuda: the CUDA release it shipped with.
        min_driver: the minimum Linux driver of that CUDA release (its first update).
    """

    __slots__ = ("cuda", "line", "min_driver", "patches")

    def __init__(self, line: tuple[int, int], patches: list[str], cuda: str,
                 min_driver: str) -> None:
        self.line = line
        self.patches = patches
        self.cuda = cuda
        self.min_driver = min_driver

    @property
    def branch(self) -> int:
        """The driver branch (major number) this release needs."""
        return int(self.min_driver.split(".")[0])

    @property
    def newest(self) -> str:
        """The newest patch version of this release line."""
        return self.patches[-1]


#: The compat table of reference/ncu-compat.md (CUDA 11.8 … 13.1), oldest first. Releases
#: before 2022.3 come from the same rule applied to the CUDA toolkit release notes' minimum
#: drivers (11.0 → 450 … 11.7 → 515); they matter only for pods with an old ncu installed.
RELEASES: list[Release] = [
    Release((2020, 1), ["2020.1.0", "2020.1.1", "2020.1.2"], "11.0", "450.36.06"),
    Release((2020, 2), ["2020.2.0", "2020.2.1"], "11.1", "455.23.05"),
    Release((2020, 3), ["2020.3.0", "2020.3.1"], "11.2", "460.27.03"),
    Release((2021, 1), ["2021.1.0", "2021.1.1"], "11.3", "465.19.01"),
    Release((2021, 2), ["2021.2.0", "2021.2.1", "2021.2.2"], "11.4", "470.42.01"),
    Release((2021, 3), ["2021.3.0", "2021.3.1"], "11.5", "495.29.05"),
    Release((2022, 1), ["2022.1.0", "2022.1.1"], "11.6", "510.39.01"),
    Release((2022, 2), ["2022.2.0", "2022.2.1"], "11.7", "515.43.04"),
    Release((2022, 3), ["2022.3.0"], "11.8", "520.61.05"),
    Release((2022, 4), ["2022.4.0", "2022.4.1"], "12.0", "525.60.13"),
    Release((2023, 1), ["2023.1.0", "2023.1.1"], "12.1", "530.30.02"),
    Release((2023, 2), ["2023.2.0", "2023.2.1", "2023.2.2"], "12.2", "535.54.03"),
    Release((2023, 3), ["2023.3.0", "2023.3.1"], "12.3", "545.23.06"),
    Release((2024, 1), ["2024.1.0", "2024.1.1"], "12.4", "550.54.14"),
    Release((2024, 2), ["2024.2.0", "2024.2.1"], "12.5", "555.42.02"),
    Release((2024, 3), ["2024.3.0", "2024.3.1", "2024.3.2"], "12.6", "560.28.03"),
    Release((2025, 1), ["2025.1.0", "2025.1.1"], "12.8", "570.26"),
    Release((2025, 2), ["2025.2.0", "2025.2.1"], "12.9", "575.51.03"),
    Release((2025, 3), ["2025.3.0", "2025.3.1"], "13.0", "580.65.06"),
    Release((2025, 4), ["2025.4.0", "2025.4.1"], "13.1", "590.44.01"),
]

#: First release line that can profile each architecture (CUDA release notes: 11.0 added
#: sm_80, 11.1 sm_86, 11.8 sm_89/sm_90, 12.8 sm_100/101/120, 12.9 sm_103/121, 13.0 renamed
#: sm_101 to sm_110).
_ARCH_MIN: dict[int, tuple[int, int]] = {
    80: (2020, 1), 86: (2020, 2), 87: (2022, 1), 89: (2022, 3), 90: (2022, 3),
    100: (2025, 1), 101: (2025, 1), 120: (2025, 1), 103: (2025, 2), 121: (2025, 2),
    110: (2025, 3),
}
#: Last release line that still profiles each architecture (Volta was dropped after 2024.x).
_ARCH_MAX: dict[int, tuple[int, int]] = {70: (2024, 3), 72: (2024, 3)}

#: Linux distributions with an NVIDIA CUDA apt repository (``repos/<name>/<arch>/``).
_APT_REPOS = ("ubuntu2004", "ubuntu2204", "ubuntu2404", "debian11", "debian12")
#: Distributions with an NVIDIA CUDA dnf repository (``repos/<name>/<arch>/cuda-<name>.repo``).
_DNF_REPOS = ("rhel8", "rhel9", "rhel10", "fedora41", "fedora42")
_REPO_BASE = "https://developer.download.nvidia.com/compute/cuda/repos"

#: Standalone installers, by version. NVIDIA publishes no listing that can be derived from a
#: version: the file name carries a build number. The names below are the ones NVIDIA's
#: download centre links to (``developer.nvidia.com/downloads/assets/tools/secure/
#: nsight-compute/<Y_N_P>/<file>``), as fetched by nixpkgs and public install scripts; 2025.3.1's
#: build id 36398880 matches the ``ncu --version`` of the fixtures.
_RUN_INSTALLERS: dict[str, str] = {
    "2023.3.1": "nsight-compute-linux-2023.3.1.4-33567449.run",
    "2024.1.1": "nsight-compute-linux-2024.1.1.4-33998838.run",
    "2024.3.2": "nsight-compute-linux-2024.3.2.3-34861637.run",
    "2025.1.0": "nsight-compute-linux-2025.1.0.14-35237751.run",
    "2025.2.0": "nsight-compute-linux-2025.2.0.11-35613519.run",
    "2025.3.0": "nsight-compute-linux-2025.3.0.19-36273991.run",
    "2025.3.1": "nsight-compute-linux-2025.3.1.4-36398880.run",
}
_RUN_BASE = "https://developer.nvidia.com/downloads/assets/tools/secure/nsight-compute"

# A download step that needs no curl/wget: the agent's own python3 is always there.
_DOWNLOAD = "import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])"

_VERSION_RE = re.compile(r"(?<![\d.])(20\d\d)\.(\d{1,2})(?:\.(\d{1,3}))?(?:\.(\d{1,4}))?")


def parse_ncu_version(text: str) -> str | None:
    """The ``YYYY.N.P`` version in ``ncu --version`` output (or a path holding one).

    Args:
        text: e.g. ``"Version 2025.3.1.0 (build 36398880) (public-release)"`` or
            ``"/opt/nvidia/nsight-compute/2025.3.1/ncu"``.

    Returns:
        ``"2025.3.1"``, or None when no version is in the text.
    """
    m = re.search(r"Version\s+(20\d\d\.\d+(?:\.\d+)*)", text)
    m2 = _VERSION_RE.search(m.group(1) if m else text)
    if m2 is None:
        return None
    return f"{m2.group(1)}.{int(m2.group(2))}.{int(m2.group(3) or 0)}"


def _version_key(version: str) -> tuple[int, int, int]:
    m = _VERSION_RE.search(version)
    if m is None:
        raise ValueError(f"not an Nsight Compute version: {version!r}")
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


def _driver_branch(driver: str) -> int | None:
    m = re.match(r"\s*(\d+)", driver)
    return int(m.group(1)) if m else None


def _arch_number(compute_capability: str) -> int | None:
    """``"9.0"``/``"sm_90"``/``"90"``/``"12.0"`` → 90/90/90/120."""
    cc = compute_capability.strip().lower()
    if cc.startswith("sm_"):
        cc = cc[3:]
    m = re.match(r"^(\d+)\.(\d)$", cc)
    if m:
        return int(m.group(1)) * 10 + int(m.group(2))
    m = re.match(r"^(\d+)[a-z]?$", cc)
    return int(m.group(1)) if m else None


def release_for(version: str) -> tuple[Release | None, str]:
    """The table row governing ``version`` and a note when it had to be assumed.

    Args:
        version: an Nsight Compute version (``"2025.3.1"``).

    Returns:
        ``(release, note)``: the matching release line and ``""``; for a version newer
        than the table, the newest known line and a note saying it was assumed; for one
        older than the table, ``(None, note)``.
    """
    line = _version_key(version)[:2]
    for rel in RELEASES:
        if rel.line == line:
            return rel, ""
    newest = RELEASES[-1]
    if line > newest.line:
        return newest, (
            f"ncu {version} is newer than the compat table; assumed to need the newest known "
            f"driver branch ({newest.branch}, like {newest.newest} from CUDA {newest.cuda})")
    # A release line between known ones (e.g. a hypothetical 2024.4) needs at least
    # what the line before it needed.
    older = [r for r in RELEASES if r.line < line]
    if older:
        rel = older[-1]
        return rel, (f"ncu {version} is not in the compat table; "
                     f"assumed to need what {rel.newest} needs")
    return None, f"ncu {version} predates the compat table"


def supports_arch(version: str, compute_capability: str | None) -> tuple[bool, str]:
    """Whether ncu ``version`` can profile a GPU of ``compute_capability``.

    Args:
        version: an Nsight Compute version.
        compute_capability: ``"9.0"`` or ``"sm_90"``; None skips the check.

    Returns:
        ``(ok, reason)``; the reason is empty when ``ok``.
    """
    if not compute_capability:
        return True, ""
    arch = _arch_number(compute_capability)
    if arch is None:
        return True, ""
    line = _version_key(version)[:2]
    lo = _ARCH_MIN.get(arch)
    if lo is not None and line < lo:
        return False, f"sm_{arch} needs ncu {lo[0]}.{lo[1]} or newer"
    hi = _ARCH_MAX.get(arch)
    if hi is not None and line > hi:
        return False, f"ncu {line[0]}.{line[1]} dropped sm_{arch} (Volta); use a {hi[0]}.x release"
    if arch < 70:
        return False, f"sm_{arch} predates Volta; current ncu releases cannot profile it"
    return True, ""


def install_path_for(version: str) -> str:
    """Where NVIDIA's ``nsight-compute-<version>`` package puts ncu (not on PATH)."""
    return f"/opt/nvidia/nsight-compute/{version}/ncu"


def user_install_path_for(version: str, home: str) -> str:
    """Where the non-root install plan puts ncu: ``~/nsight-compute/<version>/ncu``."""
    return os.path.join(home, "nsight-compute", version, "ncu")


def parse_os_release(text: str) -> dict[str, str]:
    """The ``KEY=value`` pairs of an ``/etc/os-release`` text, quotes removed."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def cuda_repo(os_release: str | None, machine: str) -> tuple[str | None, str, str | None]:
    """NVIDIA's CUDA repository for this pod: ``(repo dir, apt|dnf|"", repo arch)``.

    ``repo dir`` (``ubuntu2404``) is None where NVIDIA has no repository for the OS;
    ``repo arch`` (``x86_64``/``sbsa``) None for an architecture it does not build.
    Shared with the Nsight Systems plan, which installs from the same repositories.
    """
    repo, manager = _repo_name(parse_os_release(os_release or ""))
    if repo is not None and repo not in (_APT_REPOS if manager == "apt" else _DNF_REPOS):
        repo = None
    return repo, manager, _repo_arch(machine)


#: Where NVIDIA's CUDA repositories live (``<base>/<repo dir>/<repo arch>/``).
CUDA_REPO_BASE = _REPO_BASE
#: A download step that needs no curl/wget (``python3 -c`` this, URL, destination).
DOWNLOAD_PY = _DOWNLOAD

#: The root plans' first step: NVIDIA's cuda-keyring package fetched into a private
#: ``mkdtemp`` directory (0700, root's), checked, and handed to the installer named after
#: the URL (``dpkg -i``), in one process. A fixed path such as ``/tmp/cuda-keyring…deb``
#: let another user of a shared pod plant or rewrite the package between the download and
#: ``dpkg -i`` as root (issue 26). The check: at most 1 MiB; ``dpkg-deb`` says Package
#: ``cuda-keyring``, Version ``1.1-1``; its files are regular files under apt's sources,
#: apt's preferences, ``/usr/share/keyrings`` or ``/usr/share/doc`` (no link, device or
#: anything elsewhere). The download is HTTPS with urllib's certificate checks.
KEYRING_INSTALL_PY = r"""
import os, shutil, subprocess, sys, tempfile, urllib.request
url, installer = sys.argv[1], sys.argv[2:]
allowed = ("./etc/apt/sources.list.d/", "./etc/apt/preferences.d/", "./usr/share/keyrings/",
           "./usr/share/doc/")
def refuse(why):
    sys.exit("gpuws: the cuda-keyring package from %s was refused: %s" % (url, why))
d = tempfile.mkdtemp(prefix="gpuws-keyring-")
try:
    deb = os.path.join(d, "cuda-keyring_1.1-1_all.deb")
    with urllib.request.urlopen(url, timeout=120) as r:
        data = r.read((1 << 20) + 1)
    if len(data) > 1 << 20:
        refuse("it is over 1 MiB")
    fd = os.open(deb, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    def dpkg_deb(*args):
        res = subprocess.run(["dpkg-deb"] + list(args) + [deb], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, universal_newlines=True)
        if res.returncode != 0:
            refuse("dpkg-deb cannot read it (%s)" % res.stderr.strip()[-200:])
        return res.stdout
    fields = dpkg_deb("--field").splitlines()
    got = dict(line.split(": ", 1) for line in fields if ": " in line)
    if (got.get("Package"), got.get("Version")) != ("cuda-keyring", "1.1-1"):
        refuse("it is %r %r, not cuda-keyring 1.1-1" % (got.get("Package"), got.get("Version")))
    for line in dpkg_deb("--contents").splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or line[0] == "d":
            continue
        if line[0] != "-" or not parts[5].startswith(allowed) or ".." in parts[5]:
            refuse("it holds %s" % parts[-1][:200])
    sys.exit(subprocess.call(installer + [deb]))
finally:
    shutil.rmtree(d, ignore_errors=True)
"""


def _repo_name(osr: dict[str, str]) -> tuple[str | None, str]:
    """NVIDIA's repo directory name for this OS and its package manager (apt/dnf)."""
    ids = [osr.get("ID", "").lower(), *osr.get("ID_LIKE", "").lower().split()]
    version = osr.get("VERSION_ID", "")
    major = version.split(".")[0]
    if ids[0] == "ubuntu":
        return "ubuntu" + version.replace(".", ""), "apt"
    if ids[0] == "debian":
        return "debian" + major, "apt"
    if ids[0] == "fedora":
        return "fedora" + major, "dnf"
    if "rhel" in ids or ids[0] in ("rhel", "rocky", "almalinux", "centos", "ol"):
        return "rhel" + major, "dnf"
    if "ubuntu" in ids or "debian" in ids:
        return None, "apt"
    return None, ""


def step_text(step: list[str]) -> str:
    """One plan step as a person reads it before confirming: the keyring step (only when
    its code is exactly :data:`KEYRING_INSTALL_PY`, this gpuws's own) as what it does,
    any other step as its words."""
    if step[:3] == ["python3", "-c", KEYRING_INSTALL_PY] and len(step) >= 5:
        return ("python3 -c <fetch %s into a private directory, check it is cuda-keyring "
                "1.1-1 holding only apt and keyring files, then: %s it>"
                % (step[3], " ".join(step[4:])))
    return " ".join(step)


def _repo_arch(machine: str) -> str | None:
    m = machine.lower()
    if m in ("x86_64", "amd64"):
        return "x86_64"
    if m in ("aarch64", "arm64"):
        return "sbsa"
    return None


def _plan_install(target: str, os_release: str | None, is_root: bool, home: str,
                  machine: str) -> tuple[list[list[str]] | None, str, str | None]:
    """Argv lists that install ``target``; ``(None, why, None)`` when none can be made.

    Returns:
        ``(plan, how, ncu_path)``: the steps, a sentence saying what they do and where
        the plan came from, and where ncu will be afterwards.
    """
    arch = _repo_arch(machine)
    if is_root:
        osr = parse_os_release(os_release or "")
        repo, manager = _repo_name(osr)
        if arch is not None and repo is not None and manager == "apt" and repo in _APT_REPOS:
            keyring = f"{_REPO_BASE}/{repo}/{arch}/cuda-keyring_1.1-1_all.deb"
            apt = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get"]
            plan = [
                ["python3", "-c", KEYRING_INSTALL_PY, keyring, "dpkg", "-i"],
                [*apt, "update"],
                [*apt, "install", "-y", "--no-install-recommends", "nsight-compute-" + target],
            ]
            how = (f"as root from NVIDIA's CUDA apt repository ({_REPO_BASE}/{repo}/{arch}/, "
                   f"added through its cuda-keyring package, fetched into a private "
                   f"directory and checked before dpkg installs it): the pinned package "
                   f"nsight-compute-{target}")
            return plan, how, install_path_for(target)
        if arch is not None and repo is not None and manager == "dnf" and repo in _DNF_REPOS:
            repo_url = f"{_REPO_BASE}/{repo}/{arch}/cuda-{repo}.repo"
            plan = [
                ["python3", "-c", _DOWNLOAD, repo_url, f"/etc/yum.repos.d/cuda-{repo}.repo"],
                ["dnf", "install", "-y", "nsight-compute-" + target],
            ]
            how = (f"as root from NVIDIA's CUDA dnf repository ({repo_url}): the pinned package "
                   f"nsight-compute-{target}")
            return plan, how, install_path_for(target)
    run = _RUN_INSTALLERS.get(target)
    if run is None or arch != "x86_64":
        return None, "", None
    url = "{}/{}/{}".format(_RUN_BASE, target.replace(".", "_"), run)
    dest_dir = os.path.join(home, "nsight-compute", target)
    run_path = os.path.join(home, "nsight-compute", run)
    plan = [
        ["mkdir", "-p", dest_dir],
        ["python3", "-c", _DOWNLOAD, url, run_path],
        ["sh", run_path, "--quiet", "--", "-noprompt", "-targetpath=" + dest_dir],
        ["rm", "-f", run_path],
    ]
    how = (f"without root: NVIDIA's standalone installer {run} into {dest_dir} (URL pattern "
           "of NVIDIA's download centre, developer.nvidia.com/downloads/assets/tools/secure/"
           "nsight-compute/<Y_N_P>/<file>, with the file names it links to)")
    return plan, how, user_install_path_for(target, home)


def _install_target(branch: int | None, compute_capability: str | None,
                    excluded_versions: Iterable[str], usable: Iterable[str] | None = None
                    ) -> str | None:
    """Newest release (its newest patch) that fits the driver branch and the arch."""
    skip = set(excluded_versions)
    for rel in reversed(RELEASES):
        if rel.line < (2022, 3):
            break  # NVIDIA's repositories carry these no more; do not plan them
        if branch is not None and rel.branch > branch:
            continue
        for version in reversed(rel.patches):
            if version in skip or not supports_arch(version, compute_capability)[0]:
                continue
            if usable is not None and version not in usable:
                continue
            return version
    return None


def _check(version: str | None, error: str | None, driver: str | None,
           branch: int | None, compute_capability: str | None, excluded: bool
           ) -> tuple[bool, str]:
    if version is None:
        why = "could not tell its version"
        return False, why + (": " + error if error else "")
    if excluded:
        return False, "excluded: the driver refused it earlier (\"driver is not compatible\")"
    ok, why = supports_arch(version, compute_capability)
    if not ok:
        return False, why
    rel, note = release_for(version)
    note = "; " + note if note else ""
    if rel is None:
        return True, "older than every known release; any current driver runs it" + note
    if driver is None or branch is None:
        return True, (f"driver version unknown; assumed compatible "
                      f"(needs branch >= {rel.branch}){note}")
    if branch >= rel.branch:
        return True, f"driver {driver} meets branch {rel.branch} (CUDA {rel.cuda}){note}"
    return False, (f"needs driver branch >= {rel.branch} (shipped with CUDA {rel.cuda}); "
                   f"pod has {driver}{note}")


def select_ncu(installs: list[dict[str, Any]], driver: str | None,
               compute_capability: str | None, exclude: Iterable[str] = (), *,
               cuda_driver: str | None = None, os_release: str | None = None,
               is_root: bool = True, home: str | None = None,
               machine: str = "x86_64") -> dict[str, Any]:
    """Choose the newest installed ncu that fits the driver and the GPU, or plan an install.

    Args:
        installs: what the probe found, ``[{"path", "version", "error"}]`` (``ToolInstall``).
        driver: the NVIDIA driver version (``"580.159.04"``), None if unknown.
        compute_capability: the GPU's compute capability (``"9.0"``), None if unknown.
        exclude: paths or versions to pass over, e.g. one that printed "Cuda driver is
            not compatible with Nsight Compute" (step back one release).
        cuda_driver: the driver's CUDA version, passed through into the plan.
        os_release: the pod's ``/etc/os-release`` text (picks the package repository).
        is_root: whether the agent runs as root (package repo vs standalone installer).
        home: the pod user's home directory for the non-root plan (default: this process's).
        machine: ``uname -m`` of the pod.

    Returns:
        The fields of ``protocol.NcuPlan`` (with ``"type": "ncu_plan"``): ``driver``,
        ``cuda_driver``, ``arch``, ``choices`` (``NcuChoice`` dicts, newest first),
        ``selected``, ``selected_version``, ``reason``, ``install_plan`` and
        ``install_target_version``.
    """
    excluded = set(exclude)
    branch = _driver_branch(driver) if driver else None
    arch = _arch_number(compute_capability) if compute_capability else None
    arch_name = f"sm_{arch}" if arch is not None else None

    rows: list[tuple[tuple[int, int, int], dict[str, Any]]] = []
    seen = set()
    for inst in installs:
        path = str(inst.get("path") or "")
        if not path or path in seen:
            continue
        seen.add(path)
        raw_version = inst.get("version")
        version = parse_ncu_version(str(raw_version)) if raw_version else None
        if version is None and not inst.get("error"):
            version = parse_ncu_version(path)
        is_excluded = path in excluded or (version is not None and version in excluded)
        ok, why = _check(version, inst.get("error"), driver, branch, compute_capability,
                         is_excluded)
        key = _version_key(version) if version else (0, 0, 0)
        rows.append((key, {"path": path, "version": version, "compatible": ok, "reason": why}))
    rows.sort(key=lambda r: r[0], reverse=True)
    choices = [row for _, row in rows]

    plan: dict[str, Any] = {
        "type": "ncu_plan",
        "driver": driver,
        "cuda_driver": cuda_driver,
        "arch": arch_name,
        "choices": choices,
        "selected": None,
        "selected_version": None,
        "reason": "",
        "install_plan": None,
        "install_target_version": None,
    }
    gpu = f" and {arch_name}" if arch_name else ""
    fits = f"driver {driver}{gpu}" if driver else f"this GPU{gpu}"
    for choice in choices:
        if choice["compatible"]:
            plan["selected"] = choice["path"]
            plan["selected_version"] = choice["version"]
            plan["reason"] = "ncu {} at {} is the newest installed one that fits {}".format(
                choice["version"], choice["path"], fits)
            if branch is None:
                plan["reason"] += " (driver version unknown: compatibility assumed)"
            return plan

    excluded_versions = [v for v in excluded if _VERSION_RE.match(v)]
    excluded_versions += [str(c["version"]) for c in choices
                          if c["version"] and c["path"] in excluded]
    found = "no ncu installed" if not choices else f"no installed ncu fits {fits}"
    if driver is None and compute_capability is None:
        # Neither NVML nor nvidia-smi saw a GPU: an ncu would have nothing to profile, and
        # which release fits depends on the driver that is still to be installed.
        plan["reason"] = (f"{found}, and none is needed yet: no NVIDIA GPU or driver was "
                          "found on this machine; install the NVIDIA driver (or connect to "
                          "a GPU pod) first")
        return plan
    target = _install_target(branch, compute_capability, excluded_versions)
    if target is None:
        plan["reason"] = (f"{found}, and no known release does (driver branch {branch}): "
                          "upgrade the driver")
        return plan
    home_dir = home if home is not None else os.path.expanduser("~")
    steps, how, ncu_path = _plan_install(target, os_release, is_root, home_dir, machine)
    if steps is None and not is_root:
        # The newest fitting release may have no known standalone installer; take the newest
        # one that has.
        alt = _install_target(branch, compute_capability, excluded_versions,
                              usable=_RUN_INSTALLERS)
        if alt is not None:
            target = alt
            steps, how, ncu_path = _plan_install(alt, os_release, is_root, home_dir, machine)
    if steps is None:
        plan["reason"] = ("{}; ncu {} would fit, but no install plan fits this pod ({}, {}); "
                          "install it by hand from https://developer.nvidia.com/nsight-compute"
                          ).format(found, target, "root" if is_root else "not root", machine)
        plan["install_target_version"] = target
        return plan
    rel, note = release_for(target)
    plan["install_plan"] = steps
    plan["install_target_version"] = target
    plan["reason"] = "{}; plan: install ncu {} (needs driver branch >= {}) {}, then {}{}".format(
        found, target, rel.branch if rel else "?", how, ncu_path, "; " + note if note else "")
    return plan
