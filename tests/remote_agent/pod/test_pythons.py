"""Choosing the workloads' Python on the pod (remote_agent/pod/pythons.py), with real venvs.

Every interpreter here is a real virtualenv made with ``python -m venv`` (or a real
pyenv install of this machine). torch and CuPy cannot be installed here (no GPU, no
network), so "has torch" is a stand-in package written into a venv's site-packages: a
``*.dist-info`` with the metadata pip writes, plus a ``torch/`` (or ``cupy/``) package
with ``__init__.py`` and, for torch, the ``version.py`` real wheels carry; one test
installs such a stand-in with a real ``pip install`` of a wheel built in the test.
Discovery never imports them; the chosen interpreter's ``find_spec`` must find them.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from gpuws.protocol import PyPackage, PythonChoice
from gpuws.remote_agent.pod import pythons

VER = f"python{sys.version_info[0]}.{sys.version_info[1]}"
TORCH_VERSION_PY = "__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\n"


def make_venv(dest: Path, python: str = sys.executable) -> Path:
    """A real venv (without pip: 30 ms instead of 3 s); returns its ``bin/python3``."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(dest)], check=True,
                   capture_output=True, timeout=60)
    return dest / "bin" / "python3"


def site_of(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3.*/site-packages"))
    assert found, venv
    return found[0]


def add_package(site: Path, name: str, version: str = "2.11.0") -> None:
    """A stand-in torch or CuPy (see the module docstring)."""
    dist = "torch" if name == "torch" else "cupy_cuda13x"
    meta = site / f"{dist}-{version}.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n")
    (meta / "INSTALLER").write_text("pip\n")
    pkg = site / ("torch" if name == "torch" else "cupy")
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('a stand-in: never imported')\n")
    if name == "torch":
        (pkg / "version.py").write_text(TORCH_VERSION_PY)


def venv_with(dest: Path, *packages: str, python: str = sys.executable) -> Path:
    exe = make_venv(dest, python)
    for name in packages:
        add_package(site_of(dest), name)
    return exe


@pytest.fixture
def places(tmp_path: Path) -> dict[str, object]:
    """A fake pod: a home, an /opt, a login venv on the PATH that has neither package."""
    home, opt = tmp_path / "home", tmp_path / "opt"
    home.mkdir()
    opt.mkdir()
    login = make_venv(tmp_path / "login")
    return {"own": str(login), "environ": {"PATH": str(login.parent)}, "home": str(home),
            "opt_dirs": [str(opt)], "workspace_dirs": [], "local_bins": []}


def choose(places: dict[str, object], **kw: object) -> tuple[dict, list, float]:
    t0 = time.monotonic()
    choice, packages = pythons.choose(**{**places, **kw})  # type: ignore[arg-type]
    took = time.monotonic() - t0
    # What the agent sends must decode strictly on the laptop.
    msgspec.convert(choice, PythonChoice)
    for p in packages:
        msgspec.convert(p, PyPackage)
    print(f"\nchoice: {choice['how']} {choice['path']} in {took:.3f} s "
          f"({len(choice['candidates'])} listed)\n  {choice['reason']}")
    return choice, packages, took


def test_login_python_lacks_both_a_venv_in_home_has_them(places: dict[str, object],
                                                         tmp_path: Path) -> None:
    home, opt = Path(str(places["home"])), Path(str(places["opt_dirs"][0]))  # type: ignore[index]
    best = venv_with(home / ".venv", "torch", "cupy")
    venv_with(opt / "other" / ".venv", "torch")
    choice, packages, _ = choose(places)
    assert choice["how"] == "found"
    assert choice["path"] == str(best)
    assert choice["version"] == "{}.{}.{}".format(*sys.version_info[:3])  # from the real run
    assert {p["name"]: p["version"] for p in packages} == {"cupy-cuda13x": "2.11.0",
                                                          "torch": "2.11.0+cu130"}
    cands = {c["path"]: c for c in choice["candidates"]}
    assert choice["candidates"][0]["path"] == places["own"]
    assert cands[str(best)]["packages"] == ["cupy-cuda13x 2.11.0", "torch 2.11.0+cu130"]
    assert str(opt / "other" / ".venv" / "bin" / "python3") in cands
    assert "has neither CuPy nor torch" in choice["reason"] and str(best) in choice["reason"]


def test_the_gpu_machine_layout_opt_torch_venv(places: dict[str, object]) -> None:
    """As on the H200 machine: nothing in the home, ``/opt/torch/.venv`` has both."""
    opt = Path(str(places["opt_dirs"][0]))  # type: ignore[index]
    best = venv_with(opt / "torch" / ".venv", "torch", "cupy")
    choice, _, _ = choose(places)
    assert (choice["how"], choice["path"]) == ("found", str(best))


def test_ranking_both_then_torch_then_cupy(places: dict[str, object]) -> None:
    opt = Path(str(places["opt_dirs"][0]))  # type: ignore[index]
    venv_with(opt / "a" / ".venv", "cupy")
    torch_only = venv_with(opt / "b" / ".venv", "torch")
    both = venv_with(opt / "c" / ".venv", "torch", "cupy")
    assert choose(places)[0]["path"] == str(both)
    shutil.rmtree(opt / "c")
    assert choose(places)[0]["path"] == str(torch_only)


def test_ties_go_to_the_newer_python_then_to_path_order(places: dict[str, object],
                                                        tmp_path: Path) -> None:
    opt = Path(str(places["opt_dirs"][0]))  # type: ignore[index]
    newer = [p for p in (Path.home() / ".pyenv" / "versions").glob("3.1[2-9]*/bin/python3")
             if p.exists()]
    if newer:
        old = venv_with(opt / "a" / ".venv", "torch")
        new = venv_with(opt / "b" / ".venv", "torch", python=str(newer[0]))
        assert choose(places)[0]["path"] == str(new), (old, new)
        shutil.rmtree(opt / "b")
    # Same version: the one earlier on the PATH wins, whatever /opt holds.
    first = venv_with(tmp_path / "p1", "torch")
    second = venv_with(tmp_path / "p2", "torch")
    path = os.pathsep.join([str(places["environ"]["PATH"]), str(second.parent),  # type: ignore[index]
                            str(first.parent)])
    assert choose(places, environ={"PATH": path})[0]["path"] == str(second)


def test_python_given_is_kept_without_a_search(places: dict[str, object]) -> None:
    """``--python`` names the interpreter: no search, its packages still reported."""
    opt = Path(str(places["opt_dirs"][0]))  # type: ignore[index]
    venv_with(opt / "torch" / ".venv", "torch", "cupy")
    named = venv_with(Path(str(places["home"])) / "mine", "cupy")
    choice, packages, _ = choose(places, own=str(named), given=True)
    assert (choice["how"], choice["path"]) == ("--python", str(named))
    assert [c["path"] for c in choice["candidates"]] == [str(named)]
    assert pythons.installed(packages, "cupy") and not pythons.installed(packages, "torch")
    assert "named with --python" in choice["reason"] and "CuPy" in choice["reason"]
    # The agent learns it from its environment (serve --python-given sets it).
    choice, _, _ = choose(places, own=str(named), environ={
        "PATH": "/nonexistent", pythons.GIVEN_ENV: "1"})
    assert choice["how"] == "--python"


def test_login_python_with_both_is_kept(places: dict[str, object], tmp_path: Path) -> None:
    own = venv_with(tmp_path / "rich", "torch", "cupy")
    venv_with(Path(str(places["opt_dirs"][0])) / "x" / ".venv", "torch", "cupy")  # type: ignore[index]
    choice, _, _ = choose(places, own=str(own))
    assert (choice["how"], choice["path"]) == ("login", str(own))
    assert len(choice["candidates"]) == 1  # nothing else was looked at


def test_never_trade_cupy_for_torch_only(places: dict[str, object], tmp_path: Path) -> None:
    """A login python3 with CuPy runs the bundled kernels; a torch-only venv would not."""
    own = venv_with(tmp_path / "cupyonly", "cupy")
    opt = Path(str(places["opt_dirs"][0]))  # type: ignore[index]
    venv_with(opt / "t" / ".venv", "torch")
    choice, _, _ = choose(places, own=str(own))
    assert (choice["how"], choice["path"]) == ("login", str(own))
    assert "no other interpreter has more" in choice["reason"]
    both = venv_with(opt / "u" / ".venv", "torch", "cupy")
    assert choose(places, own=str(own))[0]["path"] == str(both)


def test_none_found_falls_back_with_a_reason(places: dict[str, object]) -> None:
    venv_with(Path(str(places["opt_dirs"][0])) / "empty" / ".venv")  # type: ignore[index]
    choice, packages, _ = choose(places)
    assert (choice["how"], choice["path"]) == ("fallback", places["own"])
    assert "no interpreter with CuPy or torch was found" in choice["reason"]
    assert "--python" in choice["reason"]
    assert not pythons.installed(packages, "torch") and not pythons.installed(packages, "cupy")


def hostile_python(bindir: Path, marker: Path) -> Path:
    """A "python3" that records being run, beside a stand-in torch and CuPy."""
    bindir.mkdir(parents=True, exist_ok=True)
    exe = bindir / "python3"
    exe.write_text(f"#!/bin/sh\necho ran >> {marker}\necho '3.12.0 1 1'\n")
    exe.chmod(0o755)
    root = bindir.parent
    (root / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.12.0\n")
    site = root / "lib" / "python3.12" / "site-packages"
    add_package(site, "torch")
    add_package(site, "cupy")
    return exe


def test_hostile_candidates_are_never_run(places: dict[str, object], tmp_path: Path) -> None:
    opt = Path(str(places["opt_dirs"][0]))  # type: ignore[index]
    marker = tmp_path / "ran"
    # A venv in a directory anyone may write (not sticky): anyone could have put it there.
    shared = hostile_python(opt / "shared" / ".venv" / "bin", marker)
    (opt / "shared").chmod(0o777)
    # A link from a trusted place into such a directory.
    evil_dir = tmp_path / "drop"
    evil = hostile_python(evil_dir / "env" / "bin", marker)
    evil_dir.chmod(0o777)
    linked = opt / "linked" / ".venv" / "bin"
    linked.mkdir(parents=True)
    (linked.parent / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.12.0\n")
    (linked / "python3").symlink_to(evil)
    expected = {str(shared): "writable by others", str(linked / "python3"): "writable by others"}
    if os.geteuid() == 0:
        # Another user's directory, not writable by us, /tmp-style: their code, not ours.
        theirs = hostile_python(opt / "theirs" / "bin", marker)
        os.chown(opt / "theirs", 65534, 65534)
        expected[str(theirs)] = "belongs to uid 65534"
    choice, _, _ = choose(places)
    assert not marker.exists(), "a hostile candidate was executed"
    assert choice["how"] == "fallback"
    errors = {c["path"]: c["error"] for c in choice["candidates"]}
    for path, why in expected.items():
        assert errors[path] and errors[path].startswith("not looked at:") and why in errors[path], \
            (path, errors.get(path))


def test_trust_problem_rules(tmp_path: Path) -> None:
    assert pythons.trust_problem(os.path.realpath(sys.executable)) is None
    assert pythons.trust_problem("relative/python3") is not None
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o777 | stat.S_ISVTX)
    exe = sticky / "python3"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    # Sticky and world-writable is /tmp's way, fine when root owns the directory (others
    # cannot replace our entries); anyone else's such directory is not.
    if os.geteuid() == 0:
        assert pythons.trust_problem(str(exe)) is None
    else:
        assert "writable by others" in (pythons.trust_problem(str(exe)) or "")
    group = tmp_path / "group"
    group.mkdir()
    group.chmod(0o775)
    (group / "python3").symlink_to(sys.executable)
    assert "writable by its group" in (pythons.trust_problem(str(group / "python3")) or "")
    os.mkfifo(tmp_path / "fifo")
    assert "not a regular file" in (pythons.trust_problem(str(tmp_path / "fifo")) or "")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert pythons.trust_problem(str(loop)) is not None


def test_a_fifo_never_hangs_discovery(places: dict[str, object]) -> None:
    """FIFOs where a pyvenv.cfg, an environments.txt or an interpreter should be."""
    opt, home = Path(str(places["opt_dirs"][0])), Path(str(places["home"]))  # type: ignore[index]
    (opt / "f" / ".venv" / "bin").mkdir(parents=True)
    os.mkfifo(opt / "f" / ".venv" / "pyvenv.cfg")
    os.mkfifo(opt / "f" / ".venv" / "bin" / "python3")
    (home / ".conda").mkdir()
    os.mkfifo(home / ".conda" / "environments.txt")
    # A real interpreter whose pyvenv.cfg is a FIFO: read without blocking, so not a venv.
    (opt / "h" / ".venv" / "bin").mkdir(parents=True)
    (opt / "h" / ".venv" / "bin" / "python3").symlink_to(os.path.realpath(sys.executable))
    os.mkfifo(opt / "h" / ".venv" / "pyvenv.cfg")
    best = venv_with(opt / "g" / ".venv", "torch", "cupy")
    result: list[dict] = []
    t = threading.Thread(target=lambda: result.append(choose(places)[0]), daemon=True)
    t.start()
    t.join(30)
    assert result, "discovery hung on a FIFO"
    assert result[0]["path"] == str(best)
    errors = {c["path"]: c["error"] for c in result[0]["candidates"]}
    assert "not a regular file" in errors[str(opt / "f" / ".venv" / "bin" / "python3")]


def test_a_candidate_that_does_not_run_gives_way(places: dict[str, object]) -> None:
    opt = Path(str(places["opt_dirs"][0]))  # type: ignore[index]
    broken = venv_with(opt / "a" / ".venv", "torch", "cupy")
    broken.unlink()
    broken.symlink_to(shutil.which("false") or "/bin/false")
    hung = venv_with(opt / "b" / ".venv", "torch", "cupy")
    hung.unlink()
    # It leaves a child holding the pipes: killing only the script would not end the read.
    hung.write_text("#!/bin/sh\nsleep 60 &\nsleep 60\n")
    hung.chmod(0o755)
    good = venv_with(opt / "d" / ".venv", "torch")
    choice, _, took = choose(places, verify_timeout_s=1.0)
    assert (choice["how"], choice["path"]) == ("found", str(good))
    errors = {c["path"]: c["error"] for c in choice["candidates"]}
    assert errors[str(broken)] == "did not run: exit status 1"
    assert errors[str(hung)] == "did not answer within 1 s"
    print(f"  with one hung candidate (1 s timeout): {took:.2f} s")


def test_metadata_without_the_package_is_not_believed(places: dict[str, object]) -> None:
    opt = Path(str(places["opt_dirs"][0]))  # type: ignore[index]
    lying = venv_with(opt / "c" / ".venv", "torch", "cupy")
    shutil.rmtree(site_of(opt / "c" / ".venv") / "cupy")  # metadata without the package
    good = venv_with(opt / "d" / ".venv", "torch")
    choice, _, _ = choose(places)
    assert (choice["how"], choice["path"]) == ("found", str(good))
    errors = {c["path"]: c["error"] for c in choice["candidates"]}
    assert errors[str(lying)] == "its metadata lists cupy but import would not find it"


def old_python_venv(root: Path, version: str = "3.7.16") -> Path:
    """A stand-in of a Python 3.7 venv with torch, as its files are (``pyvenv.cfg``, the
    ``lib/python3.7/site-packages`` layout) and as its interpreter answers (this script
    prints what the real 3.7 prints to the verify probe). Needed where no 3.6/3.7 is
    installed (a fresh CI machine: scripts/test installs none), so the test never skips
    (issue 31); where pyenv has one, the real one is tried too."""
    exe = root / "bin" / "python3"
    exe.parent.mkdir(parents=True)
    exe.write_text(f"#!/bin/sh\necho '{version} 1 0'\n")
    exe.chmod(0o755)
    (root / "pyvenv.cfg").write_text(f"home = /usr/bin\nversion = {version}\n")
    add_package(root / "lib" / f"python{version.rsplit('.', 1)[0]}" / "site-packages", "torch")
    return exe


def test_too_old_pythons_are_passed_over(places: dict[str, object]) -> None:
    opt = Path(str(places["opt_dirs"][0]))  # type: ignore[index]
    olds = [old_python_venv(opt / "old" / ".venv")]
    real = sorted(p for p in (Path.home() / ".pyenv" / "versions").glob("3.[67].*/bin/python3")
                  if p.exists())
    if real:
        olds.append(venv_with(opt / "real-old" / ".venv", "torch", python=str(real[0])))
    choice, _, _ = choose(places)
    assert choice["how"] == "fallback"
    errors = {c["path"]: c["error"] for c in choice["candidates"]}
    for exe in olds:
        assert errors[str(exe)] and "older than 3.8" in errors[str(exe)], (exe, errors)


def test_conda_environments(places: dict[str, object], tmp_path: Path) -> None:
    """A conda root's ``envs/*`` and ``~/.conda/environments.txt`` (conda itself cannot be
    installed here: each environment is a real venv in conda's layout)."""
    home = Path(str(places["home"]))
    (home / "miniconda3" / "conda-meta").mkdir(parents=True)
    in_envs = venv_with(home / "miniconda3" / "envs" / "gpu", "torch")
    choice, _, _ = choose(places)
    assert choice["path"] == str(in_envs)
    listed = venv_with(tmp_path / "elsewhere" / "cu", "torch", "cupy")
    (home / ".conda").mkdir()
    (home / ".conda" / "environments.txt").write_text(f"{tmp_path / 'elsewhere' / 'cu'}\n")
    assert choose(places)[0]["path"] == str(listed)


def test_virtual_env_variable_and_workspace(places: dict[str, object], tmp_path: Path) -> None:
    active = venv_with(tmp_path / "active", "torch")
    env = {"PATH": str(places["environ"]["PATH"]), "VIRTUAL_ENV": str(tmp_path / "active")}  # type: ignore[index]
    assert choose(places, environ=env)[0]["path"] == str(active)
    ws = tmp_path / "workspace"
    proj = venv_with(ws / "proj" / ".venv", "torch", "cupy")
    assert choose(places, workspace_dirs=[str(ws)])[0]["path"] == str(proj)


def test_a_real_pip_install_is_found(places: dict[str, object], tmp_path: Path) -> None:
    """The stand-in torch and CuPy installed by a real pip from wheels built here, so the
    metadata layout is pip's own (RECORD, INSTALLER, normalised names)."""
    wheels = []
    for dist, top, version in (("torch", "torch", "2.11.0"),
                               ("cupy_cuda12x", "cupy", "13.6.0")):
        whl = tmp_path / f"{dist}-{version}-py3-none-any.whl"
        info = f"{dist}-{version}.dist-info"
        files = {f"{top}/__init__.py": "raise ImportError('stand-in')\n",
                 f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\n"
                                     f"Version: {version}\n",
                 f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                  "Tag: py3-none-any\n"}
        if top == "torch":
            files["torch/version.py"] = TORCH_VERSION_PY
        with zipfile.ZipFile(whl, "w") as zf:
            for name, text in files.items():
                zf.writestr(name, text)
            zf.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in files)
                        + f"{info}/RECORD,,\n")
        wheels.append(str(whl))
    venv = Path(str(places["opt_dirs"][0])) / "pipped" / ".venv"  # type: ignore[index]
    make_venv(venv)
    # This environment's pip installs into the venv (pip --python): ensurepip would take 9 s.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python3"),
                    "install", "--no-index", "--no-deps", "--disable-pip-version-check", "-q",
                    *wheels], check=True, capture_output=True, timeout=120)
    assert (site_of(venv) / "torch-2.11.0.dist-info" / "INSTALLER").read_text() == "pip\n"
    choice, packages, _ = choose(places)
    assert (choice["how"], choice["path"]) == ("found", str(venv / "bin" / "python3"))
    assert {p["name"]: p["version"] for p in packages} == {"cupy-cuda12x": "13.6.0",
                                                          "torch": "2.11.0+cu130"}
    assert {p["name"]: p["cuda"] for p in packages} == {"cupy-cuda12x": "12",
                                                       "torch": "13.0"}


def test_discovery_is_bounded(places: dict[str, object], capsys: pytest.CaptureFixture[str]
                              ) -> None:
    """300 environments under /opt: at most MAX_CANDIDATES are looked at. (They are venv
    layouts, pyvenv.cfg and a link to this interpreter, not 300 real venvs: making those
    would take a minute and prove nothing more.)"""
    opt = Path(str(places["opt_dirs"][0]))  # type: ignore[index]
    real = os.path.realpath(sys.executable)
    for i in range(300):
        root = opt / f"env{i:03d}" / ".venv"
        (root / "bin").mkdir(parents=True)
        (root / "bin" / "python3").symlink_to(real)
        (root / "pyvenv.cfg").write_text(f"home = {os.path.dirname(real)}\nversion = "
                                         "%d.%d.%d\n" % sys.version_info[:3])
        (root / "lib" / VER / "site-packages").mkdir(parents=True)
    choice, _, took = choose(places)
    assert len(choice["candidates"]) <= pythons.MAX_CANDIDATES + 1
    assert f"stopped at the bound of {pythons.MAX_CANDIDATES} interpreters" in choice["reason"]
    with capsys.disabled():
        print(f"\n  discovery over 300 environments: {took:.3f} s, "
              f"{len(choice['candidates'])} looked at")
    # A tiny time budget stops it too, and says so.
    choice, _, _ = choose(places, budget_s=0.0)
    assert "stopped at the 0.0 s bound" in choice["reason"]


def test_a_crowded_home_does_not_hide_opt(places: dict[str, object]) -> None:
    """A home with more project venvs than the bound: ``/opt`` is looked at before them.
    (The projects are venv layouts linking this interpreter, as in the bound test.)"""
    home, opt = Path(str(places["home"])), Path(str(places["opt_dirs"][0]))  # type: ignore[index]
    real = os.path.realpath(sys.executable)
    for i in range(pythons.MAX_CANDIDATES + 10):
        root = home / f"proj{i:03d}" / ".venv"
        (root / "bin").mkdir(parents=True)
        (root / "bin" / "python3").symlink_to(real)
        (root / "pyvenv.cfg").write_text(f"home = {os.path.dirname(real)}\n")
    best = venv_with(opt / "torch" / ".venv", "torch", "cupy")
    choice, _, _ = choose(places)
    assert (choice["how"], choice["path"]) == ("found", str(best))


def test_this_machine(capsys: pytest.CaptureFixture[str]) -> None:
    """The real places of this machine (its PATH, home, /opt): decodes, and is quick."""
    t0 = time.monotonic()
    choice, _ = pythons.choose()
    took = time.monotonic() - t0
    msgspec.convert(choice, PythonChoice)
    assert choice["how"] in ("login", "found", "fallback")
    with capsys.disabled():
        print(f"\n  this machine: {choice['how']} {choice['path']} — "
              f"{len(choice['candidates'])} looked at in {took:.3f} s")


def test_using_the_choice(tmp_path: Path) -> None:
    found = {"path": "/opt/torch/.venv/bin/python3", "how": "found"}
    login = {"path": "/usr/bin/python3", "how": "login"}
    assert pythons.interpreter(found) == "/opt/torch/.venv/bin/python3"
    assert pythons.interpreter(None) == sys.executable
    assert pythons.command_argv(["python3", "train.py"], found) == [
        "/opt/torch/.venv/bin/python3", "train.py"]
    assert pythons.command_argv(["python", "-c", "x"], {**found, "how": "--python"})[0] == \
        "/opt/torch/.venv/bin/python3"
    # What the PATH gives anyway, a path, or a versioned name: as typed.
    assert pythons.command_argv(["python3", "x.py"], login) == ["python3", "x.py"]
    assert pythons.command_argv(["/usr/bin/python3", "x.py"], found)[0] == "/usr/bin/python3"
    assert pythons.command_argv(["python3.11", "x.py"], found)[0] == "python3.11"
    assert pythons.command_argv(["nvidia-smi"], found) == ["nvidia-smi"]
    venv = make_venv(tmp_path / "v")
    assert "--user" not in pythons.pip_install_argv(str(venv), "cupy-cuda12x")
    assert pythons.pip_install_argv("/usr/bin/python3", "cupy-cuda12x") == [
        "/usr/bin/python3", "-m", "pip", "install", "--user", "cupy-cuda12x"]


@pytest.fixture(autouse=True)
def _no_stray_given(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(pythons.GIVEN_ENV, raising=False)
    yield
