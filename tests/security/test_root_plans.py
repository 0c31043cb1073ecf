"""The root install plans cannot be raced (issue 26, point 7).

The ncu and nsys plans used to download NVIDIA's cuda-keyring package to a fixed
``/tmp/cuda-keyring_1.1-1_all.deb`` and ``dpkg -i`` it as root in a later step: another
user of a shared pod could plant a link there or rewrite the file in between. The plan's
first step is now one process (``ncu_select.KEYRING_INSTALL_PY``) that downloads into a
private ``mkdtemp`` directory, checks the package with ``dpkg-deb`` and hands it to the
installer. Here the real step runs against real ``.deb`` files built with ``dpkg-deb
--build``, served from ``file://`` URLs; the installer is a recorder script in place of
``dpkg -i`` (a fake: no test may install packages as root).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from faults.figures import record  # type: ignore[import-not-found]
from gpuws.remote_agent.profilers.ncu_select import KEYRING_INSTALL_PY, select_ncu
from gpuws.remote_agent.profilers.nsys_provision import plan_nsys

pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")

UBUNTU = 'ID=ubuntu\nVERSION_ID="24.04"\n'


def build_deb(tmp: Path, name: str, package: str = "cuda-keyring", version: str = "1.1-1",
              files: dict[str, bytes] | None = None, link: str | None = None) -> Path:
    root = tmp / f"{name}-root"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: {version}\nArchitecture: all\n"
        "Maintainer: test <t@example.com>\nDescription: keyring stand-in\n")
    for path, data in (files or {
            "usr/share/keyrings/cuda-archive-keyring.gpg": b"\x99key",
            "etc/apt/sources.list.d/cuda-ubuntu2404-x86_64.list":
                b"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
                b"https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/ /\n",
    }).items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    if link:
        (root / "etc" / "apt" / "sources.list.d" / "evil.list").symlink_to(link)
    deb = tmp / f"{name}.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)],
                   check=True, capture_output=True)
    return deb


def run_step(tmp: Path, deb: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """The plan's first step as the agent runs it, the recorder in place of dpkg -i."""
    log = tmp / "installed.log"
    recorder = tmp / "fake-dpkg"
    recorder.write_text("#!/bin/sh\n"
                        f"stat -c '%a %U %F' \"$(dirname \"$2\")\" \"$2\" >> {log}\n"
                        f"sha256sum \"$2\" >> {log}\necho \"$2\" >> {log}\n")
    recorder.chmod(0o755)
    res = subprocess.run([sys.executable, "-c", KEYRING_INSTALL_PY, deb.as_uri(),
                          str(recorder), "-i"], capture_output=True, text=True, timeout=60)
    return res, log.read_text().splitlines() if log.exists() else []


def test_the_plans_name_no_fixed_path() -> None:
    ncu = select_ncu([], "580.159.04", "9.0", os_release=UBUNTU, is_root=True)["install_plan"]
    nsys = plan_nsys([], "13.0", UBUNTU, True, "x86_64")["install_plan"]
    for plan in (ncu, nsys):
        assert plan[0][:3] == ["python3", "-c", KEYRING_INSTALL_PY]
        assert plan[0][4:] == ["dpkg", "-i"]  # the verified path is appended by the step
        assert not any("cuda-keyring" in arg for step in plan[1:] for arg in step)


def test_an_honest_package_is_installed_from_a_private_directory(tmp_path: Path) -> None:
    # Another user's plant at the old fixed path: a link to a file of theirs.
    planted = Path("/tmp/cuda-keyring_1.1-1_all.deb")
    mine = not planted.exists() and not planted.is_symlink()
    if mine:
        planted.symlink_to(tmp_path / "attacker.deb")
    try:
        deb = build_deb(tmp_path, "honest")
        res, log = run_step(tmp_path, deb)
        assert res.returncode == 0, res.stderr
        mode_dir, mode_file, digest, path = log[0], log[1], log[2], log[3]
        assert mode_dir.startswith("700 ") and "directory" in mode_dir
        assert mode_file.startswith("600 ") and "regular" in mode_file
        assert digest.split()[0] == subprocess.run(
            ["sha256sum", str(deb)], capture_output=True, text=True).stdout.split()[0]
        assert Path(path).parent.name.startswith("gpuws-keyring-")
        assert not Path(path).parent.exists()  # removed after the install
        if mine:
            assert planted.is_symlink() and not (tmp_path / "attacker.deb").exists()
    finally:
        if mine:
            planted.unlink()


@pytest.mark.parametrize(("name", "kwargs", "says"), [
    ("other", {"package": "evil-tools"}, "'evil-tools' '1.1-1', not cuda-keyring 1.1-1"),
    ("version", {"version": "9.9-9"}, "not cuda-keyring 1.1-1"),
    ("cron", {"files": {"etc/cron.d/gpuws": b"* * * * * root sh -c id\n"}},
     "it holds ./etc/cron.d/gpuws"),
    ("link", {"link": "/etc/shadow"}, "it holds"),
])
def test_a_tampered_package_is_refused_before_the_installer_runs(
        tmp_path: Path, name: str, kwargs: dict[str, object], says: str) -> None:
    deb = build_deb(tmp_path, name, **kwargs)  # type: ignore[arg-type]
    res, log = run_step(tmp_path, deb)
    assert res.returncode != 0 and log == [], (res.stderr, log)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuws: the cuda-keyring package from ")
    assert says in lines[0], lines[0]


def test_an_oversized_or_unreadable_package_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.deb"
    big.write_bytes(os.urandom(1024) * 1100)
    res, log = run_step(tmp_path, big)
    assert res.returncode != 0 and log == [] and "over 1 MiB" in res.stderr
    junk = tmp_path / "junk.deb"
    junk.write_bytes(b"!<arch>\nnot a deb")
    res, log = run_step(tmp_path, junk)
    assert res.returncode != 0 and log == [] and "dpkg-deb cannot read it" in res.stderr
    left = [p for p in Path(os.environ.get("TMPDIR", "/tmp")).glob("gpuws-keyring-*")
            if p.stat().st_uid == os.getuid() and stat.S_ISDIR(p.stat().st_mode)]
    record("test_root_plans", tampered_refused=6, installer_ran_on_refusal=0,
           private_dirs_left=len(left))
    assert left == []


def test_a_person_reads_what_the_keyring_step_does() -> None:
    from gpuws.remote_agent.profilers.ncu_select import step_text

    step = select_ncu([], "580.159.04", "9.0", os_release=UBUNTU,
                      is_root=True)["install_plan"][0]
    said = step_text(step)
    assert said.startswith("python3 -c <fetch https://developer.download.nvidia.com/")
    assert "private directory" in said and said.endswith("then: dpkg -i it>")
    assert len(said) < 300
    # Other code under the same shape is shown whole: the summary is only for gpuws's own.
    forged = ["python3", "-c", "import os; os.system('id')", step[3], "dpkg", "-i"]
    assert step_text(forged) == " ".join(forged)
