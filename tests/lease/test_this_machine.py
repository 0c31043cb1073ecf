"""Issue 31 (part A): gpuws never stops the laptop unless the person named it for that.

A lease (``idle_stop_minutes`` + ``stop_on_pod``) or a budget stop in ``[defaults]`` is
meant for pods; on ``local``, or on a host that turns out to be this very machine (the
test's real sshd on 127.0.0.1 IS this machine: its probe carries this machine's id), it is
not armed, and gpuws says so once. Only the host's own ``[hosts.NAME]`` table arms it
there. Through the real CLI, against the real sshd and the real local agent; the
``stop_on_pod`` only writes a marker (it stands in for ``shutdown -h now``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuws import protocol
from gpuws.cli import main
from gpuws.config import Config, HostConfig, host_config, withheld_defaults
from gpuws.live.uptime.lease import is_this_machine
from gpuws.remote_agent.pod.probe import host_id, machine_ids
from lease.leasekit import script, wait_marker  # type: ignore[import-not-found]
from sshd import SshServer  # type: ignore[import-not-found]

IDLE_MIN = 0.05  # 3 s
LEASE_KEYS = ["stop_on_pod", "idle_stop_minutes"]


def _write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> Path:
    """The config, with the marker-writing ``stop_on_pod`` as ``{stop_on_pod}``."""
    marker = tmp_path / "lease-fired"
    on_pod = script(tmp_path / "stop_on_pod.sh", f"date +%s.%N > {marker}\n")
    cfg = tmp_path / "config.toml"
    cfg.write_text(text.replace("{stop_on_pod}", on_pod).replace("{idle}", str(IDLE_MIN)))
    monkeypatch.setenv("GPUWS_CONFIG", str(cfg))
    return marker


DEFAULTS_LEASE = '[defaults]\nidle_stop_minutes = {idle}\nstop_on_pod = ["{stop_on_pod}"]\n'


def _local_cache() -> Path:
    """Where ``local``'s agent keeps its lease (tests/conftest.py points it at tmp_path)."""
    return Path(os.environ["GPUWS_POD_CACHE"])


def _doctor(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str]:
    assert main(["doctor", *argv, "--json"]) == 0
    got = capsys.readouterr()
    return json.loads(got.out)["lease"], got.err


def test_a_defaults_lease_never_arms_on_local_and_says_why_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Finding 1 of the newcomer review, as it was done: `[defaults]` lease, `doctor local`."""
    _write(tmp_path, monkeypatch, DEFAULTS_LEASE)
    lease, err = _doctor(["local"], capsys)
    assert lease["armed"] is False, lease
    assert lease["withheld_defaults"] == LEASE_KEYS
    assert lease["said"] == ("no auto-stop: off on this machine: only [hosts.local] arms a "
                             "lease here, not [defaults]")
    assert err.count("gpuws: note:") == 1, err
    assert "local runs on this machine: stop_on_pod, idle_stop_minutes in [defaults] not " \
           "applied" in err and "under [hosts.local]" in err
    # Nothing was handed to the lease process here: no settings, no log line.
    assert not (_local_cache() / "lease" / "settings.json").exists()
    assert not (_local_cache() / "lease" / "log").exists()
    # The engine's faces (`run`, `connect`, `scripts/run`) say it once too, as a warning.
    assert main(["run", "local", "-w", "cmd:true"]) == 0
    err = capsys.readouterr().err
    assert err.count("gpuws: note: local runs on this machine") == 1, err
    assert not (_local_cache() / "lease" / "settings.json").exists()


def test_the_hosts_own_table_arms_a_lease_on_local(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path, monkeypatch, DEFAULTS_LEASE.replace("{idle}", "600")
           + '[hosts.local]\nidle_stop_minutes = 600\nstop_on_pod = ["{stop_on_pod}"]\n')
    try:
        lease, err = _doctor(["local"], capsys)
        assert lease["armed"] is True and lease["idle_s"] == 600 * 60, lease
        assert lease["withheld_defaults"] == [] and "note:" not in err
        assert (_local_cache() / "lease" / "settings.json").exists()
    finally:
        (_local_cache() / "lease" / "settings.json").unlink(missing_ok=True)


def test_a_defaults_lease_never_arms_through_sshd_on_127_0_0_1_and_its_table_does(
        pod: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The alias `pod` is 127.0.0.1: this machine, found by its probe's machine id. The
    same keys under [hosts.pod] arm the lease, and it fires: the check is what held it."""
    marker = _write(tmp_path, monkeypatch, DEFAULTS_LEASE)
    ssh = str(pod.client_files(tmp_path / "ssh"))
    lease, err = _doctor(["pod", "-F", ssh], capsys)
    assert lease["armed"] is False and lease["this_machine"] is True, lease
    assert "only [hosts.pod] arms a lease here" in lease["said"]
    assert err.count("gpuws: note:") == 1, err
    assert "pod is this machine: stop_on_pod, idle_stop_minutes in [defaults] not applied" \
           in err and "under [hosts.pod]" in err
    assert main(["run", "pod", "-F", ssh, "-w", "cmd:true"]) == 0
    err = capsys.readouterr().err
    assert err.count("gpuws: note: pod is this machine") == 1, err
    assert not (pod.pod_cache / "lease" / "settings.json").exists()
    assert not (pod.pod_cache / "lease" / "log").exists()
    assert not marker.exists()

    # Named for it in its own table, the same lease arms, and fires after the idle time.
    _write(tmp_path, monkeypatch,
           '[hosts.pod]\nidle_stop_minutes = {idle}\nstop_on_pod = ["{stop_on_pod}"]\n')
    lease, err = _doctor(["pod", "-F", ssh], capsys)
    assert lease["armed"] is True and lease["withheld_defaults"] == [] and "note:" not in err
    wait_marker(marker)


# ----------------------------------------------------------------------------- the rule
def test_host_config_keeps_every_stopping_key_of_defaults_off_this_machine() -> None:
    every = HostConfig(rate_usd_per_hour=2.0, budget_usd=5.0, stop=["x"], stop_on_pod=["y"],
                       idle_stop_minutes=1.0, stop_running=True, budget_action="stop")
    config = Config(defaults=every, hosts={"pod": HostConfig(stop=["own"])})
    # A pod elsewhere inherits everything, as before.
    assert host_config(config, "gpu1") == every
    assert withheld_defaults(config, "gpu1") == []
    # local, and a pod found to be this machine: only what is not a stop.
    for host, here in (("local", False), ("gpu1", True)):
        cfg = host_config(config, host, this_machine=here)
        assert cfg == HostConfig(rate_usd_per_hour=2.0, budget_usd=5.0)
        assert not cfg.stops_at_budget and not cfg.may_stop_running
        assert withheld_defaults(config, host, this_machine=here) == [
            "stop", "stop_on_pod", "idle_stop_minutes", "stop_running", "budget_action"]
    # Its own table still counts; only what it leaves out is withheld.
    assert host_config(config, "pod", this_machine=True).stop == ["own"]
    assert "stop" not in withheld_defaults(config, "pod", this_machine=True)


def _probe(**ids: Any) -> dict[str, Any]:
    return dict(hostname="h", os="o", kernel="k", arch="a", container=[], virtualization=[],
                python_path="/p", python_version="3", uid=0, user="u", home="/h", **ids)


@pytest.mark.parametrize("value", [
    "A" * 8, "0" * 65, "", "../../etc/passwd", "3d12\n", "\x1b]0;x\x07", "ab cd", 7, [],
])
def test_a_hostile_machine_id_from_the_pod_is_refused(value: Any) -> None:
    """The pod's word crosses the wire: only 1-64 lowercase hex digits and dashes."""
    for field in ("machine_id", "boot_id"):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(_probe(**{field: value}), protocol.Probe)


def test_the_probe_carries_this_machines_ids_and_only_equal_ids_are_this_machine(
        tmp_path: Path) -> None:
    mine = machine_ids()
    # Every Linux kernel has a boot id; a container may have no /etc/machine-id (the GPU
    # machine's had none: docs/gpu-validation.md run 19), and the boot id alone decides.
    assert mine["boot_id"] is not None
    probe = msgspec.convert(_probe(**mine), protocol.Probe)
    assert is_this_machine(probe)
    assert is_this_machine(msgspec.convert(_probe(boot_id=mine["boot_id"]), protocol.Probe))
    other = msgspec.convert(_probe(machine_id="0" * 32, boot_id="1" * 36), protocol.Probe)
    assert not is_this_machine(other)
    assert not is_this_machine(msgspec.convert(_probe(), protocol.Probe))  # older agent
    assert not is_this_machine(None)
    # What the agent sends is cleaned the same way the laptop checks it.
    (tmp_path / "mid").write_text("  3D1219C7\n")
    (tmp_path / "bad").write_text("not an id\n")
    assert machine_ids([str(tmp_path / "none"), str(tmp_path / "mid")],
                       str(tmp_path / "bad")) == {"machine_id": "3d1219c7", "boot_id": None}
    assert host_id(None) is None and host_id("x" * 10) is None


# ----------------------------------------------------------------------------- gpuws stop
def test_gpuws_stop_never_runs_a_defaults_stop_on_this_machine(
        pod: SshServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`gpuws stop ALIAS` where the alias is this machine: a `stop` inherited from
    [defaults] (`shutdown -h now` in the README's presets) is refused in one line, whether
    the host answers (the real sshd on 127.0.0.1; its probe is this machine's) or not (a
    loopback alias nothing listens on); the host's own table's stop runs."""
    marker = tmp_path / "stopped"
    stop = script(tmp_path / "stop.sh", f"date +%s.%N > {marker}\n")
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[defaults]\nstop = ["{stop}"]\n')
    monkeypatch.setenv("GPUWS_CONFIG", str(cfg))
    ssh = pod.client_files(tmp_path / "ssh")
    with open(ssh, "a") as f:
        f.write("\nHost nothing-here\n  HostName 127.0.0.1\n  Port 9\n")
    for alias in ("pod", "nothing-here", "local"):
        assert main(["stop", alias, "-F", str(ssh), "--wait", "1"]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("gpuws: ") and (
            f"{alias} is this machine: the `stop` in [defaults] is for pods and never runs "
            "on it") in line, line
        assert f"under [hosts.{alias}]" in line
        assert not marker.exists()
    # Its own table names the stop for it: that one runs (the sshd keeps answering, so
    # the stop is then reported as not taking effect; the marker is what matters here).
    cfg.write_text(f'[defaults]\nstop = ["{stop}"]\n[hosts.pod]\nstop = ["{stop}"]\n')
    main(["stop", "pod", "-F", str(ssh), "--wait", "1"])
    capsys.readouterr()
    assert marker.exists()
