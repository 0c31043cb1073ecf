"""The figures each fault, fuzz and security test records (docs/reliability.md quotes them).

``record`` prints one ``FIGURES <test> key=value ...`` line (seen with ``pytest -s``) and,
when ``GPUWS_FIGURES`` names a file, appends the same as a JSON line there, so a CI job
can collect them.
"""

from __future__ import annotations

import json
import os


def record(test: str, **figures: int | float | str) -> str:
    """Print (and optionally append to ``$GPUWS_FIGURES``) one test's figures."""
    line = "FIGURES " + test + " " + " ".join(f"{k}={v}" for k, v in figures.items())
    print(line)
    path = os.environ.get("GPUWS_FIGURES")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"test": test, **figures}) + "\n")
    return line
