"""Which Python runs the workloads: the login PATH's python3, or one found that has CuPy/torch.

On rented pods the login PATH's ``python3`` is often the system's, without CuPy or torch,
while the image keeps them in a virtualenv or a conda environment (on the H200 test machine
``/usr/bin/python3`` had neither and ``/opt/torch/.venv/bin/python3`` had both, so gpuws
needed ``--python`` until this module). When the agent's own interpreter lacks them,
:func:`choose` looks in the usual places, reads what each interpreter has from its
installed metadata (never importing torch: that takes seconds), runs only the one it
picks (``-c`` with a timeout, to prove it starts and finds what its metadata promised)
and says why in words. ``--python`` on the laptop names the interpreter outright: the
agent is told so (``serve --python-given``, then :data:`GIVEN_ENV` for the workers it
starts) and searches for nothing.

Bounded, because it runs in every probe: at most :data:`MAX_CANDIDATES` interpreters and
:data:`BUDGET_S` seconds of looking, directory listings cut at :data:`MAX_LISTING`
entries, fixed depths only (``/opt/*/.venv``, never a walk), files read without blocking.

Standard library only (runs on the pod's python3 >= 3.8).
"""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import time
from typing import Any, Dict, FrozenSet, Iterable, Iterator, List, Mapping, Optional, Tuple

from ..safefiles import read_regular
from . import probe

#: Set (to ``1``) in the agent's environment when the laptop named its interpreter with
#: ``--python``; the workers ``serve`` starts inherit it.
GIVEN_ENV = "GPUWS_PYTHON_GIVEN"
#: Interpreters looked at, at most (duplicates of one already seen do not count). One
#: without torch or CuPy costs about a millisecond to look at.
MAX_CANDIDATES = 64
#: Seconds spent looking (listing, reading metadata) before the search stops.
BUDGET_S = 1.0
#: Seconds the chosen interpreter may take to answer ``-c``; a venv on a cold network disk
#: can take a few, a hung one never holds the probe longer than this.
VERIFY_TIMEOUT_S = 10.0
#: Candidates run, at most, when better-ranked ones fail to start.
MAX_VERIFIED = 3
#: Entries read from one directory listing (a home with thousands of entries).
MAX_LISTING = 256
#: The agent's own code runs in the workload's interpreter (``agent.pyz child``).
MIN_VERSION = (3, 8)
#: Where conda-style installers put their root in a home directory.
CONDA_NAMES = ("miniconda3", "anaconda3", "miniforge3", "mambaforge", "micromamba")
OPT_DIRS = ("/opt",)
WORKSPACE_DIRS = ("/workspace",)
LOCAL_BINS = ("/usr/local/bin",)

_PY_NAME = re.compile(r"^python3(?:\.(\d+))?$")
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
#: What the chosen interpreter runs: its version, and whether ``import torch`` / ``import
#: cupy`` would find a package. ``find_spec`` of a top-level name locates it without
#: executing it, so this costs an interpreter start (~20 ms), not a torch import.
_VERIFY = ("import sys, importlib.util as u\n"
           "print('%d.%d.%d' % tuple(sys.version_info[:3]), "
           "int(u.find_spec('torch') is not None), int(u.find_spec('cupy') is not None))\n")


# ----------------------------------------------------------------------------- packages
def installed(packages: Iterable[Mapping[str, Any]], name: str) -> bool:
    """Whether ``name`` (``torch`` or ``cupy``) is in a ``python_packages`` list.

    Any CuPy wheel (``cupy-cuda12x``...) counts as ``cupy``; a CPU-only torch counts as
    installed here (it imports), though :func:`usable` does not rank it.
    """
    for p in packages:
        pname = str(p.get("name") or "")
        if (pname == name or pname.startswith(name + "-")) and p.get("version"):
            return True
    return False


def usable(packages: Iterable[Mapping[str, Any]]) -> FrozenSet[str]:
    """Which of torch and CuPy a GPU workload can use: installed, and torch built for CUDA."""
    have = set()
    for p in packages:
        pname = str(p.get("name") or "")
        if not p.get("version"):
            continue
        if pname == "torch" and not p.get("error"):
            have.add("torch")
        elif pname == "cupy" or pname.startswith("cupy-"):
            have.add("cupy")
    return frozenset(have)


def _labels(packages: Iterable[Mapping[str, Any]]) -> List[str]:
    out = []
    for p in packages:
        if not p.get("version"):
            continue
        note = " (%s)" % p["error"] if p.get("error") else ""
        out.append("%s %s%s" % (p.get("name"), p.get("version"), note))
    return out


def _has_words(has: FrozenSet[str]) -> str:
    if has == frozenset(("torch", "cupy")):
        return "torch and CuPy"
    if has:
        return "torch" if "torch" in has else "CuPy"
    return "neither CuPy nor torch"


# ----------------------------------------------------------------------------- trust
def trust_problem(path: str, uid: Optional[int] = None) -> Optional[str]:
    """Why running (or reading) ``path`` would run what someone else controls; None if not.

    The rule, as OpenSSH's StrictModes: every directory passed through on the way to the
    file, every symlink followed (resolved here component by component, so an
    intermediate link in a directory others can write is seen too) and the file itself
    must belong to root or to this user, and no directory may be writable by group or
    others unless it is root's and sticky (``/tmp``: others can add entries there but not
    replace ours, and the next component's owner is checked). So a hostile
    ``/tmp/x/bin/python3`` (``/tmp/x`` made by another user), a python3 in a
    world-writable ``/opt/shared/bin`` or one reached through a link someone else owns is
    never run, and its site-packages are never read.
    """
    me = os.getuid() if uid is None else uid
    if not os.path.isabs(path):
        return "%s is not an absolute path" % path
    pending = [c for c in path.split("/") if c]
    cur = "/"
    links = 0
    try:
        st = os.lstat(cur)
        problem = _mode_problem(cur, st, me)
        if problem:
            return problem
        while pending:
            comp = pending.pop(0)
            if comp == ".":
                continue
            if comp == "..":
                cur = os.path.dirname(cur)
                continue
            nxt = os.path.join(cur, comp)
            st = os.lstat(nxt)
            problem = _mode_problem(nxt, st, me)
            if problem:
                return problem
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > 40:
                    return "%s: too many levels of symbolic links" % path
                target = os.readlink(nxt)
                if target.startswith("/"):
                    cur = "/"
                pending = [c for c in target.split("/") if c] + pending
                continue
            if pending and not stat.S_ISDIR(st.st_mode):
                return "%s is not a directory" % nxt
            cur = nxt
    except OSError as exc:
        return "%s cannot be examined (%s)" % (path, exc.strerror or exc)
    if not stat.S_ISREG(st.st_mode):
        return "%s is not a regular file" % cur
    if not st.st_mode & 0o111:
        return "%s is not executable" % cur
    return None


def _mode_problem(path: str, st: os.stat_result, uid: int) -> Optional[str]:
    if st.st_uid not in (0, uid):
        return "%s belongs to uid %d (neither root nor you)" % (path, st.st_uid)
    if stat.S_ISLNK(st.st_mode):
        return None  # a link's own mode means nothing; its directory was checked
    if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and st.st_uid == 0:
        return None
    if st.st_mode & 0o022:
        return "%s is writable by %s" % (path, "others" if st.st_mode & 0o002 else "its group")
    return None


# ----------------------------------------------------------------------------- one interpreter
def _parse_version(text: str) -> Optional[Tuple[int, ...]]:
    m = _VERSION.search(text or "")
    if m is None:
        return None
    return tuple(int(x) for x in m.groups() if x is not None)


def _version_str(version: Optional[Tuple[int, ...]]) -> Optional[str]:
    return None if version is None else ".".join(str(x) for x in version)


def _lib_version(prefix: str) -> Optional[Tuple[int, ...]]:
    """X.Y from the one ``lib/pythonX.Y`` directory of a prefix (None: none or several)."""
    found = set()
    for lib in ("lib", "lib64"):
        for name in _listing(os.path.join(prefix, lib)):
            m = re.match(r"^python(\d+)\.(\d+)$", name)
            if m:
                found.add((int(m.group(1)), int(m.group(2))))
    return found.pop() if len(found) == 1 else None


def _prefix_dirs(real_exe: str, version: Optional[Tuple[int, ...]], home: str) -> List[str]:
    """Where a non-venv interpreter finds packages: its prefix's site-/dist-packages (as
    CPython, conda and Debian's patched python3 lay them out) and the user site."""
    prefix = os.path.dirname(os.path.dirname(real_exe))
    if version is None or len(version) < 2:
        return []
    ver = "python%d.%d" % (version[0], version[1])
    dirs = [os.path.join(prefix, "lib", ver, "site-packages"),
            os.path.join(prefix, "lib64", ver, "site-packages"),
            os.path.join(prefix, "lib", ver, "dist-packages"),
            os.path.join(prefix, "lib", "python3", "dist-packages"),
            os.path.join(prefix, "local", "lib", ver, "dist-packages"),
            os.path.join(home, ".local", "lib", ver, "site-packages")]
    return dirs


def site_dirs(exe: str, home: str) -> Tuple[List[str], Optional[Tuple[int, ...]]]:
    """Where ``exe`` finds its packages and its version, as far as files tell (not run).

    A venv says both in ``pyvenv.cfg`` (``version``, or uv's ``version_info``); otherwise
    the version comes from the resolved file's name (``python3.12``) or the prefix's one
    ``lib/pythonX.Y`` directory.
    """
    venv = probe.pyvenv_cfg(exe)
    if venv is not None:
        root, values = venv
        version = _parse_version(values.get("version_info") or values.get("version") or "")
        if version is None:
            version = _parse_version(os.path.basename(os.path.realpath(exe))) \
                or _lib_version(root)
        dirs: List[str] = []
        if version is not None and len(version) >= 2:
            found = probe.venv_site_packages(exe, (version[0], version[1]))
            dirs = list(found[0]) if found else []
        if values.get("include-system-site-packages", "").lower() == "true":
            base = values.get("executable") or os.path.join(values.get("home", ""), "python3")
            dirs += _prefix_dirs(os.path.realpath(base), version, home)
        return _existing(dirs), version
    real = os.path.realpath(exe)
    version = _parse_version(os.path.basename(real)) \
        or _lib_version(os.path.dirname(os.path.dirname(real)))
    return _existing(_prefix_dirs(real, version, home)), version


def _existing(dirs: Iterable[str]) -> List[str]:
    out: List[str] = []
    seen = set()
    for d in dirs:
        real = os.path.realpath(d)
        if real not in seen and os.path.isdir(d):
            seen.add(real)
            out.append(d)
    return out


class Candidate:
    """One interpreter looked at: what its files say it has, or why it was passed over."""

    def __init__(self, path: str, order: int) -> None:
        self.path = path
        self.order = order
        self.version: Optional[Tuple[int, ...]] = None
        self.packages: List[Dict[str, Any]] = []
        self.error: Optional[str] = None

    @property
    def has(self) -> FrozenSet[str]:
        return usable(self.packages)

    def rank(self) -> Tuple[int, Tuple[int, ...], int]:
        """Sort key: both > torch > CuPy, then the newer Python, then PATH order."""
        has = self.has
        score = 3 if len(has) == 2 else 2 if "torch" in has else 1 if has else 0
        return (-score, tuple(-x for x in (self.version or (0,))), self.order)

    def as_dict(self) -> Dict[str, Any]:
        """A ``protocol.PythonCandidate``."""
        return {"path": self.path, "version": _version_str(self.version),
                "packages": _labels(self.packages), "error": self.error}


def look(path: str, order: int, home: str, uid: Optional[int] = None) -> Candidate:
    """What ``path`` is, from its files only: trusted? version? torch and CuPy?"""
    cand = Candidate(path, order)
    problem = trust_problem(path, uid)
    if problem is not None:
        cand.error = "not looked at: " + problem
        return cand
    dirs, cand.version = site_dirs(path, home)
    if cand.version is not None and cand.version[:2] < MIN_VERSION:
        cand.error = "Python %s is older than %d.%d, which the agent needs" % (
            _version_str(cand.version), MIN_VERSION[0], MIN_VERSION[1])
        return cand
    cand.packages = probe.python_packages(dirs)
    return cand


def verify(cand: Candidate, timeout_s: float = VERIFY_TIMEOUT_S) -> Optional[str]:
    """Run the candidate once (``-c``): None when it starts, is 3.8+ and finds the packages
    its metadata lists; else why not. Fills in the exact version."""
    code, out, err = _run_bounded([cand.path, "-c", _VERIFY], timeout_s)
    if code is None:
        return "did not answer within %.0f s" % timeout_s
    words = out.split()
    if code != 0 or len(words) != 3 or not all(w.isdigit() for w in words[1:]):
        last = (err.strip().splitlines() or ["exit status %d" % code])[-1]
        return "did not run: %s" % last[:200]
    version = _parse_version(words[0])
    if version is None or version[:2] < MIN_VERSION:
        return "Python %s is older than %d.%d, which the agent needs" % (
            words[0], MIN_VERSION[0], MIN_VERSION[1])
    cand.version = version
    finds = {"torch": words[1] == "1", "cupy": words[2] == "1"}
    missing = sorted(name for name in cand.has if not finds[name])
    if missing:
        return "its metadata lists %s but import would not find it" % " and ".join(missing)
    return None


def _run_bounded(argv: List[str], timeout_s: float) -> Tuple[Optional[int], str, str]:
    """Exit code (None: timed out), stdout, stderr. The process gets its own process group,
    killed whole on timeout, so a child it left holding the pipes cannot stall us."""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd="/", close_fds=True,
                                start_new_session=True)
    except OSError as exc:
        return 127, "", str(exc)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            proc.communicate(timeout=1)
        except subprocess.TimeoutExpired:
            pass  # something outside the group holds the pipes: stop reading them
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()
        return None, "", ""
    return (proc.returncode, out.decode("utf-8", "replace")[:4096],
            err.decode("utf-8", "replace")[-4096:])


# ----------------------------------------------------------------------------- where to look
def _listing(directory: str) -> List[str]:
    """Sorted names in ``directory`` (at most :data:`MAX_LISTING`; hidden ones left out)."""
    names: List[str] = []
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if not entry.name.startswith("."):
                    names.append(entry.name)
                if len(names) >= 4 * MAX_LISTING:
                    break
    except OSError:
        return []
    return sorted(names)[:MAX_LISTING]


def _in_bin(directory: str) -> Iterator[str]:
    """``python3``, ``python`` and ``python3.N`` (newest first) in one bin directory."""
    yield os.path.join(directory, "python3")
    yield os.path.join(directory, "python")
    minors = []
    for name in _listing(directory):
        m = _PY_NAME.match(name)
        if m and m.group(1):
            minors.append((int(m.group(1)), name))
    for _minor, name in sorted(minors, reverse=True):
        yield os.path.join(directory, name)


def _env(root: str) -> Iterator[str]:
    """The interpreter of an environment root (a venv or a conda prefix)."""
    yield os.path.join(root, "bin", "python3")


def _conda(root: str) -> Iterator[str]:
    yield from _env(root)
    for name in _listing(os.path.join(root, "envs")):
        yield from _env(os.path.join(root, "envs", name))


def _environments_txt(home: str) -> List[str]:
    """The environments conda recorded in ``~/.conda/environments.txt`` (64 at most)."""
    try:
        raw = read_regular(os.path.join(home, ".conda", "environments.txt"), 1 << 16)
    except OSError:
        return []
    lines = [x.strip() for x in raw.decode("utf-8", "replace").splitlines()]
    return [x for x in lines if x.startswith("/")][:64]


def candidate_paths(environ: Mapping[str, str], home: str,
                    opt_dirs: Iterable[str] = OPT_DIRS,
                    workspace_dirs: Iterable[str] = WORKSPACE_DIRS,
                    local_bins: Iterable[str] = LOCAL_BINS) -> Iterator[str]:
    """Every place an interpreter may be, in the order ties are broken by: the PATH first
    (absolute entries only: a relative one depends on the directory the agent started in;
    pyenv's shims are scripts, its versions are looked at directly), then the active and
    conda environments, ``~/.venv``/``~/venv``, ``/opt`` and ``/workspace``, and only then
    the broad ``~/*/.venv`` (a home with many projects must not use up the bound before
    ``/opt/torch/.venv`` is reached), pyenv's versions, ``/usr/local/bin``. Only existing
    paths are yielded; duplicates are for the caller to drop."""
    def gen() -> Iterator[str]:
        seen_dirs: List[str] = []
        for d in environ.get("PATH", "").split(os.pathsep):
            if d.rstrip("/").endswith("/.pyenv/shims"):
                continue  # scripts that pick a version per directory; versions/* come later
            if d.startswith("/") and d not in seen_dirs and len(seen_dirs) < 64:
                seen_dirs.append(d)
                yield from _in_bin(d)
        for var in ("VIRTUAL_ENV", "CONDA_PREFIX"):
            if environ.get(var, "").startswith("/"):
                yield from _env(environ[var])
        for root in _environments_txt(home):
            yield from _env(root)
        for name in CONDA_NAMES:
            yield from _conda(os.path.join(home, name))
        for name in (".venv", "venv"):
            yield from _env(os.path.join(home, name))
        for opt in opt_dirs:
            for name in _listing(opt):
                root = os.path.join(opt, name)
                if os.path.isdir(os.path.join(root, "conda-meta")):
                    yield from _conda(root)
                else:
                    yield from _env(root)
                yield from _env(os.path.join(root, ".venv"))
                yield from _env(os.path.join(root, "venv"))
        for ws in workspace_dirs:
            yield from _env(os.path.join(ws, ".venv"))
            for name in _listing(ws):
                yield from _env(os.path.join(ws, name, ".venv"))
                yield from _env(os.path.join(ws, name, "venv"))
        for name in _listing(home):
            yield from _env(os.path.join(home, name, ".venv"))
        for name in _listing(os.path.join(home, ".pyenv", "versions")):
            yield from _env(os.path.join(home, ".pyenv", "versions", name))
        for d in local_bins:
            yield from _in_bin(d)

    for path in gen():
        # lexists: a dangling link is not an interpreter; a FIFO or directory is looked at
        # (and refused) by trust_problem, never opened.
        if os.path.lexists(path) and not os.path.isdir(path):
            yield path


def identity(path: str) -> str:
    """Which interpreter ``path`` really is: a venv by its directory (its ``python3`` is a
    link to the base interpreter, yet it sees other packages), else the resolved file."""
    bindir = os.path.dirname(path)
    for root in (bindir, os.path.dirname(bindir)):
        if os.path.exists(os.path.join(root, "pyvenv.cfg")):
            return "venv:" + os.path.realpath(root)
    return os.path.realpath(path)


# ----------------------------------------------------------------------------- the choice
def choose(own: Optional[str] = None, given: Optional[bool] = None,
           environ: Optional[Mapping[str, str]] = None, home: Optional[str] = None,
           opt_dirs: Iterable[str] = OPT_DIRS, workspace_dirs: Iterable[str] = WORKSPACE_DIRS,
           local_bins: Iterable[str] = LOCAL_BINS, budget_s: float = BUDGET_S,
           verify_timeout_s: float = VERIFY_TIMEOUT_S
           ) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """The interpreter workloads run under, and its packages.

    The agent's own interpreter (the login PATH's python3, or the one ``--python`` named)
    is kept when it has both torch and CuPy, or when it was named (``given``). Otherwise
    interpreters are looked at (:func:`candidate_paths`) and one is taken only when it has
    everything the own one has and more (so a login python3 with CuPy is never traded for
    a torch-only one that would break the bundled CuPy kernels); among those, torch and
    CuPy > torch > CuPy, then the newer Python, then PATH order; the first that really
    starts (:func:`verify`) wins.

    Args:
        own: The agent's interpreter (default ``sys.executable``).
        given: Whether ``--python`` named it (default: :data:`GIVEN_ENV` is set).
        environ, home, opt_dirs, workspace_dirs, local_bins: Where to look (tests point
            these at a fake home and ``/opt``).
        budget_s: Seconds of looking; verify_timeout_s: of one ``-c`` run.

    Returns:
        A ``protocol.PythonChoice`` dict and the chosen interpreter's
        ``protocol.PyPackage`` dicts.
    """
    t0 = time.monotonic()
    own = own or sys.executable
    env = os.environ if environ is None else environ
    home = home or os.path.expanduser("~")
    if given is None:
        given = bool(env.get(GIVEN_ENV))
    me = Candidate(own, -1)
    if own == sys.executable:
        # The running interpreter: ask it (sys.path, site), not its files.
        me.version = tuple(sys.version_info[:3])
        me.packages = probe.python_packages()
    else:
        dirs, me.version = site_dirs(own, home)
        me.packages = probe.python_packages(dirs)
    own_has = me.has
    where = "named with --python" if given else "python3 on the login PATH"
    if given:
        return _result(me, "--python", "%s (%s); it has %s" % (
            where, own, _has_words(own_has)), [me]), me.packages
    if len(own_has) == 2:
        return _result(me, "login", "%s (%s) has torch and CuPy" % (where, own),
                       [me]), me.packages

    looked: List[Candidate] = []
    seen = {identity(own)}
    stopped = ""
    deadline = t0 + budget_s
    for path in candidate_paths(env, home, opt_dirs, workspace_dirs, local_bins):
        if len(looked) >= MAX_CANDIDATES:
            stopped = "; stopped at the bound of %d interpreters" % MAX_CANDIDATES
            break
        if time.monotonic() > deadline:
            stopped = "; stopped at the %.1f s bound" % budget_s
            break
        key = identity(path)
        if key in seen:
            continue
        seen.add(key)
        looked.append(look(path, len(looked), home))
    better = sorted((c for c in looked if c.error is None and c.has > own_has),
                    key=Candidate.rank)
    chosen: Optional[Candidate] = None
    for cand in better[:MAX_VERIFIED]:
        problem = verify(cand, verify_timeout_s)
        if problem is None:
            chosen = cand
            break
        cand.error = problem
    took = "%d looked at in %.2f s%s" % (len(looked), time.monotonic() - t0, stopped)
    listed = [me, *looked]
    if chosen is not None:
        reason = "%s (%s) has %s; %s (Python %s) has %s (%s)" % (
            where, own, _has_words(own_has), chosen.path, _version_str(chosen.version),
            ", ".join(_labels(chosen.packages)), took)
        return _result(chosen, "found", reason, listed), chosen.packages
    if own_has:
        reason = ("%s (%s) has %s; no other interpreter has more (%s)"
                  % (where, own, _has_words(own_has), took))
        return _result(me, "login", reason, listed), me.packages
    reason = ("no interpreter with CuPy or torch was found (%s): workloads run under %s "
              "(%s), which has neither; install CuPy there (or run with --install-cupy), or "
              "name the right one with --python PATH" % (took, where, own))
    return _result(me, "fallback", reason, listed), me.packages


def _result(chosen: Candidate, how: str, reason: str, listed: List[Candidate]
            ) -> Dict[str, Any]:
    return {"path": chosen.path, "version": _version_str(chosen.version), "how": how,
            "reason": reason, "candidates": [c.as_dict() for c in listed[:MAX_CANDIDATES + 1]]}


# ----------------------------------------------------------------------------- using it
def interpreter(choice: Optional[Mapping[str, Any]]) -> str:
    """The interpreter workload processes start with: the probe's choice, else this one.

    The one place the worker's children (Tier 1, the nsys/ncu/torch.profiler targets, the
    ``static`` pass) get their interpreter from.
    """
    if choice and choice.get("path"):
        return str(choice["path"])
    return sys.executable


def workload_python() -> str:
    """The workloads' interpreter outside a run (a fresh :func:`choose`): for the ncu and
    nsys smoke profiles, which import CuPy as a workload does."""
    return interpreter(choose()[0])


def command_argv(argv: List[str], choice: Optional[Mapping[str, Any]]) -> List[str]:
    """A ``cmd:`` argv with a bare ``python``/``python3`` made the workloads' interpreter.

    Only when that is not simply what the PATH gives (``found``, or named with
    ``--python``): ``cmd:python3 train.py`` then runs where torch is, as Tier 1 does. A
    path (``/usr/bin/python3``) or a versioned name (``python3.11``) is kept as typed.
    """
    if argv and argv[0] in ("python", "python3") and choice \
            and choice.get("how") in ("found", "--python") and choice.get("path"):
        return [str(choice["path"]), *argv[1:]]
    return list(argv)


def path_for(path: str, choice: Optional[Mapping[str, Any]]) -> str:
    """``PATH`` with the workloads' interpreter's directory first, as activating its
    environment would: a ``cmd:`` that reaches Python through a shell (``python3 a.py |
    tee log``), a script (``bash run.sh``) or a launcher (``torchrun``) then finds the
    interpreter that has CuPy and torch, and that environment's own tools.

    Only for a ``found``/``--python`` choice whose directory's ``python3`` is that very
    interpreter (a venv's or conda's ``bin``): putting ``/usr/bin`` first for a chosen
    ``/usr/bin/python3.11`` would hand out ``/usr/bin/python3`` instead.
    """
    choice = choice or {}
    chosen = str(choice.get("path") or "")
    if choice.get("how") not in ("found", "--python") or not chosen:
        return path
    where = os.path.dirname(os.path.abspath(chosen))
    python3 = os.path.join(where, "python3")
    try:
        same = os.path.abspath(chosen) == python3 or os.path.samefile(python3, chosen)
    except OSError:
        same = False
    parts = path.split(os.pathsep) if path else []
    if not same or (parts and parts[0] == where):
        return path
    return os.pathsep.join([where, *[d for d in parts if d != where]])


def pip_install_argv(python: str, package: str) -> List[str]:
    """``pip install`` into ``python``: ``--user`` outside a venv, none inside one (pip
    refuses ``--user`` in a venv, whose site-packages are the user's already)."""
    user = [] if probe.pyvenv_cfg(python) is not None else ["--user"]
    return [python, "-m", "pip", "install", *user, package]
