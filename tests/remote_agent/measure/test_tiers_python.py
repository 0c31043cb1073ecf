"""The tiers start workloads under the interpreter the probe chose, and judge CuPy and
torch by that interpreter's packages, not the worker's own.

The pod facts are a stand-in (this machine has no GPU, and its Python has neither CuPy
nor torch); the run context, the event log and the tier code are the real ones.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuws import protocol
from gpuws.remote_agent import runs
from gpuws.remote_agent.measure import tiers
from gpuws.remote_agent.worker import RunContext

HAS_BOTH = [{"name": "cupy-cuda12x", "version": "13.6.0", "cuda": "12", "error": None},
            {"name": "torch", "version": "2.11.0+cu130", "cuda": "13.0", "error": None}]
HAS_NEITHER = [{"name": "cupy", "version": None, "cuda": None, "error": "not installed"},
               {"name": "torch", "version": None, "cuda": None, "error": "not installed"}]


class ChosenPod:
    """The probe's facts: a GPU, no profilers, and the workloads' Python (stand-in)."""

    has_gpu = True

    def __init__(self, choice: dict[str, Any], packages: list[dict[str, Any]]) -> None:
        self.facts: dict[str, Any] = {"python_choice": choice, "python_packages": packages,
                                      "cuda_driver": "12.8"}
        self.python = choice
        self.counters: dict[str, Any] = {}

    def has_package(self, name: str) -> bool:
        return tiers.Pod.has_package(self, name)  # type: ignore[arg-type]

    def nsys(self) -> None:
        return None

    def nsys_passed_over(self) -> str | None:
        return None

    def select_ncu(self, exclude: list[str]) -> dict[str, Any]:
        return {"selected": None, "reason": "no ncu here"}


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunContext:
    monkeypatch.setenv("GPUWS_POD_CACHE", str(tmp_path / "pod"))
    spec = {"workload": "builtin:saxpy", "tiers": [1, 2]}
    runs.ensure_private_dir(runs.cache_root())
    runs.ensure_private_dir(runs.runs_root())
    rdir = Path(runs.run_dir("r-py"))
    (rdir / "artifacts").mkdir(parents=True)
    (rdir / "spec.json").write_text(json.dumps(spec))
    log = runs.EventLog("r-py", str(rdir / "events.ndjson"))
    return RunContext("r-py", spec, log.append)


def events(ctx: RunContext) -> list[protocol.Events]:
    out = []
    for line in (Path(ctx.run_dir) / "events.ndjson").read_bytes().splitlines():
        ev = protocol.decode_event(line)
        assert not isinstance(ev, protocol.BadLine), ev
        out.append(ev)
    return out


@pytest.fixture
def venv_python(tmp_path: Path) -> str:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")],
                   check=True, capture_output=True, timeout=60)
    return str(tmp_path / "v" / "bin" / "python3")


def test_children_start_under_the_chosen_python(ctx: RunContext, venv_python: str) -> None:
    assert tiers.child_argv(ctx, "tier1")[0] == sys.executable  # before the probe: our own
    ctx.python_choice = {"path": venv_python, "how": "found"}
    for mode in ("tier1", "exec", "torchprof", "static"):
        assert tiers.child_argv(ctx, mode, "10")[0] == venv_python


def test_cmd_python3_runs_under_the_chosen_python(ctx: RunContext, venv_python: str) -> None:
    ctx.python_choice = {"path": venv_python, "how": "found"}
    assert tiers.command_argv(ctx, "python3 train.py --lr 3")[:2] == [venv_python, "train.py"]
    assert tiers.command_argv(ctx, "true --x") == ["true", "--x"]
    ctx.python_choice = {"path": venv_python, "how": "login"}
    assert tiers.command_argv(ctx, "python3 x.py")[0] == "python3"


def test_cupy_is_judged_by_the_chosen_python(ctx: RunContext, venv_python: str) -> None:
    choice = {"path": venv_python, "how": "found", "reason": "r"}
    ctx.python_choice = choice
    # This interpreter has no CuPy; the chosen one has: nothing to complain about.
    tiers.ensure_cupy(ctx, ChosenPod(choice, HAS_BOTH))  # type: ignore[arg-type]
    assert events(ctx) == []
    with pytest.raises(tiers.WorkloadError):
        tiers.ensure_cupy(ctx, ChosenPod({**choice, "how": "fallback"}, HAS_NEITHER))  # type: ignore[arg-type]
    diag = next(e for e in events(ctx) if isinstance(e, protocol.Diagnosis))
    assert diag.code == "no_cupy" and diag.cause.startswith(venv_python)
    # pip refuses --user inside a venv: the remedy installs into the venv itself.
    assert diag.remedies[0] == f"{venv_python} -m pip install cupy-cuda12x"


def test_tier2_takes_torch_profiler_when_the_chosen_python_has_torch(ctx: RunContext,
                                                                    venv_python: str) -> None:
    choice = {"path": venv_python, "how": "found", "reason": "r"}
    pod = ChosenPod(choice, HAS_BOTH)
    # A target that fails: what matters is that the torch.profiler path was tried at all,
    # which the worker's own interpreter (no torch) would not have allowed.
    assert tiers.tier2(ctx, pod, ["/bin/false"], python=True,  # type: ignore[arg-type]
                       torch_argv=["/bin/false"]) is None
    started = [e for e in events(ctx) if isinstance(e, protocol.TierStarted)]
    assert started and "torch.profiler" in started[0].name
    pod = ChosenPod(choice, HAS_NEITHER)
    assert tiers.tier2(ctx, pod, ["/bin/false"], python=True,  # type: ignore[arg-type]
                       torch_argv=["/bin/false"]) is None
    finished = [e for e in events(ctx) if isinstance(e, protocol.TierFinished)]
    assert "torch.profiler: torch is not installed" in finished[-1].reason


def test_a_cmd_finds_the_chosen_python_through_a_shell_or_a_script(
        ctx: RunContext, venv_python: str, tmp_path: Path) -> None:
    """``cmd:python3 a.py | tee log`` runs under a shell, and ``bash run.sh`` or
    ``torchrun`` reach Python by PATH: the chosen environment's bin comes first on it, as
    activating that venv would, unless the person set PATH themselves."""
    bindir = str(Path(venv_python).parent)
    ctx.python_choice = {"path": venv_python, "how": "found"}
    ctx.env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    argv = tiers.command_argv(ctx, "python3 -c 'import sys; print(sys.prefix)' | cat")
    assert ctx.env["PATH"] == f"{bindir}:/usr/local/bin:/usr/bin:/bin"
    out = subprocess.run(argv, env=ctx.env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(Path(venv_python).parent.parent)  # the venv ran it
    tiers.command_argv(ctx, "python3 x.py")
    assert ctx.env["PATH"].split(":").count(bindir) == 1  # not stacked on every call
    # Login choice, or a PATH the person set: left alone.
    ctx.env["PATH"] = "/usr/bin:/bin"
    ctx.python_choice = {"path": venv_python, "how": "login"}
    tiers.command_argv(ctx, "python3 x.py | cat")
    assert ctx.env["PATH"] == "/usr/bin:/bin"
    ctx.python_choice = {"path": venv_python, "how": "found"}
    tiers.command_argv(ctx, "PATH=/opt/x:/usr/bin python3 x.py")
    assert not ctx.env["PATH"].startswith(bindir)


def test_a_chosen_system_interpreter_does_not_reorder_path(tmp_path: Path) -> None:
    """A chosen ``/usr/bin/python3.11`` must not put /usr/bin first: its ``python3`` is
    another interpreter."""
    from gpuws.remote_agent.pod import pythons

    d = tmp_path / "bin"
    d.mkdir()
    (d / "python3.11").write_text("#!/bin/sh\n")
    (d / "python3").write_text("#!/bin/sh\n")  # another file: not the chosen one
    path = "/usr/local/bin:/bin"
    assert pythons.path_for(path, {"path": str(d / "python3.11"), "how": "found"}) == path
    (d / "python3").unlink()
    (d / "python3").symlink_to(d / "python3.11")  # the same interpreter under python3
    assert pythons.path_for(path, {"path": str(d / "python3.11"), "how": "found"}) == \
        f"{d}:{path}"
