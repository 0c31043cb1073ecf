"""Fixtures for the TUI tests: no cursor blink, UTC, a fixed home for screenshots."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuws.sessions import store as store_module

#: Snapshot tests print paths: they need the same GPUWS_HOME on every machine.
SNAPSHOT_HOME = Path("/tmp/gpuws-tui-snapshots")


@pytest.fixture(autouse=True)
def _steady_terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No blinking cursor (screenshots must not depend on the blink phase); times in UTC."""
    monkeypatch.setattr("textual.widgets._input.Input.cursor_blink", False)
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


@pytest.fixture
def snapshot_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fixed GPUWS_HOME and predictable session ids, so screenshots match anywhere."""
    shutil.rmtree(SNAPSHOT_HOME, ignore_errors=True)
    monkeypatch.setenv("GPUWS_HOME", str(SNAPSHOT_HOME / "home"))
    counter = iter(range(1, 1000))
    monkeypatch.setattr(store_module.secrets, "token_hex",
                        lambda n: f"{next(counter):0{2 * n}x}")
    yield SNAPSHOT_HOME / "home"
    shutil.rmtree(SNAPSHOT_HOME, ignore_errors=True)
