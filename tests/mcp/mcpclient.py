"""A real ``gpuws mcp`` process driven by the MCP SDK's own stdio client."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

SRC = Path(__file__).parents[2] / "src"


def write_config(text: str) -> None:
    """The person's config (the hermetic GPUWS_CONFIG every test has)."""
    Path(os.environ["GPUWS_CONFIG"]).write_text(text)


@asynccontextmanager
async def mcp_client(*args: str) -> AsyncIterator[ClientSession]:
    """``gpuws mcp ARGS`` as a subprocess, with an initialized client session on it."""
    env = {k: os.environ[k] for k in ("GPUWS_HOME", "GPUWS_CONFIG", "GPUWS_POD_CACHE", "PATH",
                                      "HOME") if k in os.environ}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    params = StdioServerParameters(command=sys.executable, args=["-m", "gpuws", "mcp", *args],
                                   env=env)
    with open(Path(os.environ["GPUWS_HOME"]).parent / "mcp-stderr.log", "a") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session
