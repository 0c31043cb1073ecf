"""The listings people copy run ids from fit the terminal (issue 24): ids never cut, rows of
a few lines at 80 columns (``history`` rows folded to 13-17 lines), prose cut with an
ellipsis. Checked at 80 and 160 columns."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
from rich.console import Console

from gpuws import protocol
from gpuws.cli import main
from gpuws.commands.run import runs_table
from gpuws.sessions.store import Store


def _load_recorded() -> ModuleType:
    # The realistic event streams of tests/sessions/recorded.py, under a name of its own.
    spec = importlib.util.spec_from_file_location(
        "gpuws_cli_listings_recorded", Path(__file__).parents[1] / "sessions" / "recorded.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECORDED = _load_recorded()
#: The longest run id the agent accepts (RUN_ID_RE: 64 characters), as a replay may hold.
LONGEST_ID = "r" + "0123456789abcdef" * 3 + "-longest-run-id"
LONG_CMD = ("cmd:python3 bench/attention.py --seq 8192 --heads 32 --dim 128 --dtype bf16 "
            "--causal --iters 200 | tee results/attention-$(date +%s).log")


def _rows(text: str, ids: list[str]) -> list[list[str]]:
    """The printed lines of each row: from its id's line to the next id's (or the end)."""
    lines = text.splitlines()
    starts = [next(i for i, line in enumerate(lines) if run_id in line) for run_id in ids]
    ends = [*starts[1:], len(lines)]
    return [[ln for ln in lines[a:b] if ln.strip() and not ln.startswith("run ids")]
            for a, b in zip(starts, ends, strict=True)]


@pytest.mark.parametrize("width", [80, 160])
def test_history_fits_and_keeps_every_id_whole(width: int, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    ids = ["20261121-120000-aaaaaa", "20261121-120100-bbbbbb", "20261121-120200-cccccc",
           "20261121-120300-dddddd"]
    with Store() as store:
        sid = store.open_session("h200", "ssh+sftp", None, 3.99, started=RECORDED.T0 - 10)
        store.ingest_many(sid, RECORDED.saxpy_run(ids[0], workload=LONG_CMD))
        store.ingest_many(sid, RECORDED.blocked_run(ids[1], t0=RECORDED.T0 + 60))
        store.ingest_many(sid, RECORDED.cancelled_run(ids[2], t0=RECORDED.T0 + 120))
        store.ingest_many(sid, RECORDED.saxpy_run(ids[3], t0=RECORDED.T0 + 180, tiers=(3,)))
        store.end_session(sid, RECORDED.T0 + 300)
    assert main(["history"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= width
    rows = _rows(out, ids)
    for run_id, lines in zip(ids, rows, strict=True):
        assert re.search(rf"(^| ){run_id}( |$)", lines[0]), lines  # whole, on its first line
        assert len(lines) <= 3, lines  # workload, reason, code: one line each at most
    # The blocked run's reason is there (cut with an ellipsis at 80, whole at 160).
    reason = "tier 3 failed: ERR_NVGPUCTRPERM: counters blocked"
    assert reason in out if width >= 160 else "tier 3 failed: ERR" in out and "…" in out
    assert "1.733 ms ±" in out and "240." in out  # the medians whole
    if width < 100:
        assert "started" not in out  # the id holds the start time; the column goes first


def _printed(items: list[protocol.RunInfo], width: int) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(runs_table("pod", items, console.width))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= width
    for item in items:
        (line,) = [ln for ln in text.splitlines() if item.run_id in ln]  # one line, whole
        assert item.status in line
    return text


@pytest.mark.parametrize("width", [80, 160])
def test_runs_on_the_pod_keep_every_id_whole(width: int) -> None:
    items = [protocol.RunInfo(run_id="20261121-130950-9ba123", workload=LONG_CMD,
                              status="running", started=RECORDED.T0, last_seq=41),
             protocol.RunInfo(run_id="20261121-131050-0c0ffe", workload="builtin:saxpy",
                              status="cancelled", started=RECORDED.T0 + 60, last_seq=33)]
    text = _printed(items, width)
    assert "builtin:saxpy" in text and "…" in text  # the long command is cut, not folded
    # Title, head, its rule, and one line per run.
    assert len([ln for ln in text.splitlines() if ln.strip()]) == 5
    # The worst id the agent accepts (64 characters) stays whole too, as does its status;
    # at 80 columns the workload is what gives way.
    _printed([protocol.RunInfo(run_id=LONGEST_ID, workload=LONG_CMD, status="running",
                               started=RECORDED.T0, last_seq=41), *items], width)


@pytest.mark.parametrize("width", [80, 160])
def test_gpuws_runs_lists_a_real_pods_runs_whole(width: int, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``gpuws runs local`` (the agent on this machine): the id ``attach`` takes, whole."""
    assert main(["run", "local", "-w", LONG_CMD.replace("200 |", "1 ; true |"),
                 "--detach"]) == 0
    run_id = capsys.readouterr().out.strip().splitlines()[-1]
    monkeypatch.setenv("COLUMNS", str(width))
    assert main(["runs", "local"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= width
    (line,) = [ln for ln in out.splitlines() if run_id in ln]
    assert re.search(rf"(^| ){run_id} ", line) and "cmd:python3 bench/attention.py" in line
