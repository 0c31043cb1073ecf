"""The NVML code paths through ctypes, against a stand-in ``libnvidia-ml.so``.

This machine has no GPU and no driver, so the library is a small C stub compiled here
with nvml.h's signatures and struct layouts (2 GPUs; 70 compute processes, more than the
first buffer holds, so NVML's "insufficient size" answer and the retry run; a graphics
process that is also a compute one; a ``usedGpuMemory`` of NVML_VALUE_NOT_AVAILABLE; an
old driver that has only ``nvmlDeviceGetCurrentClocksThrottleReasons``; a GPU whose
process lists are not supported). The real library is exercised on the GPU machine by
tests/gpu/test_gpu_pinning.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from gpuws.protocol import ClockRange, Gpu, GpuSample
from gpuws.remote_agent.pod import clocks, gpuinfo

STUB = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef void *nvmlDevice_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory;
                 unsigned int gpuInstanceId, computeInstanceId; } info_t;
typedef struct { unsigned long long total, free, used; } mem_t;
typedef struct { unsigned int gpu, memory; } util_t;
typedef struct { char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId,
                 pciSubSystemId; char busId[32]; } pci_t;
static int idx(nvmlDevice_t d) { return (int)(long)d - 1; }
static unsigned int env(const char *name, unsigned int dflt) {
    const char *v = getenv(name); return v ? (unsigned int)atoi(v) : dflt; }
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) { return r == 3 ? "Not Supported" : "Unknown Error"; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (i >= 2) return 2; *d = (nvmlDevice_t)(long)(i + 1); return 0; }
int nvmlSystemGetDriverVersion(char *b, unsigned int n) { snprintf(b, n, "535.54.03"); return 0; }
int nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 12020; return 0; }
int nvmlDeviceGetName(nvmlDevice_t d, char *b, unsigned int n) {
    snprintf(b, n, "Stub GPU %d", idx(d)); return 0; }
int nvmlDeviceGetUUID(nvmlDevice_t d, char *b, unsigned int n) {
    snprintf(b, n, "GPU-%08d-aaaa-bbbb-cccc-000000000000", idx(d)); return 0; }
int nvmlDeviceGetMemoryInfo(nvmlDevice_t d, mem_t *m) {
    m->total = 143771ULL << 20; m->used = 1024ULL << 20; m->free = m->total - m->used; return 0; }
int nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *a, int *b) {
    *a = 9; *b = 0; return 0; }
int nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, pci_t *p) {
    memset(p, 0, sizeof *p);
    snprintf(p->busId, 32, "00000000:%02X:00.0", 0x18 + idx(d)); return 0; }
int nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *c) {
    if (type == 1) *c = env("STUB_SM", 1980); else if (type == 2) *c = 3201; else return 3;
    return 0; }
int nvmlDeviceGetMaxClockInfo(nvmlDevice_t d, int type, unsigned int *c) {
    *c = type == 1 ? 1980 : 3201; return 0; }
int nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    *mw = env("STUB_MW", 412345); return 0; }
int nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw) {
    *mw = 700000; return 0; }
int nvmlDeviceGetTemperature(nvmlDevice_t d, int s, unsigned int *t) { *t = 44; return 0; }
int nvmlDeviceGetUtilizationRates(nvmlDevice_t d, util_t *u) {
    u->gpu = 97; u->memory = 80; return 0; }
int nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *r) {
    *r = idx(d) == 0 ? env("STUB_REASONS", 0x4) : 0x1; return 0; }
#define NPROC 70
int nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *n, info_t *infos) {
    if (idx(d) == 1) return 3;
    if (*n < NPROC) { *n = NPROC; return 7; }
    for (int i = 0; i < NPROC; i++) {
        infos[i].pid = i == 0 ? env("STUB_PID", 1) : 4000000 + i;
        infos[i].usedGpuMemory = i == 1 ? ~0ULL : (unsigned long long)(i + 1) << 20;
        infos[i].gpuInstanceId = infos[i].computeInstanceId = 0xFFFFFFFF;
    }
    *n = NPROC; return 0; }
int nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *n, info_t *infos) {
    if (idx(d) == 1) return 3;
    if (*n < 2) { *n = 2; return 7; }
    infos[0].pid = env("STUB_PID", 1); infos[0].usedGpuMemory = 4096ULL << 20;
    infos[1].pid = env("STUB_OWN", 2); infos[1].usedGpuMemory = 8ULL << 20;
    *n = 2; return 0; }
"""


def build_stub(tmp_path_factory: pytest.TempPathFactory, source: str, name: str,
               what: str) -> str:
    """Compile a stand-in C library (``what`` names it in the skip without a compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip(f"no C compiler to build the stand-in {what}")
    root = tmp_path_factory.mktemp(what.split()[-1].lower())
    (root / "stub.c").write_text(source)
    lib = root / name
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(root / "stub.c")],
                   check=True)
    return str(lib)


@pytest.fixture(scope="module")
def stub_lib(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_stub(tmp_path_factory, STUB, "libnvidia-ml-stub.so", "NVML")


@pytest.fixture
def nvml(stub_lib: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[gpuinfo.Nvml]:
    """A fresh NVML session on the stub, with a sleeping process as GPU 0's first pid."""
    monkeypatch.setattr(gpuinfo, "_NVML", gpuinfo._NvmlState())
    sleeper = subprocess.Popen(["sleep", "30"])
    comm = Path(f"/proc/{sleeper.pid}/comm")
    for _ in range(200):  # until the child has exec'd (its name is python's before that)
        if comm.read_text().strip() == "sleep":
            break
        time.sleep(0.01)
    monkeypatch.setenv("STUB_PID", str(sleeper.pid))
    monkeypatch.setenv("STUB_OWN", str(os.getpid()))
    session = gpuinfo.nvml_session(stub_lib)
    assert session is not None
    try:
        yield session
    finally:
        sleeper.kill()
        sleeper.wait()


def test_every_gpu_with_clocks_reasons_and_processes(nvml: gpuinfo.Nvml, stub_lib: str) -> None:
    found = gpuinfo.list_gpus(nvml_lib=stub_lib)
    assert (found.source, found.driver, found.cuda_driver) == ("nvml", "535.54.03", "12.2")
    first, second = (msgspec.convert(g, Gpu, strict=True) for g in found.gpus)
    assert (first.index, first.uuid) == (0, "GPU-00000000-aaaa-bbbb-cccc-000000000000")
    assert (first.sm_clock_mhz, first.sm_clock_max_mhz) == (1980.0, 1980.0)
    assert (first.mem_clock_mhz, first.mem_clock_max_mhz) == (3201.0, 3201.0)
    assert (first.power_w, first.power_limit_w, first.temp_c, first.util_pct) == (
        412.345, 700.0, 44.0, 97.0)
    # Only the pre-R535 name exists in this library: the agent falls back to it.
    assert first.clock_events == ["sw_power_cap"] and second.clock_events == ["gpu_idle"]
    procs = first.processes
    assert procs is not None and len(procs) == 70  # 64 slots asked first, then 78
    sleeper = int(os.environ["STUB_PID"])
    head = procs[0] if procs[0].pid == sleeper else next(p for p in procs if p.pid == sleeper)
    # In both lists ("C+G"): one entry, the larger figure; named from /proc where ours.
    assert head.used_mib == 4096.0
    assert head.name == ("sleep" if gpuinfo.pids_are_ours(
        Path("/proc/self/status").read_text()) else "")
    assert os.getpid() not in [p.pid for p in procs]  # the agent itself is left out
    assert next(p for p in procs if p.pid == 4000001).used_mib is None  # NOT_AVAILABLE
    assert next(p for p in procs if p.pid == 4000002).name == ""  # no such pid here
    assert second.processes is None  # not supported there: unknown, not "nobody"


def test_telemetry_samples_every_gpu(nvml: gpuinfo.Nvml, stub_lib: str,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STUB_REASONS", str(0x4 | 0x40))
    samples = [msgspec.convert(s, GpuSample, strict=True)
               for s in gpuinfo.telemetry(nvml_lib=stub_lib)]
    assert [s.index for s in samples] == [0, 1]
    assert samples[0].clock_events == ["sw_power_cap", "hw_thermal"]
    assert samples[0].mem_clock_mhz == 3201.0 and samples[1].clock_events == ["gpu_idle"]


def test_sampler_reads_a_cold_start_through_ctypes(nvml: gpuinfo.Nvml,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The H200 idles at 345 MHz and boosts to 1,980: the first reading is the idle one."""
    sampler = clocks.sampler_for(0)
    assert sampler is not None and sampler.ceiling_mhz == 1980.0
    assert sampler.power_limit_w == 700.0
    sampler.period_s = 0.02
    monkeypatch.setenv("STUB_SM", "345")
    monkeypatch.setenv("STUB_REASONS", "1")  # gpu_idle
    sampler.start()
    try:
        sampler.mark("start")
        monkeypatch.setenv("STUB_SM", "1980")
        monkeypatch.setenv("STUB_REASONS", "0")
        time.sleep(0.1)
        sampler.mark("end")
    finally:
        sampler.stop()
    summary = sampler.summary()
    assert summary is not None
    c = msgspec.convert(summary, ClockRange, strict=True)
    assert (c.sm_mhz_min, c.sm_mhz_max, c.sm_mhz_ceiling) == (345.0, 1980.0, 1980.0)
    assert c.samples >= 3 and c.clock_events == []  # idle is not a slowdown
    assert (c.power_w_max, c.power_limit_w, c.temp_c_max) == (412.345, 700.0, 44.0)
    assert clocks.sampler_for(5) is None  # no such GPU
