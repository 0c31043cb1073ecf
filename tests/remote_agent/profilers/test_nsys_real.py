"""Tier 2 through nsys, on what a real Nsight Systems printed and wrote (issue 23).

The fixtures (tests/fixtures/nsys-2023.4.4-h100, README there) are Nsight Systems
2023.4.4's real output on an H100 with the CUDA 13 driver: a CuPy program traced whole,
a torch cu130 forward traced in part (its CUPTI 12.4 did not know runtime function 468),
a capture whose importer could not start, `nsys stats` CSVs and SQLite exports. No nsys
runs here (no GPU, no nsys on CI machines), so the Tier-2 tests put a stand-in `nsys`
script on the pod that prints those real words and leaves the real export where nsys
leaves it; everything around it (the worker's Tier-2 logic, the diagnosis, the fallback,
the SQLite parser, the durable event log) is the real code.
"""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from gpuws import protocol
from gpuws.remote_agent import runs
from gpuws.remote_agent.measure import tier2_parse as t2
from gpuws.remote_agent.measure import tiers
from gpuws.remote_agent.profilers import nsys_output
from gpuws.remote_agent.worker import RunContext

FIX = Path(__file__).parents[2] / "fixtures" / "nsys-2023.4.4-h100"


def test_the_real_failure_strings_are_explained() -> None:
    partial = nsys_output.diagnose((FIX / "profile_torch.txt").read_text(), "2023.4.4",
                                   (12, 4), "13.0")
    assert partial is not None
    assert partial.startswith("nsys 2023.4.4 (CUPTI for CUDA 12.4) traced this run only "
                              "in part (runtime API function 468 is unknown to it)")
    assert "this program's CUDA 13.0 is newer" in partial and "falls back" in partial
    importer = nsys_output.diagnose((FIX / "profile_no_importer.txt").read_text(),
                                    "2023.4.4", (12, 4), None)
    assert importer is not None and "only a .qdstrm came out" in importer
    assert "install the full nsight-systems package" in importer
    # A whole trace says nothing.
    assert nsys_output.diagnose((FIX / "profile_cupy.txt").read_text(), "2023.4.4",
                                (12, 4), "13.0") is None


def test_the_cupti_an_install_carries_is_read_from_the_install(tmp_path: Path) -> None:
    target = tmp_path / "nsight-systems" / "target-linux-x64"
    target.mkdir(parents=True)
    for v in ("11.8", "12.4", "10.2"):
        (target / f"libcupti.so.{v}").write_bytes(b"")
    (target / "nsys").write_text("#!/bin/sh\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nsys").symlink_to(target / "nsys")  # bin/nsys is a link there
    assert nsys_output.nsys_cupti(str(tmp_path / "bin" / "nsys")) == (12, 4)
    assert nsys_output.nsys_cupti(str(tmp_path / "nowhere" / "nsys")) is None


def test_the_real_exports_parse() -> None:
    cupy = t2.parse_nsys_sqlite(str(FIX / "nsys_cupy.sqlite"))
    saxpy = next(k for k in cupy["kernels"] if k["name"] == "saxpy")
    assert saxpy["calls"] == 50 and 80_000 < saxpy["mean_ns"] < 83_500
    assert cupy["kernel_count"] == 52
    torch = t2.parse_nsys_sqlite(str(FIX / "nsys_torch.sqlite"))
    assert torch["kernel_count"] == 1  # of ~60 launched: the partial trace
    rows = t2.parse_nsys_kern_sum_csv((FIX / "stats_cupy_cuda_gpu_kern_sum.csv").read_text())
    assert rows[0]["name"] == "saxpy" and rows[0]["calls"] == 50


def stand_in_nsys(root: Path, profile_out: Path, sqlite: Path | None, stats_out: str) -> str:
    """An nsys install whose CLI prints ``profile_out`` (and leaves the real export where
    ``-o`` points) for ``profile``, and ``stats_out`` for ``stats``, as 2023.4.4 did."""
    target = root / "target-linux-x64"
    target.mkdir(parents=True)
    (target / "libcupti.so.12.4").write_bytes(b"")
    (root / "stats.txt").write_text(stats_out)
    copy = f'cp "{sqlite}" "$o.sqlite"; ' if sqlite is not None else ""
    nsys = target / "nsys"
    nsys.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = profile ]; then\n'
        '  for a in "$@"; do if [ "$prev" = "-o" ]; then o="$a"; fi; prev="$a"; done\n'
        f'  : > "$o.nsys-rep"; {copy}cat "{profile_out}"; exit 0\n'
        "fi\n"
        f'cat "{root / "stats.txt"}" >&2; exit 1\n')
    nsys.chmod(nsys.stat().st_mode | stat.S_IEXEC)
    return str(nsys)


def pod_with(nsys: str) -> tiers.Pod:
    # A pod whose only nsys is the stand-in; its workloads' torch is built for CUDA 13.0.
    pod = tiers.Pod.__new__(tiers.Pod)
    pod.facts = {"gpus": [{"index": 0, "compute_capability": "9.0"}], "cuda_driver": "13.0",
                 "nsys": [{"path": nsys, "version": "2023.4.4"}], "ncu": [],
                 "python_packages": [{"name": "torch", "version": "2.11.0", "cuda": "13.0"}]}
    pod.cc, pod.driver, pod.counters, pod.python = "9.0", "580.159.04", {}, {}
    return pod


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunContext:
    monkeypatch.setenv("GPUWS_POD_CACHE", str(tmp_path / "pod"))
    spec = {"workload": "cmd:python3 fwd.py", "tiers": [2]}
    runs.ensure_private_dir(runs.cache_root())
    runs.ensure_private_dir(runs.runs_root())
    rdir = Path(runs.run_dir("r-nsys"))
    (rdir / "artifacts").mkdir(parents=True)
    (rdir / "spec.json").write_text(json.dumps(spec))
    log = runs.EventLog("r-nsys", str(rdir / "events.ndjson"))
    return RunContext("r-nsys", spec, log.append)


def events(ctx: RunContext) -> list[Any]:
    out = []
    for line in (Path(ctx.run_dir) / "events.ndjson").read_bytes().splitlines():
        ev = protocol.decode_event(line)
        assert not isinstance(ev, protocol.BadLine), ev
        out.append(ev)
    return out


def test_a_partial_trace_falls_back_saying_why_in_one_line(ctx: RunContext,
                                                          tmp_path: Path) -> None:
    nsys = stand_in_nsys(tmp_path / "nsys", FIX / "profile_torch.txt",
                         FIX / "nsys_torch.sqlite", "")
    rows = tiers.tier2(ctx, pod_with(nsys), ["/bin/true"], python=False)
    evs = events(ctx)
    finished = [e for e in evs if isinstance(e, protocol.TierFinished)][-1]
    # Not the one kernel the partial trace holds: no table, and the reason first.
    assert rows is None or all("distribution_elementwise" not in r["name"] for r in rows)
    assert finished.reason.startswith("nsys 2023.4.4 (CUPTI for CUDA 12.4) traced this run "
                                      "only in part (runtime API function 468")
    assert not any(isinstance(e, protocol.KernelTable) and e.source == "nsys" for e in evs)
    # The pod learnt it: the next run of this workload there does not spend another nsys
    # pass on it; another workload (a CuPy one that traces whole) still gets nsys.
    pod = pod_with(nsys)
    assert pod.nsys("cmd:python3 fwd.py") is None and pod.nsys("builtin:saxpy") == nsys
    assert tiers.tier2(ctx, pod, ["/bin/true"], python=False) is None
    again = [e for e in events(ctx) if isinstance(e, protocol.TierFinished)][-1]
    assert again.reason.startswith("nsys 2023.4.4 traced this workload only in part on this "
                                   "pod before: not used")
    assert sum(isinstance(e, protocol.TierStarted) and bool(e.argv)
               and e.argv[1:2] == ["profile"] for e in events(ctx)) == 1


def test_stats_without_its_modules_reads_the_table_from_the_real_export(
        ctx: RunContext, tmp_path: Path) -> None:
    # Debian's nsight-systems keeps the reports' nsysstats module in python3's
    # dist-packages, which the pod's python3 may not have: every report failed so.
    stats = (FIX / "stats_no_nsysstats.log").read_text()
    assert "No module named 'nsysstats'" in stats
    nsys = stand_in_nsys(tmp_path / "nsys", FIX / "profile_cupy.txt",
                         FIX / "nsys_cupy.sqlite", stats)
    rows = tiers.tier2(ctx, pod_with(nsys), ["/bin/true"], python=False)
    assert rows is not None and rows[0]["name"] == "saxpy" and rows[0]["calls"] == 50
    evs = events(ctx)
    table = next(e for e in evs if isinstance(e, protocol.KernelTable))
    assert table.source == "nsys" and table.kernels[0].name == "saxpy"
    assert any(isinstance(e, protocol.Log) and "SQLite export" in e.message for e in evs)
    started = next(e for e in evs if isinstance(e, protocol.TierStarted))
    assert started.argv[:2] == [nsys, "profile"]  # the real argv is in the run


def test_an_nsys_tier2_keeps_its_timeline_as_a_chrome_trace(ctx: RunContext,
                                                           tmp_path: Path) -> None:
    """Issue 33: every Tier 2 keeps a trace a person can open, nsys's too (from its SQLite
    export: the CuPy program's 52 kernels and its copies, on their stream, one process)."""
    import gzip

    from gpuws.remote_agent.measure import timeline_trace as tt

    nsys = stand_in_nsys(tmp_path / "nsys", FIX / "profile_cupy.txt",
                         FIX / "nsys_cupy.sqlite", (FIX / "stats_no_nsysstats.log").read_text())
    assert tiers.tier2(ctx, pod_with(nsys), ["/bin/true"], python=False) is not None
    art = [e for e in events(ctx) if isinstance(e, protocol.Artifact)
           and e.name == tt.FILE_NAME]
    assert art, [e for e in events(ctx) if isinstance(e, protocol.Artifact)]
    with gzip.open(art[-1].path, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert len(kernels) == 52 and sum(e["name"] == "saxpy" for e in kernels) == 50
    assert all(e["ph"] == "X" and e["dur"] > 0 and e["tid"].startswith("stream ")
               for e in kernels)
    copies = [e for e in doc["traceEvents"] if e.get("cat") == "memcpy"]
    assert copies and all(e["name"].startswith("memcpy ") for e in copies)
    (proc,) = [e for e in doc["traceEvents"] if e.get("name") == "process_name"]
    assert proc["args"]["name"].startswith("process 0 (pid ")


def test_a_capture_without_an_importer_is_explained(ctx: RunContext, tmp_path: Path) -> None:
    root = tmp_path / "nsys"
    nsys = stand_in_nsys(root, FIX / "profile_no_importer.txt", None, "")
    # This capture leaves no report at all: only the .qdstrm.
    text = Path(nsys).read_text().replace(': > "$o.nsys-rep"; ', ': > "$o.qdstrm"; ')
    Path(nsys).write_text(text)
    assert tiers.tier2(ctx, pod_with(nsys), ["/bin/true"], python=False) is None
    finished = [e for e in events(ctx) if isinstance(e, protocol.TierFinished)][-1]
    assert "nsys: no report came out (exit 0): nsys 2023.4.4" in finished.reason
    assert "only a .qdstrm came out" in finished.reason


def test_of_two_installs_the_one_whose_cupti_fits_the_driver_is_chosen(tmp_path: Path) -> None:
    old = stand_in_nsys(tmp_path / "a", FIX / "profile_cupy.txt", None, "")
    new = stand_in_nsys(tmp_path / "b", FIX / "profile_cupy.txt", None, "")
    shutil.move(str(tmp_path / "b" / "target-linux-x64" / "libcupti.so.12.4"),
                str(tmp_path / "b" / "target-linux-x64" / "libcupti.so.13.0"))
    pod = pod_with(old)
    pod.facts["nsys"] = [{"path": old, "version": "2023.4.4"},
                         {"path": new, "version": "2025.3.1"}]
    assert pod.nsys("builtin:saxpy") == new
    pod.facts["cuda_driver"] = "12.2"  # both fit: the inventory's order stands
    assert pod.nsys("builtin:saxpy") == old
