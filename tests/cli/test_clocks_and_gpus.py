"""The clocks behind a Tier-1 figure (gpuws.gpu.clocks) and the choice of GPU (gpuws.gpu.gpus).

Readings are real: the H200's 345 MHz idle and 1,980 MHz boost SM clock and its 3,201 MHz
memory clock (``tests/fixtures/ncu-2025.3.1-h200/nvidia_smi_q.xml``, issue 14), the GPUs
of the multi-GPU captures in ``tests/fixtures/nvidia-smi/`` and NVML's clock-event names
as the agent sends them (``gpuws.remote_agent.pod.gpuinfo.CLOCK_EVENT_BITS``).
"""

from __future__ import annotations

import pytest

from gpuws import protocol
from gpuws.errors import UsageError
from gpuws.gpu import clocks, gpus
from gpuws.remote_agent.pod.gpuinfo import CLOCK_EVENT_BITS
from multigpu import A5000_X2, K80_X4, probe  # type: ignore[import-not-found]

H200_IDLE, H200_BOOST, H200_MEM = 345.0, 1980.0, 3201.0


def clock_range(lo: float | None, mid: float | None, hi: float | None,
                events: list[str] | None = None, **extra: float) -> protocol.ClockRange:
    return protocol.ClockRange(samples=12, sm_mhz_min=lo, sm_mhz_median=mid, sm_mhz_max=hi,
                               clock_events=events or [], **extra)


# ----------------------------------------------------------------------------- caution
def test_steady_boost_clock_is_no_caution() -> None:
    c = clock_range(H200_BOOST, H200_BOOST, H200_BOOST, mem_mhz_min=H200_MEM,
                    mem_mhz_max=H200_MEM)
    assert clocks.caution(c) is None
    assert clocks.describe(c) == "SM 1,980 MHz, mem 3,201 MHz"


def test_a_cold_start_from_the_idle_clock_is_cautioned() -> None:
    """The first samples of a cold start run at the 345 MHz idle clock."""
    c = clock_range(H200_IDLE, H200_BOOST, H200_BOOST, mem_mhz_min=H200_MEM,
                    mem_mhz_max=H200_MEM, power_w_max=125.86, temp_c_max=41.0)
    caution = clocks.caution(c)
    assert caution is not None
    assert "SM clock varied 345–1,980 MHz" in caution and "83% of its median" in caution
    assert clocks.describe(c) == ("SM 345–1,980 MHz (median 1,980), mem 3,201 MHz, "
                                  "126 W max, 41 °C")


@pytest.mark.parametrize("lo,hi,cautioned", [
    (1940.0, 2000.0, False),   # (2000 - 1940) / 2000 = 3% exactly: still fine
    (1939.0, 2000.0, True),    # 3.05%
    (1965.0, 1980.0, False),   # one 15 MHz NVML step
])
def test_the_spread_limit_is_three_percent_of_the_median(lo: float, hi: float,
                                                         cautioned: bool) -> None:
    assert (clocks.caution(clock_range(lo, 2000.0, hi)) is not None) is cautioned


def test_idle_and_application_clocks_are_not_throttling() -> None:
    c = clock_range(H200_BOOST, H200_BOOST, H200_BOOST,
                    events=["gpu_idle", "applications_clocks_setting"])
    assert clocks.caution(c) is None


@pytest.mark.parametrize("event", [name for _bit, name in CLOCK_EVENT_BITS
                                   if name not in ("gpu_idle", "applications_clocks_setting")]
                         + ["bit_0x200"])
def test_every_other_reason_is_a_caution(event: str) -> None:
    """Every reason the agent can send but idle and app clocks, and one it does not know."""
    caution = clocks.caution(clock_range(H200_BOOST, H200_BOOST, H200_BOOST,
                                         events=["gpu_idle", event]))
    assert caution is not None and caution.startswith("throttled while sampling (")
    assert clocks.event_label(event) in caution and "idle" not in caution


def test_no_clocks_is_said_never_invented() -> None:
    assert clocks.caution(None) is None
    assert clocks.describe(None) == "clocks not recorded"
    assert clocks.line(None) == "clocks not recorded"
    empty = protocol.ClockRange(samples=0)
    assert clocks.caution(empty) is None
    assert "no reading" in clocks.describe(empty)
    assert clocks.cycle_ratio(0.24, None, 0.20, clock_range(1.0, H200_BOOST, 2.0)) is None


def test_cycle_ratio_takes_the_clock_out() -> None:
    """Same code at 1,755 vs 1,980 MHz: 12.8% faster in time, the same in cycles."""
    slow = clock_range(1755.0, 1755.0, 1755.0)
    fast = clock_range(H200_BOOST, H200_BOOST, H200_BOOST)
    t_slow = 0.240
    t_fast = t_slow * 1755.0 / 1980.0
    assert clocks.cycles_per_call(t_slow, slow) == pytest.approx(0.240e-3 * 1755e6)
    assert clocks.cycle_ratio(t_slow, slow, t_fast, fast) == pytest.approx(1.0)
    # B really is 20% faster in cycles on the same clock.
    assert clocks.cycle_ratio(0.240, fast, 0.200, fast) == pytest.approx(1.2)


# ----------------------------------------------------------------------------- --gpu
@pytest.mark.parametrize("typed,kept", [
    ("0", "0"), (" 7 ", "7"), ("63", "63"), ("007", "7"),
    ("GPU-2a311d9d-4e63-03d1-940a-9fa658b398ad", "GPU-2a311d9d-4e63-03d1-940a-9fa658b398ad"),
    ("GPU-2a31", "GPU-2a31"), ("gpu-2A31", "GPU-2a31"),
    ("MIG-GPU-2a311d9d-4e63-03d1-940a-9fa658b398ad/1/0",
     "MIG-GPU-2a311d9d-4e63-03d1-940a-9fa658b398ad/1/0"),
    ("MIG-c6b4e9a2-3d1f-5b7e-8a6c-0f2e4d6b8a1c", "MIG-c6b4e9a2-3d1f-5b7e-8a6c-0f2e4d6b8a1c"),
])
def test_valid_gpu_forms(typed: str, kept: str) -> None:
    assert gpus.check_syntax(typed) == kept


@pytest.mark.parametrize("typed,says", [
    ("64", "no GPU index above 63"), ("-1", "not a GPU index or UUID"),
    ("0,1", "a run uses one GPU"), ("GPU-", "not a GPU index or UUID"),
    ("GPU-xyz", "not a GPU index or UUID"), ("h200", "not a GPU index or UUID"),
    ("", "not a GPU index or UUID"), ("GPU-0\x1b[2J", "not a GPU index or UUID"),
    ("GPU-" + "a" * 200, "not a GPU index or UUID"),
])
def test_invalid_gpu_forms_say_what_is_valid(typed: str, says: str) -> None:
    with pytest.raises(UsageError) as info:
        gpus.check_syntax(typed)
    assert says in info.value.message and "0..63" in info.value.remedy
    assert "\x1b" not in info.value.one_line()


def test_a_gpu_the_pod_lacks_is_refused_with_the_pods_list() -> None:
    k80 = probe(K80_X4)
    assert gpus.check_on_pod("2", k80) is k80.gpus[2]
    uuid = k80.gpus[1].uuid
    assert uuid is not None
    assert gpus.check_on_pod(uuid[:12].lower(), k80) is k80.gpus[1]
    assert gpus.check_on_pod(None, k80) is None
    with pytest.raises(UsageError) as info:
        gpus.check_on_pod("4", k80)
    assert "the pod has no such GPU" in info.value.message
    assert info.value.remedy.count("Tesla K80") == 4 and uuid in info.value.remedy
    a5000 = probe(A5000_X2)
    with pytest.raises(UsageError, match="names 2 GPUs"):
        gpus.check_on_pod("GPU-12345678", a5000)  # both anonymised UUIDs share the prefix
    no_gpu = protocol.Probe(hostname="h", os="l", kernel="k", arch="x86_64", container=[],
                            virtualization=[], python_path="p", python_version="3", uid=0,
                            user="root", home="/root", gpu_error="no NVIDIA driver")
    with pytest.raises(UsageError, match="the pod has no GPU"):
        gpus.check_on_pod("0", no_gpu)


def test_who_uses_a_gpu_is_named() -> None:
    a5000 = probe(A5000_X2)
    g = a5000.gpus[0]
    assert gpus.processes(g.processes) == "pid 100477 llama-server (21.9 GiB)"
    assert gpus.memory(g) == "21.9 GiB / 24.0 GiB"
    assert gpus.processes([]) == "none" and gpus.processes(None) == "not readable"
    target = protocol.GpuTarget(index=0, uuid=g.uuid, name=g.name, busy=g.processes or [])
    warning = gpus.busy_warning(target)
    assert warning is not None
    assert warning.startswith("GPU 0 (NVIDIA RTX A5000) is busy: 1 other process uses it")
    assert "--gpu" in warning
    assert gpus.busy_warning(protocol.GpuTarget(index=1)) is None
    hostile = [protocol.GpuProcess(pid=1, name="x\x1b]0;owned\x07")]
    assert "\x1b" not in gpus.processes(hostile)
