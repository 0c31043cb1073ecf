"""The hosts Home offers: ssh-config aliases and pods used before (no Textual here)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GpuwsError
from ..sessions.cost import economics
from ..sessions.store import SessionRow, Store

# Names are listed from the config's Host lines; where each one leads is asked of the
# same resolver the SSH transport connects with (``ssh -G``), never guessed here.
from ..transport.sshconfig import config_hosts, resolve


@dataclass(frozen=True)
class HostEntry:
    """One host on Home.

    Attributes:
        name: what to connect to (an alias, ``user@host[:port]`` or ``local``).
        where: ``user@hostname:port`` from the ssh config, or ``""``.
        in_config: the name is a ``Host`` entry of the ssh config.
        gpu: the GPU seen on the last connection, if any.
        last_cost: what the last session there cost (``None``: no rate, or never used).
        last_used: when the last session there started.
    """

    name: str
    where: str
    in_config: bool
    gpu: str | None
    last_cost: float | None
    last_used: float | None

    @property
    def unknown_name(self) -> bool:
        """A bare name (no dot, ``@`` or port) that the ssh config does not hold: it was
        reached before through another config (``-F``), which Home does not know, so
        Enter here answered "cannot resolve host". Home marks it instead of offering it
        as if it worked."""
        return (not self.in_config and self.name not in ("local", "localhost")
                and not any(c in self.name for c in ".@:["))


#: Characters no ssh alias or host name holds: a line holding one is a pasted command or
#: a stray key, refused on Home before anything connects.
NOT_IN_A_HOST = frozenset(" \t;|&`$<>()'\"\\*?!{}~#")


def destination_problem(text: str) -> str | None:
    """Why ``text`` cannot be a destination typed on Home, or None."""
    bad = sorted({c for c in text if c in NOT_IN_A_HOST or ord(c) < 32 or c == "\x7f"})
    if not bad:
        return None
    shown = " ".join("space" if c == " " else repr(c)[1:-1] for c in bad)
    return f"not a host name (it holds {shown})"


@dataclass(frozen=True)
class SessionSummary:
    """One session as lists show it."""

    row: SessionRow
    gpu: str | None
    duration_s: float
    cost_usd: float | None


def config_aliases(config_file: str | None) -> list[str]:
    """``Host`` names without wildcards or negation, in file order (``Include`` followed).

    Raises:
        ConfigError: the file cannot be read.
    """
    return config_hosts(config_file)


def summarize_sessions(store: Store, limit: int | None = None) -> list[SessionSummary]:
    """The newest sessions with their GPU, connected time and cost (run on the store thread)."""
    # Only the sessions shown are read: Home's ten were cut from every session, so its
    # start doubled from 2,000 runs to 20,000.
    return [_summary(store, row) for row in store.newest_sessions(limit)]


def _summary(store: Store, row: SessionRow) -> SessionSummary:
    econ = economics(store, row.id)
    gpu = row.probe.gpus[0].name if row.probe and row.probe.gpus else None
    return SessionSummary(row, gpu, econ.connected_s, econ.total_cost_usd)


def home_hosts(store: Store, config_file: str | None) -> list[HostEntry]:
    """Config aliases first (in file order), then other hosts used before, newest first.

    Run on the store's thread. An unreadable ssh config leaves only the used hosts.
    """
    # One session per host is read (its newest), not every session the store holds.
    last = {row.host: _summary(store, row) for row in store.last_session_per_host()}
    try:
        aliases = config_aliases(config_file)
    except GpuwsError:
        aliases = []
    entries = [_entry(name, _where(name, config_file), True, last.get(name))
               for name in aliases]
    entries += [_entry(name, "", False, s) for name, s in last.items() if name not in aliases]
    if not any(e.name == "local" for e in entries):
        entries.append(_entry("local", "", False, None))
    return entries


def _where(alias: str, config_file: str | None) -> str:
    try:
        t = resolve(alias, config_file)
    except GpuwsError:
        return ""
    via = f" via {t.proxy_jump}" if t.proxy_jump else " via ProxyCommand" if t.proxy_command \
        else ""
    return f"{t.user}@{t.hostname}:{t.port}{via}"


def _entry(name: str, where: str, in_config: bool, last: SessionSummary | None) -> HostEntry:
    if name == "local" and not where:
        where = "this machine"
    elif not in_config and not where and "@" in name:
        where = name  # a user@host[:port] typed before says itself where it leads
    return HostEntry(name=name, where=where, in_config=in_config,
                     gpu=last.gpu if last else None,
                     last_cost=last.cost_usd if last else None,
                     last_used=last.row.started if last else None)


def last_workload(store: Store, host: str) -> str | None:
    """The workload of the newest run on ``host`` (run on the store's thread), or None.

    The launcher opens on it: the kernel chosen last time was forgotten at every opening.
    """
    return store.last_workload_on(host)
