"""bench/workspace_sync.py end to end on a small tree: gpuws sync and rsync -a both run
against the real sshd the bench starts, both copies are checked byte for byte by the bench,
and the JSON carries every case's times and the ratios (the figures in docs/performance.md
come from the full-size run by hand; this only proves the bench works)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.skipif(shutil.which("rsync") is None,
                    reason="needs rsync (apt-get install rsync): the bench races it")
def test_the_workspace_sync_bench_runs_both_tools(tmp_path: Path) -> None:
    out = tmp_path / "ws.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    res = subprocess.run([sys.executable, str(BENCH / "workspace_sync.py"), "--files", "60",
                          "--reps", "1", "--json", str(out)], capture_output=True, text=True,
                         timeout=300, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    r = json.loads(out.read_text())
    assert set(r["median_s"]) == {
        "first: gpuws sync", "first: rsync -a", "one changed file: gpuws sync",
        "one changed file: rsync -a", "one changed file: gpuws sync, connection open (watch)"}
    assert all(v > 0 for v in r["median_s"].values())
    assert all(math.isfinite(v) and v > 0 for v in r["ratios_gpuws_over_rsync"].values())
    assert r["files"] == 60 and r["tree_bytes"] > 0
    assert "goal ≤ 1.0× rsync for one changed file" in res.stdout


@pytest.mark.skipif(shutil.which("rsync") is None,
                    reason="needs rsync (apt-get install rsync): the bench runs it beside")
def test_the_phase_bench_accounts_for_the_whole_process(tmp_path: Path) -> None:
    """bench/workspace_sync_phases.py: each repetition's phases add up to the process's
    wall time (nothing left uncounted), and its child sent exactly the edited file."""
    out = tmp_path / "phases.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    res = subprocess.run([sys.executable, str(BENCH / "workspace_sync_phases.py"), "--files",
                          "60", "--reps", "1", "--json", str(out)], capture_output=True,
                         text=True, timeout=300, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    r = json.loads(out.read_text())
    phases = r["phases_s"]
    assert list(phases) == ["start, exit", "imports", "scan", "ssh config", "handshake",
                            "agent start", "sync", "close", "print"]
    assert all(v[0] > 0 for v in phases.values())
    assert math.isclose(sum(v[0] for v in phases.values()), r["gpuws_wall_s"][0],
                        rel_tol=1e-9)
    assert r["rsync_s"][0] > 0 and all(x > 0 for x in r["ssh_true"][0])
