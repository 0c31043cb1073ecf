"""Which argv each ``cmd:`` workload gets: no shell between a profiler and the program."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuws.remote_agent.cmdline import SHELL, plan_command, starts_python


@pytest.mark.parametrize("command, argv, env", [
    ("python3 tfm.py", ["python3", "tfm.py"], {}),
    ("python3 -c 'import torch; print(torch.ones(3) * 2)'",
     ["python3", "-c", "import torch; print(torch.ones(3) * 2)"], {}),
    ('python3 train.py --lr=1e-3 --name "run one"',
     ["python3", "train.py", "--lr=1e-3", "--name", "run one"], {}),
    ("CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=4 python3 x.py",
     ["python3", "x.py"], {"CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "4"}),
    (r"python3 my\ file.py", ["python3", "my file.py"], {}),
    ("./bench --size=4096 a#b", ["./bench", "--size=4096", "a#b"], {}),
])
def test_plain_commands_run_without_a_shell(command: str, argv: list[str],
                                            env: dict[str, str]) -> None:
    plan = plan_command(command)
    assert (plan.how, plan.argv, plan.env) == ("exec", argv, env)


@pytest.mark.parametrize("command", [
    "python3 x.py > out.log 2>&1",
    "python3 $HOME/x.py",
    'python3 "$SCRIPT"',
    "python3 *.py",
    "python3 ~/x.py",
    "nice -n 5 python3 x.py < input.txt",
])
def test_one_command_needing_the_shell_execs_away(command: str) -> None:
    plan = plan_command(command)
    assert plan.how == "sh-exec" and plan.argv == [SHELL, "-c", "exec " + command]


@pytest.mark.parametrize("command", [
    "cd src && python3 x.py",
    "python3 a.py; python3 b.py",
    "python3 x.py | tee log",
    "sleep 60 & echo child=$!; wait",
    "for i in 1 2; do echo $i; done",
    "FOO=$BAR python3 x.py",
    "export FOO=1",
    "(python3 x.py)",
    "echo `date`",
    "python3 'unbalanced",
    "A=1",
])
def test_lists_pipelines_and_builtins_keep_the_shell(command: str) -> None:
    plan = plan_command(command)
    assert plan.how == "sh" and plan.argv == [SHELL, "-c", command]


ARGV_JSON = "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ.get('FOO')]))"


@pytest.mark.parametrize("tail", [
    "a 'b c' \"d e\" f\\ g", "--x=1 '' \"\"", "FOO=bar", "'$HOME' 'a|b' 'x;y' '#c'",
    "é ✓ 'naïve'",
])
def test_split_matches_what_the_shell_passes(tmp_path: Path, tail: str) -> None:
    """The same argv and environment as ``/bin/sh -c`` would give the program."""
    script = tmp_path / "argv.py"
    script.write_text(ARGV_JSON)
    for command in (f"{sys.executable} {script} {tail}", f"FOO=x{len(tail)} "
                    f"{sys.executable} {script} {tail}"):
        plan = plan_command(command)
        assert plan.how == "exec", command
        env = {k: v for k, v in os.environ.items() if k != "FOO"}
        by_shell = subprocess.run([SHELL, "-c", command], env=env, capture_output=True,
                                  text=True, check=True).stdout
        direct = subprocess.run(plan.argv, env={**env, **plan.env}, capture_output=True,
                                text=True, check=True).stdout
        assert json.loads(direct) == json.loads(by_shell)


def test_sh_exec_leaves_no_shell_behind(tmp_path: Path) -> None:
    """``exec`` makes the program the shell's own process: its parent is our process."""
    plan = plan_command(f"{sys.executable} -c 'import os; print(os.getppid())' > "
                       f"{tmp_path}/out")
    assert plan.how == "sh-exec"
    proc = subprocess.run(plan.argv, check=True)
    assert proc.returncode == 0
    assert int((tmp_path / "out").read_text()) == os.getpid()


@pytest.mark.parametrize("command, python", [
    ("python3 tfm.py", True), ("/opt/venv/bin/python3.12 -m bench", True),
    ("cd src && python train.py", True), ("torchrun --nproc-per-node 8 train.py", True),
    ("CUDA_VISIBLE_DEVICES=0 python3 x.py", True), ("./bench --n 4", False),
    ("sh bench.sh", False), ("echo python", False),
])
def test_which_commands_start_python(command: str, python: bool) -> None:
    assert starts_python(command) is python
