"""The export of a ``gpuws watch`` session shows the optimisation as a history: one row
per iteration with its median and the change against the previous one and the first,
with the loop's own 95% verdict (recorded H200 saxpy streams, marked as watch runs)."""

from __future__ import annotations

import json
from types import ModuleType

from gpuws.sessions.export import export_session
from gpuws.sessions.store import Store


def as_watch(lines: list[bytes]) -> list[bytes]:
    """The run's lines with its spec marked as one of a watch session's (``fork_server``)."""
    out = []
    for line in lines:
        event = json.loads(line)
        if event["type"] == "run_started":
            event["spec"]["fork_server"] = True
            line = json.dumps(event).encode()
        out.append(line)
    return out


def test_a_watch_session_exports_its_iterations(store: Store, recorded: ModuleType) -> None:
    t0 = recorded.T0
    sid = store.open_session("pod", "ssh", None, 3.99, started=t0)
    for i, (median, seed) in enumerate(((0.240, 1), (0.240, 2), (0.200, 3), (0.300, 4))):
        store.ingest_many(sid, as_watch(recorded.saxpy_run(
            f"it{i + 1}", t0=t0 + 60 * i, median_ms=median, n_samples=400, seed=seed,
            tiers=(1,))))
    text = export_session(store, sid)
    assert "## Watch iterations" in text
    section = text.split("## Watch iterations", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| ") and "`it" in r]
    assert len(rows) == 4
    assert "start" in rows[0] and rows[0].count("—") >= 2  # the first: nothing to compare
    assert "no difference" in rows[1] and "faster" in rows[2] and "slower" in rows[3]
    assert "| -16." in rows[2]  # 0.240 → 0.200 ms (samples around it) against the previous


def test_a_session_of_plain_runs_has_no_watch_table(store: Store,
                                                    recorded: ModuleType) -> None:
    sid = store.open_session("pod", "ssh", None, 3.99, started=recorded.T0)
    store.ingest_many(sid, recorded.saxpy_run("r1", tiers=(1,)))
    assert "Watch iterations" not in export_session(store, sid)
