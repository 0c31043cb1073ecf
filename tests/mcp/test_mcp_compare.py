"""``compare`` and ``results`` through ``gpuws mcp`` on recorded runs (real H200 figures).

The runs are the event streams of tests/sessions/recorded.py stored as a pod would send
them; the client is the MCP SDK's stdio client on a real ``gpuws mcp`` process. The
verdict must be the one ``gpuws watch`` prints for the same two runs.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import pytest

from gpuws import protocol
from gpuws.sessions.compare import change_text, compare_runs, verdict_word
from gpuws.sessions.store import Store

from .mcpclient import mcp_client

pytestmark = pytest.mark.timeout(180)


def _recorded() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gpuws_mcp_recorded", Path(__file__).parents[1] / "sessions" / "recorded.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REC = _recorded()
IDS = {"a": "20261121-120000-aaaaaa", "faster": "20261121-120100-bbbbbb",
       "same": "20261121-120200-cccccc", "h100": "20261121-120300-dddddd",
       "slowclock": "20261121-120400-eeeeee", "clocked": "20261121-120500-ffffff"}


def _with_clocks(lines: list[bytes], sm_mhz: float) -> list[bytes]:
    """The run's Tier-1 result as NVML would have filled it: the SM clock it saw."""
    out = []
    for line in lines:
        ev = json.loads(line)
        if ev["type"] == "tier1_result":
            ev["clocks"] = {"samples": 40, "sm_mhz_min": sm_mhz, "sm_mhz_median": sm_mhz,
                            "sm_mhz_max": sm_mhz, "sm_mhz_ceiling": 1980.0}
        out.append(json.dumps(ev).encode() + b"\n")
    return out


def _seed() -> None:
    h200 = msgspec.convert(REC.probe(), protocol.Probe)
    raw = REC.probe()
    raw["gpus"][0]["name"] = "NVIDIA H100 80GB HBM3"
    h100 = msgspec.convert(raw, protocol.Probe)
    t0 = REC.T0
    with Store() as store:
        sid = store.open_session("h200", "ssh+sftp", h200, 3.99, started=t0 - 10)
        store.ingest_many(sid, REC.saxpy_run(IDS["a"], tiers=(1,)))
        store.ingest_many(sid, REC.saxpy_run(IDS["faster"], t0=t0 + 60, median_ms=0.200,
                                             seed=2, tiers=(1,)))
        store.ingest_many(sid, REC.saxpy_run(IDS["same"], t0=t0 + 120, seed=3, tiers=(1,)))
        store.ingest_many(sid, _with_clocks(REC.saxpy_run(IDS["clocked"], t0=t0 + 180,
                                                          seed=4, tiers=(1,)), 1980.0))
        store.ingest_many(sid, _with_clocks(REC.saxpy_run(IDS["slowclock"], t0=t0 + 240,
                                                          seed=5, tiers=(1,)), 1400.0))
        store.end_session(sid, t0 + 300)
        other = store.open_session("h100", "ssh+sftp", h100, 2.49, started=t0 + 400)
        store.ingest_many(other, REC.saxpy_run(IDS["h100"], t0=t0 + 410, seed=6, tiers=(1,)))
        store.end_session(other, t0 + 500)


def _text(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def test_compare_matches_watch_and_refuses_other_provenance() -> None:
    _seed()
    with Store() as store:
        watch_faster = compare_runs(store, IDS["a"], IDS["faster"]).tier1
        watch_same = compare_runs(store, IDS["a"], IDS["same"]).tier1
    async with mcp_client() as client:
        faster = await client.call_tool("compare", {"run_a": IDS["a"][:17],
                                                    "run_b": IDS["faster"]})
        same = await client.call_tool("compare", {"run_a": IDS["a"], "run_b": IDS["same"]})
        h100 = await client.call_tool("compare", {"run_a": IDS["a"], "run_b": IDS["h100"]})
        clocks = await client.call_tool("compare", {"run_a": IDS["clocked"],
                                                    "run_b": IDS["slowclock"]})
        itself = await client.call_tool("compare", {"run_a": IDS["a"], "run_b": IDS["a"]})
        results = await client.call_tool("results", {"run_id": IDS["h100"]})
    assert not faster.is_error, _text(faster)
    f = faster.structured_content
    assert f is not None
    assert f["verdict"] == verdict_word(watch_faster) == "faster"
    assert f["change"] == change_text(watch_faster)
    assert f["ci_low"] <= f["speedup"] <= f["ci_high"] and f["confidence"] == 0.95
    assert f["provenance_a"]["gpu_name"] == "NVIDIA H200"
    assert same.structured_content is not None
    assert same.structured_content["verdict"] == verdict_word(watch_same) == "no difference"

    assert h100.is_error
    assert _text(h100) == (
        f"gpuws: not comparable: {IDS['h100']} cannot be compared with {IDS['a']}: they ran "
        "on different GPU models (A NVIDIA H200, B NVIDIA H100 80GB HBM3) — compare runs "
        "made on the same GPU model, at like clocks and in the same timing mode")
    assert clocks.is_error
    assert "SM clocks were far apart (A median 1980 MHz, B 1400 MHz" in _text(clocks)
    assert itself.is_error and "are the same run" in _text(itself)

    r = results.structured_content
    assert r is not None
    assert r["tier1"]["median_ms"] == pytest.approx(0.240, rel=0.05)
    prov = r["provenance"]
    assert prov["gpu_name"] == "NVIDIA H100 80GB HBM3"
    assert prov["gpu_uuid"] and prov["driver"]
    # Not made through gpuws mcp: which gpuws recorded it is not known, and says so.
    assert prov["gpuws_version"] is None
