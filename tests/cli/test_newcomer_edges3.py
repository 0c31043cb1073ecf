"""Issue 34, the CLI's remaining rough edges (shared/reviews/newcomer-2026-11-28.md,
findings 2, 8, 14, 24, 26 and 28), each through the real ``gpuws`` command: ``main()``
against the real agent on ``local`` or behind the tests' real sshd."""

from __future__ import annotations

import asyncio
import ctypes.util
import io
import json
import os
import re
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from cli.test_entry_points import gpuws  # type: ignore[import-not-found]
from cli.test_entry_points import one_clean_line as one_line  # type: ignore[import-not-found]
from gpuws.cli import main
from gpuws.sessions.store import Store

#: A MIG UUID no machine has: the laptop leaves MIG ids to the agent, so on any machine
#: (with a GPU or without) the run fails on the pod with an error diagnosis.
NO_SUCH_MIG = "MIG-2a311d9d-1111-2222-3333-444455556666"


def test_a_failure_is_said_once_with_its_remedy(capsys: pytest.CaptureFixture[str]) -> None:
    """Finding 14: a failure the agent diagnosed was said three times (the diagnosis, the
    run's last line, the closing `gpuws: Run failed: run ID failed: …`). Now once, in the
    closing line, with the diagnosis's remedy; the run's last line says only that."""
    assert main(["run", "local", "-w", "cmd:true", "--gpu", NO_SUCH_MIG]) == 7
    out, err = capsys.readouterr()
    with Store() as store:
        (run,) = store.newest_runs(1)
        (diagnosis,) = store.diagnoses(run.run_id)  # what the agent said, as recorded
    assert diagnosis.severity == "error" and diagnosis.cause and diagnosis.remedies
    both = out + err
    assert both.count(diagnosis.cause) == 1, both
    assert diagnosis.title not in both  # the held diagnosis was not printed on its own
    for remedy in diagnosis.remedies:
        assert both.count(remedy) == 1, both
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"gpuws: Run {run.run_id} failed: "), line
    assert diagnosis.cause in line and "Run failed: run" not in line
    assert "run failed in " in out and out.strip().splitlines()[-1].startswith("run failed in")


def test_a_failure_without_a_diagnosis_is_said_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Finding 14: `run failed in … — the workload exited with code 3` on stdout and the
    same on stderr; the stderr line alone says it now."""
    assert main(["run", "local", "-w", "cmd:echo started; exit 3"]) == 7
    out, err = capsys.readouterr()
    assert "started" in out  # the run's own output stays on stdout
    assert (out + err).count("exited with code 3") == 1, out + err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("gpuws: ")]
    assert line.endswith("failed: the workload exited with code 3 — `gpuws export` or "
                         "`gpuws history` shows what it recorded"), line


@pytest.mark.parametrize(("workload", "shown", "printed"), [
    ('cmd:python3 -c "print(42)"', "$ python3 -c 'print(42)'", "42"),
    ('cmd:echo "one; two"', "$ echo 'one; two'", "one; two"),
])
def test_a_command_is_shown_quoted(capsys: pytest.CaptureFixture[str], workload: str,
                                   shown: str, printed: str) -> None:
    """Finding 24: `cmd:python3 -c "print(42)"` was shown `$ python3 -c print(42)` on
    local, and `echo "one; two"` as `$ echo one; two` (two commands). Shown as a shell
    reads it now, as the export does."""
    assert main(["run", "local", "-w", workload]) == 0
    out = capsys.readouterr().out
    (tier0,) = [ln for ln in out.splitlines() if "▶ tier 0" in ln]
    assert tier0.endswith(shown), tier0
    assert f"│ {printed}" in out


def _detached(ssh: Path, command: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["run", "pod", "-F", str(ssh), "-w", f"cmd:{command}", "--detach"]) == 0
    return capsys.readouterr().out.strip().splitlines()[-1]


@pytest.mark.ssh
def test_prefixes_of_runs_only_the_pod_holds(ssh_config: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Finding 2: `gpuws cancel pod 20261128-093604-e864` (a unique prefix of a detached
    run) said `no run … on pod or in the store`; an ambiguous prefix said "no run" too.
    The runs are started with another data dir, so this laptop's store holds none of
    them (as for a run the TUI or another laptop started): only the pod's list knows."""
    ssh = str(ssh_config)
    first = _detached(ssh_config, "sleep 60", capsys)
    second = _detached(ssh_config, "sleep 60", capsys)
    echo = _detached(ssh_config, "echo attached-by-prefix", capsys)
    monkeypatch.setenv("GPUWS_HOME", str(tmp_path / "another-laptop"))
    with Store() as store:
        assert store.newest_runs(10) == []
    # Character by character, as a person shortens an id (not path components).
    common = next(first[:n] for n in range(len(first), 0, -1)
                  if second.startswith(first[:n]) and echo.startswith(first[:n]))
    assert len(common) >= 9  # the date at least: one prefix names all three

    # Ambiguous: one line naming the candidates, exit 2, before anything is cancelled.
    for verb in ("cancel", "attach"):
        assert main([verb, "pod", "-F", ssh, common]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert f"run id '{common}' is ambiguous on pod: 3 runs start with it (" in line, line
        assert all(run_id in line for run_id in (first, second, echo)), line
        assert line.endswith(f"give more characters of the id (`gpuws runs -F "
                             f"{shlex.quote(ssh)} pod` lists them)"), line
    with Store() as store:  # the refused attach kept no empty session
        assert store.sessions() == []

    # Unique prefixes: cancel and attach find the pod's run.
    assert main(["cancel", "pod", "-F", ssh, first[:-4]]) == 0
    assert f"{first}: cancelled" in capsys.readouterr().out
    assert main(["attach", "pod", "-F", ssh, echo[:-3]]) == 0
    assert "attached-by-prefix" in capsys.readouterr().out
    assert main(["cancel", "pod", "-F", ssh, second]) == 0  # a full id as before
    assert f"{second}: cancelled" in capsys.readouterr().out
    assert main(["runs", "pod", "-F", ssh, "--json"]) == 0
    statuses = {r["run_id"]: r["status"] for r in json.loads(capsys.readouterr().out)}
    assert statuses == {first: "cancelled", second: "cancelled", echo: "ok"}


def test_a_hostile_run_id_in_the_pods_list_is_shown_not_interpreted() -> None:
    """Worst values from the pod: ids carrying escapes and newlines are listed as text in
    the one line (the pod's list is input like every event)."""
    import argparse

    from gpuws import protocol
    from gpuws.commands.run import resolve_run
    from gpuws.errors import UsageError

    evil = ["r1\x1b[2J\nfake line", "r1\x07bell", *(f"r1-{i}" for i in range(40))]
    runs = [protocol.RunInfo(run_id=i, status="running", started=0.0, workload="cmd:x",
                             last_seq=0) for i in evil]
    args = argparse.Namespace(run_id="r1", host="pod", ssh_config=None, port=None,
                              user=None, python="python3", accept_new=False)
    with pytest.raises(UsageError) as info:
        resolve_run(args, runs)
    line = info.value.one_line()
    assert "\x1b" not in line and "\n" not in line and "\x07" not in line
    assert "42 runs start with it" in line and line.count(", ") <= 5 and "…" in line
    assert resolve_run(argparse.Namespace(**{**vars(args), "run_id": "r1-39"}),
                       runs) == "r1-39"


def test_watch_refuses_a_command_before_connecting(tmp_path: Path) -> None:
    """Finding 8: `gpuws watch local -w cmd:true -W .` looped on `no Tier-1 samples` on
    every save: a command has no Tier 1. Refused in one line before anything connects
    (the host does not resolve: a connection would have exited 3)."""
    res = gpuws("watch", "no-such-host.invalid", "-w", "cmd:true", "-W", str(tmp_path))
    line = one_line(res, 2)
    assert "a cmd: workload has no Tier 1" in line and "print no median" in line, line
    assert line.endswith("— watch a Python file (-w file:PATH, -W DIR for its project), "
                         "or add --yes to re-run the command on every save anyway"), line
    assert res.stdout == ""


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None
                    or ctypes.util.find_library("nvidia-ml") is not None,
                    reason="needs a machine without an NVIDIA GPU (this one has a driver)")
def test_watch_refuses_a_pod_without_a_gpu(tmp_path: Path) -> None:
    """Finding 8: `gpuws watch local -w file:bench.py` on a pod without a GPU printed
    `failed: no NVIDIA GPU on this pod: …` on each of 5 saves. Refused once connected (the
    probe knows), exit 2, and no empty session is left in the store. The real agent on
    this machine, which has no GPU; --yes still watches (tests/cli/test_watch.py)."""
    bench = tmp_path / "bench.py"
    bench.write_text("def run():\n    pass\n")
    line = one_line(gpuws("watch", "local", "-w", f"file:{bench}"), 2)
    assert line.startswith("gpuws: Usage error: local has no GPU (no NVIDIA driver"), line
    assert "every save's run would fail at once, the same way" in line
    assert line.endswith("— watch on a pod with a GPU (`gpuws doctor local` says what this "
                         "one has), or add --yes to watch anyway"), line
    with Store() as store:
        assert store.sessions() == []


# ------------------------------------------------------------- ncu --install, as doctor's
def _terminal(monkeypatch: pytest.MonkeyPatch, answer: str) -> io.StringIO:
    """A terminal's stdin holding the person's answer (pytest has none to give)."""
    stdin = io.StringIO(answer)
    stdin.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr("sys.stdin", stdin)
    return stdin


class NcuPlanStandIn:
    """Stands in for the agent's ``ncu_plan`` answer where this machine (no GPU driver)
    cannot give one with steps or a fitting ncu, and where running the steps would
    apt-get install here; connecting, deploying and printing are real (as in
    tests/cli/test_doctor_nsys.py)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, fits: bool) -> None:
        from gpuws import protocol
        from gpuws.client import AgentClient

        path = "/opt/nvidia/nsight-compute/2025.3.1/ncu"
        self.plan = protocol.NcuPlan(
            driver="580.65", cuda_driver="13.0", arch="sm_90", choices=[],
            selected=path if fits else None, selected_version="2025.3.1" if fits else None,
            reason="fits the driver" if fits else "no ncu installed",
            install_plan=None if fits else [["sudo", "apt-get", "install", "-y",
                                             "cuda-nsight-compute-13-0"]],
            install_target_version=None if fits else "2025.3.1", ts=time.time())
        self.asked: list[bool] = []

        async def ncu_plan(client: AgentClient, install: bool = False) -> protocol.NcuPlan:
            self.asked.append(install)
            if not install:
                return self.plan
            return msgspec.structs.replace(self.plan, selected=path, selected_version="2025.3.1",
                                           installed=not fits, verified="smoke profile ok")

        monkeypatch.setattr(AgentClient, "ncu_plan", ncu_plan)


def test_ncu_install_on_a_terminal_asks(monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Finding 26: `gpuws ncu local --install` on a terminal refused (`add --yes to
    confirm`) where `doctor --install-nsys` asks. It asks now; `n` changes nothing."""
    stand_in = NcuPlanStandIn(monkeypatch, fits=False)
    _terminal(monkeypatch, "n\n")
    assert main(["ncu", "local", "--install"]) == 11  # still none fits
    out, err = capsys.readouterr()
    assert stand_in.asked == [False]  # the plan was read, never run
    assert "Install ncu 2025.3.1 on the pod? [y/N]" in err
    assert "$ sudo apt-get install -y cuda-nsight-compute-13-0" in out + err
    assert "Nothing was installed." in out and "none fits" in out
    _terminal(monkeypatch, "y\n")
    assert main(["ncu", "local", "--install"]) == 0
    assert stand_in.asked == [False, False, True]
    assert "verified: smoke profile ok" in capsys.readouterr().out


def test_ncu_install_with_nothing_to_install_asks_nothing(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Finding 26: with an ncu that already fits, --install still wanted --yes. It says
    there is nothing to install and only verifies the ncu (which changes nothing)."""
    stand_in = NcuPlanStandIn(monkeypatch, fits=True)
    stdin = _terminal(monkeypatch, "")
    assert main(["ncu", "local", "--install"]) == 0
    out, err = capsys.readouterr()
    assert "[y/N]" not in err and stdin.tell() == 0
    assert "fits: nothing to install; verifying it" in out and "verified: smoke" in out
    assert stand_in.asked == [False, True]


def test_ncu_install_without_a_terminal_is_refused_before_connecting() -> None:
    """Off a terminal (a script), --install without --yes is refused as doctor's is, in
    its words, before connecting: the host does not resolve, and the exit is 2, not 3."""
    line = one_line(gpuws("ncu", "no-such-host.invalid", "--install"), 2)
    assert line == ("gpuws: Usage error: --install changes the pod and there is no terminal "
                    "to ask on — run it on a terminal, or add --yes to confirm in advance")


def test_ncu_install_on_a_terminal_with_the_real_agent(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The real agent on this machine, nothing stood in: --install on a terminal is not
    refused for want of --yes. Here (no GPU driver) no ncu fits and there is no plan, so
    nothing is asked; on a pod with a plan it is asked and `n` installs nothing; with an
    ncu that fits, it is verified without a question."""
    plan = asyncio.run(_real_plan())
    stdin = _terminal(monkeypatch, "n\n")
    code = main(["ncu", "local", "--install"])
    out, err = capsys.readouterr()
    if plan.selected:
        assert code == 0 and "nothing to install" in out and "[y/N]" not in err
    elif plan.install_plan:
        assert code == 11 and "[y/N]" in err and "Nothing was installed." in out
    else:
        assert code == 11 and "none fits" in out
        assert "[y/N]" not in err and stdin.tell() == 0


async def _real_plan() -> Any:
    from gpuws.client import AgentClient
    from gpuws.transport import make_transport

    client = await AgentClient.connect(make_transport("local"))
    try:
        return await client.ncu_plan()
    finally:
        await client.close()


# ------------------------------------------------------------------- pull of what is home
@pytest.mark.ssh
def test_pull_of_what_is_already_home_says_so(sshd: Any, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Finding 26: `gpuws pull` of an artifact already home went to the pod again instead
    of saying so. A real pull over the real sshd first; then the same pull with a host
    that does not resolve exits 0, saying it is all home: the pod is not contacted (it
    may be stopped). A copy that is no longer true is pulled again, from the pod."""
    from sessions.test_pull_without_agent import _record_run  # type: ignore[import-not-found]

    sshd.reset_pod()
    cfg = sshd.client_files(tmp_path / "client")
    _remote, sha = _record_run(sshd, "home-1")
    assert main(["pull", "-F", str(cfg), "pod", "home-1"]) == 0
    assert "pulled data.bin" in capsys.readouterr().out

    assert main(["pull", "no-such-host.invalid", "home-1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("all 1 artifact(s) of run home-1 are already home (size and "
                          "sha256 checked): nothing to pull\n"), out
    assert f"  pulled  data.bin  {3 * 1024 * 1024 + 5} B  sha256 {sha}" in out
    assert main(["pull", "no-such-host.invalid", "home-1", "--json"]) == 0
    assert [r["status"] for r in json.loads(capsys.readouterr().out)] == ["pulled"]

    with Store() as store:
        (row,) = store.artifacts("home-1")
    assert row.local_path is not None
    Path(row.local_path).write_bytes(b"changed here")  # no longer the pod's file
    assert main(["pull", "no-such-host.invalid", "home-1"]) == 3  # so it goes to the pod
    assert main(["pull", "-F", str(cfg), "pod", "home-1"]) == 0
    assert "pulled data.bin" in capsys.readouterr().out


# ------------------------------------------------------------------ captions on figures
RECORDED = Path(__file__).parents[1] / "fixtures" / "recorded" / "saxpy_h200.ndjson"


def test_figures_a_kernel_engineer_questions_carry_a_caption(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Finding 28: `4,300 GB/s (102% of 4,230)` with no word on the roof, `theoretical
    occupancy 100% (registers)` (nothing limits it at 100%), ncu's estimated speedups
    ranked as if they were gpuws's own. The real H200 recording is put on this machine's
    pod as a run that finished, and `gpuws attach local` prints it through the real agent
    and the real printer."""
    run_id = json.loads(RECORDED.read_text().splitlines()[0])["run_id"]
    run_dir = Path(os.environ["GPUWS_POD_CACHE"]) / "runs" / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "events.ndjson").write_bytes(RECORDED.read_bytes())
    assert main(["attach", "local", run_id, "--no-pull"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # the table caption wraps
    assert "4,300.4 GB/s (102% of 4,230 GB/s" in text
    assert ("! 102% of its roof: the roof, 4,230 GB/s, is what a device copy reaches, not "
            "the memory's limit") in text
    assert "(measured: device-to-device cudaMemcpyAsync of 1.00 GiB" in text
    assert "theoretical occupancy 100% (full: nothing limits it)" in text
    assert "(registers)" not in text
    assert "CPIStall (est. speedup 86%)" in text
    assert ("est. speedup: ncu's own estimate were that one issue removed, not gpuws's "
            "judgement; the estimates overlap and do not add up") in text


def test_a_roof_caption_shows_the_pods_words_as_text() -> None:
    """Worst values: the roof's source is pod text (escapes, newlines, a flood): shown
    visible and bounded; no caption at or under 100%, or without a roof."""
    from gpuws.commands.run import roof_caption

    hostile = "bandwidth: measured: \x1b[2J\nfake" + "x" * 10_000
    caption = roof_caption(150.0, 100.0, "GB/s", hostile)
    assert caption is not None and "\x1b" not in caption and "\n" not in caption
    assert len(caption) < 600
    assert roof_caption(100.0, 100.0, "GB/s", hostile) is None
    assert roof_caption(float("nan"), 100.0, "GB/s", hostile) is None
    assert roof_caption(150.0, None, "GB/s", hostile) is None
    flops = roof_caption(120.0, 67.0, "TFLOP/s", "FP32 FLOPs: datasheet: H200 SXM (dense)")
    assert flops is not None and "a datasheet figure" in flops and "(datasheet: H200" in flops


def test_a_detached_runs_id_stays_the_last_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Finding 14's held diagnosis must not land after a detached run's id, the line
    scripts read: the run fails at once on the pod, and its diagnosis (if it came while
    the command drained) is printed before the id, never after it."""
    assert main(["run", "local", "-w", "cmd:true", "--gpu", NO_SUCH_MIG, "--detach"]) == 0
    out, err = capsys.readouterr()
    run_id = out.strip().splitlines()[-1]
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{8}", run_id), out
    assert f"gpuws attach local {run_id}`" in err
