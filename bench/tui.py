"""The TUI under load: 100,000 run events through the store and into the live panes.

The stream is the real H200 recording (tests/fixtures/recorded/saxpy_h200.ndjson)
repeated and renumbered: its body (tier starts and ends, 256-value sample batches, ncu
progress, output lines, the kernel table, metrics, rule findings, the artifact) over and
over, with gap-free ``seq`` and rising timestamps, between one ``run_started`` and one
``run_finished``. The app runs headless (Textual's ``run_test``, 120×40) with the run's
screen open, exactly as a live run: each event goes through ``EventFeed`` (store first,
in the store's own thread) and then to ``RunPanes.apply``.

Two figures:

* throughput: all 100,000 events arrive at once; events stored and shown per second
  (the goal: keeps up with at least 5,000 events/s);
* latency: events arrive paced at a fixed rate; the time from an event's arrival (its
  ``feed.push``) to its pane update, p50 / p99 / max (the goal: p99 <= 100 ms).

Run it with ``python3 bench/tui.py [EVENTS]``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgspec

from gpuws import protocol
from gpuws.live.storeio import StoreHandle
from gpuws.tui.app import GpuwsApp, StartHome
from gpuws.tui.screens.run import RunScreen

RECORDING = Path(__file__).resolve().parent.parent / "tests/fixtures/recorded/saxpy_h200.ndjson"
RUN_ID = "bench-tui"
EVENTS = 100_000
#: Paced arrival rates for the latency figures (events per second).
RATES = (1_000, 5_000, 10_000)
#: Events per paced burst (one burst per 1/(rate/BURST) seconds).
BURST = 25


def synthesize(n: int) -> list[protocol.Events]:
    """``n`` events: the recording's body repeated and renumbered between start and finish."""
    recorded = [protocol.decode_event(line) for line in RECORDING.read_bytes().splitlines()]
    events = [e for e in recorded if not isinstance(e, protocol.BadLine)]
    first, body, last = events[0], events[1:-1], events[-1]
    t = first.ts
    step = (last.ts - first.ts) / len(events)  # the recording's mean spacing

    def renumber(ev: protocol.Events, seq: int) -> protocol.Events:
        nonlocal t
        t += step
        return msgspec.structs.replace(ev, run_id=RUN_ID, seq=seq, ts=t)

    out = [renumber(first, 0)]
    while len(out) < n - 1:
        for ev in body:
            out.append(renumber(ev, len(out)))
            if len(out) == n - 1:
                break
    out.append(renumber(last, len(out)))
    return out


async def _drive(events: list[protocol.Events], rate: float | None) -> tuple[float, list[float]]:
    """Feed ``events`` to a headless app; returns (seconds until all shown, latencies)."""
    with tempfile.TemporaryDirectory() as tmp:
        app = GpuwsApp(StartHome(), store=StoreHandle(Path(tmp) / "bench.db"))
        async with app.run_test(size=(120, 40)) as pilot:
            sid = await app.store.call(lambda s: s.open_session("bench", "local", None, 3.99))
            app.feed.set_session(sid)
            screen = RunScreen(RUN_ID, live=False, backfill=False)
            await app.push_screen(screen)
            await pilot.pause()
            app.measure = True
            last_seq = events[-1].seq
            t0 = time.perf_counter()
            if rate is None:
                for ev in events:
                    app.feed.push(ev)
            else:
                interval = BURST / rate
                for i in range(0, len(events), BURST):
                    # Sleep to the burst's due time (drift-free), then push the burst.
                    due = t0 + (i // BURST) * interval
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                    for ev in events[i:i + BURST]:
                        app.feed.push(ev)
            while screen.panes.model.last_seq != last_seq:
                await asyncio.sleep(0.005)
            elapsed = time.perf_counter() - t0
            await pilot.pause()
            latencies = list(app.latencies)
        await app.store.close()
    return elapsed, latencies


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else EVENTS
    events = synthesize(n)
    samples = sum(len(e.values_ms) for e in events if isinstance(e, protocol.Samples))
    print(f"{n:,} events ({samples:,} Tier-1 samples) from {RECORDING.name}, app 120×40 headless")
    rows = []
    elapsed, lat = asyncio.run(_drive(events, None))
    rows.append(("all at once", n / elapsed, elapsed, lat))
    for rate in RATES:
        count = min(n, int(rate * 10))  # ten seconds of arrivals at this rate
        elapsed, lat = asyncio.run(_drive([*events[:count - 1], events[-1]], rate))
        rows.append((f"paced {rate:,}/s", count / elapsed, elapsed, lat))
    print(f"{'arrival':<16}{'events/s':>12}{'wall s':>9}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    for name, per_s, wall, lat in rows:
        print(f"{name:<16}{per_s:>12,.0f}{wall:>9.2f}{statistics.median(lat) * 1e3:>9.1f}"
              f"{_pct(lat, 99) * 1e3:>9.1f}{max(lat) * 1e3:>9.1f}")
    best = rows[0][1]
    p99 = max(_pct(r[3], 99) for r in rows[1:3])
    print(f"goals: >= 5,000 events/s: {'met' if best >= 5000 else 'NOT met'} ({best:,.0f}); "
          f"p99 <= 100 ms up to 5,000/s: {'met' if p99 <= 0.1 else 'NOT met'} "
          f"({p99 * 1e3:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
