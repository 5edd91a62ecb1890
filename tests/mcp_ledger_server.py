"""A small MCP server (stdio) for the MCP tests: each applied tool call is one row in the
SQLite ledger ``$SOJOURN_TEST_MCP_LEDGER`` names, committed before the tool answers.

Run as ``python -m tests.mcp_ledger_server`` by the client it serves (the MCP stdio transport
starts it). On start it records its pid (table ``servers``), so a test can SIGKILL it. A tool
whose ``block`` argument names a key blocks after applying the call, until the process dies, the
first time it sees that key (the "mid-call" of the tests); later calls with that key answer.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from typing import Any

from mcp.server.mcpserver import MCPServer

LEDGER = os.environ["SOJOURN_TEST_MCP_LEDGER"]

server = MCPServer("ledger")


def _db() -> sqlite3.Connection:
    db = sqlite3.connect(LEDGER, timeout=30, isolation_level=None)
    db.execute("CREATE TABLE IF NOT EXISTS servers (pid INTEGER)")
    db.execute(
        "CREATE TABLE IF NOT EXISTS calls (id INTEGER PRIMARY KEY, pid INTEGER, tool TEXT,"
        " key TEXT, value TEXT)"
    )
    db.execute("CREATE TABLE IF NOT EXISTS blocked (key TEXT PRIMARY KEY)")
    return db


def _apply(tool: str, key: str, value: str, block: bool) -> int:
    """Record the call; block (forever) the first time ``key`` blocks. Returns the row count
    of ``tool`` calls with ``key``."""
    db = _db()
    with db:
        db.execute(
            "INSERT INTO calls (pid, tool, key, value) VALUES (?, ?, ?, ?)",
            (os.getpid(), tool, key, value),
        )
    if block:
        first = db.execute("INSERT OR IGNORE INTO blocked VALUES (?)", (key,)).rowcount == 1
        if first:
            threading.Event().wait()  # until the test kills this process
    (n,) = db.execute(
        "SELECT COUNT(*) FROM calls WHERE tool = ? AND key = ?", (tool, key)
    ).fetchone()
    return int(n)


@server.tool()
def put(key: str, value: str, block: bool = False) -> dict[str, Any]:
    """Set ``key`` to ``value`` (idempotent: setting it again changes nothing)."""
    n = _apply("put", key, value, block)
    return {"key": key, "value": value, "seen": n}


@server.tool()
def charge(key: str, cents: int, block: bool = False) -> str:
    """Charge ``cents`` (not idempotent: every call is another charge)."""
    n = _apply("charge", key, str(cents), block)
    return f"ch_{key}_{n}"


@server.tool()
def fail(message: str) -> str:
    """Always fails (a tool error, ``isError``)."""
    raise ValueError(message)


if __name__ == "__main__":
    with _db() as db:
        db.execute("INSERT INTO servers VALUES (?)", (os.getpid(),))
    server.run("stdio")
