"""The export's wording (issue 24, "Exports"), on runs made for real by the local agent on
this machine, which has no GPU: a command's skipped Tier 1, a cancelled command, the no-GPU
warning; and the size an export reports, in bytes."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from gpuws.cli import main
from gpuws.errors import RunError
from gpuws.sessions.export import export_session, sentences
from gpuws.sessions.store import Store
from gpuws.tui.workers import write_atomic


def _export_of_the_only_session() -> str:
    with Store() as store:
        (session,) = store.sessions()
        return export_session(store, session.id)


def _section(md: str, run_id: str) -> str:
    return md.split(f"## Run `{run_id}`", 1)[1].split("\n## ", 1)[0]


def test_a_commands_skipped_tier1_and_the_no_gpu_warning(capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    assert main(["run", "local", "-w", "cmd:echo hi"]) == 0
    md = _export_of_the_only_session()
    commands = md.split("### Commands", 1)[1].split("###", 1)[0]
    # Tier 1 was announced and skipped: nothing ran, least of all "inside the worker".
    tier1 = commands.split("Tier 1 (CUDA events):", 1)[1].split("Tier 0", 1)[0]
    assert "inside the agent's worker" not in tier1
    assert "skipped: Tier 1 times a Python workload's run(); a command has none; nothing " \
           "ran." in tier1
    warning = next(line for line in md.splitlines() if "`no_gpu`" in line)
    if "No GPU on the pod" not in warning:
        pytest.skip("this machine has a GPU: no no-GPU warning to read")
    # Cause and meaning are two sentences, not one run together.
    cause_and_meaning = warning.split("`no_gpu`): ", 1)[1]
    assert re.fullmatch(r"[A-Z].*[^.]\. The command ran and its output and artifacts are kept; "
                        r"there are no kernels to profile\.", cause_and_meaning), warning


def test_a_cancelled_command_reads_cancelled(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    started = tmp_path / "started"
    assert main(["run", "local", "-w", f"cmd:touch {started}; sleep 60", "--detach"]) == 0
    run_id = capsys.readouterr().out.strip().splitlines()[-1]
    deadline = time.monotonic() + 60
    while not started.exists():  # the command runs: cancelling now stops it, not its start
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)
    assert main(["cancel", "local", run_id]) == 0
    # Follow it to its end, into the store (a cancelled run is not a success: exit 7).
    assert main(["attach", "local", run_id]) == RunError.exit_code
    capsys.readouterr()
    with Store() as store:
        assert store.run(run_id).status == "cancelled"
    md = _section(_export_of_the_only_session_with(run_id), run_id)
    assert "Status **cancelled** · stopped by SIGTERM (exit code -15)" in md, md
    assert "failed" not in md and "exit code -15 ·" not in md.replace("(exit code -15)", "")
    assert "cancelled: the run was cancelled while this ran." in md
    assert main(["history", "--json"]) == 0
    assert "tier 0 failed" not in capsys.readouterr().out  # the cancel, not a failure


def _export_of_the_only_session_with(run_id: str) -> str:
    with Store() as store:
        return export_session(store, store.run(run_id).session_id)


def test_sentences_end_and_begin_as_sentences() -> None:
    assert sentences("no NVIDIA GPU was found", "the command ran; no kernels") == \
        "No NVIDIA GPU was found. The command ran; no kernels."
    assert sentences("Counters blocked.", "", "  ") == "Counters blocked."


def test_an_exports_size_is_counted_in_bytes(tmp_path: Path) -> None:
    """µ, ±, → and — are 2 or 3 bytes each: the count said characters."""
    text = "median 240.4 µs ±0.2% → 1.2× — ok\n"
    path = tmp_path / "exports" / "report.md"
    size = write_atomic(path, text)
    assert size == path.stat().st_size == len(text.encode()) > len(text)
    assert path.read_text(encoding="utf-8") == text
    assert not list(path.parent.glob("*.tmp"))
