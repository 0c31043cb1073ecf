"""Issue 34: the newcomer's rough edges in the CLI (shared/reviews/newcomer-2026-11-28.md),
each through the real ``gpuws`` command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.test_cli_headless import _stored_runs  # type: ignore[import-not-found]
from cli.test_entry_points import gpuws  # type: ignore[import-not-found]
from cli.test_entry_points import one_clean_line as one_line  # type: ignore[import-not-found]
from gpuws.cli import main

NCU_CSV = Path(__file__).parents[1] / "fixtures" / "ncu-2025.3.1-h200" / "gemm_raw.csv"


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_report_into_a_reader_that_left_is_quiet(extra: list[str]) -> None:
    """Finding 27: `gpuws report FILE | head -5` once printed a BrokenPipeError traceback.

    The pipe's read end is closed before gpuws starts, so its first write meets EPIPE
    every time (the review saw it once in 29 tries, when `head` won the race). The table
    (Rich) was already quiet; --json, which writes bytes itself, was not.
    """
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        res = subprocess.run([sys.executable, "-m", "gpuws", "report", str(NCU_CSV), *extra],
                             stdout=write_end, stderr=subprocess.PIPE, text=True,
                             stdin=subprocess.DEVNULL, timeout=120, env=os.environ.copy())
    finally:
        os.close(write_end)
    assert res.stderr == "", res.stderr  # no traceback, no "Exception ignored" at exit
    assert res.returncode == 1


def test_watch_help_states_its_own_default_tiers() -> None:
    """Finding 4: watch runs Tier 1 unless told; its help said run's 1,2,3."""
    res = gpuws("watch", "--help")
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stdout.split())  # argparse wraps the help
    assert "comma-separated tiers (default 1)" in text
    assert "default 1,2,3" not in text


@pytest.mark.parametrize("flag", [["--detach"], ["--fail-if-slower", "5"], ["--json"]])
def test_watch_refuses_run_only_options(tmp_path: Path, flag: list[str]) -> None:
    """Finding 4: `watch --detach` was accepted and ignored (the watch ran in the
    foreground). Refused before anything connects: the host does not exist."""
    res = gpuws("watch", "no-such-host-xyz", "-w", "cmd:true", "-W", str(tmp_path), *flag)
    line = one_line(res, 2)
    assert f"{flag[0]} is a `gpuws run` option" in line and "drop " + flag[0] in line
    assert res.stdout == ""


def test_nothing_to_compare_is_said_once(capsys: pytest.CaptureFixture[str]) -> None:
    """Finding 14: `gpuws: Nothing to compare: nothing to compare between …`."""
    ids = _stored_runs()
    assert main(["compare", ids["t3only"], ids["failed"]]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"gpuws: nothing to compare between {ids['t3only']} and "), line
    assert line.lower().count("nothing to compare") == 1, line


@pytest.mark.parametrize(("text", "expected", "remedy"), [
    # A typo for [hosts.pod]: the top level's keys, not a host table's.
    ("[host.pod]\nrate_usd_per_hour = 1\n",
     "the top level: unknown key 'host' — known keys at the top level: [defaults], "
     "[hosts.NAME] and [pull]", None),
    ("[pull]\nstal_s = 5\n", "pull: unknown key 'stal_s' — known keys in [pull]: "
     "max_artifact_bytes, max_artifacts, max_run_bytes, stall_s", None),
    ("[hosts.pod]\nbudget_action = \"stopp\"\n",
     "hosts.pod.budget_action: 'stopp' is not one of \"warn\", \"stop\" — give one of "
     "\"warn\", \"stop\"", None),
    ("[hosts.pod]\nidle_stop_minutes = \"30\"\n",
     "hosts.pod.idle_stop_minutes: expected a number, got \"30\"", ""),
    ("[defaults]\nstop_running = 1\n", "defaults.stop_running: expected true or false, "
     "got 1", ""),
])
def test_config_errors_speak_gpuws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   text: str, expected: str, remedy: str | None) -> None:
    """Finding 25: the key list only for an unknown key, and the list of its level;
    msgspec's `Expected float | null, got str - at …` in gpuws's words."""
    config = tmp_path / "config.toml"
    config.write_text(text)
    monkeypatch.setenv("GPUWS_CONFIG", str(config))
    line = one_line(gpuws("run", "no-such-host-xyz", "-w", "builtin:saxpy"), 2)
    assert line.startswith(f"gpuws: Configuration error: {config}: {expected}"), line
    assert "Expected" not in line and " - at " not in line
    if remedy is not None:  # a wrong value: nothing after it, the key list least of all
        assert line == f"gpuws: Configuration error: {config}: {expected}", line


def test_start_names_its_whole_command(tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 26: `within 4 s of `sh` starting it` named argv[0] only. Port 1 on
    127.0.0.1 does not answer, so the start "succeeds" and the wait runs out."""
    config = tmp_path / "config.toml"
    config.write_text('[hosts."127.0.0.1"]\nstart = ["sh", "-c", "exit 0 # my pod"]\n')
    monkeypatch.setenv("GPUWS_CONFIG", str(config))
    res = gpuws("start", "x@127.0.0.1:1", "--wait", "1")
    assert res.returncode == 1, res.stderr
    line = res.stderr.strip().splitlines()[-1]  # after the countdown's line
    assert line.startswith("gpuws: Lease: ") and "Traceback" not in res.stderr
    assert "within 1 s of `sh -c 'exit 0 # my pod'` starting it" in line, line


def test_python_help_says_the_search() -> None:
    """Finding 26: `--python` help said `default python3`; the README says the default is
    a search of the pod's pythons that --python turns off."""
    res = gpuws("run", "--help")
    text = " ".join(res.stdout.split())
    assert "default python3" not in text
    assert "searches the pod's pythons" in text and "turns the search off" in text


def test_export_of_a_fleet_id_points_at_fleet(capsys: pytest.CaptureFixture[str]) -> None:
    """Finding 26: `gpuws export FLEET_ID` said `no session matches` and no more."""
    from gpuws import protocol
    from gpuws.sessions.store import Store

    with Store() as store:
        fid = store.open_fleet(protocol.RunSpec(workload="cmd:true"), ["a", "b"])
    assert main(["export", fid[:12]]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.endswith(f"— {fid} is a fleet: `gpuws export --fleet {fid}` exports it"), line
    assert main(["export", "--fleet", fid]) == 0  # the hint, pasted, works


@pytest.mark.skipif(any((Path(d) / "ncu").exists() for d in os.get_exec_path()),
                    reason="needs a machine without Nsight Compute (this one has ncu)")
def test_ncu_without_any_install_prints_no_empty_table() -> None:
    """Finding 26: `gpuws ncu local` with no ncu printed the table's header and no row
    above "none fits". Real agent on this machine, which has no Nsight Compute."""
    res = gpuws("ncu", "local")
    assert res.returncode == 11, (res.stdout, res.stderr)
    assert "no Nsight Compute install found on the pod" in res.stdout
    assert "Nsight Compute installs" not in res.stdout  # the table's title
    assert not any(line.split() == ["version", "path", "fits", "why"]
                   for line in res.stdout.splitlines())
    assert "none fits" in res.stdout


def test_detach_hint_is_a_command_that_works_pasted(
        ssh_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Finding 3: `follow it with `gpuws attach pod ID`` dropped the -F the pod was reached
    with, so the pasted hint could not resolve the host. Real sshd, real agent."""
    import shlex

    assert main(["run", "pod", "-F", str(ssh_config), "-w", "cmd:echo pasted-ok",
                 "--detach"]) == 0
    captured = capsys.readouterr()
    run_id = captured.out.strip().splitlines()[-1]
    hint = f"gpuws attach -F {shlex.quote(str(ssh_config))} pod {run_id}"
    assert f"follow it with `{hint}`" in " ".join(captured.err.split()), captured.err
    words = shlex.split(hint)
    assert words[0] == "gpuws" and main(words[1:]) == 0  # pasted, it follows the run
    assert "pasted-ok" in capsys.readouterr().out
