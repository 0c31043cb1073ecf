"""bench/sync_speed.py and bench/history_scale.py end to end on small inputs: each runs
whole processes against the real sshd (or real stores) and writes its table into a copy of
docs/performance.md between its markers, with the command beside it (the figures in the
real docs come from the full-size runs; this proves the benches and the writers work)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
DOCS = BENCH.parent / "docs" / "performance.md"


def _bench(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCH))  # the benches import their neighbours (_sshd, ...)
    try:
        spec = importlib.util.spec_from_file_location(f"gpuws_bench_{name}", BENCH / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.skipif(shutil.which("rsync") is None,
                    reason="needs rsync (apt-get install rsync): the bench races it")
def test_the_sync_bench_measures_both_tools_and_writes_its_table(tmp_path: Path) -> None:
    out = tmp_path / "sync.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    res = subprocess.run([sys.executable, str(BENCH / "sync_speed.py"), "--files", "40",
                          "--reps", "1", "--kept", "--json", str(out)], capture_output=True,
                         text=True, timeout=300, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    r = json.loads(out.read_text())
    cases = ("first", "one changed file", "nothing changed")
    tools = ("gpuws sync", "rsync -a", "gpuws sync (kept)")
    assert set(r["median_wall_s"]) == {f"{c}: {t}" for c in cases for t in tools}
    for key in ("median_wall_s", "median_cpu_s", "median_sync_own_s"):
        assert all(math.isfinite(v) and v > 0 for v in r[key].values()), (key, r[key])
    # The sync's own part is inside its process's wall time.
    for c in cases:
        for t in ("gpuws sync", "gpuws sync (kept)"):
            assert r["median_sync_own_s"][f"{c}: {t}"] < r["median_wall_s"][f"{c}: {t}"]
    docs = tmp_path / "performance.md"
    docs.write_text(DOCS.read_text())
    bench = _bench("sync_speed")
    bench.write_docs(r, "python3 bench/sync_speed.py --files 40", docs)
    text = docs.read_text()
    assert text.count("<!-- sync_speed rtt=0 kept begin") == 1
    assert "    python3 bench/sync_speed.py --files 40\n" in text
    assert bench.table(r) in text
    bench.write_docs(r, "python3 bench/sync_speed.py --files 40", docs)  # replaced, not added
    assert docs.read_text() == text


def test_the_history_bench_writes_its_table(tmp_path: Path) -> None:
    docs = tmp_path / "performance.md"
    docs.write_text(DOCS.read_text())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    res = subprocess.run([sys.executable, str(BENCH / "history_scale.py"), "--sizes", "20,40",
                          "--runs", "5", "--keep", str(tmp_path / "stores"), "--write-docs",
                          "--docs", str(docs)], capture_output=True, text=True, timeout=600,
                         env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    text = docs.read_text()
    block = text[text.index("<!-- history_scale begin"):text.index("<!-- history_scale end")]
    assert "    python3 bench/history_scale.py --sizes 20,40 --runs 5 --keep " in block
    assert "| measure | 20 runs | 40 runs |" in block
    assert "| history: first screenful / sqlite3 |" in block
