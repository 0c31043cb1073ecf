"""bench/watch_latency.py end to end here: ``gpuws watch`` against the by-hand path over
the real sshd the bench starts (a CPU-only command: no GPU here), and the Tier-1 child
fresh against forked through the worker's own code. The figures in docs/performance.md
come from runs by hand (and the GPU machine's); this proves the bench works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run(tmp_path: Path, *args: str) -> tuple[dict, str]:
    out = tmp_path / "out.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    res = subprocess.run([sys.executable, str(BENCH / "watch_latency.py"), *args, "--json",
                          str(out)], capture_output=True, text=True, timeout=600, env=env,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-2000:]
    return json.loads(out.read_text()), res.stdout


def test_watch_beside_the_by_hand_loop_over_the_real_sshd(tmp_path: Path) -> None:
    r, out = run(tmp_path, "--cpu", "--saves", "2")
    assert set(r["save_to_line_s"]) == {"watch", "by hand"}
    assert all(len(v) == 2 and min(v) > 0 for v in r["save_to_line_s"].values())
    (rows,) = r["runs"].values()
    assert [x["status"] for x in rows] == ["ok", "ok"]  # every save a stored, finished run
    assert len(r["overhead_s"]["watch"]) == 2 and r["ended_with_table"] == {"watch": True}
    assert "by hand ÷ watch" in out and "#3 " in r["lines"]["watch"][-1]


def test_the_tier1_child_fresh_against_forked(tmp_path: Path) -> None:
    r, out = run(tmp_path, "--launcher", "--cpu", "--saves", "2")
    assert {k: len(v) for k, v in r["launcher_s"].items()} == {"fresh": 2, "forked": 2}
    assert all(min(v) > 0 for v in r["launcher_s"].values())
    assert "forked saves" in out
