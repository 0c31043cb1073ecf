"""A project's own ``.git/config`` cannot run programs on the laptop.

A real git work tree whose config names a program everywhere git could run one: an
fsmonitor hook (run on every index read), a filter driver's clean and process commands
(run on each file git hashes again: an edited tracked file), a diff driver's textconv,
and a hooks directory whose ``post-index-change`` runs when an index refresh is written.
Each program appends to a marker file. ``gpuws sync -W`` through the real sshd and
``gpuws run -W`` on the embedded pod, by the real CLI, must leave no marker, and still
record the commit and the edit.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpuws.cli import main
from gpuws.sessions.store import Store
from gpuws.workspace.gitinfo import git_state
from gpuws.workspace.safegit import driver_overrides
from workspace.test_manifest import NEEDS_GIT, git  # type: ignore[import-not-found]

pytestmark = NEEDS_GIT


def hostile_repo(root: Path, marker: Path) -> Path:
    """A committed project with an edited tracked file, its config naming programs."""
    (root / "mykern").mkdir(parents=True)
    (root / "mykern" / "__init__.py").write_text("VALUE = 1\n")
    (root / "notes.txt").write_text("first\n")
    (root / ".gitattributes").write_text("* filter=evil diff=evil\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "one")
    prog = root.parent / "prog.sh"
    # A filter process speaks a protocol; this one only leaves its mark and fails.
    prog.write_text(f'#!/bin/sh\necho "$0 $*" >> {marker}\nexit 1\n')
    prog.chmod(0o755)
    hooks = root.parent / "hooks"
    hooks.mkdir()
    for hook in ("post-index-change", "pre-commit", "post-checkout"):
        (hooks / hook).write_text(f'#!/bin/sh\necho "hook {hook}" >> {marker}\n')
        (hooks / hook).chmod(0o755)
    for key, value in (("core.fsmonitor", str(prog)), ("core.hooksPath", str(hooks)),
                       ("filter.evil.clean", f"{prog} clean"),
                       ("filter.evil.smudge", f"{prog} smudge"),
                       ("filter.evil.process", f"{prog} process"),
                       ("filter.evil.required", "true"),
                       ("diff.evil.textconv", f"{prog} textconv"),
                       ("diff.external", f"{prog} external"),
                       ("core.pager", f"{prog} pager")):
        git(root, "config", key, value)
    # An edit git must hash again to tell (the clean filter's moment), a new file, and a
    # file only touched: its refreshed stat makes git write the index (the hook's moment).
    (root / "notes.txt").write_text("second\n")
    os.utime(root / "mykern" / "__init__.py", (1, 1))
    (root / "new.py").write_text("x = 1\n")
    return root


def test_the_fixture_runs_its_programs_under_plain_git(tmp_path: Path) -> None:
    """The repository is armed: git as any program would start it runs the programs (the
    tests below would pass vacuously otherwise)."""
    marker = tmp_path / "marker"
    root = hostile_repo(tmp_path / "proj", marker)
    subprocess.run(["git", "-C", str(root), "status"], capture_output=True, check=False)
    ran = marker.read_text()
    assert "prog.sh 2 " in ran and "prog.sh process" in ran  # fsmonitor, filter
    # With the filter out of the way, the refreshed index is written: the hook runs.
    subprocess.run(["git", "-C", str(root), "-c", "filter.evil.process=", "-c",
                    "filter.evil.clean=", "-c", "filter.evil.required=false", "status"],
                   capture_output=True, check=False)
    assert "hook post-index-change" in marker.read_text()


def test_sync_through_sshd_runs_none_of_the_projects_programs(
        tmp_path: Path, ssh_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "marker"
    root = hostile_repo(tmp_path / "proj", marker)
    head = git(root, "rev-parse", "HEAD")
    assert main(["sync", "pod", "-F", str(ssh_config), "-W", str(root)]) == 0
    err = capsys.readouterr()
    assert not marker.exists(), marker.read_text()
    line = err.out + err.err
    assert "4 files" in line and f"git {head[:12]}" in line and "(dirty: 2 files)" in line


def test_run_in_the_workspace_runs_none_of_the_projects_programs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "marker"
    root = hostile_repo(tmp_path / "proj", marker)
    head = git(root, "rev-parse", "HEAD")
    assert main(["run", "local", "-W", str(root), "-w",
                 'cmd:python3 -c "import mykern; print(mykern.VALUE)"', "--tiers", "2"]) == 0
    capsys.readouterr()
    assert not marker.exists(), marker.read_text()
    with Store() as store:
        (session,) = store.sessions()
        (run,) = store.runs(session.id)
        code = store.code(run.run_id)
    assert code is not None
    assert (code.git_commit, code.git_dirty, code.git_changed) == (
        head, True, ["new.py", "notes.txt"])


def test_git_state_with_a_required_filter_still_tells_the_edit(tmp_path: Path) -> None:
    """``filter.evil.required`` would make git fail without its (emptied) program: it is
    overridden too, so the state is known, not lost."""
    marker = tmp_path / "marker"
    root = hostile_repo(tmp_path / "proj", marker)
    state = git_state(root)
    assert state is not None and state.changed == ["new.py", "notes.txt"]
    assert not marker.exists()


def test_drivers_the_person_configured_keep_working(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what the repository's own config defines is emptied: a driver of the person's
    global config (git-lfs's) is left alone, unless the repository redefines it."""
    glob = tmp_path / "global.gitconfig"
    glob.write_text('[filter "lfs"]\n\tclean = git-lfs clean -- %f\n\trequired = true\n')
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(glob))
    root = tmp_path / "proj"
    root.mkdir()
    git(root, "init", "-q")
    assert driver_overrides(root) == []
    git(root, "config", "filter.lfs.process", "evil")
    git(root, "config", "diff.my.tool.textconv", "evil")  # a name with a dot in it
    args = driver_overrides(root)
    assert "filter.lfs.process=" in args and "filter.lfs.clean=" in args
    assert "filter.lfs.required=false" in args and "diff.my.tool.textconv=" in args


def test_a_driver_name_git_cannot_override_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``-c`` splits at the first '=': a driver named ``a=b`` cannot be emptied there, so
    the workspace is refused in one line, before anything connects."""
    marker = tmp_path / "marker"
    root = tmp_path / "proj"
    root.mkdir()
    (root / "a.txt").write_text("a\n")
    git(root, "init", "-q")
    with (root / ".git" / "config").open("a") as f:
        f.write(f'[filter "a=b"]\n\tclean = sh -c "echo x >> {marker}"\n')
    assert main(["sync", "no-such-host.invalid", "-W", str(root)]) == 2
    err = capsys.readouterr().err
    assert "cannot keep from running programs" in err and "Traceback" not in err
    assert "no-such-host" not in err and not marker.exists()
