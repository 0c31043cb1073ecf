"""Where to connect is OpenSSH's answer: compared field by field with ``ssh -G``.

Each config of the matrix is resolved twice, by ``ssh -G`` (what gpuws uses where
``ssh`` is installed) and by asyncssh's config support (what it uses where it is not),
and both are compared with the raw ``ssh -G`` output: HostName, Port, User,
IdentityFile, CertificateFile, ProxyJump/ProxyCommand, HostKeyAlias, ServerAlive*,
IdentityAgent, IdentitiesOnly, ConnectTimeout. Tokens that ``ssh -G`` leaves for
``ssh`` to expand at use (``%h``, ``%r``, ``${VAR}`` in IdentityFile) are expanded here
the way ssh_config(5) says.
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuws.errors import ConfigError
from gpuws.transport.sshconfig import (
    SSHTarget,
    config_hosts,
    expand_path,
    parse_destination,
    resolve,
)

SSH = shutil.which("ssh")
NEEDS_SSH = pytest.mark.skipif(SSH is None, reason="the OpenSSH client is not installed "
                                                   "(scripts/test installs openssh-client)")

#: (name, config text, destination, -p, -l). ``{d}`` is the test's directory.
MATRIX = [
    ("first value wins, wildcards",
     "Host gpu-*\n  User alice\n  Port 2200\n  IdentityFile ~/.ssh/gpu_%h_%r\n"
     "Host gpu-a\n  HostName 10.0.0.5\n  Port 9999\nHost *\n  User bob\n"
     "  IdentityFile ~/.ssh/id_default\n", "gpu-a", None, None),
    ("command line wins", "Host pod\n  HostName h\n  User u\n  Port 22\n", "carol@pod:2222",
     None, None),
    ("-p and -l", "Host pod\n  HostName h\n  User u\n  Port 22\n", "pod", 7, "dan"),
    ("Include inside a Host block that does not match",
     "Host other\n  Include {d}/inc.conf\nHost pod\n  HostName 127.0.0.1\n", "pod",
     None, None),
    ("Include inside the matching block",
     "Host pod\n  Include {d}/inc.conf\n  HostName 127.0.0.2\n", "pod", None, None),
    ("Match host and Match all",
     "Host pod\n  HostName 10.9.9.9\nMatch host 10.9.9.9\n  Port 2022\n"
     "Match all\n  User matched\n  ServerAliveInterval 7\n", "pod", None, None),
    ("Match originalhost and negation",
     "Match originalhost pod,!nope\n  HostName 10.1.1.1\n  HostKeyAlias pod-key\n", "pod",
     None, None),
    ("quoted values", 'Host pod\n  HostName "127.0.0.1"\n  User "u ser"\n'
                      '  IdentityFile "{d}/my key"\n', "pod", None, None),
    ("tokens", "Host pod\n  HostName %h.example.net\n  IdentityFile {d}/k_%n_%p_%r\n"
               "  CertificateFile {d}/c_%h-cert.pub\n  Port 2201\n  User tok\n", "pod",
     None, None),
    ("ProxyJump chain", "Host pod\n  HostName 10.0.0.7\n  ProxyJump a@hop1:2201,hop2\n",
     "pod", None, None),
    ("ProxyCommand", "Host pod\n  ProxyCommand ssh -W %h:%p bastion\n  HostName 10.0.0.8\n",
     "pod", None, None),
    ("ProxyCommand before ProxyJump: first wins",
     "Host pod\n  ProxyCommand nc %h %p\n  ProxyJump hop\n", "pod", None, None),
    ("agent and identities", "Host pod\n  IdentityAgent {d}/agent.sock\n"
                             "  IdentitiesOnly yes\n  IdentityFile {d}/k.pub\n"
                             "  ConnectTimeout 4\n  ServerAliveCountMax 5\n", "pod", None, None),
    ("no agent", "Host pod\n  IdentityAgent none\n", "pod", None, None),
    ("environment", "Host pod\n  IdentityFile ${{GPUWS_TEST_KEYDIR}}/id\n", "pod", None, None),
    ("user@host without config", "", "someone@10.2.3.4:2022", None, None),
]


def _write(tmp_path: Path, text: str) -> str:
    (tmp_path / "inc.conf").write_text("Port 4444\nUser included\n")
    cfg = tmp_path / "config"
    cfg.write_text(text.format(d=tmp_path))
    return str(cfg)


def _ssh_g(cfg: str, host: str, port: int | None, user: str | None) -> dict[str, list[str]]:
    assert SSH is not None
    argv = [SSH, "-G", "-F", cfg]
    argv += ["-p", str(port)] if port else []
    argv += ["-l", user] if user else []
    out = subprocess.run([*argv, host], capture_output=True, text=True, check=True).stdout
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        found.setdefault(key, []).append(value)
    return found


def _expected(g: dict[str, list[str]], t: SSHTarget) -> dict[str, object]:
    """The fields gpuws uses, straight from ``ssh -G``'s own lines."""
    def one(key: str) -> str | None:
        return g[key][0] if key in g else None

    proxy = one("proxycommand")
    return {
        "hostname": one("hostname"), "port": int(one("port") or 0), "user": one("user"),
        "identity_files": [expand_path(p, t) for p in g.get("identityfile", [])],
        "certificate_files": [expand_path(p, t) for p in g.get("certificatefile", [])
                              if p != "none"],
        "proxy_jump": one("proxyjump"),
        "proxy_command": proxy.replace("%h", t.hostname).replace("%p", str(t.port))
        if proxy else None,
        "host_key_alias": one("hostkeyalias"),
        "server_alive_interval": float(one("serveraliveinterval") or 0),
        "server_alive_count_max": int(one("serveralivecountmax") or 0),
        "identities_only": one("identitiesonly") == "yes",
        "connect_timeout": None if one("connecttimeout") == "none"
        else float(one("connecttimeout") or 0),
        "identity_agent": {"none": "", None: None}.get(one("identityagent"),
                                                       one("identityagent")),
    }


def _fields(t: SSHTarget) -> dict[str, object]:
    return {k: getattr(t, k) for k in ("hostname", "port", "user", "identity_files",
                                       "certificate_files", "proxy_jump", "proxy_command",
                                       "host_key_alias", "server_alive_interval",
                                       "server_alive_count_max", "identities_only",
                                       "connect_timeout", "identity_agent")}


@NEEDS_SSH
@pytest.mark.parametrize(("name", "text", "dest", "port", "user"), MATRIX,
                         ids=[m[0] for m in MATRIX])
def test_matrix_is_what_ssh_g_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str,
                                   text: str, dest: str, port: int | None,
                                   user: str | None) -> None:
    monkeypatch.setenv("GPUWS_TEST_KEYDIR", str(tmp_path / "keys"))
    cfg = _write(tmp_path, text)
    target = resolve(dest, cfg, port=port, user=user)
    assert target.source == "ssh -G"
    d_user, host, d_port = parse_destination(dest)
    g = _ssh_g(cfg, host, port or d_port, user or d_user)
    assert _fields(target) == _expected(g, target), name


@NEEDS_SSH
@pytest.mark.parametrize(("name", "text", "dest", "port", "user"), MATRIX,
                         ids=[m[0] for m in MATRIX])
def test_without_ssh_asyncssh_gives_the_same_answer(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch, name: str,
                                                    text: str, dest: str, port: int | None,
                                                    user: str | None) -> None:
    monkeypatch.setenv("GPUWS_TEST_KEYDIR", str(tmp_path / "keys"))
    cfg = _write(tmp_path, text)
    with_ssh = resolve(dest, cfg, port=port, user=user)
    without = resolve(dest, cfg, port=port, user=user, ssh_binary="")
    assert without.source == "asyncssh config"
    assert "asyncssh" in without.notes[-1]
    assert _fields(without) == _fields(with_ssh), name


@NEEDS_SSH
def test_an_option_gpuws_does_not_apply_is_named_once(tmp_path: Path) -> None:
    cfg = _write(tmp_path, "Host pod\n  Compression yes\n  LocalForward 8080 localhost:80\n"
                           "  SendEnv LANG\n  ForwardAgent yes\n")
    notes = resolve("pod", cfg).notes
    assert len(notes) == 1
    assert "compression yes" in notes[0] and "localforward" in notes[0]
    assert "forwardagent yes" in notes[0] and "sendenv" not in notes[0]
    assert resolve("pod", _write(tmp_path, "Host pod\n  HostName h\n")).notes == []


@NEEDS_SSH
def test_ssh_refusing_the_config_is_one_line(tmp_path: Path) -> None:
    cfg = _write(tmp_path, "Host pod\n  NoSuchOption 1\n")
    with pytest.raises(ConfigError, match="line 2: Bad configuration option") as info:
        resolve("pod", cfg)
    assert "ssh -G pod" in info.value.remedy


def test_unknown_token_is_refused(tmp_path: Path) -> None:
    cfg = _write(tmp_path, "Host pod\n  IdentityFile {d}/k_%Q\n")
    with pytest.raises(ConfigError, match="unknown token %Q"):
        resolve("pod", cfg)


@pytest.mark.parametrize("text,expected", [
    ("host", (None, "host", None)), ("u@host", ("u", "host", None)),
    ("u@host:2222", ("u", "host", 2222)), ("[::1]:22", (None, "::1", 22)),
    ("a@b@host", ("a@b", "host", None)), ("ssh://u@h:2200", ("u", "h", 2200)),
])
def test_parse_destination(text: str, expected: tuple[str | None, str, int | None]) -> None:
    assert parse_destination(text) == expected


def test_bad_inputs_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="bad port"):
        parse_destination("host:ssh")
    with pytest.raises(ConfigError, match="not a host name"):
        parse_destination("-oProxyCommand=x")
    for name in ("po\x00d", "pod\n", "a\x1b[2Jb"):
        with pytest.raises(ConfigError, match="control characters"):
            resolve(name)
    with pytest.raises(ConfigError, match="does not exist"):
        resolve("pod", str(tmp_path / "missing"))


def test_home_lists_hosts_from_the_files_ssh_reads(tmp_path: Path) -> None:
    (tmp_path / "more.conf").write_text("Host extra1 extra2\n  Port 1\n")
    cfg = tmp_path / "config"
    cfg.write_text(f"Host a b *.lan !c\n  User x\nInclude {tmp_path}/more.*\n"
                   "Match host a\n  Port 3\nHost a\n")
    assert config_hosts(str(cfg)) == ["a", "b", "extra1", "extra2"]
    assert config_hosts(str(tmp_path / "none")) == []


@NEEDS_SSH
def test_default_user_is_the_local_one(tmp_path: Path) -> None:
    assert resolve("10.0.0.1", _write(tmp_path, "")).user == getpass.getuser()
    assert os.path.isabs(resolve("h", _write(tmp_path, "")).known_hosts_files[0])
