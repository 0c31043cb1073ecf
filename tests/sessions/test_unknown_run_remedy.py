"""An unknown or ambiguous run id, wherever it is resolved, points to the run listing."""

from __future__ import annotations

from types import ModuleType

import pytest

from gpuws.errors import StoreError
from gpuws.sessions.runlist import RUN_LISTING_REMEDY
from gpuws.sessions.store import Store


def test_the_store_points_to_gpuws_history(store: Store, recorded: ModuleType) -> None:
    """The TUI (results, replay --run) shows the store's own error: it must name the listing
    of runs (`gpuws history`), not the listing of sessions."""
    sid = store.open_session("h200", "ssh+sftp", None, 3.99)
    store.ingest_many(sid, recorded.saxpy_run("20261121-120000-aaaaaa"))
    store.ingest_many(sid, recorded.saxpy_run("20261121-120100-bbbbbb", t0=recorded.T0 + 60))
    with pytest.raises(StoreError) as info:
        store.run("nope")
    assert info.value.remedy == RUN_LISTING_REMEDY and "`gpuws history`" in info.value.remedy
    with pytest.raises(StoreError) as info:
        store.run("20261121")
    assert "is ambiguous" in info.value.message and "`gpuws history`" in info.value.remedy
    with pytest.raises(StoreError) as info:
        store.session("nope")
    assert "`gpuws sessions`" in info.value.remedy
