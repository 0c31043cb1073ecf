"""Issue 37's Done, on the GPU machine: an MCP client plays an agent's loop on a Triton
kernel through ``gpuws mcp``, and a cheating edit is caught by ``check``.

    python tests/gpu/mcp_agent_loop.py [--out DIR]

The client is the MCP SDK's stdio client; the server is ``python -m gpuws mcp`` with a
budget and a run cap; the host is ``local`` (this machine, opened to the agent in a
throwaway config); the store is a throwaway GPUWS_HOME. The loop: three edits of a Triton
vector add (a small block, a large block, then a comment only), each through ``sync`` +
``run`` (Tier 1, ``file:bench.py`` in the workspace) + ``compare`` with the edit before;
each verdict is checked against the one ``gpuws watch`` computes from the same stored
samples (``compare_samples`` of the previous and the new run). Then an edit that returns
a cached output: its run must fail on ``check(state)`` before anything is timed.

Writes ``transcript.json`` (every call, its arguments and answer) and ``figures.md`` (the
table for docs/gpu-validation.md) under --out; exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

BENCH = '''
import torch

from kernel import add

N = 1 << 24
BYTES = 3 * 4 * N  # x and y read, out written, float32
KERNEL_REGEX = "add_kernel"


def setup(seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.rand(N, device="cuda", generator=g)
    y = torch.rand(N, device="cuda", generator=g)
    return {"x": x, "y": y, "out": torch.empty_like(x)}


def run(state):
    add(state["x"], state["y"], state["out"])


def check(state):
    return bool(torch.allclose(state["out"], state["x"] + state["y"]))
'''

KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs,
                                                                        mask=mask), mask=mask)

{comment}
def add(x, y, out):
{body}
'''

HONEST = '''    n = out.numel()
    add_kernel[(triton.cdiv(n, {block}),)](x, y, out, n, BLOCK={block}, num_warps={warps})
'''

# The cheat: compute once, then hand back the first answer (a cache keyed on nothing):
# fast, and right on the inputs it was first given.
CHEAT = '''    n = out.numel()
    if "out" not in _CACHE:
        add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024, num_warps=4)
        _CACHE["out"] = out.clone()
    out.copy_(_CACHE["out"])


_CACHE = {}
'''

EDITS = [
    ("edit 1: BLOCK=64, 1 warp", "# edit 1", HONEST.format(block=64, warps=1)),
    ("edit 2: BLOCK=1024, 4 warps", "# edit 2", HONEST.format(block=1024, warps=4)),
    ("edit 3: a comment only", "# edit 3: same kernel, reworded comment",
     HONEST.format(block=1024, warps=4)),
]


class Transcript:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def call(self, client: Any, tool: str, args: dict[str, Any]) -> Any:
        progress: list[str] = []

        async def on_progress(done: float, total: float | None, message: str | None) -> None:
            progress.append(f"{done:g}/{total:g} {message}")

        t0 = time.monotonic()
        result = await client.call_tool(tool, args, progress_callback=on_progress)
        text = "".join(getattr(c, "text", "") for c in result.content)
        self.calls.append({"tool": tool, "arguments": args, "is_error": result.is_error,
                           "seconds": round(time.monotonic() - t0, 2), "progress": progress,
                           "structured": result.structured_content,
                           "text": text if result.is_error else None})
        print(f"→ {tool} {json.dumps(args)} ({time.monotonic() - t0:.1f} s)"
              + (f"\n  ERROR {text}" if result.is_error else ""), flush=True)
        return result


async def main(out: Path) -> int:
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    from gpuws.sessions.compare import compare_samples, verdict_word
    from gpuws.sessions.store import Store

    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="gpuws-mcp-loop-"))
    home, cfg, ws = scratch / "home", scratch / "config.toml", scratch / "ws"
    ws.mkdir()
    cfg.write_text("[hosts.local]\nagent = true\nrate_usd_per_hour = 3.99\n")
    os.environ.update(GPUWS_HOME=str(home), GPUWS_CONFIG=str(cfg))
    env = dict(os.environ)
    params = StdioServerParameters(command=sys.executable, env=env, args=[
        "-m", "gpuws", "mcp", "--budget-usd", "2", "--max-run-seconds", "300"])
    t = Transcript()
    failures: list[str] = []
    rows: list[str] = []
    (ws / "bench.py").write_text(textwrap.dedent(BENCH))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
        await client.initialize()
        await t.call(client, "hosts", {})
        previous: str | None = None
        for label, comment, body in EDITS:
            (ws / "kernel.py").write_text(KERNEL.format(comment=comment, body=body))
            await t.call(client, "sync", {"host": "local", "workspace": str(ws)})
            ran = await t.call(client, "run", {"host": "local", "workload": "file:bench.py",
                                               "workspace": str(ws), "tiers": "1"})
            r = ran.structured_content or {}
            if ran.is_error or r.get("status") != "ok" or not r.get("tier1"):
                failures.append(f"{label}: the run did not give a Tier-1 figure")
                continue
            t1, prov = r["tier1"], r["provenance"]
            verdict = change = watch = "—"
            if previous is not None:
                cmp = await t.call(client, "compare", {"run_a": previous,
                                                       "run_b": r["run_id"]})
                c = cmp.structured_content or {}
                verdict, change = c.get("verdict", "refused"), c.get("change", "")
                with Store() as store:
                    watch = verdict_word(compare_samples(store.samples(previous),
                                                         store.samples(r["run_id"])))
                if verdict != watch:
                    failures.append(f"{label}: compare said {verdict}, watch {watch}")
            rows.append(f"| {label} | `{r['run_id']}` | {t1['median_ms'] * 1000:.2f} µs "
                        f"[{t1['ci_low_ms'] * 1000:.2f}, {t1['ci_high_ms'] * 1000:.2f}] | "
                        f"{t1['n']} | {change} | {verdict} | {watch} | "
                        f"{prov['gpu_name']} {(prov['clocks'] or {}).get('sm_mhz_median')} MHz "
                        f"| `{(prov['tree_sha256'] or '')[:12]}` |")
            previous = r["run_id"]
        (ws / "kernel.py").write_text(KERNEL.format(comment="# edit 4: the cheat",
                                                    body=CHEAT))
        await t.call(client, "sync", {"host": "local", "workspace": str(ws)})
        cheat = await t.call(client, "run", {"host": "local", "workload": "file:bench.py",
                                             "workspace": str(ws), "tiers": "1"})
        c = cheat.structured_content or {}
        # Where the child's refusal shows: the run's reason, its tier's, its stderr.
        said = " ".join([c.get("why", ""), *(x.get("reason", "") for x in c.get("tiers", [])),
                         *c.get("output_tail", [])])
        caught = "check(state)" in said and not c.get("tier1")
        if not caught:
            failures.append("the cheating edit was not caught by check(state)")
        rows.append(f"| edit 4: cached output | `{c.get('run_id')}` | not timed | — | — | "
                    f"{'caught by check' if caught else 'NOT CAUGHT'} | — | — | — |")
        history = await t.call(client, "history", {})
    recorded = (history.structured_content or {}).get("agent_actions", [])
    (out / "transcript.json").write_text(json.dumps(t.calls, indent=2, default=str))
    lines = ["| edit | run | Tier-1 median [95% CI] | n | change vs previous | mcp compare "
             "| gpuws watch | GPU, SM clock | tree |", "|---|---|---|---|---|---|---|---|---|",
             *rows, "", f"cheat run's words: {said[:600]}", "",
             f"agent actions recorded: {len(recorded)}"]
    (out / "figures.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")),
                        help="where transcript.json and figures.md go (default $OUT or .)")
    sys.exit(asyncio.run(main(parser.parse_args().out)))
