"""The chaos harness's external effect store: SQLite behind a tiny TCP server, in its own process.

Run::

    python -m bench.chaos_store PATH PORT        # PORT 0 picks a free one

It listens on 127.0.0.1 only and prints ``ready <port>`` once it accepts connections. The
protocol is JSON lines, one request and one answer per line:

- ``{"op": "apply", "key": K, "run": R, "step": P, "attempt": A, "pid": N}``: records the raw
  execution (a row in ``executions``, always) and applies the effect once per key (``INSERT OR
  IGNORE`` into ``effects``, whose primary key is the idempotency key). Answers
  ``{"applied": true}`` the first time a key is seen, ``{"applied": false}`` after that. Both
  rows are committed before the answer is sent, so an answered effect is never lost.
- ``{"op": "stats"}``: ``{"executions": n, "effects": n}``.

This is what a well-behaved external API looks like to an agent: it honours idempotency keys,
and it also lets the harness count how often a step's body really ran. The harness never kills
this process; workers die around it.

``StoreClient`` is the synchronous client the agent's steps use (steps run in threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["SCHEMA", "StoreClient", "StoreError", "open_db", "serve"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS executions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    run TEXT NOT NULL,
    step INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    applied INTEGER NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS effects (
    key TEXT PRIMARY KEY,
    run TEXT NOT NULL,
    step INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    at REAL NOT NULL
);
"""


def open_db(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """Open (and create) the store's database in WAL mode."""
    db = sqlite3.connect(str(path), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: nothing committed is lost on a
    db.executescript(SCHEMA)  # process crash (only an OS crash could lose the last commits)
    return db


class _Store:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def apply(self, req: dict[str, Any]) -> dict[str, Any]:
        key, run = str(req["key"]), str(req["run"])
        step, attempt, pid = int(req["step"]), int(req["attempt"]), int(req.get("pid", 0))
        now = time.time()
        # One transaction per request; the event loop runs one request at a time.
        self.db.execute("BEGIN IMMEDIATE")
        try:
            cur = self.db.execute(
                "INSERT OR IGNORE INTO effects (key, run, step, attempt, pid, at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (key, run, step, attempt, pid, now),
            )
            applied = cur.rowcount == 1
            self.db.execute(
                "INSERT INTO executions (key, run, step, attempt, pid, applied, at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key, run, step, attempt, pid, int(applied), now),
            )
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return {"applied": applied}

    def stats(self) -> dict[str, Any]:
        (executions,) = self.db.execute("SELECT COUNT(*) FROM executions").fetchone()
        (effects,) = self.db.execute("SELECT COUNT(*) FROM effects").fetchone()
        return {"executions": executions, "effects": effects}

    def handle(self, line: bytes) -> dict[str, Any]:
        try:
            req = json.loads(line)
            op = req.get("op")
            if op == "apply":
                return self.apply(req)
            if op == "stats":
                return self.stats()
            if op == "ping":
                return {"ok": True}
            return {"error": f"unknown op {op!r}"}
        except Exception as e:  # a bad request is answered, never fatal
            return {"error": f"{type(e).__name__}: {e}"}


async def serve(path: str | os.PathLike[str], port: int) -> None:
    """Serve the store on 127.0.0.1:``port`` until SIGTERM or SIGINT."""
    store = _Store(open_db(path))

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                writer.write(json.dumps(store.handle(line)).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    server = await asyncio.start_server(on_client, "127.0.0.1", port, backlog=1024)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    bound = server.sockets[0].getsockname()[1]
    print(f"ready {bound}", flush=True)
    async with server:
        await stop.wait()
    store.db.close()


class StoreError(Exception):
    """The effect store could not be reached or refused the request."""


class StoreClient:
    """A blocking client (one short connection per request; safe from any thread)."""

    def __init__(self, address: str, *, timeout: float = 30.0) -> None:
        host, _, port = address.rpartition(":")
        self.host, self.port, self.timeout = host or "127.0.0.1", int(port), timeout

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        last: Exception | None = None
        for attempt in range(5):
            try:
                with socket.create_connection((self.host, self.port), self.timeout) as sock:
                    sock.sendall(json.dumps(req).encode() + b"\n")
                    with sock.makefile("rb") as f:
                        line = f.readline()
                if not line:
                    raise ConnectionError("the store closed the connection")
                answer: dict[str, Any] = json.loads(line)
                if "error" in answer:
                    raise StoreError(answer["error"])
                return answer
            except OSError as e:
                last = e
                time.sleep(0.05 * (attempt + 1))
        raise StoreError(f"effect store at {self.host}:{self.port} unreachable: {last}")

    def apply(self, key: str, run: str, step: int, attempt: int) -> bool:
        """Apply the effect named ``key``; True if this call applied it (first time)."""
        req = {
            "op": "apply",
            "key": key,
            "run": run,
            "step": step,
            "attempt": attempt,
            "pid": os.getpid(),
        }
        return bool(self.request(req)["applied"])

    def stats(self) -> dict[str, int]:
        got = self.request({"op": "stats"})
        return {"executions": int(got["executions"]), "effects": int(got["effects"])}


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: python -m bench.chaos_store PATH PORT")
    path, port = Path(sys.argv[1]), int(sys.argv[2])
    asyncio.run(serve(path, port))


if __name__ == "__main__":
    main()
