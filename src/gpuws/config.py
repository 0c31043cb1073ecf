"""The laptop's config file (TOML), decoded strictly into typed Structs.

Example ``config.toml``::

    [defaults]
    rate_usd_per_hour = 2.50     # used for any host without its own entry

    [hosts.pod]                  # the name you pass to `gpuws connect`
    rate_usd_per_hour = 3.99
    budget_usd = 20.0
    max_output_mib = 16          # a run's output stored on the laptop (default 64)
    start = ["runpodctl", "start", "pod", "abc123"]     # run on the laptop by `gpuws start`
    stop = ["runpodctl", "stop", "pod", "abc123"]       # run on the laptop by `gpuws stop`
    stop_on_pod = ["sh", "-c", "runpodctl stop pod $RUNPOD_POD_ID"]  # run on the pod
    idle_stop_minutes = 30       # the pod stops itself after this long with nobody there
    stop_running = false         # true: the idle stop does not wait for a run in progress
    budget_action = "warn"       # "stop": at 100% of budget_usd, run `stop` (never silently)

    [pull]                       # what a run's artifacts may cost the laptop
    max_artifact_bytes = 2147483648
    max_artifacts = 64
    max_run_bytes = 2147483648
    stall_s = 60

Per host (or under ``[defaults]``):

- ``rate_usd_per_hour``, ``budget_usd`` (numbers >= 0), ``max_output_mib`` (>= 0, default 64);
- ``start``, ``stop``: argv lists (no shell) run on the laptop to start and stop the pod
  with the provider's own tool;
- ``stop_on_pod``: an argv list run on the pod to stop itself (the lease's idle stop);
- ``idle_stop_minutes``: a number > 0 (fractions allowed); no laptop contact and no run
  for that long stops the pod through ``stop_on_pod``;
- ``stop_running``: ``true`` lets the idle stop stop a pod whose run is still going
  (default ``false``: a run in progress holds it off);
- ``budget_action``: ``"warn"`` (default) or ``"stop"``: what reaching ``budget_usd`` does;
- ``stop_wait_s``: seconds the budget's stop waits for the host to stop answering SSH
  (default 300); a host that still answers is said not stopped, and may still bill;
- ``agent``, ``agent_may_start_stop``: ``true`` opens the host to a coding agent through
  ``gpuws mcp`` (and lets it start and stop the pod); both default to no.
- ``persist``: keep the host's SSH connection for the next command, as OpenSSH's
  ControlPersist does: ``"10m"``, ``"90s"``, ``"1h"``, seconds, ``"yes"`` (10 minutes) or
  ``"no"`` (the default); ``--no-persist`` turns it off for one command.

``budget_usd`` is per host, per pod start and per day: it counts what the host's sessions
cost (connected time × rate, every ``gpuws`` command and TUI connection together) since
the latest of the last start or stop gpuws recorded for it (``gpuws start``/``stop``,
``--start``, a budget stop) and local midnight. Two ``gpuws run`` in a row count together.

Every key left out of a host's table is taken from ``[defaults]``, except the keys that
can stop or power off a machine (:data:`MACHINE_STOPPING`): those never come from
``[defaults]`` for ``local`` nor for a host that turns out to be this very machine (its
machine id or boot id is the laptop's, e.g. an ssh alias for 127.0.0.1). Only the host's
own ``[hosts.NAME]`` table arms them there, and gpuws says once that it left them out.

An unknown key is an error (a typo must not silently cost money), reported with the file
and the offending path.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from gpuws.errors import ConfigError
from gpuws.locations import config_path

NonNegative = Annotated[float, msgspec.Meta(ge=0)]
Count = Annotated[int, msgspec.Meta(ge=0, le=1 << 62)]
Positive = Annotated[float, msgspec.Meta(gt=0, le=86400)]
# An argv: at least the program, no empty word (an empty program name runs nothing useful).
Argv = Annotated[list[Annotated[str, msgspec.Meta(min_length=1)]], msgspec.Meta(min_length=1)]
Minutes = Annotated[float, msgspec.Meta(gt=0, le=60 * 24 * 366)]
BudgetAction = Literal["warn", "stop"]
# A kept connection's idle time ("10m", "90s", "1h", seconds), or yes/no: checked in full
# (zero, over a week) by gpuws.transport.persist.setting.parse_persist when used.
Persist = bool | Annotated[str, msgspec.Meta(
    pattern=r"^\s*(?i:no|off|false|yes|on|true|[0-9]+(\.[0-9]+)?[smh]?)\s*$")]

#: The name of this machine as a host (``gpuws connect local``): no SSH, the agent runs here.
LOCAL_HOST = "local"
#: The keys that can stop, power off or bill-stop a machine: taken from ``[defaults]`` only
#: for a host that is not this machine. ``shutdown -h now`` in ``[defaults]`` (natural with
#: several VMs) must not power off the laptop after ``gpuws connect local``.
MACHINE_STOPPING = ("stop", "stop_on_pod", "idle_stop_minutes", "stop_running",
                    "budget_action")


class HostConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Settings for one host (or the defaults for every host).

    Attributes:
        rate_usd_per_hour: what the pod costs per hour of connected time, in US dollars.
        budget_usd: what the host may cost per pod start and per day (see the module's
            docstring for the window), in US dollars; gpuws warns at 80% and 100%.
        max_output_mib: the most of a run's output (its ``output`` events, as stored)
            the laptop stores, in MiB; ``None`` is the default, 64
            (:data:`gpuws.live.account.DEFAULT_MAX_OUTPUT_MIB`). Past it, output is
            counted, not stored, with a notice; the pod keeps all of it in the run's
            ``events.ndjson``.
        start: the argv run on the laptop to start the pod (``gpuws start``), or ``None``.
        stop: the argv run on the laptop to stop the pod (``gpuws stop``), or ``None``.
        stop_on_pod: the argv the pod runs to stop itself when the lease expires, or ``None``.
        idle_stop_minutes: minutes with no run and no laptop contact before the pod stops
            itself; ``None`` means never.
        stop_running: whether the idle stop may stop a pod whose run is still going;
            ``None`` (left out) means false.
        budget_action: ``"warn"`` or ``"stop"`` at 100% of ``budget_usd``; ``None`` (left
            out) means ``"warn"``.
        stop_wait_s: seconds the budget's stop waits for the host to stop answering;
            ``None`` means 300 (:data:`gpuws.live.uptime.power.WAIT_S`).
        agent: whether a coding agent may use the host through ``gpuws mcp`` (sync, run,
            doctor); ``None`` (left out) means no.
        agent_may_start_stop: whether that agent may also start and stop the pod (its
            ``start``/``stop`` commands); ``None`` (left out) means no.
        persist: how long the host's SSH connection is kept for the next command after
            the last one ends (``"10m"``, ``"90s"``, ``"yes"``, ``"no"``:
            :mod:`gpuws.transport.persist`); ``None`` (left out) means not kept.
    """

    rate_usd_per_hour: NonNegative | None = None
    budget_usd: NonNegative | None = None
    max_output_mib: NonNegative | None = None
    start: Argv | None = None
    stop: Argv | None = None
    stop_on_pod: Argv | None = None
    idle_stop_minutes: Minutes | None = None
    stop_running: bool | None = None
    budget_action: BudgetAction | None = None
    stop_wait_s: Positive | None = None
    agent: bool | None = None
    agent_may_start_stop: bool | None = None
    persist: Persist | None = None

    @property
    def may_stop_running(self) -> bool:
        """Whether the idle stop may stop a pod with a run in progress (default false)."""
        return bool(self.stop_running)

    @property
    def stops_at_budget(self) -> bool:
        """Whether reaching ``budget_usd`` runs ``stop`` (default: only warn)."""
        return self.budget_action == "stop"


class PullConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What pulling one run's artifacts may cost the laptop (the ``[pull]`` table).

    The pod announces names and sizes; these bound what is written whatever it announces.
    An artifact over a bound is refused before any of its bytes move, with a line that
    names the key to raise.

    Attributes:
        max_artifact_bytes: the largest single artifact pulled, in bytes.
        max_artifacts: the most artifacts pulled for one run.
        max_run_bytes: the most bytes pulled for one run, all its artifacts together.
        stall_s: seconds a transfer may go without a byte before it is stopped.
    """

    max_artifact_bytes: Count = 2 << 30
    max_artifacts: Count = 64
    max_run_bytes: Count = 2 << 30
    stall_s: Positive = 60.0


class Config(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The whole config file.

    Attributes:
        defaults: settings for hosts that have no ``[hosts.NAME]`` table (or leave a field
            out); never the :data:`MACHINE_STOPPING` keys for this machine.
        hosts: per-host settings, keyed by the name given to ``gpuws connect``
            (an ssh-config alias, or ``user@host[:port]``).
        pull: the bounds on pulling a run's artifacts (:class:`PullConfig`).
    """

    defaults: HostConfig = msgspec.field(default_factory=HostConfig)
    hosts: dict[str, HostConfig] = msgspec.field(default_factory=dict)
    pull: PullConfig = msgspec.field(default_factory=PullConfig)


def load_config(path: Path | None = None) -> Config:
    """Read and validate the config file.

    Args:
        path: an explicit file, which must exist; ``None`` reads :func:`config_path`,
            where a missing file simply means the defaults.

    Returns:
        The decoded config.

    Raises:
        ConfigError: the file is unreadable, not TOML, or does not fit :class:`Config`;
            the message names the file and the reason.
    """
    explicit = path is not None
    target = path if path is not None else config_path()
    try:
        raw = target.read_bytes()
    except FileNotFoundError as exc:
        if not explicit:
            return Config()
        raise ConfigError(f"{target}: no such file",
                          remedy="check the path given with --config") from exc
    except OSError as exc:
        raise ConfigError(f"{target}: {exc.strerror or exc}") from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{target}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{target}: invalid TOML: {exc}") from exc
    try:
        return msgspec.convert(data, Config)
    except msgspec.ValidationError as exc:
        message, remedy = _where(data, exc)
        raise ConfigError(f"{target}: {message}", remedy=remedy) from exc


#: The keys each level of the file takes, for the remedy of an unknown key there.
_TOP_KEYS = "[defaults], [hosts.NAME] and [pull]"
#: msgspec's type names, in the words a person reads in a TOML file.
_TYPE_WORDS = {"float": "a number", "int": "a whole number", "str": "a string",
               "bool": "true or false", "array": "a list", "object": "a table"}


def _where(data: dict[str, Any], exc: msgspec.ValidationError) -> tuple[str, str]:
    """The validation error as gpuws says it, and its remedy.

    msgspec says ``Expected `float | null`, got `str` - at `$.hosts[...]```; a person
    wrote ``idle_stop_minutes = "30"`` under ``[hosts.pod]`` and wants to read
    ``hosts.pod.idle_stop_minutes: expected a number, got "30"``. The key list is the
    remedy only for an unknown key, and it is the list of the level the key was found at.
    """
    text, level, root = str(exc), "", data
    hosts = data.get("hosts")
    if isinstance(hosts, dict):
        for name, entry in hosts.items():
            try:
                msgspec.convert(entry, HostConfig)
            except msgspec.ValidationError as host_exc:
                key = name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else f'"{name}"'
                text, level, root = str(host_exc), f"hosts.{key}", entry
                break
    found = re.fullmatch(r"(?s)(.*?)(?: - at `\$(.*)`)?", text)
    assert found is not None  # the pattern matches any text
    reason, sub = found.group(1), (found.group(2) or "").lstrip(".")
    path = ".".join(p for p in (level, sub) if p)
    unknown = re.fullmatch(r"Object contains unknown field `(.*)`", reason)
    if unknown:
        if not path:
            keys = _TOP_KEYS
        elif path == "pull":
            keys = ", ".join(PullConfig.__struct_fields__)
        else:
            keys = ", ".join(HostConfig.__struct_fields__)
        return (f"{path or 'the top level'}: unknown key {unknown.group(1)!r}",
                f"known keys {f'in [{path}]' if path else 'at the top level'}: {keys}")
    value = _lookup(root, sub)
    enum = re.fullmatch(r"Invalid enum value (.*)", reason)
    field = re.sub(r"\[\d+\]$", "", sub.split(".")[-1]) if sub else ""
    if enum and field in HostConfig.__struct_fields__:
        values = ", ".join(f'"{v}"' for v in _literal_values(field))
        return f"{path}: {enum.group(1)} is not one of {values}", f"give one of {values}"
    expected = re.fullmatch(r"(?s)Expected `(.*?)`(.*?)(?:, got `(.*)`)?", reason)
    if expected:
        kind, bound, got_type = expected.groups()
        words = " or ".join(_TYPE_WORDS.get(t, t) for t in kind.split(" | ") if t != "null")
        got = (_toml_value(value) if value is not _MISSING
               else _TYPE_WORDS.get(got_type or "", got_type or "something else"))
        return f"{path}: expected {words}{bound}, got {got}", ""
    return (f"{path}: {reason}" if path else reason), ""


_MISSING = object()


def _lookup(root: Any, sub: str) -> Any:
    """The value at msgspec's path (``start[1]``, ``pull.stall_s``) under ``root``."""
    value = root
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", sub):
        if part.startswith("[") and isinstance(value, list) and int(part[1:-1]) < len(value):
            value = value[int(part[1:-1])]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return _MISSING
    return value


def _literal_values(field: str) -> list[str]:
    """The values a ``Literal`` field of :class:`HostConfig` takes (``budget_action``)."""
    import typing

    hint = typing.get_type_hints(HostConfig)[field]
    out: list[str] = []
    for arm in typing.get_args(hint) or (hint,):
        out.extend(str(v) for v in typing.get_args(arm))
    return out


def _toml_value(value: Any) -> str:
    """A value as it was written in the file (``"30"``, ``true``), cut to stay one line."""
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value[:60] + ("…" if len(value) > 60 else ""), ensure_ascii=False)
    if isinstance(value, (int, float)):
        return str(value)
    kind = "object" if isinstance(value, dict) else "array" if isinstance(value, list) else ""
    return _TYPE_WORDS.get(kind, type(value).__name__)  # a TOML date: "datetime"


def host_config(config: Config, host_alias: str | None, *,
                this_machine: bool = False) -> HostConfig:
    """The effective settings for a host: its own table over the defaults, field by field.

    A field left out of both stays ``None``; :attr:`HostConfig.may_stop_running` and
    :attr:`HostConfig.stops_at_budget` say what that means for the two that have a default.
    For ``local``, or a host known to be this machine (``this_machine``), the
    :data:`MACHINE_STOPPING` keys come from its own table only
    (:func:`withheld_defaults` names those left out).

    The alias is looked up as given, then as its bare host name (``user@gpu1:2222`` →
    ``gpu1``), so one entry covers the different ways of spelling the same pod.

    Args:
        config: the decoded config file.
        host_alias: the host as given to a command, or ``None`` for the defaults alone.
        this_machine: the host was found to be the laptop itself (its probe's machine id).

    Returns:
        The merged settings.
    """
    entry = _entry(config, host_alias)
    guarded = this_machine or is_local(host_alias)
    merged: dict[str, Any] = {}
    for name in HostConfig.__struct_fields__:
        value = getattr(entry, name) if entry is not None else None
        if value is None and not (guarded and name in MACHINE_STOPPING):
            value = getattr(config.defaults, name)
        merged[name] = value
    return HostConfig(**merged)


def is_local(host_alias: str | None) -> bool:
    """Whether the alias names this machine without SSH (``gpuws connect local``)."""
    return host_alias == LOCAL_HOST


def withheld_defaults(config: Config, host_alias: str | None, *,
                      this_machine: bool = False) -> list[str]:
    """The ``[defaults]`` keys :func:`host_config` left out because the host is this
    machine: set in ``[defaults]``, not in the host's own table; ``[]`` for any other host.

    Args:
        config: the decoded config file.
        host_alias: the host as given to a command.
        this_machine: the host was found to be the laptop itself.

    Returns:
        The keys' names, in :data:`MACHINE_STOPPING`'s order.
    """
    if not (this_machine or is_local(host_alias)):
        return []
    entry = _entry(config, host_alias)
    return [name for name in MACHINE_STOPPING
            if getattr(config.defaults, name) is not None
            and (entry is None or getattr(entry, name) is None)]


def withheld_note(host: str, keys: list[str]) -> str:
    """The one line that says why this machine's lease or stop was not armed."""
    why = "is this machine" if not is_local(host) else "runs on this machine"
    return (f"{host} {why}: {', '.join(keys)} in [defaults] not applied to it (they could "
            f"stop or power off the laptop); set them under [hosts.{host}] to arm them here")


def _entry(config: Config, host_alias: str | None) -> HostConfig | None:
    if not host_alias:
        return None
    return config.hosts.get(host_alias) or config.hosts.get(_bare_host(host_alias))


def _bare_host(alias: str) -> str:
    host = alias.rsplit("@", 1)[-1]
    if host.startswith("["):  # [ipv6]:port
        return host[1:].split("]", 1)[0]
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host
