"""The agent's runs and calls in the CLI's ``history`` and ``export`` (a real store)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuws.cli import main
from gpuws.sessions import agent_actions as actions
from gpuws.sessions.store import Store

from .test_mcp_compare import IDS, REC


def test_history_and_export_show_the_agents_work(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    with Store() as store:
        sid = store.open_session("h200", "ssh+sftp", None, 3.99, started=REC.T0 - 10)
        store.ingest_many(sid, REC.saxpy_run(IDS["a"], tiers=(1,)))
        store.ingest_many(sid, REC.saxpy_run(IDS["faster"], t0=REC.T0 + 60, tiers=(1,)))
        store.end_session(sid, REC.T0 + 300)
        # Reading a store no agent used leaves it without the table.
        assert actions.actions(store) == []
        assert store._conn.execute("SELECT name FROM sqlite_master WHERE name = "
                                   "'agent_actions'").fetchone() is None
        actions.record(store, "run", {"host": "h200", "workload": "builtin:saxpy | x"}, "ok",
                       host="h200", run_id=IDS["faster"], session_id=sid, cost_usd=0.0123,
                       at=REC.T0 + 70)
        actions.record(store, "run", {"host": "other", "workload": "cmd:true"}, "refused",
                       detail="gpuws: refused: host 'other' is not open to agents",
                       session_id=sid, at=REC.T0 + 80)
    assert main(["history", "--json"]) == 0
    rows = {r["run_id"]: r["by"] for r in json.loads(capsys.readouterr().out)}
    assert rows == {IDS["a"]: "person", IDS["faster"]: "agent"}
    assert main(["history"]) == 0
    assert "by agent" in capsys.readouterr().out
    report = tmp_path / "report.md"
    assert main(["export", sid, "-o", str(report)]) == 0
    text = report.read_text()
    section = text[text.index("## Agent actions (gpuws mcp)"):]
    # A "|" in an argument stays inside its cell.
    assert '`{"host":"h200","workload":"builtin:saxpy \\| x"}`' in section
    assert f"| ok | {IDS['faster']} | $0.0123 |" in section
    assert "refused: gpuws: refused: host 'other' is not open to agents" in section
