"""Stored runs of real events with their timeline traces pulled, for the Timeline tests.

``store_real`` stores a run recorded on an H200 (tests/fixtures/real-programs-h200x2: the events
the laptop stored and the trace artifact the agent wrote, byte for byte) and marks its
trace pulled, as a real pull does after checking the sha256. ``store_run`` makes the same
shape from the older real trace (tests/fixtures/real-programs-h200, HF `generate` cut to
its last 8 decode steps) through the agent's own ``read_results`` and ``Merger``, so a test
can swap in a hostile trace; only its envelope (run id, times, spec) is written here.

Imported as ``tui.timelinekit``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from gpuws.live.timeline import FILE_NAME
from gpuws.locations import artifacts_dir
from gpuws.remote_agent.measure import timeline_trace as tt
from gpuws.remote_agent.measure.torch_profile import read_results
from gpuws.sessions.store import Store
from tui.tuikit import RECORDED, h200_probe  # type: ignore[import-not-found]

REAL = Path(__file__).parents[1] / "fixtures" / "real-programs-h200"
HF = REAL / "hf-generate-2layers-last8steps.trace.json.gz"
RECORDINGS = Path(__file__).parents[1] / "fixtures" / "real-programs-h200x2"
RUN_ID = "20261128-101500-hfgen"
WORKLOAD = "cmd:python3 hf_generate.py --layers 2"


def real_run_id(name: str) -> str:
    """The run id of a recording (``hf_generate`` or ``ddp_step``)."""
    first = (RECORDINGS / f"{name}.ndjson").read_bytes().split(b"\n", 1)[0]
    return str(json.loads(first)["run_id"])


def store_real(name: str, pulled: bool = True) -> str:
    """A recording (``hf_generate`` or ``ddp_step``) in the store, its trace pulled."""
    lines = (RECORDINGS / f"{name}.ndjson").read_bytes().splitlines(keepends=True)
    first = json.loads(lines[0])
    run_id = str(first["run_id"])
    with Store() as s:
        sid = s.open_session("h200", "ssh+sftp", h200_probe(), 3.99, 20.0,
                             started=first["ts"] - 30)
        s.ingest_many(sid, lines)
        if pulled:
            local = artifacts_dir(sid, run_id) / FILE_NAME
            shutil.copyfile(RECORDINGS / f"{name}.timeline.trace.json.gz", local)
            s.mark_pulled(run_id, FILE_NAME, local)
        s.end_session(sid, ended=json.loads(lines[-1])["ts"] + 60)
    return run_id


def real_trace(tmp: Path, sources: list[tuple[Path, int]] | None = None
               ) -> tuple[bytes, dict[str, Any]]:
    """The merged trace bytes and the kernel table the agent makes of real traces."""
    out, art = tmp / "torch-out", tmp / "torch-art"
    out.mkdir(parents=True)
    art.mkdir()
    for src, pid in sources or [(HF, 4242)]:
        with gzip.open(src, "rb") as f, open(out / f"torch-trace-{pid}.json", "wb") as dst:
            shutil.copyfileobj(f, dst)
    merger = tt.Merger()
    got = read_results(str(out), merger=merger)
    path = merger.write(str(art))
    assert path is not None
    got.pop("processes")
    got.pop("problems")
    return Path(path).read_bytes(), got


def run_lines(run_id: str, table: dict[str, Any], trace: bytes) -> list[bytes]:
    """The run's events as the pod's events.ndjson holds them."""
    ev = RECORDED._Stream(run_id, RECORDED.T0)
    run_dir = f"/root/.cache/gpuws/runs/{run_id}"
    ev.add("run_started", spec={"workload": WORKLOAD, "tiers": [2]}, run_dir=run_dir,
           pid=4242, hostname="h200-pod")
    ev.add("tier_started", 0.1, tier=0, name="workload (torch.profiler injected)",
           argv=["/bin/sh", "-c", "exec python3 hf_generate.py --layers 2"])
    ev.add("output", 6.0, stream="stdout", tier=0, text="generated 24 tokens")
    ev.add("tier_finished", 0.1, tier=0, status="ok", wall_s=6.2)
    ev.add("tier_started", 0.1, tier=2,
           name="kernel timeline (torch.profiler, injected in the workload's run)")
    ev.add("kernel_table", 0.8, source="torch.profiler (injected)", **table)
    ev.add("artifact", 0.01, name=FILE_NAME, path=f"{run_dir}/artifacts/{FILE_NAME}",
           size=len(trace), sha256=hashlib.sha256(trace).hexdigest(), kind="trace")
    ev.add("tier_finished", 0.01, tier=2, status="ok", wall_s=0.9,
           source="torch.profiler (injected)")
    ev.add("run_finished", 0.05, status="ok", wall_s=round(ev.t + 0.05 - RECORDED.T0, 6),
           exit_code=0)
    return list(ev.lines)


def store_run(tmp: Path, run_id: str = RUN_ID, pulled: bool = True,
              trace: bytes | None = None) -> str:
    """The run in the store (``GPUWS_HOME``), its trace pulled into its artifact dir."""
    real, table = real_trace(tmp / run_id)
    data = real if trace is None else trace
    with Store() as s:
        sid = s.open_session("h200", "ssh+sftp", h200_probe(), 3.99, 20.0,
                             started=RECORDED.T0 - 30)
        s.ingest_many(sid, run_lines(run_id, table, data))
        if pulled:
            local = artifacts_dir(sid, run_id) / FILE_NAME
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(data)
            s.mark_pulled(run_id, FILE_NAME, local)
        s.end_session(sid, ended=RECORDED.T0 + 60)
    return run_id
