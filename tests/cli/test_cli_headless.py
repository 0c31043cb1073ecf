"""The headless twins end to end over a real sshd: run, pull, sessions, export, attach, report.

And what a newcomer meets first: mistakes refused before connecting (exit 2, with what
is valid), run ids found with ``gpuws history``, ``compare`` refusing nothing-to-compare,
numbers printed for people, help on every option.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pytest

from gpuws import runspec
from gpuws.cli import main, make_parser
from gpuws.errors import RunError, UsageError
from gpuws.sessions.store import Store

FIX = Path(__file__).parents[1] / "fixtures" / "ncu-2025.3.1-h200"


def _load_recorded() -> ModuleType:
    # The realistic event streams of tests/sessions/recorded.py, loaded by path under a
    # name no other test module uses.
    spec = importlib.util.spec_from_file_location(
        "gpuws_cli_recorded", Path(__file__).parents[1] / "sessions" / "recorded.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECORDED = _load_recorded()


def test_cmd_run_over_ssh_pulls_artifacts_and_exports(ssh_config: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    cmd = ("cmd:echo hello-from-pod; head -c 200000 /dev/urandom > $GPUWS_ARTIFACT_DIR/blob.bin;"
           " echo warn >&2")
    code = main(["run", "pod", "-F", str(ssh_config), "-w", cmd, "--rate", "2.0"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "hello-from-pod" in out and "pulled blob.bin" in out
    with Store() as store:
        (session,) = store.sessions()
        (run,) = store.runs(session.id)
        (art,) = store.artifacts(run.run_id)
        assert art.status == "pulled" and art.size == 200000
        assert hashlib.sha256(Path(art.local_path or "").read_bytes()).hexdigest() == art.sha256
        assert session.rate_usd_per_hour == 2.0 and session.probe is not None
    assert main(["sessions", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["runs"] == 1 and rows[0]["host"] == "pod"
    report = tmp_path / "session.md"
    assert main(["export", rows[0]["id"][:6], "-o", str(report)]) == 0
    md = report.read_text()
    assert "blob.bin" in md and art.sha256 in md and "hello-from-pod" not in md.split("##")[0]
    assert "/bin/sh -c" in md  # the exact command is there to reproduce


def test_detach_attach_runs_and_cancel(ssh_config: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "pod", "-F", str(ssh_config), "-w",
                 "cmd:for i in 1 2 3; do echo tick-$i; sleep 0.2; done", "--detach"]) == 0
    run_id = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]+", run_id)
    assert main(["attach", "pod", "-F", str(ssh_config), run_id]) == 0
    out = capsys.readouterr().out
    assert out.count("tick-3") == 1 and "run ok" in out
    with Store() as store:
        evs = store.events(run_id)
        assert [e.seq for e in evs] == list(range(len(evs)))  # exactly once, no gaps
    assert main(["run", "pod", "-F", str(ssh_config), "-w", "cmd:sleep 30", "--detach"]) == 0
    long_id = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(["runs", "pod", "-F", str(ssh_config), "--json"]) == 0
    listed = {r["run_id"]: r["status"] for r in json.loads(capsys.readouterr().out)}
    assert listed[run_id] == "ok" and listed[long_id] == "running"
    assert main(["cancel", "pod", "-F", str(ssh_config), long_id]) == 0
    assert "cancelled" in capsys.readouterr().out


def test_failing_workloads_give_one_clear_line(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    assert main(["run", "local", "-w", f"file:{tmp_path}/missing.py"]) == UsageError.exit_code
    err = capsys.readouterr().err
    assert "cannot read the workload file" in err and len(err.strip().splitlines()) == 1
    assert main(["run", "local", "-w", "builtin:saxpy"]) == RunError.exit_code
    # Said once, by the closing line, with the agent's remedy (issue 34, finding 14).
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "no NVIDIA GPU on this pod" in line and "run on a machine with an NVIDIA GPU" in line


# A host that cannot resolve: a mistake caught before connecting exits 2; one that got as
# far as connecting would exit 3 instead.
NOWHERE = "no-such-pod.invalid"


@pytest.mark.parametrize("argv,expected", [
    (["-w", "builtin:nosuch"], ["unknown builtin workload 'nosuch'", "valid: copy (",
                                "saxpy (", "sdpa ("]),
    (["-w", "builtin:gemm?m=abc"], ["gemm: m='abc': expected an integer",
                                    "valid: m (int, default 4096)", "dtype (fp32|fp16|bf16"]),
    (["-w", "builtin:saxpy?bogus=1"], ["saxpy has no parameter 'bogus'",
                                       "valid: n (int, default 67108864), a (float"]),
    (["-w", "builtin:saxpy?block=33"], ["block=33: must be a multiple of 32"]),
    (["-w", "builtin:gemm?dtype=fp8"], ["expected one of fp32, fp16, bf16"]),
    (["-w", "saxpy"], ["must start with builtin:, file: or cmd:", "builtins: copy, saxpy"]),
    (["-w", "cmd:"], ["cmd: needs a command"]),
    (["-w", "builtin:saxpy", "--tiers", "4"], ["there is no tier '4'", "1 (CUDA events)",
                                               "3 (Nsight Compute)"]),
    (["-w", "builtin:saxpy", "--tiers", ","], ["no tier chosen", "choose from 1, 2, 3"]),
    (["-w", "builtin:saxpy", "--tiers", "1", "-k", "saxpy"],
     ["--kernel-regex only affects Tier 3", "tiers chosen (1)"]),
    (["-w", "builtin:saxpy", "--tiers", "2,3", "--hot", "--warmup", "2"],
     ["--warmup, --cold/--hot only affect Tier 1"]),
    (["-w", "builtin:saxpy", "--target-ci", "5"], ["CI of 500% of the median", "0.01 for 1%"]),
    (["-w", "builtin:saxpy", "--target-ci", "0"], ["must be above 0"]),
    (["-w", "builtin:saxpy", "--launch-count", "0"], ["--launch-count 0 must be at least 1"]),
    (["-w", "builtin:saxpy", "--max-seconds", "-1"], ["--max-seconds -1 must be above 0"]),
    (["-w", "builtin:saxpy", "--max-tier3-seconds", "0"],
     ["--max-tier3-seconds 0 must be above 0"]),
    (["-w", "builtin:saxpy", "--max-tier3-seconds", "nan"],
     ["--max-tier3-seconds nan must be above 0"]),
    (["-w", "builtin:saxpy", "--tiers", "1,2", "--max-tier3-seconds", "30"],
     ["--max-tier3-seconds only affects Tier 3"]),
    (["-w", "builtin:saxpy", "--rank", "-1"], ["--rank -1 must be at least 0"]),
    (["-w", "builtin:saxpy", "--tiers", "1,2", "--rank", "1"],
     ["--rank only affects Tier 3"]),
    (["-w", "builtin:saxpy", "-k", "saxpy("], ["is not a regular expression"]),
    (["-w", "builtin:saxpy", "--env", "=x"], ["bad --env '=x'", "KEY=VALUE"]),
    (["-w", "builtin:saxpy", "--env", "GPUWS_TEST_NEVER_SET"],
     ["--env GPUWS_TEST_NEVER_SET: GPUWS_TEST_NEVER_SET is not set in this shell's environment",
      "--env-file FILE"]),
    (["-w", "builtin:saxpy", "--env", "not a name"], ["bad --env 'not a name'", "--env KEY"]),
    (["-w", "builtin:saxpy", "--env-file", "/nonexistent/secrets.env"],
     ["--env-file /nonexistent/secrets.env: no such file", "KEY=VALUE lines"]),
    (["-w", "builtin:saxpy", "--env-file", "/"], ["--env-file / is not a regular file"]),
    (["-w", "builtin:saxpy", "--fail-if-slower", "3"], ["--fail-if-slower needs --baseline",
                                                        "gpuws history"]),
    (["-w", "builtin:saxpy", "--baseline", "nope"], ["--baseline: no run matches 'nope'",
                                                     "`gpuws history` lists the stored runs"]),
    (["-w", "builtin:saxpy", "--baseline", "x", "--detach"], ["--detach returns before"]),
])
def test_laptop_mistakes_are_refused_before_connecting(
        argv: list[str], expected: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", NOWHERE, *argv]) == UsageError.exit_code
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.strip().splitlines()  # one line: cause — what is valid
    assert line.startswith("gpuws: Usage error: ")
    for text in expected:
        assert text in line


def test_launcher_and_cli_share_the_ci_target() -> None:
    """One unit on both faces: 1% (as typed in the launcher) is the CLI's share 0.01."""
    assert runspec.parse_target_ci("1%") == runspec.parse_target_ci(0.01) == 0.01
    assert runspec.parse_target_ci(" 0.5 % ") == 0.005
    spec = runspec.build_spec(runspec.LaunchOptions(workload="builtin:saxpy",
                                                    target_ci=runspec.parse_target_ci("2%")))
    assert spec.target_ci == 0.02
    with pytest.raises(UsageError) as info:
        runspec.parse_target_ci("2")  # 2 what? Refused, not guessed.
    assert "write 2% (with the % sign)" in info.value.remedy


def test_the_rank_tier3_profiles_reaches_the_spec() -> None:
    spec = runspec.build_spec(runspec.LaunchOptions(workload="cmd:torchrun x.py", rank=1))
    assert spec.rank == 1
    assert runspec.build_spec(runspec.LaunchOptions(workload="cmd:x")).rank is None


def test_the_tier3_budget_reaches_the_spec() -> None:
    spec = runspec.build_spec(runspec.LaunchOptions(workload="builtin:saxpy",
                                                    max_tier3_seconds=45.0))
    assert spec.max_tier3_s == 45.0
    assert runspec.build_spec(runspec.LaunchOptions(workload="builtin:saxpy")).max_tier3_s \
        is None


def _stored_runs() -> dict[str, str]:
    """A session holding an ok, a failed, a cancelled and a Tier-3-only run; ids by kind."""
    ids = {"ok": "20261121-120000-aaaaaa", "failed": "20261121-120100-bbbbbb",
           "cancelled": "20261121-120200-cccccc", "t3only": "20261121-120300-dddddd",
           "t3again": "20261121-120400-eeeeee"}
    with Store() as store:
        sid = store.open_session("h200", "ssh+sftp", None, 3.99, started=RECORDED.T0 - 10)
        store.ingest_many(sid, RECORDED.saxpy_run(ids["ok"]))
        store.ingest_many(sid, RECORDED.blocked_run(ids["failed"], t0=RECORDED.T0 + 60))
        store.ingest_many(sid, RECORDED.cancelled_run(ids["cancelled"], t0=RECORDED.T0 + 120))
        store.ingest_many(sid, RECORDED.saxpy_run(ids["t3only"], t0=RECORDED.T0 + 180,
                                                  tiers=(3,)))
        store.ingest_many(sid, RECORDED.saxpy_run(ids["t3again"], t0=RECORDED.T0 + 240,
                                                  tiers=(3,)))
        store.end_session(sid, RECORDED.T0 + 300)
    ids["session"] = sid
    return ids


def test_history_lists_the_stored_runs(capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")  # rich folds long cells at 80; read them whole
    ids = _stored_runs()
    assert main(["history", "--json"]) == 0
    rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert list(rows) == [ids[k] for k in ("ok", "failed", "cancelled", "t3only", "t3again")]
    ok, failed, cancelled = rows[ids["ok"]], rows[ids["failed"]], rows[ids["cancelled"]]
    assert ok["status"] == "ok" and ok["why"] == "" and ok["session_id"] == ids["session"]
    assert ok["workload"] == "builtin:saxpy" and ok["tier1_n"] == 200
    assert ok["tier1_median_ms"] == pytest.approx(0.240, rel=0.05)
    assert failed["status"] == "failed"
    assert failed["why"] == "tier 3 failed: ERR_NVGPUCTRPERM: counters blocked"
    assert cancelled["why"] == "cancelled during tier 1"
    assert cancelled["tier1_median_ms"] is None
    assert rows[ids["t3only"]]["tiers"] == [3]

    assert main(["history", ids["session"][:6]]) == 0
    out = capsys.readouterr().out
    assert f"session {ids['session']} · h200" in out
    for key in ("ok", "failed", "cancelled"):
        assert ids[key] in out
    assert f"{ok['tier1_median_ms'] * 1000:.1f} µs ±" in out  # the median, for people
    assert "not run" in out  # the Tier-3-only runs did not ask for Tier 1
    assert "ERR_NVGPUCTRPERM" in out

    assert main(["sessions"]) == 0
    assert "gpuws history SESSION" in capsys.readouterr().out  # where run ids are found
    assert main(["history", "nope"]) == UsageError.exit_code
    assert "`gpuws sessions` lists the sessions" in capsys.readouterr().err


def test_every_error_naming_a_run_points_to_history(capsys: pytest.CaptureFixture[str]) -> None:
    ids = _stored_runs()
    for argv in (["compare", ids["ok"], "nope"], ["compare", "nope", ids["ok"], "--json"],
                 ["baseline", "nope"], ["pull", NOWHERE, "nope"],
                 ["compare", "20261121", ids["ok"]]):  # ambiguous prefix
        assert main(argv) == UsageError.exit_code, argv
        captured = capsys.readouterr()
        (line,) = captured.err.strip().splitlines()
        assert "`gpuws history` lists the stored runs" in line and captured.out == "", argv


def test_compare_refuses_what_it_cannot_compare(capsys: pytest.CaptureFixture[str]) -> None:
    ids = _stored_runs()
    # Tier 1 only in one, Tier-3 metrics only in the other: nothing in common.
    for extra in ([], ["--json"]):
        assert main(["compare", ids["t3only"], ids["failed"], *extra]) == UsageError.exit_code
        captured = capsys.readouterr()
        (line,) = captured.err.strip().splitlines()
        assert captured.out == ""
        assert line.startswith(f"gpuws: nothing to compare between {ids['t3only']} and ")
        assert f"no Tier-1 samples in run {ids['t3only']}" in line
        assert "the kernels Tier 3 profiled differ" in line
    assert main(["compare", ids["ok"], ids["ok"][:17]]) == UsageError.exit_code
    assert "are the same run" in capsys.readouterr().err
    # Metrics in both, Tier 1 in neither: the metrics are compared and Tier 1 says why not.
    assert main(["compare", ids["t3only"], ids["t3again"]]) == 0
    out = capsys.readouterr().out
    assert "Tier 1 not compared: no Tier-1 samples in either run" in out
    assert "duration_ns" in out
    assert main(["compare", ids["ok"], ids["cancelled"]]) == 0  # its 20 samples do compare
    assert "speedup (A/B)" in capsys.readouterr().out


def test_doctor_prints_numbers_for_people(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "local"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\d CPUs · \d+\.\d (MiB|GiB|TiB) memory", out), out
    assert not re.search(r"\d\.\d{3,} ?MiB", out)  # never 24105.55078125 MiB
    assert re.search(r"deploy \d+(\.\d+)? (ms|s)", out)


def _options(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.Action]]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [(name, action) for name, p in sub.choices.items() for action in p._actions
            if not isinstance(action, argparse._HelpAction)]


def test_every_option_has_help() -> None:
    missing = [f"{name} {action.option_strings or action.dest}"
               for name, action in _options(make_parser())
               if name != "run" and not action.help]
    assert missing == []


def test_every_run_option_has_help() -> None:
    missing = [f"run {action.option_strings or action.dest}"
               for name, action in _options(make_parser()) if name == "run" and not action.help]
    assert missing == []


def test_report_reads_ncu_csv_on_the_laptop(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(FIX / "saxpy_raw.csv"), "--json"]) == 0
    (kernel,) = json.loads(capsys.readouterr().out)
    assert kernel["kernel"].startswith("saxpy") and kernel["metrics"]["duration_ns"] > 0
    assert main(["report", str(FIX / "no_such.csv")]) != 0


def test_secrets_reach_the_workload_without_the_process_list(
        ssh_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """--env KEY and --env-file carry values that never appear in gpuws's own argv (where
    ``ps`` shows them to every user of the laptop): over the real sshd, the workload sees
    them."""
    secrets = tmp_path / "secrets.env"
    secrets.write_text("# the pod's tokens\nexport HF_TOKEN='hf_file_secret'\n\n"
                       'WANDB_KEY = "w key"\nOVERRIDDEN=from-file\n')
    monkeypatch.setenv("GPUWS_TEST_TOKEN", "shell-secret-42")
    argv = ["run", "pod", "-F", str(ssh_config), "-w",
            "cmd:echo seen:$HF_TOKEN:$WANDB_KEY:$GPUWS_TEST_TOKEN:$OVERRIDDEN",
            "--env-file", str(secrets), "--env", "GPUWS_TEST_TOKEN", "--env", "OVERRIDDEN=cli"]
    assert not any(secret in arg for arg in argv
                   for secret in ("hf_file_secret", "shell-secret-42", "w key"))
    assert main(argv) == 0
    assert "seen:hf_file_secret:w key:shell-secret-42:cli" in capsys.readouterr().out


def test_a_malformed_env_file_names_the_line_not_the_secret(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.env"
    bad.write_text("A=1\n# fine\nthis-is-hunter2\n")
    assert main(["run", NOWHERE, "-w", "builtin:saxpy", "--env-file", str(bad)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"--env-file {bad}, line 3: not KEY=VALUE" in line and "hunter2" not in line
    binary = tmp_path / "bin.env"
    binary.write_bytes(b"A=\xff\xfe\n")
    assert main(["run", NOWHERE, "-w", "builtin:saxpy", "--env-file", str(binary)]) == 2
    assert "is not UTF-8 text" in capsys.readouterr().err
