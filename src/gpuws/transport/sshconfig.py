"""Where and how to connect, decided by OpenSSH's own rules.

Where the ``ssh`` client is installed, ``ssh -G`` is asked: it applies ``Host`` and
``Match`` (all of its criteria, ``exec`` included), ``Include``, quoting, first-value-wins
and the ``%`` tokens it expands itself, exactly as ``ssh`` would before connecting. Its
answer is parsed into an :class:`SSHTarget`. Where there is no ``ssh``, asyncssh's own
OpenSSH config support evaluates the same files. gpuws keeps no resolver of its own.

What is left to do here is what ``ssh`` also does only when it uses a value: the
``%`` tokens and ``${VAR}`` of ``IdentityFile``, ``CertificateFile``, ``IdentityAgent``
and ``ProxyCommand`` (OpenSSH 9.2's ``ssh -G`` prints those unexpanded).

An option that changes how ``ssh`` would connect but that gpuws does not apply is named
in :attr:`SSHTarget.notes` (once), never dropped in silence. With ``ssh -G`` that is
every option whose value differs from what ``ssh -G -F /dev/null`` prints (OpenSSH's
built-in defaults), minus the ones gpuws applies and a few that cannot change which
server is reached or how it is trusted (logging, escape characters, multiplexing...).
"""

from __future__ import annotations

import getpass
import glob
import hashlib
import os
import re
import shlex
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from ..errors import ConfigError, UsageError

#: What gpuws applies from the resolved options (``ssh -G`` spells keys in lower case).
HONOURED = frozenset({
    "host", "hostname", "port", "user", "identityfile", "certificatefile",
    "userknownhostsfile", "globalknownhostsfile", "stricthostkeychecking", "proxyjump",
    "proxycommand", "identitiesonly", "connecttimeout", "identityagent", "hostkeyalias",
    "serveraliveinterval", "serveralivecountmax", "include", "match",
})
#: Options that cannot change which server is reached, who logs in or how the server
#: is trusted; a config sets them for interactive ``ssh`` and gpuws need not say so.
QUIET = frozenset({
    "sendenv", "hashknownhosts", "gssapiauthentication", "gssapidelegatecredentials",
    "visualhostkey", "loglevel", "logverbose", "escapechar", "requesttty", "batchmode",
    "controlmaster", "controlpath", "controlpersist", "forwardx11", "forwardx11trusted",
    "forwardx11timeout", "xauthlocation", "numberofpasswordprompts", "updatehostkeys",
    "addkeystoagent", "checkhostip", "tcpkeepalive", "sessiontype", "stdinnull",
    "forkafterauthentication", "enableescapecommandline", "permitlocalcommand",
    "localcommand", "syslogfacility", "ipqos", "canonicalizefallbacklocal",
    "passwordauthentication", "kbdinteractiveauthentication",
    "challengeresponseauthentication", "preferredauthentications",
})
#: ``IdentityFile`` when a config names none (what ``ssh -G`` prints then).
DEFAULT_IDENTITIES = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ecdsa_sk",
                      "~/.ssh/id_ed25519", "~/.ssh/id_ed25519_sk", "~/.ssh/id_xmss",
                      "~/.ssh/id_dsa")
DEFAULT_USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
#: Seconds ``ssh -G`` may take (a ``Match exec`` runs a command of the person's).
SSH_G_TIMEOUT = 20.0


@dataclass
class SSHTarget:
    """Where and how to connect, after OpenSSH's config rules.

    Attributes:
        alias: the host as given (without ``user@`` and ``:port``); ``%n`` in tokens.
        hostname: the name or address to reach (``HostName``).
        identity_files: ``IdentityFile`` paths, tokens and ``~`` expanded, in order.
        certificate_files: ``CertificateFile`` paths, expanded.
        known_hosts_files: user files first (new keys are recorded in the first),
            then the global ones.
        user_known_hosts: how many of ``known_hosts_files`` are user files.
        strict_host_key_checking: ``yes``, ``no``, ``accept-new`` or ``ask``.
        proxy_jump: ``ProxyJump`` (``None`` when unset or ``none``).
        proxy_command: ``ProxyCommand`` with its tokens expanded (``None`` when unset).
        identity_agent: ``None``: ``$SSH_AUTH_SOCK``; ``""``: no agent
            (``IdentityAgent none``); else the agent socket's path.
        server_alive_interval: ``ServerAliveInterval`` seconds (0: unset).
        source: ``ssh -G`` or ``asyncssh config`` (what evaluated the files).
        notes: options set in the config that gpuws does not apply, named once.
    """

    alias: str
    hostname: str
    port: int = 22
    user: str = field(default_factory=getpass.getuser)
    identity_files: list[str] = field(default_factory=list)
    certificate_files: list[str] = field(default_factory=list)
    known_hosts_files: list[str] = field(default_factory=list)
    user_known_hosts: int = 0
    strict_host_key_checking: str = "ask"
    proxy_jump: str | None = None
    proxy_command: str | None = None
    identities_only: bool = False
    connect_timeout: float | None = None
    identity_agent: str | None = None
    host_key_alias: str | None = None
    server_alive_interval: float = 0.0
    server_alive_count_max: int = 3
    config_file: str | None = None
    source: str = "ssh -G"
    notes: list[str] = field(default_factory=list)

    @property
    def known_hosts_name(self) -> str:
        """The name ``ssh`` writes in known_hosts: ``host`` or ``[host]:port``."""
        name = self.host_key_alias or self.hostname
        return name if self.port == 22 else f"[{name}]:{self.port}"

    @property
    def jump_hosts(self) -> list[str]:
        """The ``ProxyJump`` hops in the order they are reached (first: straight from here)."""
        return [h.strip() for h in (self.proxy_jump or "").split(",") if h.strip()]


def parse_destination(text: str) -> tuple[str | None, str, int | None]:
    """Split ``[user@]host[:port]`` (and ``[v6addr]:port``, ``ssh://user@host:port``)."""
    if text.startswith("ssh://"):
        text = text[len("ssh://"):].rstrip("/")
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
    if any(ord(c) < 32 or c == "\x7f" for c in text):
        # No resolver takes such a name, and ssh -G could not even be given it (a NUL
        # cannot be in an argv): one clear line instead.
        raise ConfigError(f"{text!r} holds control characters: not a host name",
                          title="Unknown host", remedy="use an ssh alias or user@host[:port]")
    if host.startswith("-"):
        raise ConfigError(f"{host!r} is not a host name", remedy="use an ssh alias or "
                                                                  "user@host[:port]")
    return user, host, port


def resolve(destination: str, config_file: str | None = None, *,
            port: int | None = None, user: str | None = None,
            ssh_binary: str | None = None, ignore_proxy: bool = False) -> SSHTarget:
    """Resolve a command-line destination the way ``ssh`` would.

    Args:
        destination: an alias from the config, or ``[user@]host[:port]``.
        config_file: ``-F FILE``; when None, ``ssh``'s own defaults (``~/.ssh/config``
            and the system-wide file).
        port: ``-p PORT`` (wins over the config, like ssh).
        user: ``-l USER``.
        ssh_binary: the ``ssh`` client to ask; None finds it on ``PATH``, ``""`` uses
            asyncssh's config support instead (as when ``ssh`` is not installed).
        ignore_proxy: the host is a later hop of a ``ProxyJump`` chain: as in OpenSSH
            (which reaches it with ``ssh -J <earlier hops>``), its own ``ProxyJump`` and
            ``ProxyCommand`` do not apply.

    Raises:
        ConfigError: the destination or the config is malformed (with ssh's own words).
    """
    dest_user, host, dest_port = parse_destination(destination)
    user = user or dest_user
    port = port or dest_port
    if config_file and not Path(config_file).expanduser().exists():
        raise ConfigError(f"ssh config file {config_file} does not exist",
                          remedy="check the -F path")
    binary = shutil.which("ssh") if ssh_binary is None else ssh_binary
    if binary:
        target = _from_ssh_g(binary, host, config_file, port, user)
    else:
        target = _from_asyncssh(host, config_file, port, user)
    if ignore_proxy:
        target.proxy_jump = target.proxy_command = None
    return target


# ----------------------------------------------------------------------------- ssh -G
def ssh_g(binary: str, host: str, config_file: str | None = None, port: int | None = None,
          user: str | None = None) -> dict[str, list[str]]:
    """``ssh -G`` for ``host``: every option, keys in lower case, values in order.

    Raises:
        ConfigError: ssh refused the config (its message says which line).
    """
    argv = [binary, "-G"]
    if config_file:
        argv += ["-F", str(Path(config_file).expanduser())]
    if port:
        argv += ["-p", str(port)]
    if user:
        argv += ["-l", user]
    argv += ["--", host]
    try:
        out = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL,
                             timeout=SSH_G_TIMEOUT, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ConfigError(f"`ssh -G {host}` did not finish within {SSH_G_TIMEOUT:.0f} s",
                          remedy="check `Match exec` commands in your ssh config") from exc
    except (OSError, ValueError) as exc:  # ValueError: an argument holding a NUL
        raise ConfigError(f"cannot run {binary} -G for {host!r}: "
                          f"{getattr(exc, 'strerror', None) or exc}") from exc
    if out.returncode != 0:
        said = [line for line in out.stderr.decode("utf-8", "replace").splitlines()
                if line.strip() and not line.startswith("Pseudo-terminal")]
        reason = "; ".join(said[-2:]) or f"exit {out.returncode}"
        if "invalid characters" in reason:
            # Not the config's fault: what was typed is no host name (a pasted command
            # line in Home's box, say).
            raise UsageError(f"{host!r} is not a host name: ssh says {reason}",
                             remedy="give an ssh config alias, user@host or host:port")
        raise ConfigError(f"ssh rejects the config for {host!r}: {reason}",
                          remedy="fix the line ssh names (try `ssh -G " + shlex.quote(host) + "`)")
    options: dict[str, list[str]] = {}
    for line in out.stdout.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition(" ")
        if key:
            options.setdefault(key.lower(), []).append(value)
    return options


@lru_cache(maxsize=4)
def builtin_defaults(binary: str) -> dict[str, tuple[str, ...]]:
    """What ``ssh -G`` prints with no config at all: OpenSSH's built-in defaults.

    Asked once per process (cached): the first resolve costs two ``ssh -G`` runs, every
    later one a single run.
    """
    return {k: tuple(v) for k, v in ssh_g(binary, "gpuws-defaults.invalid", os.devnull).items()}


def _from_ssh_g(binary: str, host: str, config_file: str | None, port: int | None,
                user: str | None) -> SSHTarget:
    opts = ssh_g(binary, host, config_file, port, user)

    def one(key: str) -> str | None:
        values = opts.get(key)
        return values[0] if values else None

    target = SSHTarget(alias=host, hostname=one("hostname") or host,
                       port=int(one("port") or 22), user=one("user") or getpass.getuser(),
                       config_file=config_file, source="ssh -G")
    target.strict_host_key_checking = {"true": "yes", "yes": "yes", "false": "no",
                                       "no": "no", "accept-new": "accept-new"}.get(
        (one("stricthostkeychecking") or "ask").lower(), "ask")
    target.identities_only = (one("identitiesonly") or "no").lower() == "yes"
    timeout = one("connecttimeout")
    target.connect_timeout = float(timeout) if timeout and timeout != "none" else None
    target.host_key_alias = one("hostkeyalias")
    target.proxy_jump = _none(one("proxyjump"))
    target.server_alive_interval = float(one("serveraliveinterval") or 0)
    target.server_alive_count_max = int(one("serveralivecountmax") or 3)
    target.proxy_command = _none(one("proxycommand"))
    agent = one("identityagent")
    identity_files = [v for v in opts.get("identityfile", []) if v.lower() != "none"]
    cert_files = [v for v in opts.get("certificatefile", []) if v.lower() != "none"]
    user_kh = _split_files(" ".join(opts.get("userknownhostsfile", [])))
    global_kh = _split_files(" ".join(opts.get("globalknownhostsfile", [])))
    # ssh -G has already expanded the known-hosts files' tokens (a second pass would
    # misread a "%" that came from "%%"); only "~" is left to do.
    _finish(target, identity_files, cert_files, user_kh, global_kh, agent, tokens_done=True)
    defaults = builtin_defaults(binary)
    changed = [k for k, v in opts.items()
               if k not in HONOURED and k not in QUIET and tuple(v) != defaults.get(k)]
    if changed:
        shown = ", ".join(f"{k} {' / '.join(opts[k])}"[:80] for k in sorted(changed))
        target.notes.append(f"ssh config options gpuws does not apply: {shown}")
    return target


def _none(value: str | None) -> str | None:
    return None if value is None or value.lower() == "none" else value


def _split_files(value: str) -> list[str]:
    if not value.strip() or value.strip().lower() == "none":
        return []
    return shlex.split(value)


# ----------------------------------------------------------------------------- asyncssh
def _from_asyncssh(host: str, config_file: str | None, port: int | None,
                   user: str | None) -> SSHTarget:
    """The same answer from asyncssh's OpenSSH config support (no ``ssh`` client here)."""
    from asyncssh.config import ConfigParseError, SSHClientConfig  # asyncssh: remote only

    if config_file:
        paths = [Path(config_file).expanduser()]
    else:
        paths = [p for p in (Path("~/.ssh/config").expanduser(), Path("/etc/ssh/ssh_config"))
                 if p.exists()]
    local = getpass.getuser()
    try:
        # (last_config, paths, reload, canonical, final, local_user, user, host, port):
        # () means "not given on the command line", as in asyncssh.connect.
        cfg = SSHClientConfig.load(None, paths, False, False, False, local,
                                   user or (), host, port or ())
    except (ConfigParseError, OSError, ValueError) as exc:
        raise ConfigError(f"cannot use the ssh config for {host!r}: {exc}",
                          remedy="fix the line named") from exc

    def get(name: str) -> object:
        return cfg.get(name)

    def text(name: str) -> str | None:
        value = get(name)
        return None if value is None else str(value)

    target = SSHTarget(alias=host, hostname=text("Hostname") or host,
                       port=int(str(get("Port") or 22)), user=text("User") or local,
                       config_file=config_file, source="asyncssh config")
    target.identities_only = bool(get("IdentitiesOnly"))
    timeout = get("ConnectTimeout")
    target.connect_timeout = float(str(timeout)) if timeout else None
    target.host_key_alias = text("HostKeyAlias")
    target.proxy_command = text("ProxyCommand")
    target.proxy_jump = None if target.proxy_command else text("ProxyJump")
    target.server_alive_interval = float(str(get("ServerAliveInterval") or 0))
    count = get("ServerAliveCountMax")
    target.server_alive_count_max = int(str(count)) if count is not None else 3
    files = get("IdentityFile")
    identity_files = list(files) if isinstance(files, list) else list(DEFAULT_IDENTITIES)
    certs = get("CertificateFile")
    user_kh_value = get("UserKnownHostsFile")
    user_kh = (list(user_kh_value) if isinstance(user_kh_value, list)
               else list(DEFAULT_USER_KNOWN_HOSTS))
    global_value = get("GlobalKnownHostsFile")
    global_kh = (list(global_value) if isinstance(global_value, list)
                 else list(DEFAULT_GLOBAL_KNOWN_HOSTS))
    loaded = cfg.get_options(False)  # the options the files set, by asyncssh's names
    agent = get("IdentityAgent")
    if "IdentityAgent" in loaded and agent is None:  # asyncssh keeps `none` as None
        agent = "none"
    _finish(target, identity_files, list(certs) if isinstance(certs, list) else [],
            user_kh, global_kh, None if agent is None else str(agent))
    ignored = sorted(k for k in loaded if k.lower() not in HONOURED and k.lower() not in QUIET)
    if ignored:
        target.notes.append("ssh config options gpuws does not apply: " + ", ".join(ignored))
    # asyncssh skips options it does not know (StrictHostKeyChecking among them) without
    # a word, so this path cannot name them: say what evaluated the config instead.
    target.notes.append("no `ssh` client here: the ssh config was evaluated by asyncssh, "
                        "which ignores StrictHostKeyChecking and options it does not know "
                        "(install openssh-client for OpenSSH's own rules)")
    return target


# ----------------------------------------------------------------------------- tokens
def _finish(target: SSHTarget, identity_files: list[str], cert_files: list[str],
            user_kh: list[str], global_kh: list[str], agent: str | None,
            tokens_done: bool = False) -> None:
    """Expand what ``ssh`` expands only when it uses a value (see the module notes)."""
    target.identity_files = [expand_path(p, target) for p in identity_files]
    target.certificate_files = [expand_path(p, target) for p in cert_files]

    def known(path: str) -> str:
        return os.path.expanduser(path) if tokens_done else expand_path(path, target)

    user_files = [known(p) for p in user_kh]
    target.known_hosts_files = user_files + [known(p) for p in global_kh]
    target.user_known_hosts = len(user_files)
    if agent is None:
        target.identity_agent = None
    elif agent.lower() == "none":
        target.identity_agent = ""
    elif agent == "SSH_AUTH_SOCK":
        target.identity_agent = None
    else:
        target.identity_agent = expand_path(agent, target)
    if target.proxy_command:
        target.proxy_command = expand_tokens(target.proxy_command, target)


def _tokens(t: SSHTarget) -> dict[str, str]:
    local = socket.gethostname()
    # %C as OpenSSH 9.2 computes it: sha1 of %l%h%p%r.
    conn_hash = hashlib.sha1(f"{local}{t.hostname}{t.port}{t.user}".encode()).hexdigest()
    return {"%": "%", "C": conn_hash, "d": str(Path.home()), "h": t.hostname,
            "i": str(os.getuid()), "j": t.proxy_jump or "", "k": t.host_key_alias or t.alias,
            "L": local.split(".")[0], "l": local, "n": t.alias, "p": str(t.port),
            "r": t.user, "u": getpass.getuser()}


def expand_tokens(value: str, target: SSHTarget) -> str:
    """``%`` tokens of ssh_config(5) (``%h``, ``%p``, ``%r``, ``%%``...) for ``target``.

    Raises:
        ConfigError: an unknown token, as ``ssh`` refuses it.
    """
    tokens = _tokens(target)

    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in tokens:
            raise ConfigError(f"unknown token %{name} in {value!r}",
                              remedy="see TOKENS in `man ssh_config`")
        return tokens[name]

    return re.sub(r"%(.)", one, value)


def expand_path(value: str, target: SSHTarget) -> str:
    """A file option's value as ``ssh`` opens it: ``${VAR}``, tokens, then ``~``."""

    def env(m: re.Match[str]) -> str:
        if m.group(1) not in os.environ:
            raise ConfigError(f"environment variable {m.group(1)} in {value!r} is not set")
        return os.environ[m.group(1)]

    return os.path.expanduser(expand_tokens(re.sub(r"\$\{(\w+)\}", env, value), target))


# ----------------------------------------------------------------------------- Home
def config_hosts(config_file: str | None) -> list[str]:
    """``Host`` names without wildcards or negation, in file order, ``Include`` followed.

    Only lists names for people to pick; where each leads is :func:`resolve`'s answer.

    Raises:
        ConfigError: the file cannot be read.
    """
    path = Path(config_file).expanduser() if config_file else Path("~/.ssh/config").expanduser()
    names: list[str] = []
    for pattern in _host_patterns(path, 0):
        if not any(c in pattern for c in "*?!%") and pattern not in names:
            names.append(pattern)
    return names


def _host_patterns(path: Path, depth: int) -> list[str]:
    if depth > 16:  # OpenSSH's READCONF_MAX_DEPTH
        raise ConfigError(f"Include nested too deep in {path}")
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ConfigError(f"cannot read ssh config {path}: {exc.strerror}") from exc
    out: list[str] = []
    for raw in text.splitlines():
        try:
            words = shlex.split(raw.replace("=", " ", 1), comments=True)
        except ValueError:
            continue  # ssh -G names a malformed line when the host is resolved
        if not words:
            continue
        key, args = words[0].lower(), words[1:]
        if key == "host":
            out += args
        elif key == "include":
            for pattern in args:
                pattern = os.path.expanduser(pattern)
                if not os.path.isabs(pattern):
                    # As OpenSSH: relative to ~/.ssh in a user configuration file.
                    pattern = str(Path("~/.ssh").expanduser() / pattern)
                for inc in sorted(glob.glob(pattern)):
                    out += _host_patterns(Path(inc), depth + 1)
    return out
