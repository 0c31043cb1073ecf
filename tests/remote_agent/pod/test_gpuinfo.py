"""nvidia-smi parsers on real H200 output, and the NVML → nvidia-smi → nothing fallback."""

from __future__ import annotations

import ctypes
import stat
import sys
from pathlib import Path

import msgspec
import pytest

from gpuws.protocol import Gpu, GpuSample
from gpuws.remote_agent.pod import gpuinfo

FIXTURES = Path(__file__).parents[2] / "fixtures" / "ncu-2025.3.1-h200"
SMI_TEXT = (FIXTURES / "nvidia_smi.txt").read_text()
SMI_XML = (FIXTURES / "nvidia_smi_q.xml").read_text()
SMI_CSV = (FIXTURES / "nvidia_smi_query.csv").read_text()
# The fixture was captured with QUERY_FIELDS less pci.bus_id (see fixtures/README.md).
CSV_FIELDS = [f for f in gpuinfo.QUERY_FIELDS if f != "pci.bus_id"]
UUID = "GPU-2a311d9d-4e63-03d1-940a-9fa658b398ad"


def test_query_csv_fixture() -> None:
    rows = gpuinfo.parse_query_csv(SMI_CSV, CSV_FIELDS)
    assert len(rows) == 1
    (gpu,) = gpuinfo.gpus_from_query(rows)
    assert msgspec.convert(gpu, Gpu) == Gpu(
        index=0, name="NVIDIA H200", uuid=UUID, memory_total_mib=143771.0,
        memory_used_mib=0.0, sm_clock_mhz=1980.0, sm_clock_max_mhz=1980.0,
        compute_capability="9.0", pci_bus_id=None)
    assert rows[0]["driver_version"] == "580.159.04"
    (sample,) = gpuinfo.samples_from_query(rows)
    assert msgspec.convert(sample, GpuSample) == GpuSample(
        index=0, util_pct=0.0, mem_used_mib=0.0, sm_clock_mhz=1980.0, power_w=125.86,
        temp_c=41.0)


def test_query_csv_unsupported_values_and_bad_width() -> None:
    # What nvidia-smi prints for readings a GPU lacks (e.g. power under some vGPUs).
    line = SMI_CSV.replace("125.86", "[N/A]").replace("1980, 1980", "[Not Supported], 1980")
    (sample,) = gpuinfo.samples_from_query(gpuinfo.parse_query_csv(line, CSV_FIELDS))
    assert sample["power_w"] is None and sample["sm_clock_mhz"] is None
    assert sample["temp_c"] == 41.0
    with pytest.raises(ValueError, match="13 fields"):
        gpuinfo.parse_query_csv(SMI_CSV, gpuinfo.QUERY_FIELDS)


def test_plain_table_fixture() -> None:
    parsed = gpuinfo.parse_nvidia_smi_text(SMI_TEXT)
    assert parsed["driver"] == "580.159.04"
    assert parsed["cuda_driver"] == "13.0"
    (gpu,) = parsed["gpus"]
    assert msgspec.convert(gpu, Gpu) == Gpu(
        index=0, name="NVIDIA H200", memory_total_mib=143771.0, memory_used_mib=0.0,
        pci_bus_id="00000000:00:06.0")
    (sample,) = parsed["samples"]
    assert msgspec.convert(sample, GpuSample) == GpuSample(
        index=0, util_pct=0.0, mem_used_mib=0.0, power_w=125.0, temp_c=41.0)


def test_xml_fixture() -> None:
    parsed = gpuinfo.parse_nvidia_smi_xml(SMI_XML)
    assert (parsed["driver"], parsed["cuda_driver"]) == ("580.159.04", "13.0")
    (gpu,) = parsed["gpus"]
    assert msgspec.convert(gpu, Gpu) == Gpu(
        index=0, name="NVIDIA H200", uuid=UUID, memory_total_mib=143771.0,
        memory_used_mib=0.0, sm_clock_mhz=1980.0, sm_clock_max_mhz=1980.0,
        pci_bus_id="00000000:00:06.0", mem_clock_mhz=3201.0, mem_clock_max_mhz=3201.0,
        util_pct=0.0, power_w=125.68, power_limit_w=700.0, temp_c=41.0,
        clock_events=["gpu_idle"], processes=[])
    (sample,) = parsed["samples"]
    assert sample["power_w"] == 125.68 and sample["temp_c"] == 41.0
    with pytest.raises(ValueError, match="not nvidia-smi XML"):
        gpuinfo.parse_nvidia_smi_xml(SMI_TEXT)


def test_three_sources_agree() -> None:
    text = gpuinfo.parse_nvidia_smi_text(SMI_TEXT)["gpus"][0]
    xml = gpuinfo.parse_nvidia_smi_xml(SMI_XML)["gpus"][0]
    csv = gpuinfo.gpus_from_query(gpuinfo.parse_query_csv(SMI_CSV, CSV_FIELDS))[0]
    for key in ("name", "memory_total_mib", "memory_used_mib"):
        assert text[key] == xml[key] == csv[key]
    assert text["pci_bus_id"] == xml["pci_bus_id"]
    assert xml["uuid"] == csv["uuid"]


def test_nvml_constants_match_nvml_h() -> None:
    assert gpuinfo.cuda_version_from_int(13000) == "13.0"
    assert gpuinfo.cuda_version_from_int(12040) == "12.4"
    # nvmlMemory_v2 = NVML_STRUCT_VERSION(Memory, 2) = sizeof(nvmlMemory_v2_t) | 2 << 24.
    assert gpuinfo._NVML_MEMORY_V2 == 0x02000028
    # nvmlPciInfo_t: char[16] + 5 uint + char[32].
    assert ctypes.sizeof(gpuinfo._NvmlPciInfo) == 68


# ----------------------------------------------------------------------------- fallbacks
FAKE_SMI = """#!{python}
# A stand-in for nvidia-smi that answers with the real H200 captures. Fields it was not
# captured with are refused the way an older nvidia-smi refuses unknown fields.
import sys
fixtures = {fixtures!r}
refuse = {refuse!r}
csv = open(fixtures + "/nvidia_smi_query.csv").read().strip().split(", ")
known = dict(zip({fields!r}, csv))
known["pci.bus_id"] = "00000000:00:06.0"  # from nvidia_smi_q.xml
args = sys.argv[1:]
if not args:
    sys.stdout.write(open(fixtures + "/nvidia_smi.txt").read())
    sys.exit(0)
fields = args[0].split("=", 1)[1].split(",")
for f in fields:
    if f not in known or f in refuse:
        print('Field "%s" is not a valid field to query.' % f)
        print()
        sys.exit(2)
print(", ".join(known[f] for f in fields))
"""


def _fake_smi(tmp_path: Path, refuse: tuple[str, ...] = ()) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text(FAKE_SMI.format(python=sys.executable, fixtures=str(FIXTURES),
                                    refuse=list(refuse), fields=CSV_FIELDS))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def fresh_nvml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """A fresh NVML session object and a library path that cannot load."""
    monkeypatch.setattr(gpuinfo, "_NVML", gpuinfo._NvmlState())
    return str(tmp_path / "libnvidia-ml.so.1")


def test_list_gpus_falls_back_to_nvidia_smi(fresh_nvml: str, tmp_path: Path) -> None:
    found = gpuinfo.list_gpus(nvml_lib=fresh_nvml, smi=_fake_smi(tmp_path))
    assert (found.source, found.error) == ("nvidia-smi", None)
    assert (found.driver, found.cuda_driver) == ("580.159.04", "13.0")
    (gpu,) = found.gpus
    assert msgspec.convert(gpu, Gpu).compute_capability == "9.0"
    assert gpu["pci_bus_id"] == "00000000:00:06.0" and gpu["uuid"] == UUID


def test_list_gpus_drops_fields_an_old_driver_lacks(fresh_nvml: str, tmp_path: Path) -> None:
    found = gpuinfo.list_gpus(nvml_lib=fresh_nvml,
                              smi=_fake_smi(tmp_path, refuse=("compute_cap",)))
    assert found.error is None
    (gpu,) = found.gpus
    assert gpu["compute_capability"] is None and gpu["sm_clock_max_mhz"] == 1980.0


def test_telemetry_through_nvidia_smi(fresh_nvml: str, tmp_path: Path) -> None:
    (sample,) = gpuinfo.telemetry(nvml_lib=fresh_nvml, smi=_fake_smi(tmp_path))
    assert msgspec.convert(sample, GpuSample) == GpuSample(
        index=0, util_pct=0.0, mem_used_mib=0.0, sm_clock_mhz=1980.0, power_w=125.86,
        temp_c=41.0)


def test_no_driver_says_so(fresh_nvml: str, monkeypatch: pytest.MonkeyPatch,
                           tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    found = gpuinfo.list_gpus(nvml_lib=fresh_nvml)
    assert found == gpuinfo.GpuList([], None, None, None, gpuinfo.NO_DRIVER)
    assert gpuinfo.telemetry(nvml_lib=fresh_nvml) == []
    assert gpuinfo.gpu_virtualization(nvml_lib=fresh_nvml) == []


def test_broken_nvidia_smi_is_reported(fresh_nvml: str, tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    # What nvidia-smi prints when the kernel module and user-space library disagree.
    smi.write_text("#!/bin/sh\necho 'Failed to initialize NVML: Driver/library version "
                   "mismatch'\necho 'NVML library version: 580.159'\nexit 18\n")
    smi.chmod(0o755)
    found = gpuinfo.list_gpus(nvml_lib=fresh_nvml, smi=str(smi))
    assert found.gpus == [] and found.source is None
    assert found.error is not None
    assert "could not be loaded" in found.error
    assert "nvidia-smi failed (exit 18): Failed to initialize NVML: Driver/library version " \
        "mismatch" in found.error
