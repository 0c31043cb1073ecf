"""The ``persist`` setting: how long a kept connection waits for the next command.

No heavy import here: the config module and ``gpuws --help`` read it.
"""

from __future__ import annotations

import re

from ...errors import ConfigError

#: What ``persist = "yes"`` keeps a connection for: ten minutes, as the ControlPersist
#: setups people copy use; long enough for an edit–run loop's pauses, short enough that
#: a forgotten master does not hold a link (it never holds an agent or a lease).
DEFAULT_IDLE_S = 600.0
#: Left out of the config: not kept. A master is a process that outlives the command,
#: and this stays opt-in until the whole suite has run with it on (see docs/performance.md).
DEFAULT_PERSIST: str | bool = "no"
#: The longest idle time accepted: a week.
MAX_IDLE_S = 7 * 86400.0

_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smh]?)")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_persist(value: str | bool | None) -> float | None:
    """Seconds a master stays with no command, or None when connections are not kept.

    Args:
        value: the config's ``persist`` (None: left out, :data:`DEFAULT_PERSIST`).

    Raises:
        ConfigError: not a duration, ``yes`` or ``no``, zero, or over a week.
    """
    if value is None:
        value = DEFAULT_PERSIST
    if isinstance(value, bool):
        return DEFAULT_IDLE_S if value else None
    text = value.strip().lower()
    if text in ("no", "off", "false"):
        return None
    if text in ("yes", "on", "true"):
        return DEFAULT_IDLE_S
    m = _DURATION.fullmatch(text)
    remedy = 'write persist = "10m" (or "90s", "1h", a number of seconds), "yes" or "no"'
    if m is None:
        raise ConfigError(f"persist = {value!r} is not a duration", remedy=remedy)
    seconds = float(m.group(1)) * _UNIT[m.group(2)]
    if not 0 < seconds <= MAX_IDLE_S:
        raise ConfigError(f"persist = {value!r}: the idle time must be more than 0 and at "
                          "most a week", remedy=remedy)
    return seconds


def idle_for(host: str, *, enabled: bool = True) -> float | None:
    """The idle time of ``host``'s kept connection from the config, or None (not kept).

    Args:
        host: the host as given to a command (``local`` is never kept: there is no link).
        enabled: False for ``--no-persist``.

    Raises:
        ConfigError: the config file is broken, or its ``persist`` is.
    """
    from ...config import host_config, is_local, load_config

    if not enabled or is_local(host):
        return None
    return parse_persist(host_config(load_config(), host).persist)
