"""Strings full of shell metacharacters reach the pod verbatim and never run a command.

Workload arguments, environment values, kernel regexes, file names and host names are
drawn (hypothesis) from quotes, ``$()``, backticks, ``;|&``, globs, newlines, CR, tabs,
bidi marks and other unicode, mixed with ready-made injections that would create a
sentinel file if any shell ever evaluated them. Each string must arrive exactly as sent
(argv over a real sshd, the run's spec and environment in a real worker, ncu's argv, the
workload file's name on disk), and the sentinel must never appear. A static check backs
this up: no ``shell=True``, no ``os.system``, and every command line sent over SSH is
``shlex.join`` of an argv (through ``transport.base.shell_command``, which carries that
POSIX command line past any login shell as octal escapes).

Host names go to exactly one process: ``ssh -G ... -- NAME`` (an argv, no shell), where
OpenSSH decides where they lead; nothing else is ever started for one.
"""

from __future__ import annotations

import ast
import asyncio
import base64
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faults.figures import record  # type: ignore[import-not-found]
from gpuws import protocol
from gpuws.client import AgentClient
from gpuws.errors import GpuwsError
from gpuws.remote_agent import procs, runs
from gpuws.remote_agent.child import materialize_file
from gpuws.remote_agent.profilers.ncu_cmd import build_ncu_argv
from gpuws.transport.ssh import SSHTransport
from sshd import SshServer  # type: ignore[import-not-found]

SRC = Path(protocol.__file__).parent
SENTINEL = Path(f"/tmp/gpuws-pwned-{uuid.uuid4().hex}")
META = " ;|&$()<>`'\"\\\n\r\t*?[]{}~#!%^=,.-_/:@+"
UNICODE = "éß漢字🙂\u202e\u00a0\u2028\u0301"
INJECTIONS = [f"$(touch {SENTINEL})", f"`touch {SENTINEL}`", f"; touch {SENTINEL}",
              f"&& touch {SENTINEL}", f"| touch {SENTINEL}", f"\ntouch {SENTINEL}\n",
              f"'; touch {SENTINEL}; '", f'"; touch {SENTINEL}; "', f"$(touch${{IFS}}{SENTINEL})",
              f"\\$(touch {SENTINEL})", f"-o ProxyCommand=touch {SENTINEL}"]
nasty_text = st.text(alphabet=st.sampled_from(META + UNICODE + "abcXYZ019"), max_size=40)
any_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
                   max_size=20)
nasty = st.one_of(nasty_text, st.sampled_from(INJECTIONS), any_text)
COUNTS: dict[str, int] = {}

ECHO_ARGV = "import json, sys; sys.stdout.write(json.dumps(sys.argv[1:]))"
DUMP_ENV = ("import json, os; json.dump({k: v for k, v in os.environ.items() "
            "if k.startswith('GPUWS_FUZZ_')}, open(os.environ['GPUWS_ARTIFACT_DIR'] "
            "+ '/env.json', 'w'))")

def count(name: str, n: int = 1) -> None:
    COUNTS[name] = COUNTS.get(name, 0) + n


def injected() -> int:
    """1 if an injected command ran (the sentinel exists), counted and cleared; else 0."""
    ran = SENTINEL.exists()
    SENTINEL.unlink(missing_ok=True)
    count("commands_injected", ran)
    return int(ran)


def altered(sent: object, got: object) -> bool:
    """Whether a string arrived otherwise than sent (counted for the figures)."""
    changed = sent != got
    count("strings_altered", changed)
    return changed


@pytest.fixture(autouse=True)
def _no_sentinel() -> Iterator[None]:
    SENTINEL.unlink(missing_ok=True)
    yield
    assert not injected(), "a string was evaluated by a shell"


def test_argv_reaches_the_pod_verbatim_over_ssh(ssh_config: Path) -> None:
    loop = asyncio.new_event_loop()
    transport = SSHTransport("pod", config_file=str(ssh_config))
    loop.run_until_complete(transport.connect())

    @given(st.lists(nasty, min_size=1, max_size=8))
    @settings(max_examples=40, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    def check(args: list[str]) -> None:
        # printf (the login shell's builtin) prints each argument as it got it, NUL-ended.
        res = loop.run_until_complete(transport.run(["printf", "%s\\0", *args]))
        assert res.returncode == 0, res.stderr
        assert not altered([a.encode() for a in args], res.stdout.split(b"\0")[:-1])
        assert not injected()
        count("ssh_argv")

    try:
        check()
        # A NUL cannot be in an argv; sshd drops a connection whose exec request holds
        # one. A clear error, and nothing ran.
        with pytest.raises(GpuwsError):
            loop.run_until_complete(transport.run(
                ["python3", "-c", ECHO_ARGV, f"a\x00; touch {SENTINEL}"]))
        assert not injected()
    finally:
        loop.run_until_complete(transport.close())
        loop.close()


def test_spec_strings_reach_the_worker_verbatim(ssh_config: Path, sshd: SshServer) -> None:
    loop = asyncio.new_event_loop()
    client = loop.run_until_complete(
        AgentClient.connect(SSHTransport("pod", config_file=str(ssh_config))))
    finished: dict[str, protocol.RunFinished] = {}
    client.add_listener(lambda ev: finished.__setitem__(ev.run_id, ev)  # type: ignore[union-attr]
                        if isinstance(ev, protocol.RunFinished) and ev.run_id else None)

    async def run(spec: protocol.RunSpec) -> str:
        run_id = (await client.start_run(spec)).run_id
        deadline = time.monotonic() + 30
        while run_id not in finished:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        return run_id

    @given(st.lists(nasty, min_size=1, max_size=8), nasty, nasty)
    @settings(max_examples=8, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    def check(values: list[str], regex: str, name: str) -> None:
        env = {f"GPUWS_FUZZ_{i}": v for i, v in enumerate(values)}
        spec = protocol.RunSpec(workload=f"cmd:python3 -c {json.dumps(DUMP_ENV)}", tiers=[],
                                env=env, kernel_regex=regex, file_name=name,
                                ncu_sections=values)
        run_id = loop.run_until_complete(run(spec))
        assert finished[run_id].status == "ok", finished[run_id].error
        rdir = sshd.pod_cache / "runs" / run_id
        assert not altered(env, json.loads((rdir / "artifacts" / "env.json").read_text()))
        sent = json.loads((rdir / "spec.json").read_text())
        assert not altered(protocol.to_builtins(spec), sent)  # stored exactly as sent
        assert not injected()
        count("run_spec")

    try:
        check()
    finally:
        loop.run_until_complete(client.close())
        loop.close()


def test_kernel_regex_reaches_ncu_as_one_argument(tmp_path: Path) -> None:
    fake_ncu = tmp_path / "ncu"
    fake_ncu.write_text(f"#!{sys.executable}\n{ECHO_ARGV}\n")
    fake_ncu.chmod(0o700)

    @given(nasty)
    @settings(max_examples=40, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    def check(regex: str) -> None:
        argv = build_ncu_argv(str(fake_ncu), report_path=str(tmp_path / "r"),
                              target_argv=["python3", "-c", "pass"], kernel_regex=regex,
                              launch_skip=0, launch_count=1, ncu_set=None, sections=None,
                              replay_mode=None, clock_control="none", cache_control="all")
        lines: list[str] = []
        res = procs.run_streaming(argv, emit=lambda e: lines.append(str(e.get("text"))),
                                  tier=3, cwd=str(tmp_path), env=dict(os.environ))
        assert res.returncode == 0
        got = json.loads("".join(lines))
        assert not altered(argv[1:], got)  # every argument arrived whole
        want = regex[len("regex:"):] if regex.startswith("regex:") else regex
        assert got[got.index("-k") + 1] == "regex:" + (want or ".*")
        assert not injected()
        count("ncu_regex")

    check()


def test_file_names_stay_in_the_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWS_POD_CACHE", str(tmp_path / "pod"))
    refused = {"n": 0}

    @given(nasty)
    @settings(max_examples=150, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    def check(name: str) -> None:
        run_id = "fuzz-" + uuid.uuid4().hex[:12]
        rdir = Path(runs.run_dir(run_id))
        rdir.mkdir(parents=True)
        body = name.encode("utf-8", "surrogatepass") + b"\n# workload\n"
        spec = {"file_name": name, "file_b64": base64.b64encode(body).decode()}
        try:
            path = Path(materialize_file(spec, run_id))
        except OSError:
            # Only the names that mean "this directory" cannot be a file name.
            assert os.path.basename(name) in (".", "..")
            refused["n"] += 1
            return
        assert path.parent == rdir / "workload"  # never anywhere else
        expected = os.path.basename(name) or "workload.py"
        if expected in (".", ".."):
            assert path.resolve().is_relative_to(rdir)
            return
        assert path.name == expected
        assert not altered(body, path.read_bytes())
        assert not injected()
        count("file_name")

    check()
    outside = [p for p in (tmp_path / "pod").rglob("*")
               if not p.resolve().is_relative_to((tmp_path / "pod" / "runs").resolve())]
    assert outside == []


host_names = st.one_of(nasty, st.text(alphabet=st.sampled_from(META + "ab.-"), min_size=1,
                                      max_size=30).map(lambda s: "h" + s))


def _only_ssh_g(real: Callable[..., Any], seen: list[list[str]]) -> Callable[..., Any]:
    """A ``subprocess.Popen`` that lets through only ``ssh -G [-F f] [-p n] [-l u] -- HOST``."""

    def popen(args: Any, *rest: Any, **kwargs: Any) -> Any:
        assert not kwargs.get("shell"), f"shell=True for {args!r}"
        assert isinstance(args, list) and all(isinstance(a, str) for a in args), \
            f"a process was started with a command string: {args!r}"
        assert os.path.basename(args[0]) == "ssh" and args[1] == "-G" and args[-2] == "--", \
            f"a process other than ssh -G was started for a host name: {args!r}"
        opts = args[2:-2]
        assert len(opts) % 2 == 0 and all(o in ("-F", "-p", "-l") for o in opts[::2]), args
        seen.append(args)
        return real(args, *rest, **kwargs)

    return popen


def test_host_names_never_reach_a_shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every odd name reaches ``ssh -G`` as one argument after ``--`` (or is refused before
    it), never a shell and never any other process; then fails with one clear line."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text("")
    raw: list[str] = []
    resolved: list[list[str]] = []

    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a process was started for a host name: {args!r}")

    monkeypatch.setattr(subprocess, "Popen", _only_ssh_g(subprocess.Popen, resolved))
    monkeypatch.setattr(asyncio, "create_subprocess_exec", no_process)  # a ProxyCommand
    monkeypatch.setattr(asyncio, "create_subprocess_shell", no_process)

    async def connect(name: str) -> None:
        await SSHTransport(name, config_file=str(cfg), connect_timeout=2).connect()

    @given(host_names)
    @settings(max_examples=60, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    def check(name: str) -> None:
        before = len(resolved)
        try:
            asyncio.run(connect(name))
        except GpuwsError:
            count("host_name")
        except (UnicodeError, ValueError, TypeError) as exc:  # must not happen: one clear line
            raw.append(f"{name!r}: {type(exc).__name__}")
            count("host_name")
        else:
            raise AssertionError(f"connected to {name!r}?")
        assert not injected()
        for argv in resolved[before:]:
            # The host is the argument after "--", cut from the name exactly as typed
            # (user@ and :port go as -l and -p), or the defaults' probe.
            assert argv[-1] in name or argv[-1] == "gpuws-defaults.invalid", (name, argv)
            for flag, value in zip(argv[2:-2:2], argv[3:-2:2], strict=True):
                assert flag == "-F" or value in name, (name, argv)

    check()
    # Counted over this file's tests so far (they run in file order): after every example,
    # whether the sentinel an injection would create exists, and whether any string
    # arrived otherwise than sent.
    injected()
    commands_injected = COUNTS.get("commands_injected", 0)
    strings_altered = COUNTS.get("strings_altered", 0)
    assert (commands_injected, strings_altered) == (0, 0)
    record("fuzz_shell", ssh_argv_examples=COUNTS.get("ssh_argv", 0),
           run_spec_examples=COUNTS.get("run_spec", 0),
           ncu_regex_examples=COUNTS.get("ncu_regex", 0),
           file_name_examples=COUNTS.get("file_name", 0),
           host_name_examples=COUNTS.get("host_name", 0),
           host_names_to_ssh_g=len({a[-1] for a in resolved} - {"gpuws-defaults.invalid"}),
           host_names_without_clear_error=len(raw), commands_injected=commands_injected,
           strings_altered=strings_altered)
    assert raw == [], raw  # every odd host name ends in one clear GpuwsError line
    assert resolved, "no name reached ssh -G: the check above checked nothing"


@pytest.mark.parametrize("name", ["a" * 64 + ".example", "..", "\u202epod", "po\x00d"])
def test_odd_host_names_give_one_clear_error(name: str, tmp_path: Path) -> None:
    cfg = tmp_path / "ssh_config"
    cfg.write_text("")
    with pytest.raises(GpuwsError):
        asyncio.run(SSHTransport(name, config_file=str(cfg), connect_timeout=2).connect())


# ----------------------------------------------------------------------------- static
def _calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    return "?"


def _is_quoted(node: ast.AST, func: ast.AST) -> bool:
    """``node`` is shlex.join(...)/shlex.quote(...)/shell_command(...), or a name only ever
    bound to one, or an f-string of those and of secrets.token_* values (a random token is
    shell-safe)."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Call):
        # shell_command(argv) is shlex.join(argv) carried past any login shell (checked
        # below, in transport/base.py, and run under every shell in test_login_shells).
        return _name(node.func) in ("shlex.join", "shlex.quote", "shell_command") or \
            _name(node.func).startswith("secrets.token_")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _is_quoted(node.left, func) and _is_quoted(node.right, func)
    if isinstance(node, ast.JoinedStr):
        return all(_is_quoted(v.value if isinstance(v, ast.FormattedValue) else v, func)
                   for v in node.values)
    if isinstance(node, ast.Name):
        bound = [a.value for a in ast.walk(func) if isinstance(a, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == node.id for t in a.targets)]
        return bool(bound) and all(_is_quoted(v, func) for v in bound)
    return False


def test_no_shell_command_is_built_by_concatenation() -> None:
    checked = 0
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        rel = path.relative_to(SRC).as_posix()
        funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef,
                                                             ast.AsyncFunctionDef))]
        for call in _calls(tree):
            name = _name(call.func)
            assert not any(k.arg == "shell" for k in call.keywords), f"{rel}: shell= in {name}"
            assert name not in ("os.system", "os.popen", "subprocess.getoutput",
                                "subprocess.getstatusoutput", "asyncio.create_subprocess_shell"
                                ) and not name.endswith(".subprocess_shell"), f"{rel}: {name}"
            if name in ("subprocess.Popen", "subprocess.run", "subprocess.check_output",
                        "asyncio.create_subprocess_exec") and call.args:
                # An argv, never one string for a shell to split.
                assert not isinstance(call.args[0], (ast.Constant, ast.JoinedStr, ast.BinOp)), \
                    f"{rel}:{call.lineno}: {name} with a command string"
                checked += 1
            if name.endswith(".create_process") and call.args:
                # The command line an SSH server hands to the login shell.
                func = next(f for f in funcs if f.lineno <= call.lineno <= (f.end_lineno or 0))
                assert _is_quoted(call.args[0], func), \
                    f"{rel}:{call.lineno}: a command line not built by shlex.join"
                checked += 1
            # `sh -c SCRIPT`: the script is fixed text; data goes in as "$@" positional
            # arguments. The one exception is a cmd: workload, which is a shell command
            # by the person's explicit request.
            for lst in [a for a in call.args if isinstance(a, ast.List)]:
                checked += _check_sh_c(lst, rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.List):
                checked += _check_sh_c(node.value, rel)
            if isinstance(node, ast.Return) and isinstance(node.value, ast.List):
                checked += _check_sh_c(node.value, rel)
    # Every command line the SSH transport sends is shell_command(argv)...
    ssh = ast.parse((SRC / "transport" / "ssh.py").read_text())
    sends = [c for c in _calls(ssh) if _name(c.func).endswith(".create_process")]
    assert sends and all(isinstance(c.args[0], ast.Call) and _name(c.args[0].func)
                         == "shell_command" for c in sends if c.args)
    # ...and shell_command quotes the argv with shlex.join and puts only fixed text and
    # that (octal-escaped) line into what the login shell reads.
    base = ast.parse((SRC / "transport" / "base.py").read_text())
    (func,) = [f for f in ast.walk(base)
               if isinstance(f, ast.FunctionDef) and f.name == "shell_command"]
    joins = [c for c in _calls(func) if _name(c.func) == "shlex.join"]
    assert [ast.unparse(c.args[0]) for c in joins] == ["argv"]
    (ret,) = [n for n in ast.walk(func) if isinstance(n, ast.Return)]
    assert isinstance(ret.value, ast.JoinedStr)
    pieces = [v.value for v in ret.value.values if isinstance(v, ast.FormattedValue)]
    assert [ast.unparse(p) for p in pieces] == ["encoded"]
    assert checked >= 10


def _check_sh_c(lst: ast.List, rel: str) -> int:
    elts = lst.elts
    for i, el in enumerate(elts[:-1]):
        if not (isinstance(el, ast.Constant) and el.value == "-c" and i > 0):
            continue
        shell = elts[i - 1]
        if not (isinstance(shell, ast.Constant) and str(shell.value).split("/")[-1]
                in ("sh", "bash", "dash", "zsh")):
            continue  # python3 -c CODE: the code is ours, its args are sys.argv
        script = elts[i + 1]
        if rel == "remote_agent/measure/tiers.py" and isinstance(script, ast.Name) \
                and script.id == "command":
            return 1  # cmd:COMMAND, the explicit request
        ok = isinstance(script, ast.Constant) or (
            isinstance(script, ast.JoinedStr) and all(
                isinstance(v, ast.Constant) or _name(v.value) in ("POD_CACHE", "bundle.sha256")
                for v in script.values if isinstance(v, (ast.Constant, ast.FormattedValue))))
        assert ok, f"{rel}:{lst.lineno}: sh -c with a script built from data"
        return 1
    return 0
