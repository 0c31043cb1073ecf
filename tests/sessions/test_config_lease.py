"""The config's lease keys (issue 22): start/stop argvs, the pod's own stop, the idle limit,
whether a run holds the stop off, and what a spent budget does; merged field by field."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuws.config import HostConfig, host_config, load_config
from gpuws.errors import ConfigError

CONFIG = """
[defaults]
rate_usd_per_hour = 2.0
idle_stop_minutes = 30
stop_on_pod = ["sudo", "shutdown", "-h", "now"]

[hosts.pod]
start = ["runpodctl", "start", "pod", "abc123"]
stop = ["runpodctl", "stop", "pod", "abc123"]
stop_on_pod = ["sh", "-c", "runpodctl stop pod $RUNPOD_POD_ID"]
idle_stop_minutes = 0.05
stop_running = true
budget_action = "stop"

[hosts.vm]
budget_usd = 10
"""


def test_every_lease_key_is_read_and_merged_over_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(CONFIG)
    config = load_config(path)
    pod = host_config(config, "root@pod:2222")
    assert pod.start == ["runpodctl", "start", "pod", "abc123"]
    assert pod.stop == ["runpodctl", "stop", "pod", "abc123"]
    assert pod.stop_on_pod == ["sh", "-c", "runpodctl stop pod $RUNPOD_POD_ID"]
    assert pod.idle_stop_minutes == 0.05  # fractional: tests use seconds
    assert pod.may_stop_running and pod.stops_at_budget
    assert pod.rate_usd_per_hour == 2.0  # left out: from [defaults]
    # A host that sets only its budget takes every lease key from [defaults], and the two
    # keys with a default mean it: a run holds the stop off, a spent budget only warns.
    vm = host_config(config, "vm")
    assert vm == HostConfig(rate_usd_per_hour=2.0, budget_usd=10.0, idle_stop_minutes=30.0,
                            stop_on_pod=["sudo", "shutdown", "-h", "now"])
    assert not vm.may_stop_running and not vm.stops_at_budget
    assert vm.start is None and vm.stop is None


@pytest.mark.parametrize(("text", "reason"), [
    ("[hosts.pod]\nstart = 'runpodctl start pod x'\n",
     r'start: expected a list, got "runpodctl start pod x"'),
    ("[hosts.pod]\nstop = []\n", r"length >= 1"),
    ("[hosts.pod]\nstop_on_pod = ['']\n", r"length >= 1"),
    ("[hosts.pod]\nstart = ['gcloud', 3]\n", r"start\[1\]: expected a string, got 3"),
    ("[hosts.pod]\nidle_stop_minutes = 0\n", r"> 0"),
    ("[hosts.pod]\nidle_stop_minutes = -5\n", r"> 0"),
    ("[hosts.pod]\nstop_running = 'yes'\n", r'expected true or false, got "yes"'),
    ("[hosts.pod]\nbudget_action = 'halt'\n", "'halt' is not one of \"warn\", \"stop\""),
    ("[hosts.pod]\nidle_stop = 5\n", r"unknown key 'idle_stop'"),
])
def test_bad_lease_keys_are_refused_with_every_real_key_named(
        tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=reason) as info:
        load_config(path)
    assert "hosts.pod" in info.value.message  # an unknown key's table is named too
    if "unknown key" in reason:
        # The remedy names every real key, the lease's included (a typo must find its
        # word); for a wrong value it is not noise behind the line (finding 25).
        for key in ("start", "stop", "stop_on_pod", "idle_stop_minutes", "stop_running",
                    "budget_action", "rate_usd_per_hour", "max_output_mib"):
            assert key in info.value.remedy
    else:
        assert "rate_usd_per_hour" not in info.value.remedy
