"""ssh config resolution behaves like OpenSSH's for the options gpuws uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuws.errors import ConfigError
from gpuws.transport.sshconfig import parse_destination, resolve


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "config"
    p.write_text(text)
    return str(p)


def test_first_value_wins_and_wildcards(tmp_path: Path) -> None:
    cfg = write(tmp_path, """
Host gpu-*
  User alice
  Port 2200
  IdentityFile ~/.ssh/gpu_%h
Host gpu-a
  HostName 10.0.0.5
  Port 9999
Host *
  User bob
  IdentityFile ~/.ssh/id_default
  StrictHostKeyChecking accept-new
""")
    t = resolve("gpu-a", cfg)
    assert (t.hostname, t.port, t.user) == ("10.0.0.5", 2200, "alice")
    assert t.identity_files[0].endswith("/.ssh/gpu_10.0.0.5")
    assert t.identity_files[1].endswith("/.ssh/id_default")
    assert t.strict_host_key_checking == "accept-new"
    assert t.known_hosts_name == "[10.0.0.5]:2200"


def test_command_line_wins_over_config(tmp_path: Path) -> None:
    cfg = write(tmp_path, "Host pod\n  HostName h\n  User u\n  Port 22\n")
    t = resolve("carol@pod:2222", cfg)
    assert (t.user, t.port, t.hostname) == ("carol", 2222, "h")
    assert resolve("pod", cfg, port=7, user="dan").port == 7
    assert resolve("pod", cfg).known_hosts_name == "h"


def test_negation_include_proxyjump_and_match(tmp_path: Path) -> None:
    (tmp_path / "extra.conf").write_text("Host pod\n  ProxyJump bastion\n")
    cfg = write(tmp_path, f"Include {tmp_path}/extra.conf\nHost * !pod\n  User other\n"
                          "Match host pod\n  User matched\n")
    t = resolve("pod", cfg)
    assert t.proxy_jump == "bastion"
    assert t.user != "other" and t.user != "matched"
    assert any("Match" in n for n in t.notes)


@pytest.mark.parametrize("text,expected", [
    ("host", (None, "host", None)), ("u@host", ("u", "host", None)),
    ("u@host:2222", ("u", "host", 2222)), ("[::1]:22", (None, "::1", 22)),
    ("a@b@host", ("a@b", "host", None)),
])
def test_parse_destination(text: str, expected: tuple) -> None:
    assert parse_destination(text) == expected


def test_bad_inputs_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="bad port"):
        parse_destination("host:ssh")
    with pytest.raises(ConfigError, match="does not exist"):
        resolve("pod", str(tmp_path / "missing"))
