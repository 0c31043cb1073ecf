"""The TUI's results screen names the code a run measured (its workspace tree and git state).

The run is a real one (`gpuws run local -W DIR`, a ``cmd:`` in a real git work tree), read
back from the real store by the screen's own loader and summary.
"""

from __future__ import annotations

from pathlib import Path

from gpuws.cli import main
from gpuws.sessions.store import Store
from gpuws.tui.results import load_results
from gpuws.tui.screens.results import _summary
from workspace.test_manifest import NEEDS_GIT, git  # type: ignore[import-not-found]


@NEEDS_GIT
def test_the_summary_names_tree_commit_and_dirty_files(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "k.py").write_text("X = 1\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "one")
    (root / "k.py").write_text("X = 2\n")
    assert main(["run", "local", "-W", str(root), "-w", "cmd:true", "--tiers", "2"]) == 0
    with Store() as store:
        run_id = store.runs(store.sessions()[0].id)[0].run_id
        results = load_results(store, run_id)
    assert results.code is not None
    text = _summary(results).plain
    head = git(root, "rev-parse", "HEAD")
    assert (f"code: tree {results.code.tree_sha256[:12]} · git {head[:12]} (dirty: 1 file) · "
            f"{root}") in text
