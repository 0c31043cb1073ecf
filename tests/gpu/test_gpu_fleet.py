"""A fleet on a real GPU: ``gpuws run pod local -w builtin:saxpy --tiers 1``.

Two "pods" on the GPU machine: a real SSH server on loopback (OpenSSH's sshd where it
exists, else tests/gpu/sshserver.py) and the local transport. Both time saxpy at once on
the machine's one GPU, so their samples interleave: the ratio to the first pod says how
much two runs sharing a GPU disturb each other, not how two GPUs compare. What this
checks is the GPU path of the fleet table: every figure shown was measured (Tier-1
median with its CI, GB/s and % of the GPU's peak, the clocks behind it), the ratio has a
bootstrap CI, and the export writes the same table. With GPUWS_GPU_OUT set, the table,
the figures and the export are written there (fleet.json).
Skipped where there is no NVIDIA GPU.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpuws.cli import main

pytestmark = pytest.mark.gpu
if shutil.which("nvidia-smi") is None:
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)

OUT = Path(os.environ["GPUWS_GPU_OUT"]) if os.environ.get("GPUWS_GPU_OUT") else None


def test_fleet_table_on_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    from sshd import SshServer, find_sshd  # type: ignore[import-not-found]

    monkeypatch.setenv("GPUWS_HOME", str(tmp_path / "home"))
    server: Any
    if find_sshd():
        server = SshServer(tmp_path / "sshd").start()
    else:
        from sshserver import AsyncSSHServer  # type: ignore[import-not-found]

        server = AsyncSSHServer(tmp_path / "srv").start()
    try:
        cfg = server.client_files(tmp_path / "client")
        argv = ["run", "pod", "local", "-F", str(cfg), "-w", "builtin:saxpy", "--tiers", "1",
                "--max-seconds", "3"]
        code = main([*argv, "--json"])
        out = capsys.readouterr().out
    finally:
        server.stop()
    result = json.loads(out.strip().splitlines()[-1])
    assert result["type"] == "fleet_result", out[-2000:]
    lines = result["lines"]
    print(json.dumps(lines, indent=2))
    assert code == 0 and result["failed"] == [], out[-2000:]
    for line in lines:
        assert line["median_ms"] and line["ci_low_ms"] <= line["median_ms"] <= line["ci_high_ms"]
        assert line["rate_unit"] == "GB/s" and line["rate"] > 0 and line["pct_peak"] > 0
        assert line["gpu"] and line["driver"] and line["clocks"]
    first, second = lines
    assert first["speedup"] == 1.0
    assert second["speedup_low"] <= second["speedup"] <= second["speedup_high"]
    assert main(["export", "--fleet", result["fleet_id"]]) == 0
    md = capsys.readouterr().out
    assert "| pod | status | GPU | driver |" in md and "`local`" in md
    print(md)
    if OUT:  # one file: few come back from the GPU machine
        (OUT / "fleet.json").write_text(json.dumps({"result": result, "export": md}, indent=2))
