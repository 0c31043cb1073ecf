"""Every GPU of a multi-GPU pod, parsed from real ``nvidia-smi -q -x`` output.

The fixtures in tests/fixtures/nvidia-smi/ come from public repositories (their README
says which, at which commit); the H200 capture is ours. Each test checks every GPU of a
file: index order, UUID, clocks, power and its limit, the clock-event reasons by name and
who holds a context, and that the result decodes strictly as ``protocol.Gpu``.
"""

from __future__ import annotations

import ctypes
import stat
import sys
from pathlib import Path

import msgspec
import pytest

from gpuws.protocol import Gpu, GpuProcess, GpuSample
from gpuws.remote_agent.pod import gpuinfo

FIXTURES = Path(__file__).parents[2] / "fixtures"
SMI = FIXTURES / "nvidia-smi"
K80 = SMI / "pai_tesla_k80_x4_430.26.xml"
GTX = SMI / "pai_gtx1070_x2_384.66.xml"
A5000 = SMI / "telegraf_rtx_a5000_x2_590.44.01.xml"
H200 = FIXTURES / "ncu-2025.3.1-h200" / "nvidia_smi_q.xml"
H200_BUSY = SMI / "h200_busy_580.159.04.xml"


def parse(path: Path, own_pid: int | None = None) -> dict:
    return gpuinfo.parse_nvidia_smi_xml(path.read_text(), own_pid=own_pid)


def strict(gpus: list[dict]) -> list[Gpu]:
    return [msgspec.convert(g, Gpu, strict=True) for g in gpus]


def test_four_k80s_in_pci_order_with_processes_and_app_clock_reasons() -> None:
    parsed = parse(K80)
    assert (parsed["driver"], parsed["cuda_driver"]) == ("430.26", None)  # "Not Found"
    gpus = strict(parsed["gpus"])
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    # Index is the position (PCI order), not minor_number (1, 2, 3, 0 in this file).
    assert [g.pci_bus_id for g in gpus] == ["00001580:00:00.0", "00002DF7:00:00.0",
                                            "00004968:00:00.0", "0000F8D6:00:00.0"]
    assert [g.uuid for g in gpus] == [
        "GPU-c3b26f7a-8dcb-619c-fa1b-8029265a4db0", "GPU-b01b80eb-0f18-1df0-cf88-0725bd90f1e1",
        "GPU-30bc2701-3bc2-5f35-0ebd-9867a077e138", "GPU-3341aba2-f01d-2c1f-7dd4-e389779faec2"]
    assert all(g.name == "Tesla K80" for g in gpus)
    assert [g.clock_events for g in gpus] == [["applications_clocks_setting"],
                                              ["applications_clocks_setting"],
                                              ["gpu_idle"], ["gpu_idle"]]
    assert [(g.sm_clock_mhz, g.mem_clock_mhz) for g in gpus] == [
        (810.0, 2505.0), (810.0, 2505.0), (324.0, 324.0), (324.0, 324.0)]
    assert {(g.sm_clock_max_mhz, g.mem_clock_max_mhz, g.power_limit_w) for g in gpus} == {
        (875.0, 2505.0, 149.0)}
    assert [g.power_w for g in gpus] == [135.72, 139.71, 32.27, 34.44]
    assert [g.temp_c for g in gpus] == [64.0, 69.0, 28.0, 26.0]
    assert [g.util_pct for g in gpus] == [99.0, 99.0, 0.0, 0.0]
    assert [g.processes for g in gpus] == [
        [GpuProcess(pid=58813, name="python", used_mib=576.0)],
        [GpuProcess(pid=58642, name="python", used_mib=576.0)], [], []]


def test_old_driver_throttle_names_and_graphics_processes() -> None:
    parsed = parse(GTX)
    assert parsed["driver"] == "384.66" and parsed["cuda_driver"] is None
    first, second = strict(parsed["gpus"])
    assert (first.index, second.index) == (0, 1)
    assert first.uuid == "GPU-e511a7b2-f9d5-ba47-9b98-853732ca6c1b"
    assert second.uuid == "GPU-28daffaf-8abe-aaf8-c298-4bd13aecb5e6"
    # Five throttle reasons, none active, in the pre-R535 <clocks_throttle_reasons> block.
    assert first.clock_events == [] and second.clock_events == []
    assert (first.sm_clock_mhz, first.sm_clock_max_mhz) == (1923.0, 1961.0)
    assert (first.mem_clock_mhz, first.mem_clock_max_mhz) == (3802.0, 4004.0)
    assert (first.power_w, first.power_limit_w) == (119.47, 180.0)  # enforced limit
    assert (second.power_w, second.util_pct, second.temp_c) == (139.3, 98.0, 59.0)
    assert first.processes == [GpuProcess(pid=1357, name="/usr/lib/xorg/Xorg", used_mib=99.0),
                               GpuProcess(pid=2384, name="/usr/bin/gnome-shell", used_mib=79.0),
                               GpuProcess(pid=3093, name="./ethminer", used_mib=2283.0)]
    assert second.processes == [GpuProcess(pid=3093, name="./ethminer", used_mib=2283.0)]


def test_r535_names_two_a5000s_one_server_on_both() -> None:
    parsed = parse(A5000)
    assert (parsed["driver"], parsed["cuda_driver"]) == ("590.44.01", "13.1")
    first, second = strict(parsed["gpus"])
    assert [first.pci_bus_id, second.pci_bus_id] == ["00000000:81:00.0", "00000000:C1:00.0"]
    assert first.uuid == "GPU-12345678-aaaa-bbbb-cccc-0123456789ab"
    assert second.uuid == "GPU-12345678-aaaa-bbbb-cccc-0123456789cd"
    for gpu in (first, second):
        assert gpu.clock_events == ["gpu_idle"]
        assert (gpu.sm_clock_mhz, gpu.sm_clock_max_mhz) == (210.0, 2100.0)
        assert (gpu.mem_clock_mhz, gpu.mem_clock_max_mhz) == (405.0, 8001.0)
        assert gpu.power_limit_w == 230.0
    assert (first.power_w, second.power_w) == (6.52, 13.59)  # instant, not average
    assert (first.temp_c, second.temp_c) == (13.0, 15.0)
    server = "/root/src/llama.cpp/build/bin/llama-server"
    assert first.processes == [GpuProcess(pid=100477, name=server, used_mib=22430.0)]
    assert second.processes == [GpuProcess(pid=100477, name=server, used_mib=17246.0)]


def test_h200_single_gpu_capture_still_parses() -> None:
    (gpu,) = strict(parse(H200)["gpus"])
    assert gpu.clock_events == ["gpu_idle"] and gpu.processes == []
    assert (gpu.sm_clock_max_mhz, gpu.power_limit_w) == (1980.0, 700.0)


def test_h200_busy_capture_names_the_process_holding_it() -> None:
    """Our own capture on the H200 while a CuPy process ran: R580's field names, and the
    process nvidia-smi lists is the one a run on this GPU would be warned about."""
    parsed = parse(H200_BUSY)
    assert (parsed["driver"], parsed["cuda_driver"]) == ("580.159.04", "13.0")
    (gpu,) = strict(parsed["gpus"])
    assert gpu.uuid == "GPU-674de672-f949-15c3-88b0-a3b1c3335b1d"
    assert gpu.processes == [GpuProcess(pid=848, name="/opt/torch/.venv/bin/python3",
                                        used_mib=1032.0)]
    assert "gpu_idle" not in gpu.clock_events  # it was busy, not idle
    assert parse(H200_BUSY, own_pid=848)["gpus"][0]["processes"] == []


def test_own_pid_is_left_out() -> None:
    """The agent's own process never counts as someone else using the GPU."""
    gpus = parse(GTX, own_pid=3093)["gpus"]
    assert [p["pid"] for p in gpus[0]["processes"]] == [1357, 2384]
    assert gpus[1]["processes"] == []


@pytest.mark.parametrize("path", [K80, GTX, A5000, H200], ids=lambda p: p.name)
def test_samples_cover_every_gpu_and_decode(path: Path) -> None:
    parsed = parse(path)
    samples = [msgspec.convert(s, GpuSample, strict=True) for s in parsed["samples"]]
    assert [s.index for s in samples] == [g["index"] for g in parsed["gpus"]]
    assert all(s.mem_clock_mhz is not None for s in samples)
    assert [s.clock_events for s in samples] == [g["clock_events"] for g in parsed["gpus"]]


def test_reason_bits_are_nvml_h_values() -> None:
    # nvml.h: nvmlClocksEventReasonGpuIdle 0x1, ApplicationsClocksSetting 0x2,
    # SwPowerCap 0x4, nvmlClocksThrottleReasonHwSlowdown 0x8, SyncBoost 0x10,
    # SwThermalSlowdown 0x20, HwThermalSlowdown 0x40, HwPowerBrakeSlowdown 0x80,
    # DisplayClockSetting 0x100.
    expect = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
              0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal",
              0x80: "hw_power_brake", 0x100: "display_clocks_setting"}
    for bit, name in expect.items():
        assert gpuinfo.clock_events_from_mask(bit) == [name]
    assert gpuinfo.clock_events_from_mask(0) == []
    assert gpuinfo.clock_events_from_mask(0x4 | 0x1) == ["gpu_idle", "sw_power_cap"]
    # A reason a later driver adds is kept by its bit, not dropped.
    assert gpuinfo.clock_events_from_mask(0x200 | 0x8) == ["hw_slowdown", "bit_0x200"]


def test_reason_mask_from_nvidia_smi_hex() -> None:
    """``--query-gpu=clocks_event_reasons.active`` prints the same bitmask in hex."""
    assert gpuinfo.events_from_hex("0x0000000000000001") == ["gpu_idle"]
    assert gpuinfo.events_from_hex("0x0000000000000044") == ["sw_power_cap", "hw_thermal"]
    assert gpuinfo.events_from_hex("[N/A]") == [] and gpuinfo.events_from_hex(None) == []
    assert gpuinfo.events_from_hex("zz") == []


def test_xml_and_bit_names_agree() -> None:
    """The XML's reason names map onto the same names as NVML's bits."""
    assert set(gpuinfo._XML_REASONS.values()) == {n for _b, n in gpuinfo.CLOCK_EVENT_BITS}


def test_pid_namespace_decides_whether_names_are_given() -> None:
    host = "Name:\tpython3\nNStgid:\t6870\nNSpid:\t6870\n"
    container = "Name:\tpython3\nNStgid:\t812\t1\nNSpid:\t812\t1\n"
    assert gpuinfo.pids_are_ours(host)
    assert not gpuinfo.pids_are_ours(container)
    assert gpuinfo.pids_are_ours("Name:\tpython3\n")  # a kernel before 4.1: cannot tell
    assert gpuinfo.pids_are_ours(None)


def test_process_structs_match_nvml_h() -> None:
    # nvmlProcessInfo_v1_t {uint pid; ull usedGpuMemory} and nvmlProcessInfo_t (the _v2/_v3
    # functions' struct) {uint pid; ull usedGpuMemory; uint gpuInstanceId, computeInstanceId}.
    assert ctypes.sizeof(gpuinfo._NvmlProcessInfoV1) == 16
    assert ctypes.sizeof(gpuinfo._NvmlProcessInfo) == 24


# ----------------------------------------------------------------------------- fallback
FAKE_SMI = """#!{python}
# A stand-in for nvidia-smi (this machine has no GPU) that answers -q -x with a real
# multi-GPU capture and refuses --query-gpu fields as driver 430 does (compute_cap came
# in R510; clocks_event_reasons in R535).
import sys
args = sys.argv[1:]
if args == ["-q", "-x"]:
    sys.stdout.write(open({xml!r}).read())
    sys.exit(0)
fields = args[0].split("=", 1)[1].split(",")
for f in fields:
    if f not in ("index",):
        print('Field "%s" is not a valid field to query.' % f)
        sys.exit(2)
print("\\n".join(str(i) for i in range(4)))
"""


@pytest.fixture
def fresh_nvml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """A fresh NVML session object and a library path that cannot load."""
    monkeypatch.setattr(gpuinfo, "_NVML", gpuinfo._NvmlState())
    return str(tmp_path / "libnvidia-ml.so.1")


def test_list_gpus_without_nvml_reads_the_xml(fresh_nvml: str, tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable, xml=str(K80)))
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    found = gpuinfo.list_gpus(nvml_lib=fresh_nvml, smi=str(smi))
    assert (found.source, found.error, found.driver) == ("nvidia-smi", None, "430.26")
    gpus = strict(found.gpus)
    assert len(gpus) == 4 and all(g.compute_capability is None for g in gpus)
    assert gpus[0].clock_events == ["applications_clocks_setting"]
    assert gpus[1].processes and gpus[1].processes[0].pid == 58642
