"""Config file, rate resolution and session economics."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from gpuws.config import Config, HostConfig, host_config, load_config
from gpuws.errors import ConfigError, StoreError, UsageError
from gpuws.sessions.cost import economics, resolve_budget, resolve_rate
from gpuws.sessions.store import Store

CONFIG = """
[defaults]
rate_usd_per_hour = 2.0

[hosts.pod]
rate_usd_per_hour = 3.99
budget_usd = 20.0

[hosts."root@h100:2222"]
budget_usd = 5
"""


# ----------------------------------------------------------------------------- config
def test_config_is_read_strictly(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(CONFIG)
    config = load_config(path)
    assert config.defaults == HostConfig(rate_usd_per_hour=2.0)
    assert config.hosts["pod"] == HostConfig(rate_usd_per_hour=3.99, budget_usd=20.0)
    # A host entry inherits what it leaves out from [defaults].
    assert host_config(config, "root@h100:2222") == HostConfig(rate_usd_per_hour=2.0,
                                                               budget_usd=5.0)
    # user@host:port finds the bare host's entry; an unknown host gets the defaults.
    assert host_config(config, "ubuntu@pod:22").rate_usd_per_hour == 3.99
    assert host_config(config, "elsewhere") == config.defaults
    assert host_config(config, None) == config.defaults


@pytest.mark.parametrize(("text", "reason"), [
    ("[hosts.pod]\nrate_usd_per_hour = 'cheap'\n",
     r'hosts\.pod\.rate_usd_per_hour: expected a number, got "cheap"'),
    ('[hosts."a.b"]\nbudget_usd = true\n', r'hosts\."a\.b"\.budget_usd: expected a number'),
    ("[hosts.pod]\nrate_per_hour = 3\n", r"unknown key 'rate_per_hour'"),
    ("[hosts.pod]\nrate_usd_per_hour = -1\n", r">= 0"),
    ("[hosts.pod\n", r"invalid TOML"),
    ("colour = 'blue'\n", r"unknown key 'colour'"),
])
def test_bad_config_names_file_and_reason(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=reason) as info:
        load_config(path)
    assert str(path) in info.value.message


def test_config_file_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWS_CONFIG", str(tmp_path / "absent.toml"))
    assert load_config() == Config()  # no file: defaults
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "absent.toml")  # named explicitly: must exist
    (tmp_path / "absent.toml").write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config()


def test_rate_resolution_order() -> None:
    config = Config(defaults=HostConfig(rate_usd_per_hour=1.5, budget_usd=9.0),
                    hosts={"pod": HostConfig(rate_usd_per_hour=3.99)})
    assert resolve_rate(2.5, "pod", config) == 2.5  # the flag wins
    assert resolve_rate(0.0, "pod", config) == 0.0  # a free pod is a rate, not "unset"
    assert resolve_rate(None, "pod", config) == 3.99
    assert resolve_rate(None, "other", config) == 1.5
    assert resolve_rate(None, "pod", Config()) is None  # nobody said: the UI asks
    assert resolve_budget(None, "pod", config) == 9.0
    assert resolve_budget(3.0, "pod", config) == 3.0
    with pytest.raises(UsageError):
        resolve_rate(-1.0, "pod", config)
    with pytest.raises(UsageError):
        resolve_budget(-1.0, "pod", config)


# ----------------------------------------------------------------------------- economics
def test_economics_of_a_recorded_session(store: Store, recorded: ModuleType) -> None:
    t0 = recorded.T0
    sid = store.open_session("pod", "local", None, 3.60, budget_usd=10.0, started=t0 - 100)
    store.ingest_many(sid, recorded.saxpy_run("r1"))
    store.add_phase(sid, None, "provisioning (ncu install)", t0 - 90, t0 - 30)
    # A pull that overlaps the end of tier 3: counted once in busy time.
    store.add_phase(sid, "r1", "transfer saxpy.ncu-rep", t0 + 15.0, t0 + 20.0)
    store.end_session(sid, t0 + 1100)

    e = economics(store, sid)
    assert e.connected_s == 1200 and not e.live
    assert e.total_cost_usd == pytest.approx(1.20)  # 1200 s × $3.60/h
    tiers = [r for r in e.rows if r.phase.startswith("tier")]
    assert [r.phase for r in tiers] == ["tier 1 (CUDA events)", "tier 2 (timeline)",
                                        "tier 3 (Nsight Compute)"]
    assert [round(r.duration_s, 2) for r in tiers] == [8.02, 2.96, 4.83]
    assert tiers[0].cost_usd == pytest.approx(8.02 * 3.60 / 3600, rel=1e-3)
    assert tiers[0].gpu_s == pytest.approx(0.048278, abs=1e-6)
    # Busy: 60 s provisioning + tiers 0.2..16.21 s (with gaps between tiers) + the pull
    # past tier 3's end (16.21..20).
    busy = 60 + 8.02 + 2.96 + 4.83 + (20.0 - 16.21)
    assert e.busy_s == pytest.approx(busy, abs=0.01)
    assert e.idle_s == pytest.approx(1200 - busy, abs=0.01)
    assert e.idle_cost_usd == pytest.approx((1200 - busy) * 3.6 / 3600, abs=1e-4)
    assert e.idle_pct == pytest.approx(100 * (1200 - busy) / 1200, abs=0.01)
    assert e.idle_warning  # 93% idle, 18 minutes
    assert not e.budget_warning and not e.over_budget


def test_budget_and_open_session(store: Store, recorded: ModuleType) -> None:
    t0 = recorded.T0
    sid = store.open_session("pod", "local", None, 36.0, budget_usd=1.0, started=t0)
    store.ingest_many(sid, recorded.saxpy_run("r1", t0=t0 + 1))
    early = economics(store, sid, now=t0 + 60)
    assert early.live and early.connected_s == 60
    assert early.total_cost_usd == pytest.approx(0.60)
    assert not early.budget_warning and not early.idle_warning  # idle, but only 44 s
    near = economics(store, sid, now=t0 + 85)
    assert near.budget_warning and not near.over_budget  # $0.85 of $1
    over = economics(store, sid, now=t0 + 101)
    assert over.budget_warning and over.over_budget


def test_unfinished_phase_and_unknown_rate(store: Store, recorded: ModuleType) -> None:
    t0 = recorded.T0
    sid = store.open_session("pod", "local", None, None, started=t0)
    # The run was cut off during tier 3: its phase has no end and runs to the session's end.
    lines = recorded.saxpy_run("r1", t0=t0 + 1)
    cut = next(i for i, line in enumerate(lines) if b'"ncu_progress"' in line)
    store.ingest_many(sid, lines[:cut])
    store.end_session(sid, t0 + 30)
    e = economics(store, sid)
    last = e.rows[-1]
    assert last.open and last.phase == "tier 3 (Nsight Compute)"
    assert last.started + last.duration_s == t0 + 30
    assert e.total_cost_usd is None and e.idle_cost_usd is None and last.cost_usd is None
    assert not e.budget_warning
    with pytest.raises(StoreError, match="before it starts"):
        store.add_phase(sid, None, "transfer", t0 + 5, t0 + 4)
    with pytest.raises(StoreError, match="no session"):
        economics(store, "missing")


def test_phase_outside_the_session_is_clipped(store: Store, recorded: ModuleType) -> None:
    t0 = recorded.T0
    sid = store.open_session("pod", "local", None, 1.0, started=t0)
    store.add_phase(sid, None, "transfer", t0 - 50, t0 + 10)  # began before we connected
    store.end_session(sid, t0 + 20)
    e = economics(store, sid)
    assert e.busy_s == 10 and e.idle_s == 10
    assert e.rows[0].duration_s == 60  # the phase itself is shown whole
