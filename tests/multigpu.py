"""Probes and telemetry of real multi-GPU machines, for the laptop side's displays.

Built from the real ``nvidia-smi -q -x`` captures in ``tests/fixtures/nvidia-smi/`` (see its
README for where each came from) through the agent's own parser
(``gpuws.remote_agent.pod.gpuinfo.parse_nvidia_smi_xml``), so the GPUs, their memory, clocks,
power, clock-event reasons and processes are exactly what such a pod reports. Only the
non-GPU part of the probe (host name, OS, python) is filled in, with plain values.

Imported as ``multigpu`` (``tests`` is on the path).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from gpuws import protocol
from gpuws.live.telemetry import TelemetryHistory
from gpuws.remote_agent.pod.gpuinfo import parse_nvidia_smi_xml

NVIDIA_SMI = Path(__file__).parent / "fixtures" / "nvidia-smi"
#: 2 × RTX A5000, driver 590.44.01, a llama-server on both GPUs.
A5000_X2 = NVIDIA_SMI / "telegraf_rtx_a5000_x2_590.44.01.xml"
#: 4 × Tesla K80, driver 430.26, a python process on GPUs 0 and 1, GPUs 2 and 3 idle.
K80_X4 = NVIDIA_SMI / "pai_tesla_k80_x4_430.26.xml"


def parsed(path: Path) -> dict[str, Any]:
    """The agent's reading of one capture (``driver``, ``cuda_driver``, ``gpus``, ``samples``)."""
    return parse_nvidia_smi_xml(path.read_text())


def probe(path: Path, hostname: str = "multi-gpu-pod") -> protocol.Probe:
    """A probe of the machine the capture came from."""
    smi = parsed(path)
    return msgspec.convert({
        "hostname": hostname, "os": "Ubuntu 22.04.4 LTS", "kernel": "5.15.0-105-generic",
        "arch": "x86_64", "container": [], "virtualization": [],
        "python_path": "/usr/bin/python3", "python_version": "3.10.12", "uid": 0,
        "user": "root", "home": "/root", "gpus": smi["gpus"], "gpu_source": "nvidia-smi",
        "driver": smi["driver"], "cuda_driver": smi["cuda_driver"],
        "counters": {"verdict": "unknown", "reason": "not read in this test"},
    }, protocol.Probe)


def telemetry(path: Path, ticks: int = 30) -> TelemetryHistory:
    """The capture's readings as the agent's Telemetry events, ``ticks`` of them."""
    history = TelemetryHistory()
    event = msgspec.convert({"type": "telemetry", "gpus": parsed(path)["samples"]},
                            protocol.Telemetry)
    for _ in range(ticks):
        history.add(event)
    return history
