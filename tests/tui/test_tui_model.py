"""The TUI's non-visual parts on real data: run model, feed, replay, hosts, roofline, spec."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from gpuws import protocol
from gpuws.cli import make_parser
from gpuws.commands.run import build_spec as cli_build_spec
from gpuws.errors import UsageError
from gpuws.live.feed import Batch, EventFeed
from gpuws.live.model import RunModel
from gpuws.live.replay import MAX_GAP_S, RecordingFile, check_file, play
from gpuws.live.storeio import StoreHandle
from gpuws.runspec import LaunchOptions, build_spec
from gpuws.sessions.store import Store
from gpuws.tui.hosts import config_aliases, home_hosts
from gpuws.tui.messages import PullProgress, RunEvents, TelemetryTick
from gpuws.tui.widgets.run.roofline import ceilings_from, points_from
from gpuws.tui.widgets.run.rules import sort_rules
from tui.tuikit import RECORDING, fill_store, h200_probe, recorded_events  # type: ignore[import-not-found]

RUN = "20261121-130950-9ba123"


def test_model_folds_the_recording_and_ignores_resent_events() -> None:
    model = RunModel(RUN)
    events = recorded_events()
    changed, lines = model.apply(events)
    assert {"tiers", "samples", "tier1", "kernels", "ncu", "metrics", "rules", "static",
            "artifacts", "finished", "log"} <= changed
    assert model.status == "ok" and model.workload == "builtin:saxpy"
    assert [(t.tier, t.status) for t in model.tiers.values()] == [(1, "ok"), (2, "fallback"),
                                                                  (3, "ok")]
    assert model.tiers[3].name == "Nsight Compute 2025.3.1"  # the second, naming TierStarted
    assert model.ncu["saxpy"].done and model.ncu["saxpy"].passes == 20
    assert [ln.text for ln in lines if ln.stream == "info"] == [
        "saxpy result check: relative error 2.70e-08"]
    assert len(model.rules) == 6 and model.metrics[0].metrics["duration_ns"] == 182336.0
    # A resend after an attach (same seqs) changes nothing and shows nothing twice.
    assert model.apply(events) == (set(), [])
    assert model.event_count == len(events) == 34


def test_running_statistics_match_the_agents_final_ones() -> None:
    """The live median and CI, from the same 256 samples, are exactly Tier 1's result."""
    model = RunModel(RUN)
    events = recorded_events()
    samples = [e for e in events if isinstance(e, protocol.Samples)]
    model.apply([events[0], *samples])
    running = model.running_stats()
    final = next(e for e in events if isinstance(e, protocol.Tier1Result)).stats
    assert running is not None and running.n == final.n == 256
    assert running.median_ms == final.median_ms
    assert (running.ci_low_ms, running.ci_high_ms) == (final.ci_low_ms, final.ci_high_ms)
    assert running.p5_ms == pytest.approx(final.p5_ms) and running.p95_ms == final.p95_ms
    assert running.ci_rel_halfwidth == pytest.approx(final.ci_rel_halfwidth)


def test_feed_stores_each_batch_before_delivering_it(tmp_path: Path) -> None:
    store = StoreHandle(tmp_path / "s.db")
    seen: list[tuple[int, int]] = []

    def deliver(batch: Batch) -> None:
        # By the time the panes get a batch, the store holds every event of it.
        stored = store.call_blocking(lambda s: s.last_seq(RUN))
        seen.append((max(e.seq or 0 for e in batch.events), stored))

    async def go() -> None:
        feed = EventFeed(store, deliver, lambda exc: pytest.fail(str(exc)))
        task = asyncio.create_task(feed.run())
        sid = await store.call(lambda s: s.open_session("pod", "local", None, None))
        feed.set_session(sid)
        for ev in recorded_events():
            feed.push(ev)
            if ev.seq in (5, 20):
                await asyncio.sleep(0.01)  # let a batch go before the rest arrive
        await feed.drained()
        task.cancel()
        await store.close()

    asyncio.run(go())
    assert len(seen) >= 2 and all(last <= stored for last, stored in seen)
    assert seen[-1] == (33, 33)


def test_replay_file_pacing_and_bad_lines(tmp_path: Path) -> None:
    source = tmp_path / "rec.ndjson"
    source.write_bytes(RECORDING.read_bytes() + b"not json\n")
    reader = RecordingFile(source).open()
    events = [e for batch in iter(reader.batch, []) for e in batch]
    assert len(events) == 34 and reader.bad_lines == 1 and list(reader.run_ids) == [RUN]
    pushed: list[protocol.Events] = []
    waits: list[float] = []
    opened: list[str] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    async def on_run(run_id: str) -> None:
        opened.append(run_id)

    asyncio.run(play(events, pushed.append, speed=1.0, sleep=sleep, on_run=on_run))
    assert pushed == events and opened == [RUN]
    # Recorded gaps kept, but the longest (Tier 2's 5.9 s of torch.profiler) capped.
    assert waits[0] == pytest.approx(events[1].ts - events[0].ts)
    assert max(waits) == MAX_GAP_S
    waits.clear()
    asyncio.run(play(events, pushed.append, speed=4.0, sleep=sleep))
    assert waits[0] == pytest.approx((events[1].ts - events[0].ts) / 4)
    with pytest.raises(UsageError, match="no run events"):
        (tmp_path / "empty.ndjson").write_text("{}\n")
        check_file(tmp_path / "empty.ndjson")


def test_home_lists_config_aliases_and_used_hosts(tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host *\n  User x\nHost gpu1 gpu2 !nope *.lan\n  Port 2222\n"
                      "Host gpu1\n  HostName 10.1.2.3\n")
    assert config_aliases(str(config)) == ["gpu1", "gpu2"]
    fill_store()
    with Store() as s:
        hosts = home_hosts(s, str(config))
    by_name = {h.name: h for h in hosts}
    assert [h.name for h in hosts] == ["gpu1", "gpu2", "h200", "local"]
    assert by_name["gpu1"].where.endswith("@10.1.2.3:2222") and by_name["gpu1"].in_config
    assert by_name["h200"].gpu == "NVIDIA H200" and by_name["h200"].last_cost == pytest.approx(
        0.11, abs=0.005)


def test_roofline_places_the_workload_under_the_measured_roof() -> None:
    events = recorded_events()
    tier1 = next(e for e in events if isinstance(e, protocol.Tier1Result))
    metrics = [e for e in events if isinstance(e, protocol.KernelMetrics)]
    ceilings = ceilings_from(tier1, h200_probe())
    assert ceilings is not None and ceilings.peak_gbps == tier1.peak_gbps
    points, notes = points_from(tier1, metrics)
    assert [p.label for p in points] == ["workload (Tier 1)"]
    assert points[0].ai == pytest.approx(1 / 6)  # saxpy: 2 FLOPs per 12 bytes
    assert points[0].tflops / ceilings.roof(points[0].ai) == pytest.approx(
        tier1.pct_peak_bw / 100, rel=1e-6)
    assert notes == ["saxpy: ncu measured no FLOP count, so it has no point"]
    # Without Tier 1, the GPU's datasheet gives the roofs.
    datasheet = ceilings_from(None, h200_probe())
    assert datasheet is not None and (datasheet.peak_gbps, datasheet.peak_tflops) == (4800, 67)


def test_rules_sort_by_estimated_speedup() -> None:
    rules = next(e for e in recorded_events() if isinstance(e, protocol.RuleFindings)).rules
    ordered = sort_rules(rules)
    assert [(r.rule, r.est_speedup_pct is not None) for r in ordered[:2]] == [
        ("CPIStall", True), ("AchievedOccupancy", True)]
    assert [r.kind for r in ordered[2:]] == ["WRN", "INF", "INF", "INF"]


def test_launcher_and_cli_build_the_same_spec(tmp_path: Path) -> None:
    bench = tmp_path / "bench.py"
    bench.write_text("def run(): pass\n")
    args = make_parser().parse_args(
        ["run", "pod", "-w", f"file:{bench}", "--tiers", "3,1", "--cold", "-k", "gemm",
         "--ncu-sections", "SpeedOfLight,Occupancy", "--env", "A=1"])
    opts = LaunchOptions(workload=f"file:{bench}", tiers="3,1", timing="cold",
                         kernel_regex="gemm", ncu_sections="SpeedOfLight,Occupancy",
                         env=("A=1",))
    assert build_spec(opts) == cli_build_spec(args)
    assert build_spec(opts).timing_mode() == "cold"
    for flags, timing in (([], "auto"), (["--hot"], "hot")):
        spec = cli_build_spec(make_parser().parse_args(["run", "pod", "-w", "builtin:saxpy",
                                                        *flags]))
        assert spec.timing == spec.timing_mode() == timing
    # A spec stored before `timing` existed said `cold` (default hot) and still decodes.
    old = msgspec.json.decode(b'{"workload": "builtin:saxpy", "cold": false}',
                              type=protocol.RunSpec)
    assert old.timing_mode() == "hot"
    assert build_spec(opts).file_name == "bench.py" and build_spec(opts).tiers == [1, 3]
    with pytest.raises(UsageError):
        build_spec(LaunchOptions(workload="python bench.py"))


def test_gauges_coalesce_and_run_events_never_do() -> None:
    assert TelemetryTick().can_replace(TelemetryTick())
    assert PullProgress("r", "a", 1, 9).can_replace(PullProgress("r", "a", 2, 9))
    assert not PullProgress("r", "a", 1, 9).can_replace(PullProgress("r", "b", 2, 9))
    ev = recorded_events()[:2]
    assert not RunEvents(RUN, ev, [0.0, 0.0]).can_replace(RunEvents(RUN, ev, [0.0, 0.0]))


def test_cli_has_the_tui_commands() -> None:
    args = make_parser().parse_args(["replay", str(RECORDING), "--speed", "4"])
    assert (args.source, args.speed, args.instant) == (str(RECORDING), 4.0, False)
    args = make_parser().parse_args(["connect", "pod", "-F", "cfg", "--rate", "2.5"])
    assert (args.host, args.ssh_config, args.rate) == ("pod", "cfg", 2.5)
    assert make_parser().parse_args([]).command is None  # bare `gpuws` opens Home
