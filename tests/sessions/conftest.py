"""Fixtures for the session tests: a hermetic store and the recorded event streams."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from gpuws.sessions.store import Store


def _load_recorded() -> ModuleType:
    # Test modules are imported with importlib mode (no sys.path entry), so the shared
    # helper is loaded by path, once, under a name no other test tree uses.
    spec = importlib.util.spec_from_file_location("gpuws_sessions_recorded",
                                                  Path(__file__).with_name("recorded.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECORDED = _load_recorded()


@pytest.fixture
def recorded() -> ModuleType:
    """The recorded-stream helper module (tests/sessions/recorded.py)."""
    return RECORDED


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private GPUWS_HOME (and no config file) for one test."""
    path = tmp_path / "gpuws-home"
    monkeypatch.setenv("GPUWS_HOME", str(path))
    monkeypatch.setenv("GPUWS_CONFIG", str(tmp_path / "no-config.toml"))
    return path


@pytest.fixture
def store(home: Path) -> Iterator[Store]:
    """A fresh store under the private GPUWS_HOME."""
    with Store() as s:
        yield s
