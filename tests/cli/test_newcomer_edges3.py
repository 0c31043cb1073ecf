"""Issue 34, the CLI's remaining rough edges (shared/reviews/newcomer-2026-11-28.md,
findings 2, 8, 14, 24, 26 and 28), each through the real ``gpuws`` command: ``main()``
against the real agent on ``local`` or behind the tests' real sshd."""

from __future__ import annotations

import pytest

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
