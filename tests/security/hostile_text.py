"""A store full of hostile text, put there the way a pod puts it: for the text-surface tests.

The pod is a lying agent (a stand-in that speaks the protocol: no real agent can be made
to lie, and a real pod cannot be told to), fed to the real ``AgentClient``, the real
:class:`~gpuws.live.engine.Engine` (trust boundary, feed) and the real SQLite store:

- its answer to ``probe`` (asked over the wire, checked by ``check_answer``) names the
  pod, its OS, its GPUs and tools with hostile strings, and the engine records it as the
  session's probe;
- run 1 is the real H200 recording (``tests/fixtures/recorded/saxpy_h200.ndjson``) with
  :data:`HOSTILE` appended to every free-text string of every event (workload, tier names
  and commands, kernel names of the kernel table, metrics, stalls, rules, logs, output,
  artifact kind), sent under the run id the laptop chose;
- run 2 is the same again, compared with run 1 (its baseline);
- run 3 fails with a hostile error and a hostile diagnosis.

Every surface test reads what the engine stored, through the path people use.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from gpuws import protocol
from gpuws.client import AgentClient
from gpuws.deploy import DeployResult
from gpuws.live.engine import Engine
from gpuws.live.link import Target
from gpuws.live.storeio import StoreHandle
from gpuws.transport.base import RemoteProcess, Transport, TransportInfo
from security.test_untrusted_lying_agent import LyingAgent  # type: ignore[import-not-found]
from tui.tuikit import RECORDED  # type: ignore[import-not-found]

RECORDING = Path(__file__).parent.parent / "fixtures" / "recorded" / "saxpy_h200.ndjson"

#: Each a way pod text has been, or could be, an instruction rather than text.
PIECES = {
    # terminal: window title, clipboard write (OSC 52), clear screen, one-byte CSI and OSC
    # (C1), bell, a right-to-left override that reverses what follows.
    "osc-title": "\x1b]0;pwned\x07",
    "osc52-clipboard": "\x1b]52;c;cHduZWQ=\x07",
    "clear-screen": "\x1b[2J\x1b[H",
    "c1-csi": "\x9b2J",
    "c1-osc": "\x9d0;c1-title\x9c",
    "bidi-override": "\u202eevil\u202c",
    "del-nul": "\x7f\x00",
    # Rich and Textual markup: a link, a click action, a close with nothing open.
    "rich-link": "[link=http://evil.example/]click[/link]",
    "rich-close": "[/]",
    "textual-click": "[@click=app.quit]quit[/]",
    "rich-style": "[bold red]red[/bold red]",
    # markdown: a tracking pixel, links and autolinks, raw HTML, mentions and references.
    "md-image": "![](http://evil.example/pixel.png)",
    "md-link": "[docs](http://evil.example/a)",
    "md-autolink": "<http://evil.example/b>",
    "md-bare-url": "see https://evil.example/c and www.evil.example",
    "md-email": "root@evil.example",
    "md-mention": "@octocat owner/repo#1",
    "md-html": "<img src=http://evil.example/d.png><details><summary>x",
    "md-emphasis": "**bold** _em_ ~~gone~~ $x$",
    "md-backslash-pipe": "a\\|b",
    "md-code": "`code` ```",
    # rows: newlines that would draw a heading, a rule, a table row, a fence.
    "forged-rows": "\n# Forged heading\n---\n| forged | row |\n```\n",
}
HOSTILE = " ".join(PIECES.values())

#: Fields that are not free text (the protocol fixes their values, the boundary checks
#: them, or they are the laptop's): left alone so the events stay events.
_KEEP = {"type", "run_id", "stream", "status", "kind", "level", "mode", "stop_reason",
         "sha256", "speedup_type", "limiter", "clock_control", "cache_control", "path",
         "run_dir", "requested_mode", "l2_flush_method", "timing"}
_NOW = time.time()


def _poison(value: Any, text: str, key: str | None = None) -> Any:
    if isinstance(value, dict):
        return {k: _poison(v, text, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_poison(v, text, key) for v in value]
    if isinstance(value, str) and key not in _KEEP:
        return f"{value} {text}"
    return value


def poisoned_recording(run_id: str, text: str = HOSTILE) -> list[dict[str, Any]]:
    """The real H200 run's events, every free-text string ending in ``text``."""
    events = [_poison(json.loads(line), text) for line in RECORDING.read_bytes().splitlines()]
    shift = _NOW - 600 - events[0]["ts"]
    for e in events:
        e["run_id"], e["ts"] = run_id, e["ts"] + shift
    return events


def hostile_probe(text: str = HOSTILE) -> dict[str, Any]:
    """The H200 pod's probe (tests/sessions/recorded.py) with ``text`` in its names."""
    probe = RECORDED.probe()
    for key in ("hostname", "os", "kernel", "user", "python_version"):
        probe[key] = f"{probe[key]} {text}"
    probe["container"] = [text]
    gpu = probe["gpus"][0]
    gpu["name"] = f"{gpu['name']} {text}"
    gpu["processes"] = [{"pid": 7, "name": text, "used_mib": 1.0}]
    gpu["clock_events"] = [text]
    probe["ncu"][0]["version"] = text
    probe["nsys"][0]["error"] = text
    probe["counters"]["reason"] = text
    return probe


class _Offline(Transport):
    info = TransportInfo(kind="ssh", target="liar", sftp=False)

    async def connect(self) -> None:
        pass

    async def start(self, argv: Any) -> RemoteProcess:
        raise AssertionError("the liar has no side channels")

    async def close(self) -> None:
        pass

    async def read_file(self, path: str, offset: int, agent_argv: Any,  # type: ignore[override]
                        chunk: int = 1 << 20) -> Any:
        raise AssertionError("nothing is pulled from the liar")


def _script(agent: LyingAgent, req: dict[str, Any], text: str) -> None:
    if req["type"] == "probe":
        agent.send({"type": "probe_result", "req": req["req"], "ts": _NOW,
                    "probe": hostile_probe(text)})
        return
    if req["type"] == "cancel":  # refused, in the pod's words
        agent.send({"type": "error", "req": req["req"], "ts": _NOW, "code": "refused",
                    "title": f"Refused {text}", "message": f"no {text}",
                    "remedy": f"try {text}"})
        return
    if req["type"] != "start_run":
        return
    run_id = req["run_id"]
    workload = req["spec"]["workload"]
    agent.send({"type": "run_list", "req": req["req"], "ts": _NOW, "runs": [
        {"run_id": run_id, "workload": workload, "status": "running", "started": _NOW,
         "last_seq": -1}]})
    if workload == "builtin:saxpy":
        agent.send(*poisoned_recording(run_id, text))
        return
    ts = _NOW - 100
    agent.send(
        {"type": "run_started", "run_id": run_id, "seq": 0, "ts": ts,
         "spec": {"workload": workload, "tiers": [1]}, "run_dir": f"/pod/runs/{run_id}",
         "pid": 7, "hostname": f"pod {text}"},
        {"type": "diagnosis", "run_id": run_id, "seq": 1, "ts": ts + 1, "code": "oom",
         "severity": "error", "title": f"out of memory {text}", "cause": f"cause {text}",
         "meaning": f"meaning {text}", "remedies": [f"remedy {text}"],
         "unmeasured": [f"Tier 1 {text}"]},
        {"type": "output", "run_id": run_id, "seq": 2, "ts": ts + 2, "stream": "stderr",
         "text": f"out {text}"},
        {"type": "tier_finished", "run_id": run_id, "seq": 3, "ts": ts + 3, "tier": 1,
         "status": "failed", "wall_s": 1.0, "reason": f"reason {text}"},
        {"type": "run_finished", "run_id": run_id, "seq": 4, "ts": ts + 4, "status": "failed",
         "wall_s": 4.0, "exit_code": 1, "error": f"the workload failed: {text}"})


def liar(text: str = HOSTILE) -> AgentClient:
    """A real ``AgentClient`` whose agent is the liar (call inside a running loop)."""
    hello = protocol.Hello(agent_version=f"0 {text}", agent_sha256="0" * 64,
                           protocol_version=1)
    return AgentClient(_Offline(), LyingAgent(lambda a, r: _script(a, r, text)),
                       DeployResult("0" * 64, 0, "cached", 0, 0.0, hello), b"", "python3")


async def _fill(text: str) -> tuple[str, list[str]]:
    client = liar(text)
    engine = Engine(StoreHandle(), auto_pull=False)
    probe = await client.probe()  # over the wire, through check_answer
    await engine.adopt(Target("liar"), client, probe)
    runs = []
    try:
        for workload in ("builtin:saxpy", "builtin:saxpy", f"cmd:{text}"):
            info = await engine.start_run(protocol.RunSpec(workload=workload, tiers=[1, 2, 3]))
            await asyncio.wait_for(engine.wait_finished(info.run_id), 30)
            runs.append(info.run_id)
        await engine.drained()
        # The second saxpy is compared with the first, as `--baseline` asks: every face
        # then draws a comparison of two hostile runs too.
        await engine.store.call(lambda s: s.set_baseline_of(runs[1], runs[0]))
        session_id = engine.session_id
        assert session_id is not None
    finally:
        await engine.close()
        await engine.store.close()
    return session_id, runs


def hostile_store(text: str = HOSTILE) -> tuple[str, list[str]]:
    """Fill ``GPUWS_HOME``'s store as above; (session id, [saxpy, saxpy vs it, failed]).

    ``text`` is what every free-text string gets: an honest word gives the twin session
    whose report shows what gpuws itself draws.
    """
    return asyncio.run(_fill(text))


def unsafe_chars(text: str) -> list[str]:
    """The control, C1 and bidi characters in ``text`` (a newline and a tab are fine)."""
    return [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f
            or c in "\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e"
                    "\u2066\u2067\u2068\u2069\ufeff"]
