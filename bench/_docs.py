"""What the benches that write their own tables into docs/performance.md share: the
command line as the docs show it, and replacing a bench's generated block in place."""

from __future__ import annotations

import re
import sys
from pathlib import Path


def shown_argv() -> list[str]:
    """This run's arguments as the docs show them: without --write-docs and --docs."""
    out, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
        elif a == "--docs":
            skip = True
        elif a != "--write-docs" and not a.startswith("--docs="):
            out.append(a)
    return out


def put_block(docs: Path, tag: str, block: str, anchor: str) -> None:
    """Replace the block between ``<!-- TAG begin`` and ``<!-- TAG end -->`` in ``docs``
    with ``block``, or put it under the ``anchor`` line the first time."""
    text = docs.read_text()
    pattern = re.compile(rf"<!-- {re.escape(tag)} begin.*?<!-- {re.escape(tag)} end -->", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        if anchor not in text:
            raise SystemExit(f"{docs} has no {anchor!r} line to put the table under")
        text = text.replace(anchor, f"{anchor}\n\n{block}", 1)
    docs.write_text(text)
