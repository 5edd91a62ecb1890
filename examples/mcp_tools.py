"""An agent calling the tools of an MCP server, each call a journaled step
(``pip install 'sojourn[mcp]'``; docs/mcp.md).

The server is ``examples/servers/notes_mcp.py``, a stdio server the worker starts on the first
call and stops with the worker (its notes in ``$NOTES_DB``, default ``notes.sqlite`` in the
repository). Run it::

    sojourn dev --app examples.mcp_tools
    sojourn start note-taker --run-id n1 --input '["buy milk", "call Ada"]'
    sojourn history n1         # mcp:notes.add_note steps, then mcp:notes.publish
    sojourn status n1          # completed: "published #1: 2 notes"

``add_note`` is idempotent (it deduplicates on the idempotency key the call carries): a call
cut off by a crash, of the worker or of the server, runs again. ``publish`` is not: declared
``in_doubt="ask"``, a call cut off mid-way suspends the run (``sojourn status`` says so)
until ``sojourn decide n1 <position> retry|skip|fail`` says what happened.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sojourn.actors import Context, RetryPolicy, agent
from sojourn.actors.mcp import McpCallLost, McpServer

ROOT = Path(__file__).resolve().parent.parent

notes = McpServer(
    "notes",
    command=[sys.executable, "-m", "examples.servers.notes_mcp"],
    cwd=str(ROOT),
    env={"NOTES_DB": os.environ.get("NOTES_DB", "notes.sqlite")},  # the server's own env
    retry=RetryPolicy(retry_on=(McpCallLost,), attempts=3, initial_interval=1.0),
    timeout=30,
)


@agent("note-taker", mcp=[notes])
async def note_taker(ctx: Context, items: list[str]) -> str:
    for item in items:
        await ctx.mcp("notes", "add_note", {"text": item})
    published = await ctx.mcp("notes", "publish", {"title": "Notes"}, in_doubt="ask")
    return str(published["result"])
