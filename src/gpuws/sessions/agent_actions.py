"""Every tool call an agent makes, recorded in the session store with its arguments.

The table lives in the same SQLite file as the sessions, so ``history`` and ``export``
read it beside the runs. It is created where missing (``CREATE TABLE IF NOT EXISTS``)
rather than by a store migration: it belongs to this face alone, a store without it reads
as "no agent ever used it", and the store's schema version stays the sessions' own.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import msgspec

from ..text.textsafe import visible
from .store import Store

_TABLE = """CREATE TABLE IF NOT EXISTS agent_actions(
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    tool TEXT NOT NULL,
    arguments TEXT NOT NULL,
    outcome TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT '',
    host TEXT,
    run_id TEXT,
    session_id TEXT,
    cost_usd REAL,
    record TEXT)"""

#: What a recorded call ended as.
OUTCOMES = ("ok", "refused", "error", "cancelled")


class AgentAction(msgspec.Struct, frozen=True, kw_only=True):
    """One recorded tool call.

    Attributes:
        id: its row.
        at: when it was made (unix seconds).
        tool: the tool's name.
        arguments: the arguments as the agent sent them.
        outcome: ``ok``, ``refused`` (the person's bounds), ``error`` or ``cancelled``.
        detail: the refusal's or error's one line, empty when it went well.
        host: the host it touched, if any.
        run_id: the run it started or read, if any.
        session_id: the session that run was stored in, if any.
        cost_usd: the connected time it cost, where the host has a rate.
        record: the provenance record of a run it made (:func:`.results.provenance`).
    """

    id: int
    at: float
    tool: str
    arguments: dict[str, Any]
    outcome: str
    detail: str = ""
    host: str | None = None
    run_id: str | None = None
    session_id: str | None = None
    cost_usd: float | None = None
    record: dict[str, Any] | None = None


def _ensure(store: Store) -> None:
    store._conn.execute(_TABLE)


def record(store: Store, tool: str, arguments: dict[str, Any], outcome: str, *,
           detail: str = "", host: str | None = None, run_id: str | None = None,
           session_id: str | None = None, cost_usd: float | None = None,
           provenance: dict[str, Any] | None = None, at: float | None = None) -> int:
    """Store one tool call; returns its id."""
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}")
    _ensure(store)
    with store._transaction() as cur:
        cur.execute(
            "INSERT INTO agent_actions(at, tool, arguments, outcome, detail, host, run_id, "
            "session_id, cost_usd, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (time.time() if at is None else at, tool,
             json.dumps(arguments, sort_keys=True, default=str), outcome, detail, host,
             run_id, session_id, cost_usd,
             None if provenance is None else json.dumps(provenance, sort_keys=True)))
        return int(cur.lastrowid or 0)


def actions(store: Store, session_id: str | None = None) -> list[AgentAction]:
    """The recorded calls (those of ``session_id``'s runs, or all), oldest first."""
    if store._conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                           "name = 'agent_actions'").fetchone() is None:
        return []  # no agent has used this store: reading it leaves it as it was
    sql = ("SELECT id, at, tool, arguments, outcome, detail, host, run_id, session_id, "
           "cost_usd, record FROM agent_actions")
    params: tuple[str, ...] = ()
    if session_id is not None:
        sql += " WHERE session_id = ?"
        params = (session_id,)
    out = []
    for row in store._conn.execute(sql + " ORDER BY at, id", params):
        i, at, tool, args, outcome, detail, host, run_id, sid, cost, rec = row
        out.append(AgentAction(id=i, at=at, tool=tool, arguments=json.loads(args),
                               outcome=outcome, detail=detail, host=host, run_id=run_id,
                               session_id=sid, cost_usd=cost,
                               record=None if rec is None else json.loads(rec)))
    return out


def agent_runs(store: Store) -> dict[str, AgentAction]:
    """The runs an agent started, by run id (the call that started each)."""
    return {a.run_id: a for a in actions(store) if a.tool == "run" and a.run_id}


def provenance_of(store: Store, run_id: str) -> dict[str, Any] | None:
    """The provenance recorded when an agent's run finished, if an agent made it."""
    action = agent_runs(store).get(run_id)
    return action.record if action is not None else None


def agent_section(rows: list[AgentAction]) -> str:
    """The agent's calls as a markdown section (empty when there were none)."""
    if not rows:
        return ""
    lines = ["", "## Agent actions (gpuws mcp)", "",
             "| when (UTC) | tool | arguments | outcome | run | cost |",
             "|---|---|---|---|---|---|"]
    for a in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(a.at))
        args = visible(msgspec.json.encode(a.arguments).decode(), 200).replace("|", "\\|")
        outcome = a.outcome + (f": {visible(a.detail, 200)}" if a.detail else "")
        cost = "" if a.cost_usd is None or not math.isfinite(a.cost_usd) \
            else f"${a.cost_usd:.4f}"
        lines.append(f"| {when} | {a.tool} | `{args}` | {outcome.replace('|', '/')} | "
                     f"{a.run_id or ''} | {cost} |")
    return "\n".join(lines) + "\n"
