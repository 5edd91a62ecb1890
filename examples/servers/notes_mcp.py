"""A small MCP server over stdio, for ``examples/mcp_tools.py``: notes kept in a SQLite file.

``add_note`` is idempotent by the caller's key (the step's idempotency key sojourn sends in the
request's ``_meta``, else the note's text): a call repeated after a crash adds nothing.
``publish`` is not: every call publishes again, so the example calls it at most once.

Started by the worker on the first ``ctx.mcp`` call (``python -m examples.servers.notes_mcp``);
``$NOTES_DB`` names the file (default ``notes.sqlite``).
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("notes")


def _db() -> sqlite3.Connection:
    db = sqlite3.connect(os.environ.get("NOTES_DB", "notes.sqlite"), isolation_level=None)
    db.execute("CREATE TABLE IF NOT EXISTS notes (key TEXT PRIMARY KEY, text TEXT)")
    db.execute("CREATE TABLE IF NOT EXISTS published (id INTEGER PRIMARY KEY, text TEXT)")
    return db


def _key(ctx: Context[Any, Any], fallback: str) -> str:
    meta = ctx.request_context.meta
    key = None if meta is None else dict(meta).get("sojourn/idempotency-key")
    return str(key) if key else fallback


@server.tool()
def add_note(text: str, ctx: Context[Any, Any]) -> dict[str, Any]:
    """Add a note (once per idempotency key); returns how many notes there are."""
    db = _db()
    db.execute("INSERT OR IGNORE INTO notes VALUES (?, ?)", (_key(ctx, text), text))
    (count,) = db.execute("SELECT COUNT(*) FROM notes").fetchone()
    return {"notes": int(count)}


@server.tool()
def publish(title: str) -> str:
    """Publish every note under ``title`` (not idempotent: each call publishes again)."""
    db = _db()
    texts = [t for (t,) in db.execute("SELECT text FROM notes ORDER BY rowid")]
    body = f"# {title}\n" + "\n".join(f"- {t}" for t in texts)
    cur = db.execute("INSERT INTO published (text) VALUES (?)", (body,))
    return f"published #{cur.lastrowid}: {len(texts)} notes"


if __name__ == "__main__":
    server.run("stdio")
