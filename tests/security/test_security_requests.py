"""The agent refuses what it does not understand and runs nothing it was not asked to run.

``serve`` is fed garbage by the ten thousand (random bytes, non-objects, unknown types,
known requests with fields of the wrong type, fields it does not have, ``cmd`` smuggled
into every field, paths and run ids that climb out of its directories, nesting 100,000
deep, a line over the 8 MiB limit): every line gets exactly one answer, an error, and no
process is ever started. The same over a real agent process, which must still answer a
ping afterwards, with no run created and the sentinel file an injected command would
have made nowhere to be seen.
"""

from __future__ import annotations

import asyncio
import io
import json
import random
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest

from faults.figures import record  # type: ignore[import-not-found]
from faults.helpers import child_pids  # type: ignore[import-not-found]
from gpuws import protocol
from gpuws.client import AgentClient
from gpuws.remote_agent import runs, serve, wire
from gpuws.transport.local import LocalTransport

SENTINEL = Path(f"/tmp/gpuws-pwned-{uuid.uuid4().hex}")
INJECT = f"$(touch {SENTINEL})"
GARBAGE = 10_000
VALID = [json.loads(protocol.encode(m)) for m in (
    protocol.Ping(req=1), protocol.ProbeReq(req=2),
    protocol.StartRun(req=3, spec=protocol.RunSpec(workload="cmd:true")),
    protocol.Attach(req=4, run_id="20990101-000000-abcdef"), protocol.Cancel(req=5, run_id="x"),
    protocol.ListRuns(req=6), protocol.TelemetryReq(req=7), protocol.NcuPlanReq(req=8),
    protocol.StatFile(req=9, path="/etc/passwd"), protocol.Shutdown(req=10))]


def garbage(rng: random.Random, i: int) -> bytes:
    """One request line this agent must refuse (and never act on)."""
    kind = rng.randrange(9)
    base = dict(rng.choice(VALID), req=i)
    if kind == 0:
        data = bytes(rng.randrange(256) for _ in range(rng.randint(1, 120)))
        return data.replace(b"\n", b"?").replace(b"\r", b"?").strip() or b"?"
    if kind == 1:
        return rng.choice([b"[1]", b'"ping"', b"42", b"null", b"true", b"[]", b"{"])
    if kind == 2:  # unknown types, including ones that sound dangerous
        base["type"] = rng.choice(["exec", "shell", "run", "cmd", "rm_rf", "eval", "PING",
                                   "ping ", "start_run\x00", "", None, 3, ["ping"]])
    elif kind == 3:  # a field the request does not have, often carrying a command
        base[rng.choice(["cmd", "command", "argv", "shell", "exec", "x"])] = INJECT
    elif kind == 4:  # a command where a spec field should be, or a spec field unknown
        spec = dict(VALID[2]["spec"])
        spec[rng.choice(["cmd", "command", "argv", "pre", "post", "shell"])] = INJECT
        base = {"type": "start_run", "req": i, "spec": spec}
    elif kind == 5:  # wrong types for the fields that drive actions
        base = {"type": "start_run", "req": i,
                "spec": rng.choice([INJECT, [INJECT], {"workload": [INJECT]},
                                    {"workload": {"cmd": INJECT}}, None, 1])}
    elif kind == 6:  # names that would climb out of the run directories
        name = rng.choice([f"../../{INJECT}", "../..", "/etc", "..", ".", "", "a/b",
                           "x" * 80, INJECT, "-rf", "\x00", "run\nid"])
        base = rng.choice([{"type": "attach", "req": i, "run_id": name},
                           {"type": "cancel", "req": i, "run_id": name},
                           {"type": "start_run", "req": i, "run_id": name,
                            "spec": {"workload": "cmd:true"}},
                           {"type": "stat_file", "req": i,
                            "path": rng.choice(["/etc/passwd", "~/.ssh/id_ed25519",
                                                f"{runs.runs_root()}/../agent", INJECT])}])
    elif kind == 7:  # numbers and flags of the wrong kind
        base = rng.choice([{"type": "attach", "req": i, "run_id": "r", "from_seq": INJECT},
                           {"type": "telemetry", "req": i, "interval_s": INJECT},
                           {"type": "attach", "req": i, "run_id": ["r"]},
                           {"type": "cancel", "req": i, "run_id": {"$ne": 1}}])
    else:  # nested far too deep
        return b'{"type":"ping","req":' + str(i).encode() + b',"x":' + b"[" * 100_000 + b"]" * \
            100_000 + b"}"
    return json.dumps(base).encode()


def test_contract_the_agent_knows_exactly_the_protocol_fields() -> None:
    for cls in protocol.Requests.__args__:  # type: ignore[attr-defined]
        tag = cls.__struct_config__.tag
        assert serve.REQUEST_FIELDS[tag] == {"type", *cls.__struct_fields__}, tag
    assert set(serve.REQUEST_FIELDS) == set(serve.HANDLERS)
    assert serve.SPEC_FIELDS == set(protocol.RunSpec.__struct_fields__)


def test_ten_thousand_garbage_requests_each_refused_nothing_started(
        monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[Any] = []

    class NoPopen:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            started.append(args)
            raise AssertionError(f"a process was started: {args!r}")

    monkeypatch.setattr(subprocess, "Popen", NoPopen)
    out = io.BytesIO()
    srv = serve.Server(wire.Writer(out))
    rng = random.Random(11)
    lines = [garbage(rng, i) for i in range(GARBAGE)]
    t0 = time.monotonic()
    for line in lines:
        srv.handle(line)
    replies = [json.loads(x) for x in out.getvalue().splitlines()]
    assert started == []
    assert len(replies) == len(lines)  # one answer per line, never silence, never two
    codes: dict[str, int] = {}
    for reply in replies:
        assert reply["type"] == "error", reply
        codes[reply["code"]] = codes.get(reply["code"], 0) + 1
        msgspec.convert(reply, protocol.Error)  # what the laptop decodes, strictly
    # Refusals only: never "internal" (a handler that fell over), never an answer.
    assert set(codes) <= {"bad_request", "unknown_request", "no_such_run"}, codes
    assert not SENTINEL.exists()
    assert not Path(runs.runs_root()).exists()  # not even a directory was made
    refused = sum(r["type"] == "error" for r in replies)
    record("agent_garbage_requests", requests=len(lines), refused=refused,
           processes_started=len(started), commands_injected=int(SENTINEL.exists()), **codes,
           seconds=round(time.monotonic() - t0, 1))


def test_a_real_agent_refuses_garbage_and_goes_on(tmp_path: Path) -> None:
    cache = tmp_path / "pod"
    rng = random.Random(12)
    lines = [garbage(rng, 100_000 + i) for i in range(2000)]
    lines.append(b'{"type":"ping","req":1,"x":"' + b"y" * (protocol.MAX_LINE + 10) + b'"}')

    async def go() -> tuple[list[protocol.Events], float, list[protocol.RunInfo], list[int]]:
        client = await AgentClient.connect(LocalTransport(env={"GPUWS_POD_CACHE": str(cache)}))
        got: list[protocol.Events] = []
        client.add_listener(lambda ev: got.append(ev)  # type: ignore[arg-type]
                            if not isinstance(ev, protocol.BadLine) else None)
        for line in lines:
            client.proc.stdin.write(line + b"\n")
        await client.proc.stdin.drain()
        deadline = time.monotonic() + 60
        while len(got) < len(lines) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        pong = await client.ping()
        listed = await client.list_runs()
        children = child_pids(client.hello.pid)
        await client.close()
        return got, pong, listed, children

    got, pong, listed, children = asyncio.run(go())
    assert pong < 5 and listed == [] and children == []
    assert len(got) == len(lines)
    assert all(isinstance(e, protocol.Error) for e in got)
    assert not SENTINEL.exists()
    assert not (cache / "runs").exists()
    record("agent_process_garbage_requests", requests=len(lines),
           refused=sum(isinstance(e, protocol.Error) for e in got),
           processes_started=len(children), runs_created=len(listed),
           commands_injected=int(SENTINEL.exists()))


def test_files_outside_the_run_dirs_are_never_served(tmp_path: Path) -> None:
    cache = tmp_path / "pod"
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the laptop")

    async def go() -> tuple[list[str], bytes, bytes]:
        client = await AgentClient.connect(LocalTransport(env={"GPUWS_POD_CACHE": str(cache)}))
        refusals = []
        try:
            for path in (str(secret), f"{cache}/runs/../../secret.txt", "/etc/shadow",
                         f"{cache}/agent/{client.hello.agent_sha256}.pyz"):
                try:
                    await client.stat_file(path)
                except Exception as exc:  # AgentError: the refusal itself
                    refusals.append(str(exc))
            res = await client.transport.run([*client.agent_argv(), "cat", str(secret), "0"])
            return refusals, res.stdout, res.stderr
        finally:
            await client.close()

    refusals, out, err = asyncio.run(go())
    assert len(refusals) == 4 and all("only files under" in r for r in refusals)
    assert out == b"" and b"refusing" in err
    # Asked five times (four stat_file, one cat); served: what was answered, or any byte.
    served = 4 - sum("only files under" in r for r in refusals) + (out != b"")
    assert served == 0
    record("files_outside_the_run_dirs", asked=5, served=served)
