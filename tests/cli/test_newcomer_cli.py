"""Issue 34: the newcomer's rough edges in the CLI (shared/reviews/newcomer-2026-11-28.md),
each through the real ``gpuws`` command."""

from __future__ import annotations

import pytest

from cli.test_cli_headless import _stored_runs  # type: ignore[import-not-found]
from gpuws.cli import main


def test_nothing_to_compare_is_said_once(capsys: pytest.CaptureFixture[str]) -> None:
    """Finding 14: `gpuws: Nothing to compare: nothing to compare between …`."""
    ids = _stored_runs()
    assert main(["compare", ids["t3only"], ids["failed"]]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"gpuws: nothing to compare between {ids['t3only']} and "), line
    assert line.lower().count("nothing to compare") == 1, line
