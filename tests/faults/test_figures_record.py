"""The recipe that collects the figures (docs/reliability.md): every call appends.

``GPUWS_FIGURES=figures.ndjson python -m pytest tests/faults tests/fuzz tests/security``
must leave one JSON line per ``record`` call. A test that wrote the file instead of
appending left one line where nineteen were; every figure now goes through ``record``,
and an AST check keeps any test from writing ``$GPUWS_FIGURES`` itself.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from faults.figures import record  # type: ignore[import-not-found]

TESTS = Path(__file__).parent.parent


def test_two_records_leave_two_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "figures.ndjson"
    path.write_text('{"test": "earlier", "kept": 1}\n')  # a run before this one
    monkeypatch.setenv("GPUWS_FIGURES", str(path))
    first = record("first", lost=0, seconds=1.5)
    second = record("second", crashes=2, kind="tmpfs")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [{"test": "earlier", "kept": 1},
                     {"test": "first", "lost": 0, "seconds": 1.5},
                     {"test": "second", "crashes": 2, "kind": "tmpfs"}]
    # The same figures on stdout, one line each (seen with pytest -s).
    assert capsys.readouterr().out.splitlines() == [first, second]
    assert first == "FIGURES first lost=0 seconds=1.5"


def test_no_test_writes_the_figures_file_itself() -> None:
    """Only ``faults/figures.py`` opens ``$GPUWS_FIGURES``: any other test that reads the
    variable would be writing the file its own way."""
    readers = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.parent.name == "faults" and path.name in ("figures.py", Path(__file__).name):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value == "GPUWS_FIGURES":
                readers.append(str(path.relative_to(TESTS)))
    assert readers == [], readers
