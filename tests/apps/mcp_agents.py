"""Agents for the MCP tests that need a real worker process: each calls tools of
``tests.mcp_ledger_server``, a real stdio MCP server the worker starts, whose every applied
call is a row of the SQLite ledger ``$SOJOURN_TEST_MCP_LEDGER`` (the test owns the file).

``mcp_then_hold`` charges, then holds in a plain step until ``$SOJOURN_TEST_MCP_RELEASE``
exists (the window in which a test SIGKILLs its worker), then charges again.
``ledger_server`` declares the server for the in-process tests too.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from sojourn.actors import Context, RetryPolicy, agent
from sojourn.actors.integrations.mcp import McpCallLost, McpServer

ROOT = Path(__file__).resolve().parent.parent.parent


def ledger_server(ledger: str, **options: Any) -> McpServer:
    """The ledger server (``tests/mcp_ledger_server.py``) over stdio, writing to ``ledger``."""
    return McpServer(
        "ledger",
        command=[sys.executable, "-m", "tests.mcp_ledger_server"],
        cwd=str(ROOT),
        env={"SOJOURN_TEST_MCP_LEDGER": ledger, "PYTHONPATH": str(ROOT)},
        **options,
    )


FAST = RetryPolicy(retry_on=(McpCallLost,), attempts=3, initial_interval=0.1, jitter=0)

LEDGER = os.environ.get("SOJOURN_TEST_MCP_LEDGER", "unset.sqlite")
SERVER = ledger_server(LEDGER, retry=FAST, cost=0.25)


def hold() -> int:
    """Holds until the release file exists; says who holds it in ``<release>.holding``."""
    release = Path(os.environ["SOJOURN_TEST_MCP_RELEASE"])
    Path(f"{release}.holding").write_text(str(os.getpid()))
    while not release.exists():
        time.sleep(0.05)
    return os.getpid()


@agent("mcp_then_hold", mcp=[SERVER])
async def mcp_then_hold(ctx: Context, key: str) -> list[Any]:
    first = await ctx.mcp("ledger", "charge", {"key": key, "cents": 1}, in_doubt="ask")
    await ctx.step(hold)
    second = await ctx.mcp("ledger", "charge", {"key": f"{key}-2", "cents": 2}, in_doubt="ask")
    return [first, second]
