"""NVIDIA GPUs on the pod: NVML through ctypes first, ``nvidia-smi`` as the fallback.

Standard library only (runs on the pod's python3 >= 3.8). The dicts built here have the
shapes of :class:`gpuws.protocol.Gpu` and :class:`gpuws.protocol.GpuSample` exactly, so
the laptop decodes them strictly.

NVML is preferred because it answers in microseconds once initialised and needs no
process per query; telemetry is sampled at >= 1 Hz, so the NVML library and its device
handles stay open in one lazily created module-level object (:data:`_NVML`). When
``libnvidia-ml.so.1`` cannot be loaded or initialised (no driver mounted into the
container, a driver/library version mismatch), one ``nvidia-smi -q -x`` call answers instead
(its XML carries the same fields, processes and clock-event reasons included).

Who uses a GPU (:func:`Nvml.processes`) comes from NVML's compute and graphics process
lists; a process's name is read from ``/proc/PID/comm`` only where that pid is this
container's own (in a child pid namespace NVML reports the host's pids, and the same
number names some other process here, or none).
"""

from __future__ import annotations

import csv
import ctypes
import io
import os
import re
import shutil
import subprocess
import threading
import xml.etree.ElementTree as ET
from typing import Any, NamedTuple

#: The soname the driver installs; the unversioned ``libnvidia-ml.so`` only exists where
#: the development package is installed, so it is not a useful name to try.
NVML_LIB = "libnvidia-ml.so.1"

#: Fields for the ``nvidia-smi --query-gpu`` fallback of :func:`list_gpus`, in order.
QUERY_FIELDS = (
    "index", "name", "uuid", "driver_version", "memory.total", "memory.used",
    "utilization.gpu", "temperature.gpu", "power.draw", "clocks.sm", "clocks.max.sm",
    "compute_cap", "pci.bus_id",
)
#: Fields for the ``nvidia-smi`` fallback of :func:`telemetry` (the cheap ones only). The
#: active clock-event reasons are a hex bitmask; drivers before R535 call the field
#: ``clocks_throttle_reasons.active`` and reject the new name (and the reverse may come),
#: so both are asked and the one a driver refuses is dropped (:func:`query_gpus`).
TELEMETRY_FIELDS = (
    "index", "utilization.gpu", "memory.used", "clocks.sm", "power.draw", "temperature.gpu",
    "clocks.mem", "clocks_event_reasons.active", "clocks_throttle_reasons.active",
)

NO_DRIVER = "no NVIDIA driver: libnvidia-ml.so.1 not found and nvidia-smi not on PATH"

# nvidia-smi answers within a second on a healthy machine; a hung driver can block it
# for minutes, and a probe must never hang with it.
_SMI_TIMEOUT_S = 10.0

# NVML constants (nvml.h).
_NVML_SUCCESS = 0
_NVML_ERROR_INSUFFICIENT_SIZE = 7
_NVML_CLOCK_SM = 1  # nvmlClockType_t: GRAPHICS 0, SM 1, MEM 2, VIDEO 3
_NVML_CLOCK_MEM = 2
_NVML_TEMPERATURE_GPU = 0
#: NVML_VALUE_NOT_AVAILABLE: what usedGpuMemory holds when the driver will not tell.
_NVML_VALUE_NOT_AVAILABLE = (1 << 64) - 1
#: Processes asked for per list at first; NVML says how many more it has.
_NVML_PROCESS_SLOTS = 64
_NVML_BUFFER = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE == NVML_DEVICE_UUID_V2_BUFFER_SIZE
_NVML_DRIVER_BUFFER = 80  # NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE
_MIB = 1024.0 * 1024.0

#: NVML's clock-event (formerly "throttle") reason bits, from nvml.h (the
#: ``nvmlClocksEventReason*``/``nvmlClocksThrottleReason*`` defines, which R535 renamed
#: without changing a value), with the name gpuws sends for each, in bit order:
#:   GpuIdle 0x1, ApplicationsClocksSetting 0x2, SwPowerCap 0x4, HwSlowdown 0x8,
#:   SyncBoost 0x10, SwThermalSlowdown 0x20, HwThermalSlowdown 0x40,
#:   HwPowerBrakeSlowdown 0x80, DisplayClockSetting 0x100.
CLOCK_EVENT_BITS = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal"),
    (0x040, "hw_thermal"),
    (0x080, "hw_power_brake"),
    (0x100, "display_clocks_setting"),
)
#: nvidia-smi's XML names each reason ``clocks_event_reason_<suffix>`` (R535+) or
#: ``clocks_throttle_reason_<suffix>`` (before); the suffixes map to the same names.
_XML_REASONS = {
    "gpu_idle": "gpu_idle",
    "applications_clocks_setting": "applications_clocks_setting",
    "sw_power_cap": "sw_power_cap",
    "hw_slowdown": "hw_slowdown",
    "sync_boost": "sync_boost",
    "sw_thermal_slowdown": "sw_thermal",
    "hw_thermal_slowdown": "hw_thermal",
    "hw_power_brake_slowdown": "hw_power_brake",
    "display_clocks_setting": "display_clocks_setting",
}
_REASON_ORDER = {name: i for i, (_bit, name) in enumerate(CLOCK_EVENT_BITS)}


def clock_events_from_mask(mask: int) -> list[str]:
    """The names of the reasons set in an NVML clock-event bitmask, in bit order.

    A bit this table does not know (a later driver's reason) is kept as ``bit_0xNNN``
    rather than dropped: a new reason may well be one that slows the GPU.
    """
    names = [name for bit, name in CLOCK_EVENT_BITS if mask & bit]
    known = 0
    for bit, _name in CLOCK_EVENT_BITS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest and bit <= rest:
        if rest & bit:
            names.append(f"bit_{bit:#x}")
        bit <<= 1
    return names


def sort_clock_events(names: set[str] | list[str]) -> list[str]:
    """Reason names in NVML's bit order (unknown names last, alphabetically)."""
    return sorted(set(names), key=lambda n: (_REASON_ORDER.get(n, len(_REASON_ORDER)), n))


class GpuList(NamedTuple):
    """What :func:`list_gpus` found.

    Attributes:
        gpus: One dict shaped like ``protocol.Gpu`` per GPU, in index order.
        driver: The driver version (``"580.159.04"``), or None.
        cuda_driver: The CUDA version the driver supports (``"13.0"``), or None.
        source: ``"nvml"`` or ``"nvidia-smi"``; None when neither worked.
        error: Why no GPU could be listed (or why NVML was skipped), else None.
    """

    gpus: list[dict[str, Any]]
    driver: str | None
    cuda_driver: str | None
    source: str | None
    error: str | None


# ----------------------------------------------------------------------------- NVML
class NvmlError(Exception):
    """An NVML call returned an error code."""

    def __init__(self, function: str, code: int, text: str) -> None:
        super().__init__(f"{function} failed: {text} (NVML error {code})")
        self.function = function
        self.code = code


class _NvmlMemory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class _NvmlMemoryV2(ctypes.Structure):
    # v2 splits out driver-reserved memory, so ``used`` matches what nvidia-smi shows
    # (v1 counts the reservation as used: ~600 MiB "used" on an idle H200).
    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


# NVML_STRUCT_VERSION(Memory, 2): sizeof(struct) | (version << 24).
_NVML_MEMORY_V2 = ctypes.sizeof(_NvmlMemoryV2) | (2 << 24)


class _NvmlPciInfo(ctypes.Structure):
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


class _NvmlUtilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _NvmlProcessInfoV1(ctypes.Structure):
    # nvmlProcessInfo_v1_t: what the unversioned nvmlDevice*RunningProcesses fill.
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _NvmlProcessInfo(ctypes.Structure):
    # nvmlProcessInfo_t (== nvmlProcessInfo_v2_t): what the _v2 and _v3 functions fill.
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


#: The process-list functions, newest first, with the struct each fills.
_PROCESS_FUNCTIONS: tuple[tuple[str, Any], ...] = (
    ("_v3", _NvmlProcessInfo), ("_v2", _NvmlProcessInfo), ("", _NvmlProcessInfoV1),
)


class Nvml:
    """An initialised NVML library with its device handles.

    Use :meth:`open`; every query returns None for a value the GPU does not report
    (``NVML_ERROR_NOT_SUPPORTED``, e.g. utilisation under MIG) instead of raising.
    """

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        self._handles: list[ctypes.c_void_p] = []

    @classmethod
    def open(cls, lib_name: str = NVML_LIB) -> Nvml:
        """Load and initialise NVML and fetch every device handle.

        Raises:
            OSError: The library cannot be loaded (no driver visible).
            NvmlError: NVML refused to initialise or to enumerate devices.
        """
        nvml = cls(ctypes.CDLL(lib_name))
        init = "nvmlInit_v2" if nvml._has("nvmlInit_v2") else "nvmlInit"
        nvml._check(init)
        count = ctypes.c_uint(0)
        getter = "nvmlDeviceGetCount_v2" if nvml._has("nvmlDeviceGetCount_v2") else (
            "nvmlDeviceGetCount")
        nvml._check(getter, ctypes.byref(count))
        by_index = ("nvmlDeviceGetHandleByIndex_v2"
                    if nvml._has("nvmlDeviceGetHandleByIndex_v2")
                    else "nvmlDeviceGetHandleByIndex")
        for i in range(count.value):
            handle = ctypes.c_void_p()
            nvml._check(by_index, ctypes.c_uint(i), ctypes.byref(handle))
            nvml._handles.append(handle)
        return nvml

    @property
    def count(self) -> int:
        """Number of GPUs NVML enumerated."""
        return len(self._handles)

    def close(self) -> None:
        """Shut NVML down; the object must not be used afterwards."""
        self._handles = []
        if self._has("nvmlShutdown"):
            self._lib.nvmlShutdown()

    # -- plumbing (public for the GPM reader, gpm.py, which shares this session)
    def handle(self, index: int) -> ctypes.c_void_p:
        """NVML's device handle of GPU ``index``."""
        return self._handles[index]

    def has(self, name: str) -> bool:
        """Whether the library exports ``name`` (older drivers lack newer functions)."""
        return self._has(name)

    def call(self, name: str, *args: Any) -> int:
        """Call an NVML function; its return code (-1 when the symbol is missing)."""
        return self._call(name, *args)

    def error_text(self, code: int) -> str:
        """``nvmlErrorString`` of a return code."""
        return self._error_text(code)

    def _has(self, name: str) -> bool:
        return hasattr(self._lib, name)

    def _error_text(self, code: int) -> str:
        if self._has("nvmlErrorString"):
            fn = self._lib.nvmlErrorString
            fn.restype = ctypes.c_char_p
            raw = fn(ctypes.c_int(code))
            if isinstance(raw, bytes):
                return raw.decode("utf-8", "replace")
        return "unknown error"

    def _call(self, name: str, *args: Any) -> int:
        """Call an NVML function; return its code (-1 when the symbol is missing)."""
        if not self._has(name):
            return -1
        return int(getattr(self._lib, name)(*args))

    def _check(self, name: str, *args: Any) -> None:
        code = self._call(name, *args)
        if code == -1:
            raise NvmlError(name, code, "symbol missing from " + NVML_LIB)
        if code != _NVML_SUCCESS:
            raise NvmlError(name, code, self._error_text(code))

    def _uint(self, name: str, *args: Any) -> int | None:
        value = ctypes.c_uint(0)
        if self._call(name, *args, ctypes.byref(value)) != _NVML_SUCCESS:
            return None
        return value.value

    def _text(self, name: str, *args: Any, size: int = _NVML_BUFFER) -> str | None:
        buf = ctypes.create_string_buffer(size)
        if self._call(name, *args, buf, ctypes.c_uint(size)) != _NVML_SUCCESS:
            return None
        return buf.value.decode("utf-8", "replace")

    # -- system
    def driver_version(self) -> str | None:
        """The kernel driver's version, e.g. ``"580.159.04"``."""
        return self._text("nvmlSystemGetDriverVersion", size=_NVML_DRIVER_BUFFER)

    def cuda_driver_version(self) -> str | None:
        """The CUDA version the driver supports, e.g. ``"13.0"``."""
        value = ctypes.c_int(0)
        name = ("nvmlSystemGetCudaDriverVersion_v2"
                if self._has("nvmlSystemGetCudaDriverVersion_v2")
                else "nvmlSystemGetCudaDriverVersion")
        if self._call(name, ctypes.byref(value)) != _NVML_SUCCESS or value.value <= 0:
            return None
        return cuda_version_from_int(value.value)

    # -- devices
    def _memory(self, handle: ctypes.c_void_p) -> tuple[float | None, float | None]:
        mem2 = _NvmlMemoryV2()
        mem2.version = _NVML_MEMORY_V2
        if self._call("nvmlDeviceGetMemoryInfo_v2", handle, ctypes.byref(mem2)) == 0:
            return mem2.total / _MIB, mem2.used / _MIB
        mem = _NvmlMemory()
        if self._call("nvmlDeviceGetMemoryInfo", handle, ctypes.byref(mem)) == 0:
            return mem.total / _MIB, mem.used / _MIB
        return None, None

    def gpu(self, index: int) -> dict[str, Any]:
        """One GPU as the probe shows it, shaped like ``protocol.Gpu``: what it is, its
        clocks, power and temperature now, the active clock-event reasons and who uses it."""
        h = self._handles[index]
        total, used = self._memory(h)
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        cc: str | None = None
        if self._call("nvmlDeviceGetCudaComputeCapability", h, ctypes.byref(major),
                      ctypes.byref(minor)) == _NVML_SUCCESS:
            cc = f"{major.value}.{minor.value}"
        pci = _NvmlPciInfo()
        bus_id: str | None = None
        pci_fn = ("nvmlDeviceGetPciInfo_v3" if self._has("nvmlDeviceGetPciInfo_v3")
                  else "nvmlDeviceGetPciInfo_v2")
        if self._call(pci_fn, h, ctypes.byref(pci)) == _NVML_SUCCESS:
            bus_id = pci.busId.decode("ascii", "replace") or None
        sm_max = self._uint("nvmlDeviceGetMaxClockInfo", h, ctypes.c_int(_NVML_CLOCK_SM))
        mem_max = self._uint("nvmlDeviceGetMaxClockInfo", h, ctypes.c_int(_NVML_CLOCK_MEM))
        live = self.sample(index)
        return {
            "index": index,
            "name": self._text("nvmlDeviceGetName", h) or "unknown NVIDIA GPU",
            "uuid": self._text("nvmlDeviceGetUUID", h),
            "memory_total_mib": total,
            "memory_used_mib": used,
            "sm_clock_mhz": live["sm_clock_mhz"],
            "sm_clock_max_mhz": None if sm_max is None else float(sm_max),
            "compute_capability": cc,
            "pci_bus_id": bus_id,
            "mem_clock_mhz": live["mem_clock_mhz"],
            "mem_clock_max_mhz": None if mem_max is None else float(mem_max),
            "util_pct": live["util_pct"],
            "power_w": live["power_w"],
            "power_limit_w": self.power_limit_w(index),
            "temp_c": live["temp_c"],
            "clock_events": live["clock_events"],
            "processes": self.processes(index),
            **self._gpm(index),
        }

    def _gpm(self, index: int) -> dict[str, Any]:
        """Whether NVML GPM answers for this user on GPU ``index``: asked, not assumed."""
        from .gpm import probe

        ok, why = probe(self, index)
        return {"gpm_supported": ok, "gpm_reason": why}

    def max_sm_clock_mhz(self, index: int) -> float | None:
        """The GPU's highest SM clock (its boost ceiling), or None."""
        value = self._uint("nvmlDeviceGetMaxClockInfo", self._handles[index],
                           ctypes.c_int(_NVML_CLOCK_SM))
        return None if value is None else float(value)

    def power_limit_w(self, index: int) -> float | None:
        """The power limit the driver enforces now, in W (None if not reported)."""
        h = self._handles[index]
        mw = self._uint("nvmlDeviceGetEnforcedPowerLimit", h)
        if mw is None:
            mw = self._uint("nvmlDeviceGetPowerManagementLimit", h)
        return None if mw is None else mw / 1000.0

    def clock_events(self, index: int) -> list[str] | None:
        """The clock-event (throttle) reasons active now, by name; None if unreadable.

        ``nvmlDeviceGetCurrentClocksEventReasons`` is R535's name for
        ``nvmlDeviceGetCurrentClocksThrottleReasons``; older drivers have only the latter.
        """
        mask = ctypes.c_ulonglong(0)
        for name in ("nvmlDeviceGetCurrentClocksEventReasons",
                     "nvmlDeviceGetCurrentClocksThrottleReasons"):
            code = self._call(name, self._handles[index], ctypes.byref(mask))
            if code == _NVML_SUCCESS:
                return clock_events_from_mask(mask.value)
            if code != -1:  # the symbol exists and refused: the other name will too
                return None
        return None

    def processes(self, index: int, own_pid: int | None = None) -> list[dict[str, Any]] | None:
        """The processes holding a context on GPU ``index`` (compute and graphics lists,
        merged by pid), shaped like ``protocol.GpuProcess``; this process excluded.

        Returns None when neither list could be read (e.g. not supported under MIG).
        """
        own = os.getpid() if own_pid is None else own_pid
        found: dict[int, float | None] = {}
        read_any = False
        for kind in ("Compute", "Graphics"):
            got = self._process_list(index, kind)
            if got is None:
                continue
            read_any = True
            for pid, used in got:
                if pid == own or pid <= 0:
                    continue
                # A process in both lists ("C+G") holds one context: keep its larger figure.
                known = [m for m in (found.get(pid), used) if m is not None]
                found[pid] = max(known) if known else None
        if not read_any:
            return None
        names = _ProcNames()
        return [{"pid": pid, "name": names.name(pid), "used_mib": used}
                for pid, used in sorted(found.items())]

    def _process_list(self, index: int, kind: str) -> list[tuple[int, float | None]] | None:
        """``(pid, used MiB)`` from one of NVML's process lists, or None if unreadable."""
        h = self._handles[index]
        for suffix, struct in _PROCESS_FUNCTIONS:
            name = f"nvmlDeviceGet{kind}RunningProcesses{suffix}"
            if not self._has(name):
                continue
            slots = _NVML_PROCESS_SLOTS
            for _attempt in range(3):
                count = ctypes.c_uint(slots)
                infos = (struct * slots)()
                code = self._call(name, h, ctypes.byref(count), infos)
                if code == _NVML_ERROR_INSUFFICIENT_SIZE and count.value > slots:
                    # More processes than slots: NVML said how many; a few more may
                    # start before the next call.
                    slots = min(count.value + 8, 4096)
                    continue
                if code != _NVML_SUCCESS:
                    return None
                out = []
                for info in infos[:min(count.value, slots)]:
                    used = info.usedGpuMemory
                    mib = None if used == _NVML_VALUE_NOT_AVAILABLE else used / _MIB
                    out.append((int(info.pid), mib))
                return out
            return None
        return None

    def virtualization_mode(self, index: int) -> str | None:
        """``"pass-through"``, ``"vgpu"`` (a guest's virtual GPU), ... or None if unknown.

        A vGPU guest usually cannot read performance counters at all, whatever the
        RmProfilingAdminOnly setting, so the probe reports this.
        """
        mode = self._uint("nvmlDeviceGetVirtualizationMode", self._handles[index])
        return None if mode is None else _VIRT_MODES.get(mode, f"mode {mode}")

    def sample(self, index: int) -> dict[str, Any]:
        """Live readings of one GPU, shaped like ``protocol.GpuSample``."""
        h = self._handles[index]
        util = _NvmlUtilization()
        util_pct: float | None = None
        if self._call("nvmlDeviceGetUtilizationRates", h, ctypes.byref(util)) == 0:
            util_pct = float(util.gpu)
        _total, used = self._memory(h)
        clocks = self.clocks(index)
        return {
            "index": index,
            "util_pct": util_pct,
            "mem_used_mib": used,
            "sm_clock_mhz": clocks["sm_clock_mhz"],
            "power_w": clocks["power_w"],
            "temp_c": clocks["temp_c"],
            "mem_clock_mhz": clocks["mem_clock_mhz"],
            "clock_events": clocks["clock_events"] or [],
        }

    def clocks(self, index: int) -> dict[str, Any]:
        """SM and memory clocks (MHz), power (W), temperature (°C) and the active
        clock-event reasons (a list, or None if unreadable) of one GPU: the readings the
        Tier-1 clock sampler takes a few times a second (tens of µs each)."""
        h = self._handles[index]
        sm = self._uint("nvmlDeviceGetClockInfo", h, ctypes.c_int(_NVML_CLOCK_SM))
        mem = self._uint("nvmlDeviceGetClockInfo", h, ctypes.c_int(_NVML_CLOCK_MEM))
        milliwatts = self._uint("nvmlDeviceGetPowerUsage", h)
        temp = self._uint("nvmlDeviceGetTemperature", h, ctypes.c_int(_NVML_TEMPERATURE_GPU))
        return {
            "sm_clock_mhz": None if sm is None else float(sm),
            "mem_clock_mhz": None if mem is None else float(mem),
            "power_w": None if milliwatts is None else milliwatts / 1000.0,
            "temp_c": None if temp is None else float(temp),
            "clock_events": self.clock_events(index),
        }


class _ProcNames:
    """Process names from ``/proc/PID/comm``, given only where NVML's pids are ours.

    NVML reports pids as the host sees them. Inside a container with its own pid
    namespace (``NSpid`` in ``/proc/self/status`` lists more than one pid) the same
    numbers name other processes here, or none, so no name is given there at all.
    """

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self.ours = pids_are_ours(_read_small(os.path.join(proc, "self", "status")))

    def name(self, pid: int) -> str:
        if not self.ours:
            return ""
        text = _read_small(os.path.join(self.proc, str(pid), "comm"))
        return "" if text is None else text.strip()[:64]


def pids_are_ours(status_text: str | None) -> bool:
    """Whether this process lives in the initial pid namespace (``NSpid`` has one pid).

    A kernel too old to print ``NSpid`` (before 4.1) cannot say: taken as ours.
    """
    if status_text is None:
        return True
    m = re.search(r"^NSpid:\s*(.*)$", status_text, re.M)
    return m is None or len(m.group(1).split()) <= 1


def _read_small(path: str, limit: int = 1 << 16) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(limit)
    except OSError:
        return None


# nvmlGpuVirtualizationMode_t
_VIRT_MODES = {0: "none", 1: "pass-through", 2: "vgpu", 3: "host-vgpu", 4: "host-vsga"}


def gpu_virtualization(nvml_lib: str = NVML_LIB) -> list[str]:
    """``"gpuN:MODE"`` for every GPU NVML reports as virtualised (MODE is not ``none``)."""
    nvml = _NVML.get(nvml_lib)
    if nvml is None:
        return []
    out = []
    for i in range(nvml.count):
        mode = nvml.virtualization_mode(i)
        if mode is not None and mode != "none":
            out.append(f"gpu{i}:{mode}")
    return out


def cuda_version_from_int(value: int) -> str:
    """Turn NVML's/the driver API's CUDA version integer into text: 13000 → ``"13.0"``."""
    return f"{value // 1000}.{(value % 1000) // 10}"


class _NvmlState:
    """The process's one NVML session, opened on first use and kept for telemetry."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.nvml: Nvml | None = None
        self.error: str | None = None
        self.tried = False

    def get(self, lib_name: str = NVML_LIB, retry: bool = False) -> Nvml | None:
        """The open session, opening it if needed; None (with ``error`` set) if it fails.

        A failure is remembered so that 1 Hz telemetry does not dlopen every second;
        ``retry`` (used by the probe) tries again.
        """
        with self.lock:
            if self.nvml is not None:
                return self.nvml
            if self.tried and not retry:
                return None
            self.tried = True
            try:
                self.nvml = Nvml.open(lib_name)
                self.error = None
            except OSError as exc:
                self.error = f"{lib_name} could not be loaded ({exc})"
            except NvmlError as exc:
                self.error = str(exc)
            return self.nvml


_NVML = _NvmlState()


def nvml_session(nvml_lib: str = NVML_LIB) -> Nvml | None:
    """The process's open NVML session (opened on first use), or None without NVML."""
    return _NVML.get(nvml_lib)


def nvml_error() -> str:
    """Why the NVML session could not be opened (``"not tried"`` before a try)."""
    return _NVML.error or ("not tried" if not _NVML.tried else "unknown error")


# ----------------------------------------------------------------------------- nvidia-smi parsers
_NA = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", "not found",
       "[insufficient permissions]", "[gpu is lost]", "[requested functionality has been "
       "deprecated]"}


def _clean(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    return None if value.lower() in _NA else value


def _number(value: str | None) -> float | None:
    """The leading number of ``"143771 MiB"``/``"41 C"``/``"125.86"``; None if absent."""
    value = _clean(value)
    if value is None:
        return None
    m = re.match(r"[-+]?\d+(?:\.\d+)?", value)
    return float(m.group(0)) if m else None


def _int(value: str | None) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


def parse_query_csv(text: str, fields: tuple[str, ...] | list[str]) -> list[dict[str, str | None]]:
    """Parse ``nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits`` output.

    Args:
        text: The command's stdout.
        fields: The fields in the order they were asked for.

    Returns:
        One dict per GPU mapping each field to its text, None where nvidia-smi printed
        ``[N/A]``/``[Not Supported]``.

    Raises:
        ValueError: A line has a different number of values than ``fields``.
    """
    rows: list[dict[str, str | None]] = []
    for values in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not values or not "".join(values).strip():
            continue
        if len(values) != len(fields):
            raise ValueError(
                f"nvidia-smi printed {len(values)} values for {len(fields)} fields: "
                + ", ".join(values)[:200])
        rows.append({fields[i]: _clean(values[i]) for i in range(len(fields))})
    return rows


def gpus_from_query(rows: list[dict[str, str | None]]) -> list[dict[str, Any]]:
    """``protocol.Gpu`` dicts from :func:`parse_query_csv` rows (missing fields → None)."""
    gpus = []
    for pos, row in enumerate(rows):
        index = _int(row.get("index"))
        gpus.append({
            "index": pos if index is None else index,
            "name": row.get("name") or "unknown NVIDIA GPU",
            "uuid": row.get("uuid"),
            "memory_total_mib": _number(row.get("memory.total")),
            "memory_used_mib": _number(row.get("memory.used")),
            "sm_clock_mhz": _number(row.get("clocks.sm")),
            "sm_clock_max_mhz": _number(row.get("clocks.max.sm")),
            "compute_capability": row.get("compute_cap"),
            "pci_bus_id": row.get("pci.bus_id"),
        })
    return gpus


def samples_from_query(rows: list[dict[str, str | None]]) -> list[dict[str, Any]]:
    """``protocol.GpuSample`` dicts from :func:`parse_query_csv` rows."""
    samples = []
    for pos, row in enumerate(rows):
        index = _int(row.get("index"))
        samples.append({
            "index": pos if index is None else index,
            "util_pct": _number(row.get("utilization.gpu")),
            "mem_used_mib": _number(row.get("memory.used")),
            "sm_clock_mhz": _number(row.get("clocks.sm")),
            "power_w": _number(row.get("power.draw")),
            "temp_c": _number(row.get("temperature.gpu")),
            "mem_clock_mhz": _number(row.get("clocks.mem")),
            "clock_events": events_from_hex(row.get("clocks_event_reasons.active")
                                            or row.get("clocks_throttle_reasons.active")),
        })
    return samples


def events_from_hex(value: str | None) -> list[str]:
    """Reason names from nvidia-smi's ``0x0000000000000001``-style bitmask ([] if absent)."""
    value = _clean(value)
    if value is None:
        return []
    try:
        mask = int(value, 16)
    except ValueError:
        return []
    return clock_events_from_mask(mask & ((1 << 64) - 1))


_SMI_HEADER = re.compile(
    r"NVIDIA-SMI\s+(?P<smi>\S+).*?Driver Version:\s*(?P<driver>\S+)"
    r"(?:.*?CUDA Version:\s*(?P<cuda>[\w.]+))?")
# "|   0  NVIDIA H200                    On  |   00000000:00:06.0 Off |   0 |"
_SMI_GPU_ROW = re.compile(
    r"^\|\s*(?P<index>\d+)\s+(?P<name>.+?)\s+(?:On|Off|N/A)\s*\|\s*"
    r"(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")
_SMI_TEMP = re.compile(r"(\d+)C\b")
_SMI_POWER = re.compile(r"(\d+(?:\.\d+)?)W\s*/")
_SMI_MEM = re.compile(r"(\d+)MiB\s*/\s*(\d+)MiB")
_SMI_UTIL = re.compile(r"(\d+)%\s+\S+\s*\|")


def parse_nvidia_smi_text(text: str) -> dict[str, Any]:
    """Parse the plain ``nvidia-smi`` table.

    Returns:
        ``{"driver", "cuda_driver", "gpus", "samples"}``: versions from the header (None
        when absent or ``N/A``), ``protocol.Gpu`` and ``protocol.GpuSample`` dicts from
        the device rows. The table truncates long names and shows no UUID or clocks.
    """
    driver = cuda = None
    header = _SMI_HEADER.search(text)
    if header:
        driver = _clean(header.group("driver"))
        cuda = _clean(header.group("cuda"))
    gpus: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _SMI_GPU_ROW.match(line)
        if not m:
            continue
        # The second line of a device cell: fan, temp, perf, power, memory, util.
        detail = lines[i + 1] if i + 1 < len(lines) else ""
        temp = _SMI_TEMP.search(detail)
        power = _SMI_POWER.search(detail)
        mem = _SMI_MEM.search(detail)
        util = _SMI_UTIL.search(detail)
        index = int(m.group("index"))
        gpus.append({
            "index": index,
            "name": m.group("name").strip(),
            "memory_total_mib": float(mem.group(2)) if mem else None,
            "memory_used_mib": float(mem.group(1)) if mem else None,
            "pci_bus_id": m.group("bus"),
        })
        samples.append({
            "index": index,
            "util_pct": float(util.group(1)) if util else None,
            "mem_used_mib": float(mem.group(1)) if mem else None,
            "power_w": float(power.group(1)) if power else None,
            "temp_c": float(temp.group(1)) if temp else None,
        })
    return {"driver": driver, "cuda_driver": cuda, "gpus": gpus, "samples": samples}


def _xml_text(node: ET.Element | None, path: str) -> str | None:
    if node is None:
        return None
    found = node.find(path)
    return None if found is None or found.text is None else _clean(found.text)


def xml_clock_events(node: ET.Element) -> list[str] | None:
    """Active reasons from a ``<gpu>``'s ``<clocks_event_reasons>`` (R535+) or
    ``<clocks_throttle_reasons>`` (before): the children whose text is ``Active``.

    Returns None when the GPU element has neither block.
    """
    block = node.find("clocks_event_reasons")
    prefix = "clocks_event_reason_"
    if block is None:
        block = node.find("clocks_throttle_reasons")
        prefix = "clocks_throttle_reason_"
    if block is None:
        return None
    active: list[str] = []
    for child in block:
        if (child.text or "").strip().lower() != "active" or not child.tag.startswith(prefix):
            continue
        suffix = child.tag[len(prefix):]
        active.append(_XML_REASONS.get(suffix, suffix[:64]))
    return sort_clock_events(active)


def xml_processes(node: ET.Element, own_pid: int | None = None) -> list[dict[str, Any]] | None:
    """``protocol.GpuProcess`` dicts from a ``<gpu>``'s ``<processes>`` (None when absent).

    A pid in both the compute and the graphics list appears once (its larger memory).
    """
    block = node.find("processes")
    if block is None:
        return None
    found: dict[int, dict[str, Any]] = {}
    for info in block.findall("process_info"):
        pid = _int(_xml_text(info, "pid"))
        if pid is None or pid <= 0 or pid == own_pid:
            continue
        used = _number(_xml_text(info, "used_memory"))
        entry = found.get(pid)
        if entry is None:
            found[pid] = {"pid": pid, "name": (_xml_text(info, "process_name") or "")[:256],
                          "used_mib": used}
        elif used is not None and (entry["used_mib"] is None or used > entry["used_mib"]):
            entry["used_mib"] = used
    return [found[pid] for pid in sorted(found)]


def parse_nvidia_smi_xml(text: str, own_pid: int | None = None) -> dict[str, Any]:
    """Parse ``nvidia-smi -q -x``.

    Every ``<gpu>`` element is one GPU, in the order nvidia-smi lists them, which is its
    index order (NVML's, by PCI bus id). ``minor_number`` is the ``/dev/nvidiaN`` number
    and need not match: on the 4 × K80 fixture the first GPU is minor 1.

    Args:
        text: The XML.
        own_pid: A pid to leave out of the process lists (the agent's own).

    Returns:
        ``{"driver", "cuda_driver", "gpus", "samples"}`` like
        :func:`parse_nvidia_smi_text`, the ``gpus`` with their clocks, power limit,
        clock-event reasons and processes. The XML has no compute capability.

    Raises:
        ValueError: The text is not nvidia-smi's XML.
    """
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"not nvidia-smi XML: {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"not nvidia-smi XML: root element is <{root.tag}>")
    gpus: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    for index, node in enumerate(root.findall("gpu")):
        # R470+ splits power into gpu_power_readings (instant/average draw, current
        # limit); older drivers have one power_readings block (draw, enforced limit).
        power = _xml_text(node, "gpu_power_readings/instant_power_draw") or _xml_text(
            node, "gpu_power_readings/power_draw") or _xml_text(node, "power_readings/power_draw")
        limit = _xml_text(node, "gpu_power_readings/current_power_limit") or _xml_text(
            node, "power_readings/enforced_power_limit") or _xml_text(
            node, "power_readings/power_limit")
        used = _number(_xml_text(node, "fb_memory_usage/used"))
        sm = _number(_xml_text(node, "clocks/sm_clock"))
        mem = _number(_xml_text(node, "clocks/mem_clock"))
        util = _number(_xml_text(node, "utilization/gpu_util"))
        temp = _number(_xml_text(node, "temperature/gpu_temp"))
        events = xml_clock_events(node)
        gpus.append({
            "index": index,
            "name": _xml_text(node, "product_name") or "unknown NVIDIA GPU",
            "uuid": _xml_text(node, "uuid"),
            "memory_total_mib": _number(_xml_text(node, "fb_memory_usage/total")),
            "memory_used_mib": used,
            "sm_clock_mhz": sm,
            "sm_clock_max_mhz": _number(_xml_text(node, "max_clocks/sm_clock")),
            "pci_bus_id": _xml_text(node, "pci/pci_bus_id") or node.get("id"),
            "mem_clock_mhz": mem,
            "mem_clock_max_mhz": _number(_xml_text(node, "max_clocks/mem_clock")),
            "util_pct": util,
            "power_w": _number(power),
            "power_limit_w": _number(limit),
            "temp_c": temp,
            "clock_events": events or [],
            "processes": xml_processes(node, own_pid),
        })
        samples.append({
            "index": index,
            "util_pct": util,
            "mem_used_mib": used,
            "sm_clock_mhz": sm,
            "power_w": _number(power),
            "temp_c": temp,
            "mem_clock_mhz": mem,
            "clock_events": events or [],
        })
    return {
        "driver": _xml_text(root, "driver_version"),
        "cuda_driver": _xml_text(root, "cuda_version"),
        "gpus": gpus,
        "samples": samples,
    }


# ----------------------------------------------------------------------------- nvidia-smi runner
def _run_smi(smi: str, args: list[str]) -> tuple[int, str]:
    """Run nvidia-smi; (returncode, stdout+stderr). OSError/timeout become rc 127/124."""
    try:
        proc = subprocess.run(
            [smi, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,  # never let a tool read the agent's requests
            text=True, timeout=_SMI_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return 124, f"{smi} {' '.join(args)} timed out after {_SMI_TIMEOUT_S:.0f} s"
    except OSError as exc:
        return 127, f"{smi} could not be run: {exc}"
    return proc.returncode, proc.stdout


_INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
#: Fields each nvidia-smi (by path) refused once: not asked again, so the 1 Hz telemetry
#: fallback costs one nvidia-smi call per tick, not one per refused field.
_SMI_REJECTED: dict[str, set[str]] = {}


def query_gpus(smi: str, fields: tuple[str, ...]) -> tuple[list[dict[str, str | None]], str | None]:
    """Run ``nvidia-smi --query-gpu`` and parse it, dropping fields this driver lacks.

    Older drivers reject fields newer ones know (``compute_cap`` appeared in R510); the
    query is retried without each field nvidia-smi names as invalid.

    Returns:
        (rows, error): rows as from :func:`parse_query_csv`; ``error`` is None on success.
    """
    rejected = _SMI_REJECTED.setdefault(smi, set())
    wanted = [f for f in fields if f not in rejected]
    for _attempt in range(len(fields)):
        if not wanted:
            break
        rc, out = _run_smi(smi, ["--query-gpu=" + ",".join(wanted),
                                 "--format=csv,noheader,nounits"])
        if rc == 0:
            try:
                return parse_query_csv(out, wanted), None
            except ValueError as exc:
                return [], str(exc)
        bad = _INVALID_FIELD.findall(out)
        if not bad or not set(bad) & set(wanted):
            return [], f"nvidia-smi failed (exit {rc}): {out.strip()[:300]}"
        rejected.update(bad)
        wanted = [f for f in wanted if f not in bad]
    return [], "nvidia-smi rejected every queried field"


def _list_gpus_smi(smi: str) -> GpuList:
    """GPUs from ``nvidia-smi -q -x`` (clocks, reasons and processes included), with
    the compute capability from ``--query-gpu`` (the XML has none); the CSV query alone
    where the XML cannot be had."""
    rc, out = _run_smi(smi, ["-q", "-x"])
    if rc == 0:
        try:
            parsed: dict[str, Any] | None = parse_nvidia_smi_xml(out, own_pid=os.getpid())
        except ValueError:
            parsed = None
        if parsed is not None and parsed["gpus"]:
            rows, _error = query_gpus(smi, ("index", "compute_cap"))
            caps = {_int(r.get("index")): r.get("compute_cap") for r in rows}
            names = _ProcNames()
            for gpu in parsed["gpus"]:
                gpu["compute_capability"] = caps.get(gpu["index"])
                if not names.ours:
                    # nvidia-smi named host pids from inside a container: not these names.
                    for proc in gpu["processes"] or []:
                        proc["name"] = ""
            return GpuList(parsed["gpus"], parsed["driver"], parsed["cuda_driver"],
                           "nvidia-smi", None)
    rows, error = query_gpus(smi, QUERY_FIELDS)
    if error is not None:
        return GpuList([], None, None, None, error)
    driver = rows[0].get("driver_version") if rows else None
    # The query interface has no CUDA version; the table header has it.
    rc, out = _run_smi(smi, [])
    cuda = parse_nvidia_smi_text(out)["cuda_driver"] if rc == 0 else None
    return GpuList(gpus_from_query(rows), driver, cuda, "nvidia-smi", None)


def list_gpus(nvml_lib: str = NVML_LIB, smi: str | None = None) -> GpuList:
    """Every NVIDIA GPU with the driver and its CUDA version.

    Args:
        nvml_lib: The NVML library to load (a path in tests).
        smi: The nvidia-smi to fall back on; default: the one on PATH.

    Returns:
        A :class:`GpuList`. With no driver at all: no GPUs, ``source`` None and an
        ``error`` that says so plainly. Never raises for a missing driver.
    """
    nvml = _NVML.get(nvml_lib, retry=True)
    if nvml is not None:
        # Per-device queries never raise: a value a GPU does not report is None.
        gpus = [nvml.gpu(i) for i in range(nvml.count)]
        error = None if gpus else "NVML found no NVIDIA GPU"
        return GpuList(gpus, nvml.driver_version(), nvml.cuda_driver_version(), "nvml", error)
    nvml_error = _NVML.error
    smi_path = smi if smi is not None else shutil.which("nvidia-smi")
    if smi_path is None:
        if nvml_error is not None and "could not be loaded" in nvml_error:
            return GpuList([], None, None, None, NO_DRIVER)
        return GpuList([], None, None, None, f"{nvml_error}; nvidia-smi not on PATH")
    result = _list_gpus_smi(smi_path)
    if result.error is not None:
        return result._replace(error=f"NVML: {nvml_error}; nvidia-smi: {result.error}")
    if not result.gpus:
        return result._replace(error="nvidia-smi found no NVIDIA GPU")
    return result


def telemetry(nvml_lib: str = NVML_LIB, smi: str | None = None) -> list[dict[str, Any]]:
    """Live readings of every GPU, shaped like ``protocol.GpuSample``; cheap (>= 1 Hz).

    NVML stays open between calls; without it, one ``nvidia-smi --query-gpu`` call. Each
    sample carries the memory clock and the active clock-event reasons.

    Returns:
        One dict per GPU; an empty list where no GPU can be read.
    """
    nvml = _NVML.get(nvml_lib)
    if nvml is not None:
        return [nvml.sample(i) for i in range(nvml.count)]
    smi_path = smi if smi is not None else shutil.which("nvidia-smi")
    if smi_path is None:
        return []
    rows, error = query_gpus(smi_path, TELEMETRY_FIELDS)
    return [] if error is not None else samples_from_query(rows)


# ----------------------------------------------------------------------------- SM count
#: The CUDA driver's soname (the driver installs it beside NVML).
CUDA_LIB = "libcuda.so.1"
#: ``CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`` (cuda.h).
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
#: cuInit on an idle GPU answers well under a second; a hung driver must not hang the probe.
_CUDA_TIMEOUT_S = 10.0
#: What a GPU can have (a B200 has 148; a bound, not a guess about future parts).
_MAX_SMS = 100_000

# NVML has no SM count (its core count needs a per-architecture cores-per-SM table), so
# the CUDA driver is asked: cuDeviceGetAttribute(MULTIPROCESSOR_COUNT) through ctypes. It
# runs in a child process: cuInit in the agent itself would make every fork of it unable
# to use CUDA and would keep the driver's state in a long-lived process, and a hung driver
# is a child to kill, not a thread stuck for good. The child prints one JSON object
# {PCI bus id: SMs}; CUDA_VISIBLE_DEVICES is dropped so it sees the GPUs NVML lists.
_SM_COUNT_SCRIPT = r"""
import ctypes, json, sys
try:
    lib = ctypes.CDLL(sys.argv[1])
except OSError:
    print("{}"); sys.exit(0)
out = {}
n = ctypes.c_int(0)
if lib.cuInit(0) == 0 and lib.cuDeviceGetCount(ctypes.byref(n)) == 0:
    for i in range(min(n.value, 1024)):
        dev, sms = ctypes.c_int(0), ctypes.c_int(0)
        bus = ctypes.create_string_buffer(64)
        if (lib.cuDeviceGet(ctypes.byref(dev), i) == 0
                and lib.cuDeviceGetAttribute(ctypes.byref(sms), %d, dev) == 0
                and lib.cuDeviceGetPCIBusId(bus, 64, dev) == 0):
            key = bus.value.decode("ascii", "replace")
            out[key] = None if key in out else sms.value  # two devices on one bus: MIG
print(json.dumps(out))
""" % CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT

_BUS_ID = re.compile(
    r"^\s*([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-9a-fA-F])\s*$")


def bus_key(bus_id: str | None) -> tuple[int, int, int, int] | None:
    """A PCI bus id as numbers, so NVML's ``00000000:3B:00.0`` and the CUDA driver's
    ``0000:3b:00.0`` compare equal; None for anything else."""
    m = _BUS_ID.match(bus_id or "")
    if m is None:
        return None
    dom, bus, dev, fn = (int(g, 16) for g in m.groups())
    return dom, bus, dev, fn


def parse_sm_counts(text: str) -> dict[tuple[int, int, int, int], int]:
    """The child's JSON (``{bus id: SMs}``) as ``{bus key: SMs}``; whatever is not a bus
    id with a whole count in 1..100,000 is left out (MIG's shared bus ids are None)."""
    try:
        import json

        data = json.loads(text.strip().splitlines()[-1]) if text.strip() else {}
    except ValueError:
        return {}
    out: dict[tuple[int, int, int, int], int] = {}
    if not isinstance(data, dict):
        return out
    for bus, sms in list(data.items())[:1024]:
        key = bus_key(bus) if isinstance(bus, str) else None
        if key is not None and type(sms) is int and 1 <= sms <= _MAX_SMS:
            out[key] = sms
    return out


def sm_counts(cuda_lib: str = CUDA_LIB, python: str | None = None,
              timeout_s: float = _CUDA_TIMEOUT_S) -> dict[tuple[int, int, int, int], int]:
    """Each GPU's SM count from the CUDA driver, by PCI bus key (:func:`bus_key`); empty
    where the driver cannot be loaded, answers nothing, or does not answer in time."""
    import sys

    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    try:
        res = subprocess.run([python or sys.executable, "-I", "-c", _SM_COUNT_SCRIPT, cuda_lib],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, env=env, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return {}
    if res.returncode != 0:
        return {}
    return parse_sm_counts(res.stdout[:1 << 16].decode("utf-8", "replace"))


def add_sm_counts(gpus: list[dict[str, Any]], counts: dict[tuple[int, int, int, int], int]
                  ) -> None:
    """Set each GPU's ``sm_count`` from :func:`sm_counts` where its bus id matches."""
    for gpu in gpus:
        key = bus_key(gpu.get("pci_bus_id"))
        if key is not None and key in counts:
            gpu["sm_count"] = counts[key]
