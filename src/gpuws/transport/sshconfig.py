"""OpenSSH client configuration, resolved the way ``ssh`` does it.

Only the options gpuws acts on are kept; everything else is read and ignored, like
``ssh`` ignores what it does not need. First obtained value wins, ``Host`` patterns
support ``*``/``?`` wildcards and ``!`` negation, ``Include`` is followed, ``Match``
blocks are skipped (with the reason recorded), and ``%h %p %r %u %d %%`` tokens are
expanded in IdentityFile/UserKnownHostsFile.
"""

from __future__ import annotations

import fnmatch
import getpass
import glob
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError

_MULTI = {"identityfile", "userknownhostsfile"}
_KEEP = {
    "hostname", "port", "user", "identityfile", "userknownhostsfile", "stricthostkeychecking",
    "proxyjump", "identitiesonly", "connecttimeout", "identityagent", "hostkeyalias",
}


@dataclass
class SSHTarget:
    """Where and how to connect, after config resolution."""

    alias: str
    hostname: str
    port: int = 22
    user: str = field(default_factory=getpass.getuser)
    identity_files: list[str] = field(default_factory=list)
    known_hosts_files: list[str] = field(default_factory=list)
    strict_host_key_checking: str = "ask"
    proxy_jump: str | None = None
    identities_only: bool = False
    connect_timeout: float | None = None
    identity_agent: str | None = None
    host_key_alias: str | None = None
    config_file: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def known_hosts_name(self) -> str:
        """The name ``ssh`` writes in known_hosts: ``host`` or ``[host]:port``."""
        name = self.host_key_alias or self.hostname
        return name if self.port == 22 else f"[{name}]:{self.port}"


def parse_destination(text: str) -> tuple[str | None, str, int | None]:
    """Split ``[user@]host[:port]`` (and ``[v6addr]:port``) into its parts."""
    user: str | None = None
    if "@" in text:
        user, text = text.rsplit("@", 1)
    port: int | None = None
    m = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?", text)
    if m:
        host = m.group(1)
        port = int(m.group(2)) if m.group(2) else None
    elif text.count(":") == 1:
        host, _, p = text.partition(":")
        if not p.isdigit():
            raise ConfigError(f"bad port in {text!r}", remedy="use user@host:PORT")
        port = int(p)
    else:
        host = text
    if not host:
        raise ConfigError(f"no host in {text!r}", remedy="use an ssh alias or user@host[:port]")
    return user, host, port


def _read_lines(path: Path, depth: int = 0) -> list[tuple[str, str]]:
    if depth > 8:
        raise ConfigError(f"Include nested too deep in {path}")
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ConfigError(f"cannot read ssh config {path}: {exc.strerror}") from exc
    out: list[tuple[str, str]] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"(\S+?)\s*(?:=|\s)\s*(.*)$", line)
        if not m:
            raise ConfigError(f"{path}:{lineno}: cannot parse {line!r}")
        key, value = m.group(1).lower(), m.group(2).strip()
        if key == "include":
            for pattern in shlex.split(value):
                pattern = os.path.expanduser(pattern)
                if not os.path.isabs(pattern):
                    pattern = str(path.parent / pattern)
                for inc in sorted(glob.glob(pattern)):
                    out.extend(_read_lines(Path(inc), depth + 1))
            continue
        out.append((key, value))
    return out


def _host_matches(patterns: list[str], host: str) -> bool:
    matched = False
    for pat in patterns:
        if pat.startswith("!"):
            if fnmatch.fnmatchcase(host, pat[1:]):
                return False
        elif fnmatch.fnmatchcase(host, pat):
            matched = True
    return matched


def resolve(destination: str, config_file: str | None = None, *,
            port: int | None = None, user: str | None = None) -> SSHTarget:
    """Resolve a command-line destination against an ssh config file.

    Args:
        destination: an alias from the config, or ``[user@]host[:port]``.
        config_file: ``-F FILE``; ``~/.ssh/config`` when None (missing is fine).
        port: ``-p PORT`` from the command line (wins over the config, like ssh).
        user: ``-l USER`` from the command line.
    """
    dest_user, host, dest_port = parse_destination(destination)
    path = Path(config_file).expanduser() if config_file else Path("~/.ssh/config").expanduser()
    if config_file and not path.exists():
        raise ConfigError(f"ssh config file {config_file} does not exist",
                          remedy="check the -F path")
    values: dict[str, list[str]] = {}
    notes: list[str] = []
    active = True
    for key, value in _read_lines(path):
        if key == "host":
            active = _host_matches(shlex.split(value), host)
            continue
        if key == "match":
            active = False
            notes.append(f"'Match {value}' block skipped (gpuws does not evaluate Match)")
            continue
        if not active or key not in _KEEP:
            continue
        if key in _MULTI:
            values.setdefault(key, []).extend(shlex.split(value))
        elif key not in values:
            values[key] = [value]

    def one(key: str) -> str | None:
        v = values.get(key)
        return v[0] if v else None

    hostname = one("hostname") or host
    hostname = hostname.replace("%h", host)
    target = SSHTarget(alias=host, hostname=hostname, config_file=str(path), notes=notes)
    cfg_port = one("port")
    target.port = port or dest_port or (int(cfg_port) if cfg_port else 22)
    target.user = user or dest_user or one("user") or getpass.getuser()
    tokens = {"%h": hostname, "%p": str(target.port), "%r": target.user,
              "%u": getpass.getuser(), "%d": str(Path.home()), "%%": "%"}

    def expand(p: str) -> str:
        for tok, val in tokens.items():
            p = p.replace(tok, val)
        return os.path.expanduser(p)

    target.identity_files = [expand(p) for p in values.get("identityfile", [])]
    target.known_hosts_files = [expand(p) for p in values.get("userknownhostsfile", [])
                                if p.lower() != "none"] or [
        os.path.expanduser("~/.ssh/known_hosts")]
    shkc = (one("stricthostkeychecking") or "ask").lower()
    target.strict_host_key_checking = {"yes": "yes", "no": "no", "off": "no",
                                       "accept-new": "accept-new"}.get(shkc, "ask")
    pj = one("proxyjump")
    target.proxy_jump = None if pj is None or pj.lower() == "none" else pj
    target.identities_only = (one("identitiesonly") or "no").lower() == "yes"
    ct = one("connecttimeout")
    target.connect_timeout = float(ct) if ct else None
    ia = one("identityagent")
    target.identity_agent = None if ia is None or ia.lower() == "none" else expand(ia)
    if ia is not None and ia.lower() == "none":
        target.identity_agent = ""
    target.host_key_alias = one("hostkeyalias")
    return target
