"""The agent link against a real OpenSSH sshd on 127.0.0.1, beside OpenSSH's own client.

Four measures, the first three each beside the tool a person would otherwise use, in the same run
(repetitions interleaved, so a noisy neighbour hurts both sides alike):

- **connect**: what ``gpuws connect pod`` does to reach a ready agent, with the bundle
  already in the pod's cache: ``make_transport`` (resolving with ``ssh -G``), then
  ``AgentClient.connect`` until the agent's Hello *and* the SFTP probe, which runs
  beside the bootstrap, are done; beside ``ssh -F cfg pod true``;
- **cold deploy**: the same with an empty pod cache (the bundle goes over the channel),
  and the bundle's size;
- **event stream**: a finished run of 200,000 small ``output``/``samples`` events in the
  pod's cache (written by the agent's own ``EventLog``), replayed with
  ``client.attach(run_id, from_seq=0)`` and decoded on the laptop until ``run_finished``,
  beside ``ssh -F cfg pod cat events.ndjson`` of the same bytes;
- **ssh -G**: what resolving the destination costs (``sshconfig.resolve``, which runs
  ``ssh -G``): the first resolve in a process (two runs: OpenSSH's built-in defaults are
  asked once, to name the options gpuws does not apply) and every later one. The warm
  connect above includes one.

Loopback has no round-trip time; ``--rtt-ms`` puts a delay proxy (bench/_sshd.py)
between both clients and the server. Run it from the repository root (it prints a
table; ``--json`` also writes the figures)::

    python3 bench/connect.py
    python3 bench/connect.py --rtt-ms 20 --json connect-20ms.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _sshd import Pod, machine, median, running_pod

from gpuws import deploy, protocol
from gpuws.client import AgentClient
from gpuws.deploy import build_bundle
from gpuws.framing import read_event_batches
from gpuws.remote_agent import runs, wire
from gpuws.transport import make_transport, sshconfig
from gpuws.transport.ssh import SSHTransport

RUN_ID = "bench-stream"
KB = 1000
MB = 1000 * 1000


#: The pod's python (``--python``); ``python3`` is the login PATH's, as gpuws's default.
PYTHON = "python3"


async def _connect(pod: Pod) -> AgentClient:
    return await AgentClient.connect(make_transport("pod", config_file=str(pod.config)),
                                     python=PYTHON)


async def gpuws_connect(pod: Pod, expect: str | None) -> dict[str, float]:
    """One connect until the agent is ready; the total and its phases: resolve (``ssh
    -G``), SSH link, bootstrap → Hello, and what was left of the SFTP probe after it."""
    t0 = time.perf_counter()
    transport = make_transport("pod", config_file=str(pod.config))
    resolve_s = time.perf_counter() - t0
    client = await AgentClient.connect(transport, python=PYTHON)
    total = time.perf_counter() - t0
    try:
        if expect is not None and client.deploy.cache_state != expect:
            raise SystemExit(f"expected a {expect} deploy, got {client.deploy.cache_state}")
        if not transport.info.sftp or transport.info.kind != "ssh":
            raise SystemExit(f"expected ssh with SFTP, got {transport.info}")
        ssh_s = transport.info.connect_s or 0.0
        deploy_s = client.deploy.deploy_s
        return {"total_s": total, "resolve_s": resolve_s, "ssh_s": ssh_s,
                "deploy_s": deploy_s,
                "sftp_wait_s": max(0.0, total - resolve_s - ssh_s - deploy_s),
                "transferred": float(client.deploy.transferred)}
    finally:
        await client.close()


def ssh_true(pod: Pod) -> float:
    t0 = time.perf_counter()
    subprocess.run(pod.ssh("true"), check=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - t0


@contextlib.contextmanager
def connect_as_before() -> Iterator[None]:
    """The warm connect as it was before issue 12's speed-ups, for an A/B in one run: the
    SFTP probe finished before the bootstrap starts, and stage 1 execs a second interpreter
    that starts with ``site``."""
    tail = deploy.BOOTSTRAP[deploy.BOOTSTRAP.index("sys.argv[:] = [path]"):]
    if not tail.endswith('runpy.run_path(path, run_name="__main__")'):
        raise SystemExit("bench/connect.py --before no longer matches deploy.BOOTSTRAP")
    original = (SSHTransport.connect, deploy.BOOTSTRAP)

    async def connect(self: SSHTransport) -> None:
        await original[0](self)
        await self.settled()

    SSHTransport.connect = connect  # type: ignore[method-assign]
    deploy.BOOTSTRAP = original[1].replace(
        tail, "os.execv(sys.executable, [sys.executable, path] + sys.argv[3:])")
    try:
        yield
    finally:
        SSHTransport.connect, deploy.BOOTSTRAP = original  # type: ignore[method-assign]


async def bench_connect(pod: Pod, n: int, before: bool = False) -> dict[str, Any]:
    await gpuws_connect(pod, None)  # make sure the pod's cache holds the bundle
    ours: list[dict[str, float]] = []
    theirs: list[float] = []
    old: list[dict[str, float]] = []

    async def as_before() -> None:
        with connect_as_before():
            old.append(await gpuws_connect(pod, "cached"))

    async def now() -> None:
        ours.append(await gpuws_connect(pod, "cached"))

    async def ssh() -> None:
        theirs.append(ssh_true(pod))

    steps = [now, ssh, *([as_before] if before else [])]
    for i in range(n):
        # A rotating order (AB BA ... for two): a drift in the machine's load hits all alike.
        for step in steps[i % len(steps):] + steps[:i % len(steps)]:
            await step()
    total = median([o["total_s"] for o in ours])
    ssh_s = median(theirs)
    # Each connect over the ssh run beside it: steadier than the ratio of medians when the
    # machine's load drifts (a shared 2-core machine's does).
    paired = median([o["total_s"] / t for o, t in zip(ours, theirs, strict=True)])
    out = {"runs": n, "gpuws_s": total, "ssh_true_s": ssh_s, "ratio": total / ssh_s,
           "paired_ratio": paired, "goal_ratio_max": 1.0, "met": total / ssh_s <= 1.0,
           "phases_s": {k: median([o[k] for o in ours])
                        for k in ("resolve_s", "ssh_s", "deploy_s", "sftp_wait_s")},
           "gpuws_all_s": [o["total_s"] for o in ours], "ssh_true_all_s": theirs}
    if before:
        out["before"] = {"gpuws_s": median([o["total_s"] for o in old]),
                         "ratio": median([o["total_s"] for o in old]) / ssh_s,
                         "paired_ratio": median([o["total_s"] / t for o, t in
                                                 zip(old, theirs, strict=True)]),
                         "gpuws_all_s": [o["total_s"] for o in old]}
    return out


def bench_resolve(pod: Pod, n: int) -> dict[str, Any]:
    """``sshconfig.resolve`` (``ssh -G``): first in a process, and later ones."""
    firsts: list[float] = []
    laters: list[float] = []
    for _ in range(n):
        sshconfig.builtin_defaults.cache_clear()
        t0 = time.perf_counter()
        sshconfig.resolve("pod", str(pod.config))
        firsts.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        sshconfig.resolve("pod", str(pod.config))
        laters.append(time.perf_counter() - t0)
    return {"runs": n, "first_s": median(firsts), "later_s": median(laters),
            "first_all_s": firsts, "later_all_s": laters}


async def bench_cold(pod: Pod, n: int) -> dict[str, Any]:
    bundle = build_bundle()
    colds: list[dict[str, float]] = []
    extra: list[float] = []
    for _ in range(n):
        pod.server.reset_pod()
        colds.append(await gpuws_connect(pod, "need"))
        if colds[-1]["transferred"] != bundle.size:
            raise SystemExit("the cold deploy did not send the whole bundle")
        # Paired with a warm connect right after it: the difference is the deploy's cost.
        extra.append(colds[-1]["total_s"] - (await gpuws_connect(pod, "cached"))["total_s"])
    total = median([c["total_s"] for c in colds])
    return {"runs": n, "cold_connect_s": total, "deploy_s": median([c["deploy_s"] for c in colds]),
            "over_warm_s": median(extra), "bundle_bytes": bundle.size,
            "goal_bundle_max_bytes": 200 * KB, "met": bundle.size <= 200 * KB,
            "cold_all_s": [c["total_s"] for c in colds]}


def write_run(pod: Pod, n: int) -> Path:
    """A finished run of ``n`` small events (+ run_finished) in the pod's cache, as a worker
    writes it: through the agent's own EventLog, so every line has the real shape."""
    os.environ["GPUWS_POD_CACHE"] = str(pod.cache)
    runs.ensure_private_dir(runs.runs_root())
    rdir = Path(runs.run_dir(RUN_ID))
    rdir.mkdir(mode=0o700)
    (rdir / "spec.json").write_text(json.dumps({"workload": "builtin:saxpy", "tiers": [1]}))
    rng = random.Random(7)
    log = runs.EventLog(RUN_ID, str(rdir / "events.ndjson"))
    try:
        for i in range(n):
            if i % 2:
                log.append(wire.make("output", stream="stdout", tier=0,
                                     text=f"step {i} loss {rng.random():.5f}"))
            else:
                log.append(wire.make("samples", batch=1, values_ms=[
                    round(rng.uniform(0.18, 0.19), 6) for _ in range(4)]))
        log.append(wire.make("run_finished", status="ok", wall_s=12.5, exit_code=0))
    finally:
        log.close()
    return rdir / "events.ndjson"


async def gpuws_attach(client: AgentClient, n: int) -> tuple[float, float]:
    """Replay the whole run; (seconds from the Attach request to its run_finished, CPU
    seconds this process spent meanwhile)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    state = {"next": 0, "bad": 0}

    def listen(ev: protocol.Events | protocol.BadLine) -> None:
        if isinstance(ev, protocol.BadLine) or ev.run_id != RUN_ID:
            return
        if ev.seq != state["next"]:
            state["bad"] += 1
        state["next"] += 1
        if isinstance(ev, protocol.RunFinished) and not done.done():
            done.set_result(None)

    client.add_listener(listen)
    try:
        t0, cpu0 = time.perf_counter(), time.process_time()
        await client.attach(RUN_ID, from_seq=0)
        await done
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        client.remove_listener(listen)
    if state["next"] != n + 1 or state["bad"] or client.bad_lines:
        raise SystemExit(f"replay was wrong: {state} events, {len(client.bad_lines)} bad lines")
    return elapsed, cpu


def ssh_cat(pod: Pod, path: Path, size: int) -> tuple[float, float, float]:
    """``ssh pod cat FILE`` into a pipe; (wall seconds, seconds from first byte to EOF, CPU
    seconds of the ssh client)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(pod.ssh("cat", str(path)), stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    got, first = 0, 0.0
    while chunk := os.read(proc.stdout.fileno(), 1 << 20):
        if not got:
            first = time.perf_counter()
        got += len(chunk)
    proc.wait()
    end = time.perf_counter()
    if got != size or proc.returncode:
        raise SystemExit(f"ssh cat returned {got} of {size} bytes (exit {proc.returncode})")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return end - t0, end - first, cpu


class _Memory:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    async def read(self, n: int = -1) -> bytes:
        out = self.data[self.pos:self.pos + n]
        self.pos += len(out)
        return out


async def decode_only(data: bytes) -> float:
    """The laptop's ceiling: the same bytes framed and decoded from memory."""
    t0 = time.perf_counter()
    count = 0
    async for batch in read_event_batches(_Memory(data)):
        count += len(batch)
    elapsed = time.perf_counter() - t0
    assert count == data.count(b"\n")
    return elapsed


async def bench_stream(pod: Pod, n: int, reps: int) -> dict[str, Any]:
    path = write_run(pod, n)
    size = path.stat().st_size
    events = n + 1
    client = await _connect(pod)
    ours: list[tuple[float, float]] = []
    theirs: list[tuple[float, float, float]] = []
    try:
        for i in range(reps):
            if i % 2:
                theirs.append(ssh_cat(pod, path, size))
                ours.append(await gpuws_attach(client, n))
            else:
                ours.append(await gpuws_attach(client, n))
                theirs.append(ssh_cat(pod, path, size))
    finally:
        await client.close()
    walls = [w for w, _, _ in theirs]
    streams = [s for _, s, _ in theirs]
    memory = median([await decode_only(path.read_bytes()) for _ in range(reps)])
    t, wall, stream = median([t for t, _ in ours]), median(walls), median(streams)
    ratio_stream = (size / t) / (size / stream)
    return {"runs": reps, "events": events, "bytes": size, "gpuws_s": t,
            "events_per_s": events / t, "mb_per_s": size / t / MB,
            "ssh_cat_wall_s": wall, "ssh_cat_mb_per_s": size / wall / MB,
            "ssh_cat_stream_s": stream, "ssh_cat_stream_mb_per_s": size / stream / MB,
            "ratio_vs_ssh_cat_wall": (size / t) / (size / wall),
            "ratio_vs_ssh_cat_stream": ratio_stream,
            "decode_only_events_per_s": events / memory,
            "goal_events_per_s_min": 200_000, "goal_ratio_min": 0.5,
            "met": events / t >= 200_000 and ratio_stream >= 0.5,
            "laptop_cpu_s": median([c for _, c in ours]),
            "ssh_client_cpu_s": median([c for _, _, c in theirs]),
            "gpuws_all_s": [t for t, _ in ours], "ssh_cat_wall_all_s": walls,
            "ssh_cat_stream_all_s": streams}


def table(r: dict[str, Any]) -> str:
    c, d, s, g = r["connect"], r["cold"], r["stream"], r["resolve"]
    ok = {True: "met", False: "NOT met"}
    rows = [
        ("warm connect → agent ready (gpuws)", f"{c['gpuws_s'] * 1000:.0f} ms", ""),
        ("ssh -F cfg pod true (OpenSSH)", f"{c['ssh_true_s'] * 1000:.0f} ms", ""),
        ("  ratio gpuws / ssh (of medians; median of pairs)",
         f"{c['ratio']:.2f}; {c['paired_ratio']:.2f}", f"≤ 1.0: {ok[c['met']]}"),
        *([("  before (SFTP probe first, agent execed with site)",
             f"{c['before']['gpuws_s'] * 1000:.0f} ms",
             f"ratio {c['before']['ratio']:.2f}; {c['before']['paired_ratio']:.2f}")]
           if "before" in c else []),
        ("  phases: ssh -G / SSH link / bootstrap→Hello / SFTP left",
         " / ".join(f"{c['phases_s'][k] * 1000:.0f}"
                    for k in ("resolve_s", "ssh_s", "deploy_s", "sftp_wait_s")) + " ms", ""),
        ("resolve with ssh -G: first in a process / later",
         f"{g['first_s'] * 1000:.1f} / {g['later_s'] * 1000:.1f} ms",
         "later ones are inside the warm connect"),
        ("cold connect (empty pod cache)", f"{d['cold_connect_s'] * 1000:.0f} ms",
         f"{d['over_warm_s'] * 1000:+.0f} ms over the warm one after it"),
        ("bundle size", f"{d['bundle_bytes'] / KB:.1f} KB", f"≤ 200 KB: {ok[d['met']]}"),
        (f"replay {s['events']:,} events ({s['bytes'] / MB:.1f} MB), gpuws",
         f"{s['events_per_s']:,.0f} ev/s", f"{s['mb_per_s']:.1f} MB/s"),
        ("ssh pod cat (wall, incl. connect)", f"{s['ssh_cat_mb_per_s']:.1f} MB/s",
         f"ratio {s['ratio_vs_ssh_cat_wall']:.2f}"),
        ("ssh pod cat (first byte → EOF)", f"{s['ssh_cat_stream_mb_per_s']:.1f} MB/s",
         f"ratio {s['ratio_vs_ssh_cat_stream']:.2f}"),
        ("  goal ≥ 200k ev/s and ≥ 0.5× ssh (first byte → EOF)", ok[s["met"]], ""),
        ("decode only (same bytes from memory)", f"{s['decode_only_events_per_s']:,.0f} ev/s",
         ""),
        ("laptop CPU per replay: gpuws / ssh client", f"{s['laptop_cpu_s'] * 1000:.0f} ms",
         f"{s['ssh_client_cpu_s'] * 1000:.0f} ms"),
    ]
    w0 = max(len(a) for a, _, _ in rows)
    w1 = max(len(b) for _, b, _ in rows)
    m = r["machine"]
    head = (f"{m['cpu']} × {m['nproc']}, Python {m['python']}, {m['openssh'].split(',')[0]}, "
            f"asyncssh {m['asyncssh']}, load {m['loadavg_at_end']}; RTT {r['rtt_ms']:g} ms added; "
            f"medians of {c['runs']} / {d['runs']} / {s['runs']}; pod python: {r['python']}")
    return "\n".join([head] + [f"{a:<{w0}}  {b:>{w1}}  {cmt}".rstrip() for a, b, cmt in rows])


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with running_pod(rtt_ms=args.rtt_ms) as pod:
        # Cold first: each one empties the pod's cache, which the later measures refill.
        cold = await bench_cold(pod, args.colds)
        conn = await bench_connect(pod, args.connects, args.before)
        stream = await bench_stream(pod, args.events, args.streams)
        resolved = bench_resolve(pod, args.connects)
    return {"machine": machine(), "rtt_ms": args.rtt_ms, "python": PYTHON,
            "connect": conn, "cold": cold,
            "stream": stream, "resolve": resolved}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--connects", type=int, default=20, help="warm connects (and ssh true)")
    ap.add_argument("--colds", type=int, default=5, help="cold deploys")
    ap.add_argument("--streams", type=int, default=5, help="replays (and ssh cat)")
    ap.add_argument("--events", type=int, default=200_000, help="events in the replayed run")
    ap.add_argument("--rtt-ms", type=float, default=0.0,
                    help="reach the server through a proxy adding this round-trip time")
    ap.add_argument("--before", action="store_true",
                    help="also time the connect as it was before (SFTP probe first, agent "
                         "with site), interleaved with the others")
    ap.add_argument("--python", default="python3",
                    help="the pod's python for gpuws (default: the login PATH's python3)")
    ap.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    args = ap.parse_args(argv)
    global PYTHON
    PYTHON = args.python
    results = asyncio.run(run(args))
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
