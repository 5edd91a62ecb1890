"""The SQLite read model: every run's view and steps in one file, for listing and dashboards.

The projector folds the events stream into ``RunView`` values (``projections/views.py``) and
hands them here, decision by decision, as ``Applied``. This module only stores them: it never
folds, so a view means the same here as in the KV bucket and the change messages.

Exactly-once from an at-least-once feed: the model keeps its **position** (the events-stream
sequence of the last decision applied) in the same file, and ``apply`` writes a batch of
decisions and the new position in **one transaction**, skipping every decision at or below the
position. A decision redelivered after a crash or a restart is skipped; a crash inside the
transaction leaves the file as it was, so the same decisions are applied on the next try. A
model rebuilt from the start of the stream (``sojourn projector --rebuild``: ``reset``, then
apply everything) ends up with exactly the same rows (``dump``).

SQLite in WAL mode with ``synchronous=NORMAL``: readers never block the writer, and a commit
costs no fsync (a power loss may lose the last commits, never corrupt the file; the projector
then re-applies them from its position). One process writes a file: this class is its only
writer, serialised by a lock; reads go through a second connection so a listing never waits
for a write.

Its tables and rows are ``tables.py``; what a listing may ask, its SQL and its cursors,
``queries.py`` (the names of both that a caller needs are importable from here too). Listing
order is most recently updated first, paginated by key: a run updated between two page requests
moves to the top, so it is not shown again on a later page (and a run that moved below the
cursor shows up again): a listing is a sequence of snapshots, not one.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import aiosqlite

from sojourn.schemas.codec import decode_run_view
from sojourn.schemas.errors import SojournError
from sojourn.schemas.health import LivenessState
from sojourn.schemas.views import RunsPage, RunsQuery, RunView, ViewError

from .queries import (
    CURSOR_MAX,
    InvalidQuery,
    decode_cursor,
    encode_cursor,
    query_sql,
    validate_query,
)
from .sink import Applied
from .tables import (
    ATTRIBUTE_COLUMNS,
    DELETE_ATTRIBUTES,
    INSERT_ATTRIBUTE,
    INSERT_PENDING,
    RUN_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    SET_LIVENESS,
    STEP_COLUMNS,
    STEP_STATUSES,
    UPSERT_RUN,
    UPSERT_STEP,
    StepRow,
    StepStatus,
    attribute_rows,
    changes_attributes,
    run_row,
    step_rows,
)

__all__ = [
    "CURSOR_MAX",
    "SCHEMA_VERSION",
    "STEP_STATUSES",
    "Applied",
    "InvalidQuery",
    "SqliteModel",
    "StepRow",
    "StepStatus",
    "decode_cursor",
    "encode_cursor",
    "validate_query",
]

_CACHE_KIB: Final = -65536
"""Page cache per connection (negative: KiB), 64 MiB: the indexes of ~100,000 runs stay in
memory, so an update does not read the disk (with SQLite's 2 MiB default it does, and applying
slows down three-fold)."""


def _decode_view(text: str) -> RunView:
    return decode_run_view(text)


class SqliteModel:
    """The read model in one SQLite file (see the module docstring). Open with ``open``."""

    def __init__(
        self, writer: aiosqlite.Connection, reader: aiosqlite.Connection, path: Path, position: int
    ) -> None:
        self._db = writer
        self._reader = reader
        self.path = path
        self._position = position
        self._write = asyncio.Lock()
        self._read = asyncio.Lock()

    @classmethod
    async def open(cls, path: str | Path, *, events_stream: str) -> SqliteModel:
        """Open (creating it if needed) the model file for ``events_stream``.

        Raises:
            SojournError: the file is not a SQLite database, cannot be put in WAL mode, was
                made by another schema version or for another events stream (another
                deployment prefix: its rows must not mix with this one's).
        """
        path = Path(path)
        try:
            writer = await aiosqlite.connect(path, isolation_level=None)
        except sqlite3.Error as e:
            raise SojournError(f"cannot open the read model {path}: {e}") from e
        try:
            position = await cls._prepare(writer, path, events_stream)
            reader = await aiosqlite.connect(path, isolation_level=None)
        except BaseException:
            await writer.close()
            raise
        try:
            await reader.execute("PRAGMA query_only = ON")
            await reader.execute("PRAGMA busy_timeout = 5000")
            await reader.execute(f"PRAGMA cache_size = {_CACHE_KIB}")
        except BaseException:
            await reader.close()
            await writer.close()
            raise
        return cls(writer, reader, path, position)

    @staticmethod
    async def _prepare(db: aiosqlite.Connection, path: Path, events_stream: str) -> int:
        try:
            await db.execute("PRAGMA busy_timeout = 5000")
            async with db.execute("PRAGMA journal_mode = WAL") as cur:
                row = await cur.fetchone()
            if row is None or str(row[0]).lower() != "wal":
                raise SojournError(f"the read model {path} cannot use WAL mode (got {row})")
            await db.execute("PRAGMA synchronous = NORMAL")
            await db.execute(f"PRAGMA cache_size = {_CACHE_KIB}")
            await db.execute("BEGIN IMMEDIATE")
            try:
                # One statement at a time: executescript would commit the transaction.
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        await db.execute(statement)
                rows = await db.execute_fetchall("SELECT key, value FROM meta")
                meta: dict[str, Any] = {str(r[0]): r[1] for r in rows}
                if not meta:
                    await db.executemany(
                        "INSERT INTO meta (key, value) VALUES (?, ?)",
                        [
                            ("schema_version", SCHEMA_VERSION),
                            ("events_stream", events_stream),
                            ("position", 0),
                        ],
                    )
                    meta["position"] = 0
                else:
                    if meta.get("schema_version") != SCHEMA_VERSION:
                        raise SojournError(
                            f"the read model {path} has schema version "
                            f"{meta.get('schema_version')!r}, this sojourn writes "
                            f"{SCHEMA_VERSION}: delete it, the projector rebuilds it from the "
                            "events stream"
                        )
                    if meta.get("events_stream") != events_stream:
                        raise SojournError(
                            f"the read model {path} was made for the events stream "
                            f"{meta.get('events_stream')!r}, not {events_stream!r} (another "
                            "deployment prefix): use another file for this one"
                        )
                await db.execute("COMMIT")
            except BaseException:
                await db.execute("ROLLBACK")
                raise
        except sqlite3.Error as e:
            raise SojournError(f"cannot use the read model {path}: {e}") from e
        position = meta.get("position", 0)
        return int(position)

    @property
    def position(self) -> int:
        """The events-stream sequence of the last decision applied (0: nothing yet)."""
        return self._position

    # --- writing ------------------------------------------------------------------------------

    async def apply(self, batch: Sequence[Applied]) -> int:
        """Apply the decisions of ``batch`` above the position, and move the position to the
        last of them, in one transaction. Decisions at or below the position (redeliveries)
        are skipped. Returns how many decisions were applied (0: all were redeliveries).

        On any exception nothing of the batch is applied and the position stays."""
        async with self._write:
            position = self._position
            fresh: list[Applied] = []
            for a in batch:
                if a.seq > position:
                    fresh.append(a)
                    position = a.seq
            if not fresh:
                return 0
            runs: dict[str, tuple[Any, ...]] = {}
            steps: list[tuple[Any, ...]] = []
            tagged: dict[str, RunView] = {}  # runs whose attributes may have changed
            for a in fresh:
                runs[a.view.run_id] = run_row(a.view)  # the last view of a run wins
                steps.extend(step_rows(a.view.run_id, a.events))
                if a.view.run_id in tagged or changes_attributes(a.events):
                    tagged[a.view.run_id] = a.view
            try:
                await self._transaction(
                    (UPSERT_STEP, steps),
                    (UPSERT_RUN, list(runs.values())),
                    (DELETE_ATTRIBUTES, [(run_id,) for run_id in tagged]),
                    (INSERT_ATTRIBUTE, [r for v in tagged.values() for r in attribute_rows(v)]),
                    ("UPDATE meta SET value = ? WHERE key = 'position'", [(position,)]),
                )
            except BaseException:
                # Cancelled while COMMIT ran, the batch may have landed after all: the file
                # says which, and the position follows it.
                await asyncio.shield(self._reload_position())
                raise
            self._position = position
            return len(fresh)

    async def _reload_position(self) -> None:
        rows = await self._db.execute_fetchall("SELECT value FROM meta WHERE key = 'position'")
        for row in rows:
            self._position = int(row[0])

    async def _transaction(self, *writes: tuple[str, list[tuple[Any, ...]]]) -> None:
        """Run ``writes`` (statement, rows) in one transaction; on any exception (a cancel
        included) roll back and raise it.

        ``BEGIN`` is inside the ``try``: a cancel that lands while it is queued on the
        database thread does not stop it from running, and the ``ROLLBACK`` queued behind it
        closes what it opened (else every later write fails, "cannot start a transaction
        within a transaction")."""
        db = self._db
        try:
            await db.execute("BEGIN IMMEDIATE")
            for sql, rows in writes:
                if rows:
                    await db.executemany(sql, rows)
            await db.execute("COMMIT")
        except BaseException:
            await asyncio.shield(self._rollback())
            raise

    async def _rollback(self) -> None:
        with contextlib.suppress(sqlite3.Error):  # no transaction: COMMIT ran after all
            await self._db.execute("ROLLBACK")

    async def put_pending(self, view: RunView) -> bool:
        """Record a run whose start is stored and not yet taken, unless the run has a row
        already (pending, or further along). Returns whether it was inserted. The position is
        not changed: a pending run is not an event.

        Raises:
            ValueError: ``view`` is not a pending view (status ``pending``, ``last_seq`` 0).
        """
        if view.status != "pending" or view.last_seq != 0:
            raise ValueError(
                f"put_pending takes a pending view (status pending, last_seq 0), got "
                f"{view.status} at {view.last_seq}"
            )
        async with self._write:
            async with self._db.execute(INSERT_PENDING, run_row(view)) as cur:
                return cur.rowcount > 0

    async def drop_pending(self, run_id: str) -> bool:
        """Delete the run's row if it is still only pending (no decision applied): its start
        was refused or expired. Returns whether a row was deleted."""
        async with self._write:
            async with self._db.execute(
                "DELETE FROM runs WHERE run_id = ? AND status = 'pending' AND last_seq = 0",
                (run_id,),
            ) as cur:
                return cur.rowcount > 0

    async def set_liveness(self, changes: Sequence[tuple[str, LivenessState]]) -> None:
        """Set runs' liveness (the column and the stored view), in one transaction. A run
        without a row is skipped. The position is not changed: liveness is a judgement of
        time, not an event."""
        if not changes:
            return
        async with self._write:
            await self._transaction((SET_LIVENESS, [(state, run_id) for run_id, state in changes]))

    async def reset(self) -> None:
        """Empty every table and set the position to 0 (``--rebuild``), in one transaction."""
        async with self._write:
            await self._transaction(
                ("DELETE FROM steps", [()]),
                ("DELETE FROM run_attributes", [()]),
                ("DELETE FROM runs", [()]),
                ("UPDATE meta SET value = 0 WHERE key = 'position'", [()]),
            )
            self._position = 0

    # --- reading ------------------------------------------------------------------------------

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        async with self._read:
            return list(await self._reader.execute_fetchall(sql, params))

    async def get(self, run_id: str) -> RunView | None:
        """The run's view, ``None`` without a row."""
        rows = await self._fetch("SELECT view FROM runs WHERE run_id = ?", (run_id,))
        return _decode_view(rows[0][0]) if rows else None

    async def steps(self, run_id: str) -> list[StepRow]:
        """The run's steps, by position."""
        rows = await self._fetch(
            f"SELECT {STEP_COLUMNS} FROM steps WHERE run_id = ? ORDER BY position", (run_id,)
        )
        return [
            StepRow(
                run_id=r[0],
                position=r[1],
                name=r[2],
                status=r[3],
                attempts=r[4],
                started_at=r[5],
                ended_at=r[6],
                duration=r[7],
                error=None if r[8] is None else ViewError(type=r[8], message=r[9] or ""),
            )
            for r in rows
        ]

    async def query(self, q: RunsQuery) -> RunsPage:
        """The runs matching ``q``, most recently updated first, at most ``q.limit``; ``next``
        is set when more follow. ``position`` is the model's position when it was read.

        Raises:
            InvalidQuery / InvalidName: ``q`` cannot be answered (``validate_query``).
        """
        validate_query(q)
        sql, params = query_sql(q)
        async with self._read:
            db = self._reader
            try:
                # One snapshot: the rows and the position agree. Inside the ``try`` for the
                # reason ``_transaction`` says: a cancelled listing must not leave the reader
                # in its transaction.
                await db.execute("BEGIN")
                rows = list(await db.execute_fetchall(sql, params))
                meta = list(
                    await db.execute_fetchall("SELECT value FROM meta WHERE key = 'position'")
                )
            finally:
                await asyncio.shield(_end_read(db))
        more = len(rows) > q.limit
        rows = rows[: q.limit]
        return RunsPage(
            runs=tuple(_decode_view(r[2]) for r in rows),
            next=encode_cursor(rows[-1][0], rows[-1][1]) if more else None,
            position=int(meta[0][0]) if meta else 0,
        )

    async def explain(self, q: RunsQuery) -> list[str]:
        """SQLite's plan for ``q`` (``EXPLAIN QUERY PLAN``), one line per step: for checking
        that a listing uses an index."""
        validate_query(q)
        page_sql, params = query_sql(q)
        rows = await self._fetch("EXPLAIN QUERY PLAN " + page_sql, params)
        return [str(r[-1]) for r in rows]

    async def dump(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table, in key order: two models hold the same data exactly when
        their dumps are equal."""
        return {
            "meta": await self._fetch("SELECT key, value FROM meta ORDER BY key"),
            "runs": await self._fetch(f"SELECT {RUN_COLUMNS} FROM runs ORDER BY run_id"),
            "steps": await self._fetch(
                f"SELECT {STEP_COLUMNS} FROM steps ORDER BY run_id, position"
            ),
            "run_attributes": await self._fetch(
                f"SELECT {ATTRIBUTE_COLUMNS} FROM run_attributes ORDER BY run_id, key"
            ),
        }

    async def close(self) -> None:
        """Close both connections (idempotent)."""
        async with self._write:
            for db in (self._reader, self._db):
                try:
                    await db.close()
                except ValueError:  # already closed
                    pass


async def _end_read(db: aiosqlite.Connection) -> None:
    """End a read transaction (there is none when its ``BEGIN`` itself failed)."""
    with contextlib.suppress(sqlite3.Error):
        await db.execute("COMMIT")
