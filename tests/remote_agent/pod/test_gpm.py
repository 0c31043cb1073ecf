"""NVML GPM through ctypes: the unsupported paths, the figures from a sample pair, no leaks.

This machine has no GPU and no driver, so ``libnvidia-ml.so`` is a small C library
compiled here (a stand-in: the real one cannot exist without the driver). Its GPM structs
are written from nvml.h (``nvmlGpmMetric_t``, ``nvmlGpmMetricsGet_t``, ``nvmlGpmSupport_t``)
and compiled by the C compiler, so a layout in gpm.py that differs from the header's puts
the values in the wrong places and the figures below come out wrong. It answers each
metric id with ``id × 7.5`` (a value that names the id it came from), refuses FP64 as
NOT_SUPPORTED, says 100.4% for FP16 (rounding over 100), checks the version fields and
that the second sample is the later one, and counts the sample buffers alive. Environment
variables choose what it says: ``STUB_GPM`` 0 (GPU without GPM), ``STUB_GPM_PERM`` 1
(sampling refused), ``STUB_MIG`` 1 (MIG mode). A second build without the GPM symbols is a
driver before GPM. The real library is exercised on the GPU machine by
tests/gpu/test_gpu_gpm.py.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from gpuws import protocol
from gpuws.remote_agent import runs
from gpuws.remote_agent.measure import tiers
from gpuws.remote_agent.pod import gpm, gpuinfo, gpusel
from gpuws.remote_agent.worker import RunContext
from remote_agent.pod.test_gpu_pinning_env import FAKE_TIER1  # type: ignore[import-not-found]

STUB = r"""
#include <stdlib.h>
#include <string.h>
typedef void *nvmlDevice_t;
typedef void *nvmlGpmSample_t;
static unsigned int env(const char *name, unsigned int dflt) {
    const char *v = getenv(name); return v ? (unsigned int)atoi(v) : dflt; }
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) {
    return r == 3 ? "Not Supported" : r == 4 ? "Insufficient Permissions" : "Unknown Error"; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 1; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (i >= 1) return 2; *d = (nvmlDevice_t)(long)(i + 1); return 0; }
int nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pend) {
    *cur = env("STUB_MIG", 0); *pend = 0; return 0; }
#ifndef NO_GPM
/* nvml.h's GPM structs, as the header declares them. */
typedef struct {
    unsigned int metricId; int nvmlReturn; double value;
    struct { char *shortName; char *longName; char *unit; } metricInfo;
} nvmlGpmMetric_t;
typedef struct {
    unsigned int version; unsigned int numMetrics;
    nvmlGpmSample_t sample1; nvmlGpmSample_t sample2;
    nvmlGpmMetric_t metrics[333];
} nvmlGpmMetricsGet_t;
typedef struct { unsigned int version; unsigned int isSupportedDevice; } nvmlGpmSupport_t;
static int live = 0;
static long taken = 0;
int stub_live_samples(void) { return live; }
int nvmlGpmQueryDeviceSupport(nvmlDevice_t d, nvmlGpmSupport_t *s) {
    if (s->version != 1) return 25;
    s->isSupportedDevice = env("STUB_GPM", 1); return 0; }
int nvmlGpmSampleAlloc(nvmlGpmSample_t *s) { *s = calloc(1, 64); live++; return 0; }
int nvmlGpmSampleFree(nvmlGpmSample_t s) { if (!s) return 2; free(s); live--; return 0; }
int nvmlGpmSampleGet(nvmlDevice_t d, nvmlGpmSample_t s) {
    if (env("STUB_GPM_PERM", 0)) return 4;
    *(long *)s = ++taken; return 0; }
int nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *g) {
    if (g->version != 1) return 25;
    if (g->numMetrics > 333 || !g->sample1 || !g->sample2) return 2;
    if (*(long *)g->sample2 <= *(long *)g->sample1) return 2;  /* the later one second */
    for (unsigned int i = 0; i < g->numMetrics; i++) {
        nvmlGpmMetric_t *m = &g->metrics[i];
        m->metricInfo.unit = "%";
        if (m->metricId == 11) { m->nvmlReturn = 3; m->value = 0; continue; }
        m->nvmlReturn = 0;
        m->value = m->metricId == 13 ? 100.4 : m->metricId * 7.5;
    }
    return 0; }
#endif
"""


def _build(root: Path, name: str, *flags: str) -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in NVML")
    (root / "stub.c").write_text(STUB)
    lib = root / name
    subprocess.run([cc, "-shared", "-fPIC", "-O1", *flags, "-o", str(lib),
                    str(root / "stub.c")], check=True)
    return str(lib)


@pytest.fixture(scope="module")
def gpm_lib(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _build(tmp_path_factory.mktemp("gpm"), "libnvidia-ml-gpm.so")


@pytest.fixture(scope="module")
def old_lib(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _build(tmp_path_factory.mktemp("old"), "libnvidia-ml-old.so", "-DNO_GPM")


@pytest.fixture
def nvml(gpm_lib: str) -> Iterator[gpuinfo.Nvml]:
    session = gpuinfo.Nvml.open(gpm_lib)
    yield session
    session.close()


def live_samples(lib: str) -> int:
    # dlopen of the same path returns the same loaded library: its counter is shared.
    return int(ctypes.CDLL(lib).stub_live_samples())


class Clock:
    """A hand-moved monotonic clock (the 100 ms rule is about the samples' distance)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_sample_pair_gives_each_metric_in_its_place(nvml: gpuinfo.Nvml, gpm_lib: str) -> None:
    clock = Clock()
    window = gpm.GpmWindow(gpm.GpmDevice(nvml, 0), clock=clock)
    window.open()
    clock.t += 2.5
    got = msgspec.convert(window.close(), protocol.GpmMetrics, strict=True)
    # id × 7.5: SM_UTIL 2, SM_OCCUPANCY 3, ANY_TENSOR 5, HMMA 7, DRAM_BW 10, FP32 12.
    assert (got.sm_active_pct, got.sm_occupancy_pct, got.tensor_active_pct) == (15.0, 22.5, 37.5)
    assert (got.hmma_active_pct, got.dram_bw_pct, got.fp32_pct) == (52.5, 75.0, 90.0)
    assert got.fp64_pct is None  # NVML's own per-metric NOT_SUPPORTED: no number
    assert got.fp16_pct == 100.0  # 100.4 is rounding: clamped, not refused downstream
    assert (got.window_s, got.reason, got.source) == (2.5, "", "NVML GPM")
    assert live_samples(gpm_lib) == 0  # both buffers freed
    assert window.close() is window.result  # once: a second close changes nothing


def test_a_window_under_100_ms_gives_no_figures(nvml: gpuinfo.Nvml, gpm_lib: str) -> None:
    clock = Clock()
    window = gpm.GpmWindow(gpm.GpmDevice(nvml, 0), clock=clock)
    window.open()
    clock.t += 0.04
    got = msgspec.convert(window.close(), protocol.GpmMetrics, strict=True)
    assert got.window_s is None and got.dram_bw_pct is None
    assert "40 ms" in got.reason and "100 ms" in got.reason
    assert live_samples(gpm_lib) == 0


@pytest.mark.parametrize(("env", "words"), [
    ({"STUB_GPM": "0"}, "not supported on GPU 0"),
    ({"STUB_MIG": "1"}, "MIG mode"),
    ({"STUB_GPM_PERM": "1"}, "refused GPM to this user"),
])
def test_unsupported_paths_say_why_in_one_line(nvml: gpuinfo.Nvml, gpm_lib: str,
                                               monkeypatch: pytest.MonkeyPatch,
                                               env: dict[str, str], words: str) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    window = gpm.window_for(0, nvml)
    window.open()
    got = msgspec.convert(window.close(), protocol.GpmMetrics, strict=True)
    assert words in got.reason and "\n" not in got.reason
    assert got.window_s is None and got.sm_active_pct is None
    ok, why = gpm.probe(nvml, 0)
    assert not ok and words in why
    assert live_samples(gpm_lib) == 0  # a refused sample still frees its buffers


def test_the_probe_asks_and_records_the_answer(nvml: gpuinfo.Nvml, gpm_lib: str) -> None:
    gpu = msgspec.convert(nvml.gpu(0), protocol.Gpu, strict=True)
    assert (gpu.gpm_supported, gpu.gpm_reason) == (True, "")
    assert live_samples(gpm_lib) == 0


def test_a_library_without_the_gpm_symbols(old_lib: str) -> None:
    old = gpuinfo.Nvml.open(old_lib)
    try:
        window = gpm.window_for(0, old)
        window.open()
        reason = window.close()["reason"]
        assert "nvmlGpmQueryDeviceSupport is missing" in reason
        gpu = msgspec.convert(old.gpu(0), protocol.Gpu, strict=True)
        assert gpu.gpm_supported is False and "missing" in gpu.gpm_reason
        assert "no GPU 3" in gpm.window_for(3, old).close()["reason"]
    finally:
        old.close()


@pytest.mark.skipif(any(Path(d, "libnvidia-ml.so.1").exists() for d in (
    "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")), reason="this machine has NVML")
def test_no_libnvidia_ml_at_all_under_the_bare_agent_python() -> None:
    """The agent's own interpreter rules (-I -S, standard library only), no driver."""
    src = Path(gpm.__file__).parents[3]
    code = (f"import sys; sys.path.insert(0, {str(src)!r})\n"
            "from gpuws.remote_agent.pod import gpm\n"
            "w = gpm.window_for(0); w.open(); print(w.close()['reason'])")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                         text=True, check=True, env={"PATH": os.environ.get("PATH", "")})
    assert out.stdout.startswith("NVML could not be opened (libnvidia-ml.so.1 could not be "
                                 "loaded")
    assert gpm.percent(float("nan")) is None and gpm.percent(-5.0) is None
    assert gpm.percent(100.9) == 100.0 and gpm.percent(-0.5) == 0.0


def test_a_runs_gpm_evidence_for_a_verdict() -> None:
    """Tier 1's measured window first, a cmd:'s run second, never a reason alone."""
    t1 = {"window_s": 2.0, "dram_bw_pct": 89.0, "source": "NVML GPM", "reason": ""}
    t0 = {"window_s": 9.0, "dram_bw_pct": 3.0, "source": "NVML GPM", "reason": ""}
    why = {"reason": "NVML GPM is not supported on GPU 0", "source": "NVML GPM"}
    fin = [{"type": "tier_finished", "tier": tier, "status": "ok", "wall_s": 1.0, "gpm": g}
           for tier, g in ((0, t0), (1, t1))]
    assert gpm.from_events(fin) == t1
    assert gpm.from_events(fin[:1]) == t0
    assert gpm.from_events([dict(fin[1], gpm=why)]) is None
    assert gpm.from_events([{"type": "tier_finished", "tier": 3, "gpm": t1}]) is None
    # Decoded and re-encoded events (the laptop's store) give the same answer.
    stored = [msgspec.to_builtins(msgspec.convert(e, protocol.TierFinished)) for e in fin]
    assert gpm.from_events(stored)["dram_bw_pct"] == 89.0  # type: ignore[index]


def test_tier1s_window_is_bracketed_by_gpm_on_the_worker(
        gpm_lib: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's real Tier-1 path (tiers.tier1): the child's markers open and close the
    GPM window and its figures leave on Tier 1's tier_finished. The child is the stand-in
    Tier-1 child of test_gpu_pinning_env (CuPy on a GPU cannot run here): markers around a
    0.45 s window, two 0.25 ms samples, a result."""
    monkeypatch.setattr(gpuinfo, "_NVML", gpuinfo._NvmlState())
    assert gpuinfo.nvml_session(gpm_lib) is not None  # the process's session: the stub
    monkeypatch.setenv("GPUWS_POD_CACHE", str(tmp_path / "pod"))
    runs.ensure_private_dir(runs.cache_root())
    runs.ensure_private_dir(runs.runs_root())
    rdir = Path(runs.run_dir("r-gpm"))
    (rdir / "artifacts").mkdir(parents=True)
    spec = {"workload": "builtin:saxpy", "tiers": [1]}
    (rdir / "spec.json").write_text(json.dumps(spec))
    log = runs.EventLog("r-gpm", str(rdir / "events.ndjson"))
    ctx = RunContext("r-gpm", spec, log.append)
    ctx.gpu = gpusel.Choice({"index": 0, "name": "Stub"}, True, [])
    child = tmp_path / "tier1_child.py"
    child.write_text(FAKE_TIER1)
    monkeypatch.setattr(tiers, "child_argv", lambda ctx, mode, *a: [sys.executable, str(child)])
    measured = tiers.tier1(ctx)
    got = [protocol.decode_event(x) for x in (rdir / "events.ndjson").read_bytes().splitlines()]
    fin = next(e for e in got if isinstance(e, protocol.TierFinished) and e.tier == 1)
    g = fin.gpm
    assert g is not None and g.reason == "" and g.window_s is not None
    assert g.window_s >= 0.4  # the child's window, marker to marker
    assert (g.sm_active_pct, g.dram_bw_pct, g.fp64_pct) == (15.0, 75.0, None)
    assert g.timed_share_pct == pytest.approx(100 * 0.0005 / g.window_s)
    assert measured["tier1_median_ms"] == 0.25 and measured["setup_s"] >= 0.15
    assert live_samples(gpm_lib) == 0
