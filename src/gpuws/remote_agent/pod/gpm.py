"""NVML GPM: device-wide SM, tensor, DRAM and pipe activity without hardware-counter rights.

On Hopper and newer GPUs, NVML's GPU Performance Monitoring interface (what
``nvidia-smi dmon --gpm-metrics`` and DCGM read) gives averages over a window between two
samples: SM activity, SM occupancy, tensor-pipe activity, DRAM bandwidth utilisation and
the FP64/FP32/FP16 pipes. It answers where ncu's counters may be blocked
(``ERR_NVGPUCTRPERM``), so it is the best evidence a locked pod gives beside Tier 1.

The worker brackets a window with two samples (:class:`GpmWindow`): Tier 1's timed rounds
(between the child's markers, as :mod:`.clocks` reads the clocks) and a ``cmd:`` workload's
whole run. What comes out is a ``protocol.GpmMetrics`` dict: the figures, or none and a
one-line ``reason`` (no NVML, a library without the GPM symbols, a GPU before Hopper,
MIG, a refusal, a window shorter than the 100 ms GPM needs between samples). Nothing
here raises to the caller: GPM is evidence, never a reason for a run to fail.

The figures are device-wide averages over the window: another process on the same GPU
counts too, and idle time inside the window (Tier 1's cold holds, a command's start-up)
lowers them. Standard library only (Python 3.8).

Layouts, constants and metric ids are NVIDIA's ``nvml.h`` (NVIDIA/go-nvml
``gen/nvml/nvml.h`` at 2f9e261f, the header the driver's NVML ships with):
``nvmlGpmMetricId_t``, ``nvmlGpmMetric_t``, ``nvmlGpmMetricsGet_t``
(``NVML_GPM_METRICS_GET_VERSION 1``), ``nvmlGpmSupport_t`` (``NVML_GPM_SUPPORT_VERSION 1``)
and the functions ``nvmlGpmQueryDeviceSupport``, ``nvmlGpmSampleAlloc``,
``nvmlGpmSampleGet``, ``nvmlGpmMetricsGet``, ``nvmlGpmSampleFree``; pynvml
(nvidia-ml-py) declares the same ``c_nvmlGpmMetricsGet_t``.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any, Dict, List, Optional, Tuple

#: The label every face shows beside these figures.
SOURCE = "NVML GPM"

# nvml.h: nvmlReturn_t values used here.
_SUCCESS = 0
_ERROR_NOT_SUPPORTED = 3
_ERROR_NO_PERMISSION = 4
_ERROR_FUNCTION_NOT_FOUND = 13
_ERROR_GPU_IS_LOST = 15

#: nvml.h: NVML_GPM_METRICS_GET_VERSION and NVML_GPM_SUPPORT_VERSION.
METRICS_GET_VERSION = 1
SUPPORT_VERSION = 1
#: nvml.h: NVML_GPM_METRIC_MAX (333 in the R580 header; older headers had fewer). NVML
#: reads ``numMetrics`` entries; the array is the header's size so the struct is too.
METRIC_MAX = 333
#: nvml.h: NVML_DEVICE_MIG_ENABLE (nvmlDeviceGetMigMode's current mode).
_MIG_ENABLE = 1

#: The metrics asked for: (nvmlGpmMetricId_t value from nvml.h, field of protocol.GpmMetrics).
#: Every one is a percentage, 0.0 - 100.0, as nvml.h documents each.
METRICS: Tuple[Tuple[int, str], ...] = (
    (2, "sm_active_pct"),       # NVML_GPM_METRIC_SM_UTIL: share of SMs busy
    (3, "sm_occupancy_pct"),    # NVML_GPM_METRIC_SM_OCCUPANCY: active vs theoretical warps
    (5, "tensor_active_pct"),   # NVML_GPM_METRIC_ANY_TENSOR_UTIL: any tensor op
    (7, "hmma_active_pct"),     # NVML_GPM_METRIC_HMMA_TENSOR_UTIL: FP16/BF16 tensor ops
    (10, "dram_bw_pct"),        # NVML_GPM_METRIC_DRAM_BW_UTIL: DRAM bw vs theoretical max
    (11, "fp64_pct"),           # NVML_GPM_METRIC_FP64_UTIL: non-tensor FP64
    (12, "fp32_pct"),           # NVML_GPM_METRIC_FP32_UTIL: non-tensor FP32
    (13, "fp16_pct"),           # NVML_GPM_METRIC_FP16_UTIL: non-tensor FP16
)
FIELDS = tuple(name for _id, name in METRICS)

#: nvml.h: "The interval between these two nvmlGpmSampleGet() calls should be greater
#: than 100ms due to the internal sample refresh rate."
MIN_INTERVAL_S = 0.1
#: A value this far outside 0-100 (rounding) is clamped; further out it is not a reading.
_SLACK_PCT = 1.0
#: Longest reason sent (one line).
MAX_REASON = 300


class _MetricInfo(ctypes.Structure):
    # nvmlGpmMetric_t.metricInfo: three char* (NULL when not defined).
    _fields_ = [("shortName", ctypes.c_char_p), ("longName", ctypes.c_char_p),
                ("unit", ctypes.c_char_p)]


class _Metric(ctypes.Structure):
    # nvmlGpmMetric_t: metricId (IN), nvmlReturn (OUT, an enum), value (OUT), metricInfo (OUT).
    _fields_ = [("metricId", ctypes.c_uint), ("nvmlReturn", ctypes.c_int),
                ("value", ctypes.c_double), ("metricInfo", _MetricInfo)]


class _MetricsGet(ctypes.Structure):
    # nvmlGpmMetricsGet_t; nvmlGpmSample_t is an opaque pointer.
    _fields_ = [("version", ctypes.c_uint), ("numMetrics", ctypes.c_uint),
                ("sample1", ctypes.c_void_p), ("sample2", ctypes.c_void_p),
                ("metrics", _Metric * METRIC_MAX)]


class _Support(ctypes.Structure):
    # nvmlGpmSupport_t.
    _fields_ = [("version", ctypes.c_uint), ("isSupportedDevice", ctypes.c_uint)]


_FUNCTIONS = ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleGet",
              "nvmlGpmMetricsGet", "nvmlGpmSampleFree")


class GpmUnavailable(Exception):
    """GPM cannot answer for this GPU; the message is the one line people read."""


def unavailable(reason: str) -> Dict[str, Any]:
    """The ``protocol.GpmMetrics`` dict of a window GPM could not measure."""
    return {"reason": _one_line(reason), "source": SOURCE}


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:MAX_REASON]


def _why(nvml: Any, function: str, code: int) -> str:
    if code == -1:
        return ("%s is missing from the NVML library (a driver older than NVML's GPM "
                "interface)" % function)
    if code == _ERROR_NOT_SUPPORTED:
        return "NVML GPM is not supported on this GPU (%s: Hopper or newer is needed)" % (
            function)
    if code == _ERROR_NO_PERMISSION:
        return ("NVML refused GPM to this user (%s: no permission; profiling may be "
                "restricted to admin users on this host)" % function)
    return "%s failed: %s (NVML error %d)" % (function, nvml.error_text(code), code)


class GpmDevice:
    """One GPU's GPM, reached through an open ``gpuinfo.Nvml`` session.

    Raises:
        GpmUnavailable: from the constructor when the library lacks the GPM functions,
            the GPU is in MIG mode, or NVML says the GPU does not support GPM.
    """

    def __init__(self, nvml: Any, index: int) -> None:
        self.nvml = nvml
        self.index = index
        if not 0 <= index < nvml.count:
            raise GpmUnavailable("NVML has no GPU %d" % index)
        missing = [f for f in _FUNCTIONS if not nvml.has(f)]
        if missing:
            raise GpmUnavailable(_why(nvml, missing[0], -1))
        self.handle = nvml.handle(index)
        current, pending = ctypes.c_uint(0), ctypes.c_uint(0)
        if nvml.call("nvmlDeviceGetMigMode", self.handle, ctypes.byref(current),
                     ctypes.byref(pending)) == _SUCCESS and current.value == _MIG_ENABLE:
            # Device-wide samples of a MIG GPU mix every instance (and NVML wants per-
            # instance samples there): no figure is better than a wrong one.
            raise GpmUnavailable("GPU %d is in MIG mode: NVML GPM's device-wide figures "
                                 "would mix every instance" % index)
        support = _Support(version=SUPPORT_VERSION)
        code = nvml.call("nvmlGpmQueryDeviceSupport", self.handle, ctypes.byref(support))
        if code != _SUCCESS:
            raise GpmUnavailable(_why(nvml, "nvmlGpmQueryDeviceSupport", code))
        if not support.isSupportedDevice:
            raise GpmUnavailable("NVML GPM is not supported on GPU %d (Hopper or newer is "
                                 "needed)" % index)

    def alloc(self) -> ctypes.c_void_p:
        """A fresh sample buffer (free it with :meth:`free`)."""
        sample = ctypes.c_void_p()
        code = self.nvml.call("nvmlGpmSampleAlloc", ctypes.byref(sample))
        if code != _SUCCESS or not sample.value:
            raise GpmUnavailable(_why(self.nvml, "nvmlGpmSampleAlloc", code))
        return sample

    def free(self, sample: ctypes.c_void_p) -> None:
        if sample.value:
            self.nvml.call("nvmlGpmSampleFree", sample)

    def take(self, sample: ctypes.c_void_p) -> None:
        """Read the GPU's counters into ``sample``."""
        code = self.nvml.call("nvmlGpmSampleGet", self.handle, sample)
        if code != _SUCCESS:
            raise GpmUnavailable(_why(self.nvml, "nvmlGpmSampleGet", code))

    def metrics(self, first: ctypes.c_void_p, second: ctypes.c_void_p) -> Dict[str, Any]:
        """The averages between two samples, by field; a metric NVML could not give is
        None (its own ``nvmlReturn`` says so), and one outside 0-100 is not a reading."""
        request = _MetricsGet(version=METRICS_GET_VERSION, numMetrics=len(METRICS),
                              sample1=first, sample2=second)
        for i, (metric_id, _name) in enumerate(METRICS):
            request.metrics[i].metricId = metric_id
        code = self.nvml.call("nvmlGpmMetricsGet", ctypes.byref(request))
        if code != _SUCCESS:
            raise GpmUnavailable(_why(self.nvml, "nvmlGpmMetricsGet", code))
        out: Dict[str, Any] = {}
        for i, (_metric_id, name) in enumerate(METRICS):
            metric = request.metrics[i]
            out[name] = percent(metric.value) if metric.nvmlReturn == _SUCCESS else None
        return out


def percent(value: float) -> Optional[float]:
    """A GPM percentage as sent: rounding just outside 0-100 clamped, nonsense dropped."""
    v = float(value)
    if v != v or v < -_SLACK_PCT or v > 100.0 + _SLACK_PCT:
        return None
    return min(100.0, max(0.0, v))


class GpmWindow:
    """Two GPM samples bracketing a window: :meth:`open`, then :meth:`close`.

    Never raises; whatever goes wrong becomes the result's ``reason``. Safe to call from
    the pipe reader of the Tier-1 child (each call is two NVML calls, well under a ms).
    """

    def __init__(self, device: Optional[GpmDevice], reason: str = "",
                 clock: Any = time.monotonic) -> None:
        self.device = device
        self.reason = reason
        self._clock = clock
        self._samples: List[ctypes.c_void_p] = []
        self._t0: Optional[float] = None
        self.result: Optional[Dict[str, Any]] = None

    def open(self) -> None:
        """Take the first sample (a second ``open`` is ignored)."""
        if self.device is None or self._t0 is not None or self.result is not None:
            return
        try:
            self._samples = [self.device.alloc(), self.device.alloc()]
            self.device.take(self._samples[0])
            self._t0 = self._clock()
        except GpmUnavailable as exc:
            self._finish(unavailable(str(exc)))
        except Exception as exc:  # a driver that fell over: the run goes on without GPM
            self._finish(unavailable("NVML GPM failed: %s: %s" % (type(exc).__name__, exc)))

    def close(self) -> Dict[str, Any]:
        """Take the second sample and compute the window's figures (once); the result."""
        if self.result is not None:
            return self.result
        if self.device is None:
            return self._finish(unavailable(self.reason or "NVML GPM was not sampled"))
        if self._t0 is None:
            return self._finish(unavailable("the window never opened"))
        try:
            self.device.take(self._samples[1])
            window = self._clock() - self._t0
            if window < MIN_INTERVAL_S:
                return self._finish(unavailable(
                    "the window lasted %.0f ms, under the 100 ms NVML GPM needs between "
                    "samples" % (window * 1000)))
            figures = self.device.metrics(self._samples[0], self._samples[1])
            figures.update(window_s=window, source=SOURCE, reason="")
            return self._finish(figures)
        except GpmUnavailable as exc:
            return self._finish(unavailable(str(exc)))
        except Exception as exc:
            return self._finish(unavailable("NVML GPM failed: %s: %s"
                                            % (type(exc).__name__, exc)))

    def _finish(self, result: Dict[str, Any]) -> Dict[str, Any]:
        self.result = result
        if self.device is not None:
            for sample in self._samples:
                try:
                    self.device.free(sample)
                except Exception:
                    pass  # freeing is best effort; the figures are already taken
        self._samples = []
        return result


def window_for(index: Optional[int], nvml: Any = None) -> GpmWindow:
    """A window on NVML GPU ``index`` (None: the run's GPU is not known), never raising:
    where GPM cannot answer, the window carries the reason and :meth:`GpmWindow.close`
    returns it. ``nvml``: an open ``gpuinfo.Nvml`` (default: the process's session)."""
    from .gpuinfo import nvml_error, nvml_session

    if nvml is None:
        nvml = nvml_session()
    if nvml is None:
        return GpmWindow(None, "NVML could not be opened (%s)" % nvml_error())
    if index is None:
        return GpmWindow(None, "the run's GPU is not known to NVML")
    try:
        return GpmWindow(GpmDevice(nvml, index))
    except GpmUnavailable as exc:
        return GpmWindow(None, str(exc))
    except Exception as exc:
        return GpmWindow(None, "NVML GPM failed: %s: %s" % (type(exc).__name__, exc))


def probe(nvml: Any, index: int) -> Tuple[bool, str]:
    """Ask the GPU whether GPM answers for this user: support, then one real sample (a
    restricted host may say "supported" and still refuse the sample). ``(True, "")`` or
    ``(False, why)``."""
    try:
        device = GpmDevice(nvml, index)
        sample = device.alloc()
        try:
            device.take(sample)
        finally:
            device.free(sample)
    except GpmUnavailable as exc:
        return False, _one_line(str(exc))
    except Exception as exc:
        return False, _one_line("NVML GPM failed: %s: %s" % (type(exc).__name__, exc))
    return True, ""


def from_events(events: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The GPM evidence a run's events carry, for a verdict: the ``protocol.GpmMetrics``
    dict of Tier 1's window (its ``tier_finished``), else of a ``cmd:``'s run (tier 0),
    only where GPM measured (``window_s`` set); None otherwise.

    Pure and standard library only, so the agent and the laptop (``msgspec.to_builtins``
    of stored events) read it alike. Percentages are of the whole GPU over the window; a
    Tier-1 window's ``timed_share_pct`` says how much of it the timed calls took (a cold
    Tier 1 idles between samples), so a kernel's own figure is at least the average.
    """
    found: Dict[int, Dict[str, Any]] = {}
    for ev in events:
        if ev.get("type") != "tier_finished" or ev.get("tier") not in (0, 1):
            continue
        gpm = ev.get("gpm")
        if isinstance(gpm, dict) and gpm.get("window_s"):
            found[int(ev["tier"])] = gpm
    return found.get(1) or found.get(0)
