"""Runs execute in the workspace, and every result is tied to the code that made it.

`gpuws run local -W DIR` end to end on this machine (no GPU: a ``cmd:`` runs its Tier 0
and Tiers 2/3 are skipped, as on any GPU-less pod), in a real git work tree with real
commits and edits; then history, compare and export read what was recorded.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from gpuws.cli import main
from gpuws.remote_agent import child
from gpuws.remote_agent.workspace import WorkspaceError, resolve_file
from gpuws.sessions.compare import code_lines, compare_runs
from gpuws.sessions.export import export_session
from gpuws.sessions.store import Store
from gpuws.workspace.sync import workspace_name
from workspace.test_manifest import NEEDS_GIT, git  # type: ignore[import-not-found]

IMPORTS_ITS_PACKAGE = 'cmd:python3 -c "import mykern, os; print(mykern.VALUE, os.getcwd())"'


def make_repo(root: Path) -> Path:
    (root / "mykern").mkdir(parents=True)
    (root / "mykern" / "__init__.py").write_text("VALUE = 1\n")
    (root / "bench").mkdir()
    (root / "bench" / "b.py").write_text(
        "import mykern\n\ndef run():\n    return mykern.VALUE\n")
    (root / ".gitignore").write_text("__pycache__/\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "one")
    return root


def run_ids(store: Store) -> list[str]:
    return [r.run_id for s in reversed(store.sessions()) for r in store.runs(s.id)]  # oldest first


@NEEDS_GIT
def test_a_command_runs_in_the_workspace_and_the_runs_record_their_code(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # history's table unwrapped
    root = make_repo(tmp_path / "proj")
    head = git(root, "rev-parse", "HEAD")
    assert main(["run", "local", "-W", str(root), "-w", IMPORTS_ITS_PACKAGE,
                 "--tiers", "2"]) == 0
    out, err = capsys.readouterr()
    there = Path(os.environ["GPUWS_POD_CACHE"]) / "workspaces" / workspace_name(root)
    assert f"1 {there}" in out  # imported its own package, in the workspace
    assert "workspace proj-" in err and "sent 3 files" in err and f"git {head[:12]}" in err

    (root / "mykern" / "__init__.py").write_text("VALUE = 2\n")  # an edit, not committed
    assert main(["run", "local", "-W", str(root), "-w", IMPORTS_ITS_PACKAGE,
                 "--tiers", "2"]) == 0
    out, err = capsys.readouterr()
    assert f"2 {there}" in out
    assert "sent 1 file " in err and "(dirty: 1 file)" in err

    with Store() as store:
        first, second = run_ids(store)
        a, b = store.code(first), store.code(second)
        assert a is not None and b is not None
        assert (a.git_commit, a.git_dirty, a.git_changed) == (head, False, [])
        assert (b.git_commit, b.git_dirty, b.git_changed) == (head, True,
                                                              ["mykern/__init__.py"])
        assert a.tree_sha256 != b.tree_sha256 and a.files == b.files == 3
        cmp = compare_runs(store, first, second)
        assert cmp.code_changes == ["~mykern/__init__.py"]
        assert code_lines(cmp)[-1] == "1 file(s) changed from A to B: ~mykern/__init__.py"
        report = export_session(store, store.sessions()[0].id)
    assert f"tree `{b.tree_sha256[:16]}`, git `{head[:12]}`, **dirty**: " \
           "`mykern/__init__.py` differ from it" in report

    assert main(["history"]) == 0
    listing = capsys.readouterr().out
    assert f"tree {a.tree_sha256[:12]} · git {head[:12]}" in listing
    assert "(dirty: 1 file)" in listing
    assert main(["history", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted(r["code"]["git_dirty"] for r in listed) == [False, True]


def test_a_file_workload_imports_its_own_package(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The child's own loader (what the Tier-1/exec/torchprof children call), on a synced
    workspace: the file is the workspace's, and its package imports."""
    root = tmp_path / "proj"
    (root / "mykern").mkdir(parents=True)
    (root / "mykern" / "__init__.py").write_text("VALUE = 7\n")
    (root / "bench").mkdir()
    (root / "bench" / "b.py").write_text("import mykern\n\ndef run():\n    return "
                                         "mykern.VALUE\n")
    assert main(["sync", "local", "-W", str(root)]) == 0
    name = workspace_name(root.resolve())
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "mykern", raising=False)
    workload = child.load_workload({"workload": "file:bench/b.py", "workspace": name},
                                   "20260101-000000-abcdef")
    try:
        assert workload.path == str(Path(os.environ["GPUWS_POD_CACHE"]) / "workspaces" / name
                                    / "bench" / "b.py")
        assert workload.module.run() == 7
    finally:
        sys.modules.pop("mykern", None)
    with pytest.raises(WorkspaceError, match="not inside the workspace"):
        resolve_file(name, "../../../etc/passwd")


def test_a_workspace_file_workload_must_lie_inside_it(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    (tmp_path / "elsewhere.py").write_text("def run():\n    pass\n")
    code = main(["run", "local", "-W", str(root), "-w", f"file:{tmp_path / 'elsewhere.py'}"])
    assert code == 2
    assert "not a file inside the workspace" in capsys.readouterr().err


def test_a_file_workload_in_a_workspace_is_named_by_its_path_inside_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """-W proj -w file:bench/b.py (inside the workspace) and -w file:proj/bench/b.py (from
    here) name the same file; the spec carries its path in the tree, not its bytes."""
    from gpuws.runspec import LaunchOptions, build_spec

    root = tmp_path / "proj"
    (root / "bench").mkdir(parents=True)
    (root / "bench" / "b.py").write_text("def run():\n    pass\n")
    monkeypatch.chdir(tmp_path)
    for given in ("file:bench/b.py", "file:proj/bench/b.py", f"file:{root}/bench/b.py"):
        spec = build_spec(LaunchOptions(workload=given, workspace="proj"))
        assert (spec.workload, spec.file_name, spec.file_b64) == (
            "file:bench/b.py", "bench/b.py", None), given
        assert spec.workspace == workspace_name(root.resolve())
