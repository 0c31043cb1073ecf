"""The codec and framing: round trips, hypothesis on random events and garbage, bad lines."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuws import protocol
from gpuws.framing import read_event_batches

AGENT_SRC = Path(protocol.__file__).parent / "remote_agent"
REQUESTS = msgspec.json.Decoder(protocol.Requests)


class BytesReader:
    """Feeds a byte string in fixed-size chunks, like a socket would."""

    def __init__(self, data: bytes, chunk: int = 7) -> None:
        self.data, self.chunk, self.pos = data, chunk, 0

    async def read(self, n: int = -1) -> bytes:
        out = self.data[self.pos:self.pos + min(n, self.chunk)]
        self.pos += len(out)
        return out


def collect(data: bytes, chunk: int = 7, max_line: int = protocol.MAX_LINE) -> list:
    """What the client's reader (``read_event_batches``) makes of a stream, flattened."""
    async def go() -> list:
        reader = BytesReader(data, chunk)
        return [x async for batch in read_event_batches(reader, max_line=max_line)
                for x in batch]
    return asyncio.run(go())


def test_every_request_round_trips() -> None:
    spec = protocol.RunSpec(workload="builtin:saxpy?n=1024", tiers=[1, 3], kernel_regex="sax.*")
    for msg in (protocol.Ping(req=1), protocol.ProbeReq(req=2), protocol.StartRun(req=3, spec=spec),
                protocol.Attach(req=4, run_id="r", from_seq=5), protocol.Cancel(req=5, run_id="r"),
                protocol.ListRuns(req=6), protocol.TelemetryReq(req=7, interval_s=0.5),
                protocol.NcuPlanReq(req=8, install=True), protocol.StatFile(req=9, path="/x"),
                protocol.Shutdown(req=10)):
        line = protocol.encode(msg)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        # The agent parses requests by hand (stdlib only); this decodes them as the
        # protocol declares them.
        assert REQUESTS.decode(line[:-1]) == msg


def test_events_round_trip_and_carry_the_envelope() -> None:
    ev = protocol.Samples(run_id="r1", seq=41, ts=1.5, values_ms=[0.24, 0.241], batch=1)
    back = protocol.decode_event(protocol.encode(ev))
    assert back == ev and back.run_id == "r1" and back.seq == 41


def test_bad_lines_are_reported_not_fatal() -> None:
    good = protocol.encode(protocol.Pong(req=1))
    stream = (b"garbage\n" + good + b'{"type":"hello","agent_version":"1"\n'  # truncated
              + b'{"type":"no_such_type"}\n' + b'{"type":"pong","req":"one"}\n'  # wrong type
              + b"\x00\xff\xfe\n" + good)

    out = collect(stream, 5)
    assert [type(x).__name__ for x in out] == ["BadLine", "Pong", "BadLine", "BadLine",
                                               "BadLine", "BadLine", "Pong"]
    assert "malformed" in out[0].reason


def test_oversized_line_is_skipped_and_stream_goes_on() -> None:
    good = protocol.encode(protocol.Pong(req=2))
    out = collect(good + b"x" * 5000 + b"\n" + good, chunk=1000, max_line=1000)
    assert out[0] == protocol.Pong(req=2) and out[2] == protocol.Pong(req=2)
    assert isinstance(out[1], protocol.BadLine) and out[1].length >= 5000
    assert len(out) == 3


def test_an_oversized_event_ending_in_the_read_that_crosses_the_limit_is_refused() -> None:
    # A well-formed event of 1,500 bytes whose newline comes in the same read that takes
    # it past a 1,000-byte limit: the buffer never had to skip it, and decode_event alone
    # bounds lines by the protocol's limit only. It must still be refused.
    big = protocol.encode(protocol.Output(run_id="r", seq=1, stream="stdout",
                                          text="y" * 1400))
    good = protocol.encode(protocol.Pong(req=2))
    assert 1000 < len(big) < 2000
    for chunk in (2000, 1200, 999):
        out = collect(good + big + good, chunk=chunk, max_line=1000)
        assert out[0] == out[2] == protocol.Pong(req=2) and len(out) == 3, chunk
        assert isinstance(out[1], protocol.BadLine) and "exceeds" in out[1].reason, chunk


def test_crlf_from_a_terminal_is_tolerated() -> None:
    assert collect(b'{"type":"pong"}\r\n') == [protocol.Pong()]


@given(st.lists(st.binary(max_size=300), max_size=30), st.integers(1, 64))
@settings(max_examples=200, deadline=None)
def test_random_garbage_never_raises(lines: list[bytes], chunk: int) -> None:
    data = b"\n".join(lines)
    for item in collect(data, chunk):
        assert isinstance(item, (protocol.BadLine, msgspec.Struct))


samples = st.builds(
    protocol.Samples, run_id=st.text(max_size=20), seq=st.integers(0, 2**40),
    ts=st.floats(0, 2e9), values_ms=st.lists(st.floats(0, 1e6), max_size=50),
    batch=st.integers(1, 1000))
outputs = st.builds(protocol.Output, run_id=st.text(max_size=20), seq=st.integers(0, 2**40),
                    stream=st.sampled_from(["stdout", "stderr"]), text=st.text(max_size=300))
diags = st.builds(protocol.Diagnosis, code=st.text(max_size=10),
                  severity=st.sampled_from(["info", "warning", "error"]),
                  title=st.text(max_size=40), cause=st.text(max_size=200),
                  remedies=st.lists(st.text(max_size=50), max_size=4))


@given(st.lists(st.one_of(samples, outputs, diags), max_size=20), st.integers(1, 97))
@settings(max_examples=150, deadline=None)
def test_random_event_streams_round_trip(events: list, chunk: int) -> None:
    data = b"".join(protocol.encode(e) for e in events)
    assert collect(data, chunk) == events


def test_every_event_type_the_agent_writes_is_in_the_protocol() -> None:
    """Static half of the contract: each wire.make("TYPE", ...) names a known event."""
    tags = {cls.__struct_config__.tag for cls in protocol.Events.__args__}  # type: ignore[attr-defined]
    made: set[str] = set()
    # Every module of the agent, the tiers' and verdicts' subpackages included.
    for path in AGENT_SRC.rglob("*.py"):
        made |= set(re.findall(r'wire\.make\(\s*"([a-z0-9_]+)"', path.read_text()))
        made |= set(re.findall(r'\.reply\([^,]+,\s*"([a-z0-9_]+)"', path.read_text()))
    assert {"program_verdict", "kernel_verdict", "tier3_coverage"} <= made
    assert made, "no agent events found"
    assert made <= tags, f"agent writes unknown types: {made - tags}"


def test_agent_frames_are_seven_bit_clean() -> None:
    from gpuws.remote_agent import wire

    line = wire.dumps(wire.make("output", stream="stdout", text="naïve ✓ \u2028 \x1b[0m"))
    assert all(b < 128 for b in line) and line.count(b"\n") == 1
    ev = protocol.decode_event(line)
    assert isinstance(ev, protocol.Output) and ev.text == "naïve ✓ \u2028 \x1b[0m"
    assert json.loads(line)["type"] == "output"


# ----------------------------------------------------------------------------- GPUs, pinning
FIXTURES = Path(__file__).parent / "fixtures"
K80_XML = (FIXTURES / "nvidia-smi" / "pai_tesla_k80_x4_430.26.xml").read_text()
H200_XML = (FIXTURES / "ncu-2025.3.1-h200" / "nvidia_smi_q.xml").read_text()


def _agent_line(event: dict) -> protocol.Events | protocol.BadLine:
    """One event as the agent writes it (wire.dumps), read back as the laptop reads it."""
    from gpuws.remote_agent import wire

    return protocol.decode_event(wire.dumps(event)[:-1])


def test_run_started_with_its_gpu_decodes_strictly() -> None:
    from gpuws.remote_agent import wire
    from gpuws.remote_agent.pod import gpuinfo, gpusel

    gpus = gpuinfo.parse_nvidia_smi_xml(K80_XML)["gpus"]
    for wanted in ("1", None):
        choice = gpusel.choose(wanted, {}, gpus)
        ev = _agent_line(wire.make("run_started", spec={"workload": "builtin:saxpy",
                                                        "gpu": wanted},
                                   run_dir="/r", pid=1, hostname="pod",
                                   gpu=gpusel.target_event(choice)))
        assert isinstance(ev, protocol.RunStarted) and ev.gpu is not None
        assert ev.spec.gpu == wanted and ev.gpu.name == "Tesla K80"
        assert ev.gpu.busy and ev.gpu.busy[0].used_mib == 576.0
    unknown = _agent_line(wire.make("run_started", spec={"workload": "cmd:true"},
                                    run_dir="/r", pid=1, gpu=None))
    assert isinstance(unknown, protocol.RunStarted) and unknown.gpu is None


def test_gpu_diagnoses_decode_strictly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from gpuws.remote_agent import worker
    from gpuws.remote_agent.pod import gpuinfo, gpusel

    monkeypatch.setenv("GPUWS_POD_CACHE", str(tmp_path))
    gpus = gpuinfo.parse_nvidia_smi_xml(K80_XML)["gpus"]
    out: list[dict] = []
    ctx = worker.RunContext("r-1", {"workload": "cmd:true", "gpu": "0"}, out.append)
    ctx.gpu = gpusel.choose("0", {}, gpus)
    worker.announce_gpu(ctx, "0,1")
    decoded = [_agent_line(e) for e in out]
    assert [type(e).__name__ for e in decoded] == ["Log", "Diagnosis"]
    busy = decoded[1]
    assert isinstance(busy, protocol.Diagnosis) and busy.code == "gpu_busy"
    assert busy.details["processes"][0]["pid"] == 58813


def test_tier1_result_with_clocks_decodes_strictly() -> None:
    from gpuws.remote_agent import wire
    from gpuws.remote_agent.measure import stats
    from gpuws.remote_agent.pod import clocks, gpuinfo

    # Readings shaped as Nvml.clocks returns them, from the H200 capture's sample.
    sample = gpuinfo.parse_nvidia_smi_xml(H200_XML)["samples"][0]
    readings = [{k: sample[k] for k in ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c",
                                        "clock_events")}, dict(sample, sm_clock_mhz=345.0)]
    event = wire.make("tier1_result", stats=stats.summarize([0.24, 0.241, 0.239]),
                      mode="cold", batch=1, warmup=5, stop_reason="ci_reached",
                      clocks=clocks.summarize(readings, 1980.0, 700.0))
    ev = _agent_line(event)
    assert isinstance(ev, protocol.Tier1Result) and ev.clocks is not None
    assert (ev.clocks.samples, ev.clocks.sm_mhz_min, ev.clocks.sm_mhz_max) == (2, 345.0, 1980.0)
    assert ev.clocks.clock_events == [] and ev.clocks.sm_mhz_ceiling == 1980.0


def test_probe_and_telemetry_of_every_gpu_decode_strictly() -> None:
    from gpuws.remote_agent import wire
    from gpuws.remote_agent.pod import gpuinfo, probe

    parsed = gpuinfo.parse_nvidia_smi_xml(K80_XML)
    facts = dict(probe.probe(), gpus=parsed["gpus"], gpu_source="nvidia-smi")
    ev = _agent_line(wire.make("probe_result", probe=facts))
    assert isinstance(ev, protocol.ProbeResult)
    assert [g.index for g in ev.probe.gpus] == [0, 1, 2, 3]
    assert ev.probe.gpus[0].processes and ev.probe.gpus[0].processes[0].name == "python"
    assert ev.probe.gpus[0].clock_events == ["applications_clocks_setting"]
    tel = _agent_line(wire.make("telemetry", gpus=parsed["samples"]))
    assert isinstance(tel, protocol.Telemetry) and len(tel.gpus) == 4
    assert tel.gpus[2].clock_events == ["gpu_idle"] and tel.gpus[2].mem_clock_mhz == 324.0


def test_verdict_events_as_the_agent_writes_them_decode_strictly() -> None:
    """The verdicts the worker emits (dicts from remote_agent/verdicts), on the recorded
    H200 run, decode as the protocol's Structs with nothing left over or missing."""
    from gpuws.remote_agent import wire
    from gpuws.remote_agent.verdicts import kernel, program

    run = [json.loads(line) for line in
           (FIXTURES / "recorded" / "saxpy_h200.ndjson").read_text().splitlines()]
    last = {e["type"]: e for e in run}
    pv = program.program_verdict(last["kernel_table"])
    pv["tier3_advice"] = program.tier3_advice(pv, last["kernel_table"]["kernels"], None)
    launch = dict(last["kernel_metrics"], rules=last["rule_findings"]["rules"])
    made = [wire.make("program_verdict", **pv),
            wire.make("program_verdict", **program.program_verdict(
                dict(last["kernel_table"], gpu_idle_pct=99.5, memcpy_pct=0.0,
                     kernels=[dict(r, total_ns=58000.0) for r in last["kernel_table"]["kernels"]]
                     ))),
            wire.make("kernel_verdict", **kernel.kernel_verdict(launch, launch["rules"], 132)),
            wire.make("kernel_verdict", **kernel.kernel_verdict_without_counters(
                "saxpy", last["tier1_result"], last["static_analysis"], {"dram_bw_pct": 89.0})),
            wire.make("tier3_coverage", **kernel.coverage(
                last["kernel_table"], ["saxpy"], regex="sax", launch_skip=0, launch_count=1)),
            wire.make("tier3_coverage", **kernel.coverage(
                last["kernel_table"], [], regex="nomatch", launch_skip=3, launch_count=2))]
    decoded = [_agent_line(e) for e in made]
    assert [type(e).__name__ for e in decoded] == [
        "ProgramVerdict", "ProgramVerdict", "KernelVerdict", "KernelVerdict", "Tier3Coverage",
        "Tier3Coverage"]
    launch_bound = decoded[1]
    assert isinstance(launch_bound, protocol.ProgramVerdict) and launch_bound.bound == "launch"
    assert launch_bound.findings[0].evidence[0].source == "torch.profiler"
    for ev in decoded:
        assert msgspec.convert(msgspec.to_builtins(ev), type(ev)) == ev
    assert {"program_verdict", "kernel_verdict", "tier3_coverage"} <= protocol.RUN_EVENT_TYPES
