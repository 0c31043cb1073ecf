"""bench/pull.py end to end on a small file: every method runs against the real sshd the
bench starts, and the JSON carries each one's time and the ratios (the figures in
docs/performance.md §4 come from full-size runs by hand; this only proves the bench works)."""

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


@pytest.mark.skipif(shutil.which("scp") is None, reason="needs OpenSSH's scp")
def test_the_pull_bench_runs_every_method(tmp_path: Path) -> None:
    out = tmp_path / "pull.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    res = subprocess.run([sys.executable, str(BENCH / "pull.py"), "--mib", "2", "--reps", "1",
                          "--json", str(out)], capture_output=True, text=True, timeout=300,
                         env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    r = json.loads(out.read_text())
    names = set(r["median_s"])
    assert {"sftp: gpuws pull (process)", "sftp: scp", "exec: gpuws pull (process)",
            "exec: ssh pod cat > file"} <= names
    if shutil.which("openssl"):
        assert "sftp: ssh cat | tee | openssl sha256" in names
        assert "gpuws pull process / ssh | tee | openssl process" in r["ratios"]
    assert all(v > 0 for v in r["median_s"].values())
    assert all(math.isfinite(v) for v in r["ratios"].values())
    assert "goal ≥ 0.9× scp" in res.stdout
