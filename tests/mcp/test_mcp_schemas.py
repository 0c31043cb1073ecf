"""The tools' input and output schemas, as a client receives them, pinned in a snapshot.

An agent host caches these and models are prompted with them: a change must be seen in
review. After a deliberate change:
``GPUWS_UPDATE_SNAPSHOTS=1 pytest tests/mcp/test_mcp_schemas.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .mcpclient import mcp_client

SNAPSHOT = Path(__file__).parent / "tool_schemas.json"

pytestmark = pytest.mark.timeout(120)


async def test_tool_schemas_match_the_snapshot() -> None:
    async with mcp_client() as client:
        tools = (await client.list_tools()).tools
        templates = (await client.list_resource_templates()).resource_templates
    got = {
        "tools": {t.name: {"description": t.description, "input": t.input_schema,
                           "output": t.output_schema} for t in sorted(tools, key=lambda t: t.name)},
        "resource_templates": sorted(t.uri_template for t in templates),
    }
    text = json.dumps(got, indent=2, sort_keys=True) + "\n"
    if os.environ.get("GPUWS_UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.write_text(text)
    assert json.loads(SNAPSHOT.read_text()) == got, \
        "tool schemas changed: review, then rerun with GPUWS_UPDATE_SNAPSHOTS=1"
