"""A run pinned to one GPU profiles that GPU in every tier, with the clocks behind Tier 1.

On the machine's own agent (the local transport, as `gpuws` runs on a workstation with
its GPU), checked against NVML and ncu's report:

(a) ``builtin:saxpy`` pinned with ``gpu="0"`` through tiers 1, 2 and 3: RunStarted names
    the GPU, ncu ran with ``--devices 0`` and its report's device (index, PCI domain/bus/
    device) is that GPU; a ``file:`` workload pinned by UUID prints, from inside every
    tier's process, the one CUDA device it sees: its PCI id and UUID are the pinned GPU's.
(b) the Tier-1 result carries ``clocks`` with sane numbers, printed as a table; and a
    cold start read directly (the GPU idle, then a CuPy process starts), printed too.
(c) ``CUDA_VISIBLE_DEVICES`` semantics: the pinned process sees exactly one device even
    when the run's environment said ``CUDA_VISIBLE_DEVICES=""``; an inherited
    ``CUDA_VISIBLE_DEVICES=<uuid>`` names the run's GPU without pinning; ``gpu="7"``
    fails in one line naming the GPUs there are.

Run on the GPU machine with PYTHONPATH set as tests/gpu/run_gpu_check.sh sets it;
figures go to ``$GPUWS_GPU_OUT/pinning.json`` when that is set. Skipped without a GPU.
"""

from __future__ import annotations

import asyncio
import base64
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuws import protocol

pytestmark = pytest.mark.gpu
if shutil.which("nvidia-smi") is None:
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)

from gpuws.remote_agent.pod import clocks, gpuinfo  # noqa: E402

OUT = Path(os.environ["GPUWS_GPU_OUT"]) if os.environ.get("GPUWS_GPU_OUT") else None
FIGURES: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def _write_figures() -> Any:
    yield
    if OUT:
        (OUT / "pinning.json").write_text(json.dumps(FIGURES, indent=2, default=str))


@pytest.fixture(scope="module")
def gpu0() -> dict[str, Any]:
    found = gpuinfo.list_gpus()
    assert found.gpus, found.error
    FIGURES["gpus"] = found.gpus
    FIGURES["gpu_source"] = found.source
    return found.gpus[0]


def run(spec: protocol.RunSpec, timeout_s: float = 240.0) -> list[Any]:
    """Start ``spec`` on this machine's agent; every event of the run, decoded strictly."""
    from gpuws.client import AgentClient
    from gpuws.transport.local import LocalTransport

    async def go() -> list[Any]:
        client = await AgentClient.connect(LocalTransport())
        got: list[Any] = []
        client.add_listener(got.append)
        await client.start_run(spec)
        deadline = time.monotonic() + timeout_s
        while not any(isinstance(e, protocol.RunFinished) for e in got):
            assert time.monotonic() < deadline, [type(e).__name__ for e in got]
            await asyncio.sleep(0.1)
        await client.close()
        assert client.bad_lines == []
        return [e for e in got if getattr(e, "run_id", None)]

    return asyncio.run(go())


def of(events: list[Any], cls: type) -> list[Any]:
    return [e for e in events if isinstance(e, cls)]


def pci_tuple(bus_id: str) -> tuple[int, int, int]:
    """``00000000:00:06.0`` → (domain, bus, device)."""
    domain, bus, rest = bus_id.split(":")
    return int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)


def ncu_devices(ncu: str, report: str) -> list[dict[str, str]]:
    """The device columns of every launch in a report (``ncu --import --csv --page raw``)."""
    raw = subprocess.run([ncu, "--import", report, "--csv", "--page", "raw"], text=True,
                         capture_output=True, timeout=120, check=True).stdout
    rows = [r for r in csv.reader(io.StringIO(raw)) if len(r) > 1]
    header = rows[0]
    cols = ["device__attribute_device_index", "device__attribute_pci_domain_id",
            "device__attribute_pci_bus_id", "device__attribute_pci_device_id",
            "device__attribute_display_name"]
    return [{c: r[header.index(c)] for c in cols} for r in rows[1:] if r[0] != ""]


def clock_table(rows: list[tuple[str, Any]]) -> str:
    lines = [f"  {'run':<28} {'n':>3} {'SM min':>7} {'median':>7} {'max':>7} {'ceil':>6} "
             f"{'mem':>11} {'W max':>6} {'limit':>6} {'°C':>4}  events"]
    for name, c in rows:
        if c is None:
            lines.append(f"  {name:<28} clocks not recorded")
            continue
        lines.append(
            f"  {name:<28} {c.samples:>3} {c.sm_mhz_min:>7.0f} {c.sm_mhz_median:>7.0f} "
            f"{c.sm_mhz_max:>7.0f} {c.sm_mhz_ceiling or 0:>6.0f} "
            f"{(c.mem_mhz_min or 0):>5.0f}-{(c.mem_mhz_max or 0):<5.0f} "
            f"{(c.power_w_max or 0):>6.1f} {(c.power_limit_w or 0):>6.0f} "
            f"{(c.temp_c_max or 0):>4.0f}  {','.join(c.clock_events) or '-'}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- (a) + (b)
def test_saxpy_pinned_by_index_through_every_tier(gpu0: dict[str, Any]) -> None:
    events = run(protocol.RunSpec(workload="builtin:saxpy", tiers=[1, 2, 3], gpu="0",
                                  max_seconds=3.0, profile_iters=3))
    fin = events[-1]
    assert isinstance(fin, protocol.RunFinished) and fin.status == "ok", \
        [e for e in events if isinstance(e, (protocol.Diagnosis, protocol.RunFinished))]
    started = of(events, protocol.RunStarted)[0]
    assert started.gpu is not None
    assert (started.gpu.index, started.gpu.uuid) == (0, gpu0["uuid"])
    tier3 = [e for e in of(events, protocol.TierStarted) if e.tier == 3 and e.argv]
    argv = tier3[-1].argv
    assert argv[argv.index("--devices") + 1] == "0"
    reps = [a for a in of(events, protocol.Artifact) if a.name.endswith(".ncu-rep")]
    assert reps, of(events, protocol.TierFinished)
    devices = ncu_devices(argv[0], reps[0].path)
    assert devices
    want = pci_tuple(gpu0["pci_bus_id"])
    for d in devices:
        # Inside the pinned process the GPU is CUDA device 0, and it is the pinned GPU.
        assert d["device__attribute_device_index"] == "0"
        assert (int(d["device__attribute_pci_domain_id"]), int(d["device__attribute_pci_bus_id"]),
                int(d["device__attribute_pci_device_id"])) == want
    (t1,) = of(events, protocol.Tier1Result)
    c = t1.clocks
    assert c is not None and c.source == "nvml" and c.samples >= 2
    ceiling = gpuinfo.nvml_session().max_sm_clock_mhz(0)  # type: ignore[union-attr]
    assert c.sm_mhz_ceiling == ceiling
    assert c.sm_mhz_min and c.sm_mhz_median and c.sm_mhz_max
    assert 0 < c.sm_mhz_min <= c.sm_mhz_median <= c.sm_mhz_max <= (ceiling or 1e9)
    assert c.mem_mhz_max and c.mem_mhz_max > 0
    assert c.power_w_max and 0 < c.power_w_max <= 1.3 * (c.power_limit_w or 1e9)
    assert c.temp_c_max and 0 < c.temp_c_max < 110
    assert "gpu_idle" not in c.clock_events
    print("\nTier-1 clocks (saxpy pinned to GPU 0):\n"
          + clock_table([("builtin:saxpy --gpu 0", c)]))
    FIGURES["saxpy_gpu0"] = {
        "run_started_gpu": protocol.to_builtins(started.gpu),
        "ncu_argv": argv, "ncu_report_devices": devices,
        "tier1": {"median_ms": t1.stats.median_ms, "n": t1.stats.n, "mode": t1.mode,
                  "clocks": protocol.to_builtins(c)},
        "diagnoses": [protocol.to_builtins(d) for d in of(events, protocol.Diagnosis)],
        "tiers": [protocol.to_builtins(t) for t in of(events, protocol.TierFinished)]}


IDENTITY = '''
"""Prints, from inside each tier's process, the CUDA devices that process can see."""
import json
import os

import cupy

BYTES = 2 * 4 * (1 << 24)
_scale = cupy.ElementwiseKernel("float32 x", "float32 y", "y = 2 * x", "gpuws_pin_scale")


def _uuid(props):
    raw = props.get("uuid")
    if not isinstance(raw, (bytes, bytearray)) or len(raw) != 16:
        return None
    h = bytes(raw).hex()
    return "GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])


def setup():
    props = cupy.cuda.runtime.getDeviceProperties(0)
    print("GPUWS_DEVICE " + json.dumps({
        "count": cupy.cuda.runtime.getDeviceCount(), "uuid": _uuid(props),
        "pci": [props["pciDomainID"], props["pciBusID"], props["pciDeviceID"]],
        "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "order": os.environ.get("CUDA_DEVICE_ORDER"), "pid": os.getpid()}), flush=True)
    x = cupy.ones(1 << 24, dtype=cupy.float32)
    return x, cupy.empty_like(x)


def run(state):
    x, y = state
    _scale(x, y)
'''


def test_file_workload_pinned_by_uuid_sees_one_device_in_every_tier(
        gpu0: dict[str, Any]) -> None:
    spec = protocol.RunSpec(
        workload="file:identity.py", file_name="identity.py",
        file_b64=base64.b64encode(IDENTITY.encode()).decode(), tiers=[1, 2, 3],
        gpu=gpu0["uuid"], max_seconds=1.0, profile_iters=2,
        # Pinning must win over what the run's environment says (here: no GPU at all).
        env={"CUDA_VISIBLE_DEVICES": ""})
    events = run(spec)
    fin = events[-1]
    assert fin.status == "ok", [e for e in events if isinstance(e, (protocol.Diagnosis,
                                                                    protocol.RunFinished))]
    seen: dict[int, list[dict[str, Any]]] = {}
    for e in of(events, protocol.Output):
        if e.text.startswith("GPUWS_DEVICE "):
            seen.setdefault(e.tier, []).append(json.loads(e.text.split(" ", 1)[1]))
    assert {1, 2, 3} <= set(seen), seen
    want = list(pci_tuple(gpu0["pci_bus_id"]))
    for tier, rows in seen.items():
        for row in rows:
            assert row["count"] == 1, (tier, row)
            assert row["pci"] == want, (tier, row)
            assert row["cvd"] == gpu0["uuid"] and row["order"] == "PCI_BUS_ID", (tier, row)
            if row["uuid"] is not None:
                assert row["uuid"] == gpu0["uuid"], (tier, row)
    logs = [e.message for e in of(events, protocol.Log)]
    assert any("CUDA_VISIBLE_DEVICES=''" in m and "replaced by --gpu" in m for m in logs), logs
    (t1,) = of(events, protocol.Tier1Result)
    print("\nTier-1 clocks (file workload pinned by UUID):\n"
          + clock_table([("file:identity.py --gpu UUID", t1.clocks)]))
    FIGURES["identity_by_uuid"] = {"seen": seen, "tier1_clocks": protocol.to_builtins(t1.clocks)
                                   if t1.clocks else None}


# ----------------------------------------------------------------------------- (b) cold start
BUSY = """
import time, cupy
x = cupy.ones(1 << 26, dtype=cupy.float32); y = cupy.empty_like(x)
print("ready", flush=True)
end = time.monotonic() + {seconds}
while time.monotonic() < end:
    for _ in range(50):
        cupy.multiply(x, 2, out=y)
    cupy.cuda.runtime.deviceSynchronize()
"""


def test_cold_start_clocks_and_who_uses_the_gpu(gpu0: dict[str, Any]) -> None:
    nvml = gpuinfo.nvml_session()
    assert nvml is not None
    waited = time.monotonic()
    # Let the GPU go idle first (it idles at 345 MHz on the H200), for at most 15 s.
    while time.monotonic() - waited < 15:
        now = nvml.clocks(0)
        if "gpu_idle" in (now["clock_events"] or []):
            break
        time.sleep(0.2)
    idle = nvml.clocks(0)
    sampler = clocks.ClockSampler(lambda: nvml.clocks(0), nvml.max_sm_clock_mhz(0),
                                  nvml.power_limit_w(0), period_s=0.05).start()
    proc = subprocess.Popen([sys.executable, "-c", BUSY.format(seconds=2.0)],
                            stdout=subprocess.PIPE, text=True)
    try:
        sampler.mark("start")
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        procs = nvml.processes(0)
        xml = subprocess.run(["nvidia-smi", "-q", "-x"], capture_output=True, text=True,
                             timeout=30).stdout
        smi = shutil.which("nvidia-smi")
        assert smi
        rows, error = gpuinfo.query_gpus(smi, gpuinfo.TELEMETRY_FIELDS)
        proc.wait(timeout=30)
        sampler.mark("end")
    finally:
        sampler.stop()
        if proc.poll() is None:
            proc.kill()
    readings = sampler.readings()
    t0 = readings[0]["t"]
    series = [[round(r["t"] - t0, 3), r["sm_clock_mhz"], r["mem_clock_mhz"], r["power_w"],
               r["temp_c"], r["clock_events"]] for r in readings]
    print(f"\ncold start on GPU 0 (idle before: {idle}):")
    print("    t s   SM MHz  mem MHz   W      °C   events")
    for row in series[:12] + series[12::10]:
        print(f"  {row[0]:6.2f} {row[1]:8.0f} {row[2]:8.0f} {row[3]:7.1f} {row[4]:5.0f}   "
              f"{','.join(row[5] or [])}")
    summary = clocks.summarize(readings, sampler.ceiling_mhz, sampler.power_limit_w)
    assert summary is not None and summary["sm_mhz_max"] >= 0.8 * (sampler.ceiling_mhz or 0)
    # NVML's process list: the busy process (by pid where this is the host's pid space).
    ours = gpuinfo.pids_are_ours(open("/proc/self/status").read())
    pids = [p["pid"] for p in procs or []]
    if ours:
        assert proc.pid in pids, procs
    else:
        assert procs, "a CuPy process held a context, NVML listed none"
    parsed = gpuinfo.parse_nvidia_smi_xml(xml)
    assert parsed["gpus"][0]["processes"], "nvidia-smi -q -x listed no process"
    FIGURES["cold_start"] = {"idle_before": idle, "series": series, "summary": summary,
                             "nvml_processes": procs, "busy_pid": proc.pid,
                             "pids_are_ours": ours}
    # Real captures for future fixtures (a process on the GPU; the telemetry fields).
    FIGURES["captures"] = {"nvidia_smi_q_x_busy": xml, "telemetry_fields": rows,
                           "telemetry_error": error,
                           "telemetry_fields_refused": sorted(
                               gpuinfo._SMI_REJECTED.get(smi, set()))}


# ----------------------------------------------------------------------------- (c)
def test_inherited_visible_devices_name_the_gpu_without_pinning(gpu0: dict[str, Any]) -> None:
    events = run(protocol.RunSpec(workload="cmd:env", tiers=[1],
                                  env={"CUDA_VISIBLE_DEVICES": gpu0["uuid"]}), timeout_s=60)
    started = of(events, protocol.RunStarted)[0]
    assert started.gpu is not None and started.gpu.uuid == gpu0["uuid"]
    out = [e.text for e in of(events, protocol.Output)]
    assert f"CUDA_VISIBLE_DEVICES={gpu0['uuid']}" in out
    FIGURES["inherited"] = protocol.to_builtins(started.gpu)


def test_a_gpu_that_is_not_there_fails_in_one_line(gpu0: dict[str, Any]) -> None:
    events = run(protocol.RunSpec(workload="builtin:saxpy", gpu="7"), timeout_s=60)
    fin = events[-1]
    assert isinstance(fin, protocol.RunFinished) and fin.status == "failed"
    assert fin.error and "\n" not in fin.error and "there is no GPU '7'" in fin.error
    assert f"0 = {gpu0['name']} ({gpu0['uuid']})" in fin.error
    assert not of(events, protocol.TierStarted)
    print(f"\n--gpu 7: {fin.error}")
    FIGURES["gpu_7"] = fin.error
