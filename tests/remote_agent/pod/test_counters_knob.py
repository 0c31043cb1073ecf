"""``GPUWS_COUNTERS=blocked``: the counters taken as blocked whatever the driver allows
(tests/gpu/test_gpu_verdicts.py uses it to see the counters-blocked verdicts on a GPU
whose counters are open), read from this machine's real /proc files."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gpuws.protocol import Counters
from gpuws.remote_agent.pod import probe


def test_the_knob_blocks_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    params = tmp_path / "params"
    params.write_text("RmProfilingAdminOnly: 0\n")
    open_ = probe.read_counters("580.159.04", params_path=str(params))
    assert open_["verdict"] == "allowed"
    monkeypatch.setenv("GPUWS_COUNTERS", "blocked")
    shut = probe.read_counters("580.159.04", params_path=str(params))
    assert shut["verdict"] == "blocked"
    assert shut["reason"] == ("treated as blocked because GPUWS_COUNTERS=blocked is set in the "
                              "agent's environment (what the driver allows: allowed)")
    assert shut["rm_profiling_admin_only"] is False  # the facts stay as read
    msgspec.convert(shut, Counters, strict=True)
    monkeypatch.setenv("GPUWS_COUNTERS", "anything else")
    assert probe.read_counters("580.159.04", params_path=str(params))["verdict"] == "allowed"
