"""The GPUs' SM count from the CUDA driver (cuDeviceGetAttribute through ctypes, in a
child), matched to NVML's GPUs by PCI bus id, against stand-in libraries.

This machine has no GPU and no driver, so ``libcuda.so.1`` is a small C stub compiled
here with cuda.h's signatures (two devices listed in the reverse of NVML's order, as
CUDA's default fastest-first ordering can; two devices on one bus as under MIG; a
``CUDA_VISIBLE_DEVICES`` that would hide one; a cuInit that hangs), and NVML is
test_nvml_stub.py's. The real driver is asked on the GPU machine by
tests/gpu/test_gpu_verdicts.py.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gpuws.protocol import Gpu, GpuTarget
from gpuws.remote_agent.pod import gpuinfo, gpusel
from remote_agent.pod.test_nvml_stub import (  # type: ignore[import-not-found]  # noqa: F401
    build_stub,
    nvml,
    stub_lib,
)

CUDA_STUB = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static int mig(void) { return getenv("STUB_MIG") != NULL; }
int cuInit(unsigned int flags) {
    if (getenv("STUB_HANG")) sleep(60);
    return getenv("STUB_NO_DEVICE") ? 100 : 0; }
int cuDeviceGetCount(int *n) {
    /* The driver honours CUDA_VISIBLE_DEVICES: set, it shows one device here. */
    *n = getenv("CUDA_VISIBLE_DEVICES") ? 1 : (mig() ? 3 : 2); return 0; }
int cuDeviceGet(int *d, int ordinal) { *d = ordinal; return 0; }
int cuDeviceGetAttribute(int *v, int attr, int d) {
    if (attr != 16) return 1;  /* CUDA_ERROR_INVALID_VALUE */
    *v = d == 0 ? 132 : 114; return 0; }
int cuDeviceGetPCIBusId(char *b, int len, int d) {
    /* CUDA's ordinal 0 is NVML's GPU 1 (bus 0x19); under MIG two devices share bus 0x18. */
    snprintf(b, len, "0000:%02x:00.0", d == 0 ? 0x19 : 0x18); return 0; }
"""


@pytest.fixture(scope="module")
def cuda_lib(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_stub(tmp_path_factory, CUDA_STUB, "libcuda-stub.so.1", "CUDA driver")


def test_sm_counts_go_to_the_gpu_on_the_same_bus(nvml: gpuinfo.Nvml, stub_lib: str,  # noqa: F811
                                                 cuda_lib: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # The agent's own CUDA_VISIBLE_DEVICES would hide a GPU NVML lists: the child drops it.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    counts = gpuinfo.sm_counts(cuda_lib)
    assert counts == {(0, 0x19, 0, 0): 132, (0, 0x18, 0, 0): 114}
    gpus = gpuinfo.list_gpus(nvml_lib=stub_lib).gpus
    assert [g["pci_bus_id"] for g in gpus] == ["00000000:18:00.0", "00000000:19:00.0"]
    gpuinfo.add_sm_counts(gpus, counts)
    first, second = (msgspec.convert(g, Gpu, strict=True) for g in gpus)
    assert (first.sm_count, second.sm_count) == (114, 132)  # by bus, not CUDA's ordinal
    # …and the run's target carries it, as RunStarted.gpu.
    target = gpusel.target_event(gpusel.Choice(gpus[1], True, []))
    assert msgspec.convert(target, GpuTarget, strict=True).sm_count == 132


def test_no_count_where_the_driver_cannot_say(cuda_lib: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # No driver library: nothing, and no exception.
    assert gpuinfo.sm_counts(str(tmp_path / "libcuda.so.1")) == {}
    # cuInit fails (CUDA_ERROR_NO_DEVICE): nothing.
    monkeypatch.setenv("STUB_NO_DEVICE", "1")
    assert gpuinfo.sm_counts(cuda_lib) == {}
    monkeypatch.delenv("STUB_NO_DEVICE")
    # MIG: two devices on one bus, so which count belongs to the GPU is not known.
    monkeypatch.setenv("STUB_MIG", "1")
    assert gpuinfo.sm_counts(cuda_lib) == {(0, 0x19, 0, 0): 132}
    monkeypatch.delenv("STUB_MIG")
    # A hung driver: the child is killed at the timeout and the probe goes on without.
    monkeypatch.setenv("STUB_HANG", "1")
    assert gpuinfo.sm_counts(cuda_lib, timeout_s=1.0) == {}


@pytest.mark.parametrize("text", [
    "", "not json", "[132]", '{"0000:18:00.0": 0}', '{"0000:18:00.0": -5}',
    '{"0000:18:00.0": 1e9}', '{"0000:18:00.0": 132.5}', '{"0000:18:00.0": true}',
    '{"0000:18:00.0": "132"}', '{"../../etc": 132}', '{"0000:18:00.0:extra": 132}',
    '{"0000:18:00.0": 100001}', '{"0000:18:00.0": null}',
])
def test_the_childs_output_is_checked(text: str) -> None:
    assert gpuinfo.parse_sm_counts(text) == {}


def test_bus_ids_of_nvml_and_cuda_compare_equal() -> None:
    assert gpuinfo.bus_key("00000000:3B:00.0") == gpuinfo.bus_key("0000:3b:00.0") == (
        0, 0x3B, 0, 0)
    assert gpuinfo.bus_key(None) is None and gpuinfo.bus_key("3b:00") is None
    assert gpuinfo.parse_sm_counts('{"0000:3b:00.0": 132}') == {(0, 0x3B, 0, 0): 132}


def test_run_started_carries_the_sm_count(nvml: gpuinfo.Nvml, stub_lib: str,  # noqa: F811
                                          cuda_lib: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's GPU choice (what ``run_started.gpu`` is made of) asks the CUDA driver
    for the SM count while NVML lists the GPUs: GPU 1 sits on bus 0x19, CUDA's 132-SM
    device. It was None: the worker listed the GPUs before, and apart from, the probe."""
    import json

    from gpuws.remote_agent import runs, worker

    real_list = gpuinfo.list_gpus
    monkeypatch.setattr(gpuinfo, "list_gpus", lambda *a, **k: real_list(nvml_lib=stub_lib))
    monkeypatch.setattr(gpuinfo, "CUDA_LIB", cuda_lib)
    monkeypatch.setenv("GPUWS_POD_CACHE", str(tmp_path / "pod"))
    runs.ensure_private_dir(runs.cache_root())
    runs.ensure_private_dir(runs.runs_root())
    rdir = Path(runs.run_dir("r-sm"))
    rdir.mkdir(parents=True)
    spec = {"workload": "cmd:true", "tiers": [], "gpu": "1"}
    (rdir / "spec.json").write_text(json.dumps(spec))
    ctx = worker.RunContext("r-sm", spec, runs.EventLog("r-sm", str(rdir / "events.ndjson")
                                                        ).append)
    worker.choose_gpu(ctx)
    target = msgspec.convert(gpusel.target_event(ctx.gpu), GpuTarget, strict=True)
    assert (target.index, target.sm_count) == (1, 132)
    # A driver that hangs in cuInit leaves the count unknown, and the run starts.
    monkeypatch.setenv("STUB_HANG", "1")
    monkeypatch.setattr(worker, "SM_COUNT_TIMEOUT_S", 1.0)
    worker.choose_gpu(ctx)
    assert ctx.gpu.gpu is not None and ctx.gpu.gpu.get("sm_count") is None


def test_a_watch_sessions_runs_take_the_count_from_its_probe(
        nvml: gpuinfo.Nvml, stub_lib: str, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """In a session of ``gpuws watch`` the probe the session keeps (probe.json, read by the
    tiers next) gives the count: no driver child per iteration."""
    import json

    from gpuws.remote_agent import forkserver, worker

    real_list = gpuinfo.list_gpus
    monkeypatch.setattr(gpuinfo, "list_gpus", lambda *a, **k: real_list(nvml_lib=stub_lib))
    monkeypatch.setattr(gpuinfo, "CUDA_LIB", str(tmp_path / "no-driver.so"))  # never asked
    monkeypatch.setitem(forkserver._SESSION, "dir", str(tmp_path))
    (tmp_path / "probe.json").write_text(json.dumps({"gpus": [
        {"index": 0, "pci_bus_id": "00000000:18:00.0", "sm_count": 114},
        {"index": 1, "pci_bus_id": "00000000:19:00.0", "sm_count": "132"}]}))
    found = worker.gpus_with_sm_counts(True)
    assert [g.get("sm_count") for g in found.gpus] == [114, None]  # a count that is no int
