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

Listing order is most recently updated first (``updated_at`` descending, then ``run_id``
descending), paginated by key: ``RunsPage.next`` is an opaque cursor naming the last run of the
page, and the next page starts strictly after it. A run updated between two page requests moves
to the top, so it is not shown again on a later page (and a run that moved below the cursor
shows up again): a listing is a sequence of snapshots, not one.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import math
import re
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final, Literal, NamedTuple, get_args

import aiosqlite
import msgspec

from sojourn.schemas.codec import decode_run_view, encode
from sojourn.schemas.errors import SojournError
from sojourn.schemas.events import RunEvent, StepCompleted, StepFailed, StepStarted
from sojourn.schemas.health import LIVENESS_STATES, LivenessState
from sojourn.schemas.names import TOKEN_PATTERN, validate_schedule_name, validate_token
from sojourn.schemas.views import (
    ERROR_MESSAGE_MAX,
    QUERY_LIMIT_MAX,
    RunsPage,
    RunsQuery,
    RunView,
    ViewError,
)
from sojourn.schemas.vocabulary import RUN_STATUSES

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

SCHEMA_VERSION: Final = 1
"""The layout of the tables. A file of another version is refused (rebuild it: delete it and
let the projector fill a new one from the events stream)."""

CURSOR_MAX: Final = 256
"""The longest cursor accepted (one names an ``updated_at`` and a run id: ~200 characters)."""

StepStatus = Literal["running", "completed", "failed", "retrying"]
"""A step's state in the ``steps`` table: started and not settled; its last attempt completed;
its last attempt failed for good; its last attempt failed and a retry is due."""
STEP_STATUSES: tuple[StepStatus, ...] = get_args(StepStatus)

_CACHE_KIB: Final = -65536
"""Page cache per connection (negative: KiB), 64 MiB: the indexes of ~100,000 runs stay in
memory, so an update does not read the disk (with SQLite's 2 MiB default it does, and applying
slows down three-fold)."""

_TOKEN = re.compile(TOKEN_PATTERN)
_CURSOR = re.compile(rf"[A-Za-z0-9_-]{{1,{CURSOR_MAX}}}")


class Applied(NamedTuple):
    """One decision as the projector applied it."""

    seq: int
    """The events-stream sequence of the decision."""
    view: RunView
    """The run's view after it."""
    events: tuple[RunEvent, ...]
    """The decision's events (for the step rows)."""


class StepRow(msgspec.Struct, frozen=True, kw_only=True):
    """One step of a run (one position), as the ``steps`` table keeps it.

    Attributes:
        attempts: the highest attempt started (or settled) at this position.
        started_at: when its first attempt started.
        ended_at / duration: when its last attempt ended and how long that attempt took
            (``None`` while one runs).
        error: the last failed attempt's error (kept when a later attempt completes).
    """

    run_id: str
    position: int
    name: str
    status: StepStatus
    attempts: int
    started_at: float | None = None
    ended_at: float | None = None
    duration: float | None = None
    error: ViewError | None = None


class InvalidQuery(SojournError, ValueError):
    """A ``RunsQuery`` that cannot be answered: a limit out of range, a status or liveness not
    in the vocabulary, an agent or parent that is not a name token, a malformed cursor."""


# --- queries and cursors (pure) ---------------------------------------------------------------


def encode_cursor(updated_at: float, run_id: str) -> str:
    """The cursor naming a run's place in the listing order (``RunsPage.next``).

    Opaque to clients: base64url (no padding) of the exact ``updated_at`` (``float.hex``) and
    the run id."""
    raw = f"{updated_at.hex()}/{run_id}".encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(cursor: str) -> tuple[float, str]:
    """``(updated_at, run_id)`` of a cursor made by ``encode_cursor``.

    Raises:
        InvalidQuery: anything else (bounded, matched in full: never reaches SQL as text).
    """
    bad = InvalidQuery(f"invalid cursor {cursor[:40]!r}: pass the `next` of a previous page")
    if not isinstance(cursor, str) or not _CURSOR.fullmatch(cursor):
        raise bad
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        stamp, _, run_id = text.partition("/")
        updated_at = float.fromhex(stamp)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise bad from None
    # Only the one spelling encode_cursor makes: "1.0" would parse too.
    if not math.isfinite(updated_at) or updated_at.hex() != stamp or not _TOKEN.fullmatch(run_id):
        raise bad
    return updated_at, run_id


def validate_query(q: RunsQuery) -> RunsQuery:
    """Return ``q`` if it can be answered, else raise saying why.

    Decoding checks the shape of a query from the wire; this checks its values (and a query
    built in Python, which nothing checked).

    Raises:
        InvalidName: the agent or parent run id is not a name token (a ``ValueError`` too).
        InvalidQuery: a limit outside 1..``QUERY_LIMIT_MAX``, a status or liveness not in the
            vocabulary, ``since`` not a finite number, a malformed cursor.
    """
    if q.agent is not None:
        validate_token(q.agent, "agent name")
    if q.parent_run_id is not None:
        validate_token(q.parent_run_id, "parent run id")
    if q.schedule is not None:
        validate_schedule_name(q.schedule)
    if not isinstance(q.limit, int) or isinstance(q.limit, bool):
        raise InvalidQuery(f"invalid limit {q.limit!r}: a whole number, 1 to {QUERY_LIMIT_MAX}")
    if not 1 <= q.limit <= QUERY_LIMIT_MAX:
        raise InvalidQuery(f"invalid limit {q.limit}: 1 to {QUERY_LIMIT_MAX}")
    for status in q.status:
        if status not in RUN_STATUSES:
            raise InvalidQuery(
                f"invalid status {str(status)[:40]!r}: one of {', '.join(RUN_STATUSES)}"
            )
    for state in q.liveness:
        if state not in LIVENESS_STATES:
            raise InvalidQuery(
                f"invalid liveness {str(state)[:40]!r}: one of {', '.join(LIVENESS_STATES)}"
            )
    if q.since is not None and (not isinstance(q.since, int | float) or not math.isfinite(q.since)):
        raise InvalidQuery(f"invalid since {q.since!r}: unix seconds")
    if q.after is not None:
        decode_cursor(q.after)
    return q


# --- the tables -------------------------------------------------------------------------------

_STATUS_CHECK = ", ".join(f"'{s}'" for s in RUN_STATUSES)
_STEP_CHECK = ", ".join(f"'{s}'" for s in STEP_STATUSES)

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value ANY NOT NULL
) STRICT, WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS runs (
    run_id        TEXT PRIMARY KEY,
    agent         TEXT NOT NULL,
    status        TEXT NOT NULL CHECK (status IN ({_STATUS_CHECK})),
    liveness      TEXT,
    parent_run_id TEXT,
    started_at    REAL NOT NULL,
    updated_at    REAL NOT NULL,
    ended_at      REAL,
    step          TEXT,
    steps_done    INTEGER NOT NULL,
    attempts      INTEGER NOT NULL,
    spent_usd     REAL NOT NULL,
    spent_tokens  INTEGER NOT NULL,
    budget_usd    REAL,
    budget_tokens INTEGER,
    error_type    TEXT,
    error_message TEXT,
    last_seq      INTEGER NOT NULL,
    view          TEXT NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS runs_by_updated ON runs (updated_at, run_id);
CREATE INDEX IF NOT EXISTS runs_by_agent ON runs (agent, updated_at, run_id);
CREATE INDEX IF NOT EXISTS runs_by_status ON runs (status, updated_at, run_id);
CREATE INDEX IF NOT EXISTS runs_by_agent_status ON runs (agent, status, updated_at, run_id);
CREATE INDEX IF NOT EXISTS runs_by_liveness ON runs (liveness, updated_at, run_id);
CREATE INDEX IF NOT EXISTS runs_by_parent ON runs (parent_run_id, updated_at, run_id)
    WHERE parent_run_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS steps (
    run_id        TEXT NOT NULL,
    position      INTEGER NOT NULL,
    name          TEXT NOT NULL,
    status        TEXT NOT NULL CHECK (status IN ({_STEP_CHECK})),
    attempts      INTEGER NOT NULL,
    started_at    REAL,
    ended_at      REAL,
    duration      REAL,
    error_type    TEXT,
    error_message TEXT,
    PRIMARY KEY (run_id, position)
) STRICT, WITHOUT ROWID;
"""

_RUN_COLUMNS = (
    "run_id, agent, status, liveness, parent_run_id, started_at, updated_at, ended_at, step, "
    "steps_done, attempts, spent_usd, spent_tokens, budget_usd, budget_tokens, error_type, "
    "error_message, last_seq, view"
)
_RUN_VALUES = ", ".join("?" * len(_RUN_COLUMNS.split(",")))
_UPDATE_RUN = ", ".join(
    f"{c} = excluded.{c}" for c in (c.strip() for c in _RUN_COLUMNS.split(",")) if c != "run_id"
)
_UPSERT_RUN = (
    f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES ({_RUN_VALUES}) "
    f"ON CONFLICT (run_id) DO UPDATE SET {_UPDATE_RUN} "
    "WHERE excluded.last_seq >= runs.last_seq"  # views of a run only move forward
)
_INSERT_PENDING = (
    f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES ({_RUN_VALUES}) ON CONFLICT (run_id) DO NOTHING"
)
_UPSERT_STEP = """
INSERT INTO steps (run_id, position, name, status, attempts, started_at, ended_at, duration,
                   error_type, error_message)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (run_id, position) DO UPDATE SET
    name = excluded.name,
    status = excluded.status,
    attempts = max(steps.attempts, excluded.attempts),
    started_at = coalesce(steps.started_at, excluded.started_at),
    ended_at = excluded.ended_at,
    duration = excluded.duration,
    error_type = coalesce(excluded.error_type, steps.error_type),
    error_message = coalesce(excluded.error_message, steps.error_message)
"""
_SET_LIVENESS = (
    "UPDATE runs SET liveness = ?1, view = json_set(view, '$.liveness', ?1) "
    "WHERE run_id = ?2 AND liveness IS NOT ?1"
)
_STEP_COLUMNS = (
    "run_id, position, name, status, attempts, started_at, ended_at, duration, error_type, "
    "error_message"
)


def _run_row(view: RunView) -> tuple[Any, ...]:
    error = view.error
    return (
        view.run_id,
        view.agent,
        view.status,
        view.liveness,
        view.parent_run_id,
        view.started_at,
        view.updated_at,
        view.ended_at,
        view.step,
        view.steps_done,
        view.attempts,
        view.spent_usd,
        view.spent_tokens,
        view.budget_usd,
        view.budget_tokens,
        None if error is None else error.type,
        None if error is None else error.message[:ERROR_MESSAGE_MAX],
        view.last_seq,
        encode(view).decode(),
    )


def _step_rows(run_id: str, events: Iterable[RunEvent]) -> list[tuple[Any, ...]]:
    """The step-table upserts of one decision, in order (``_UPSERT_STEP`` merges them)."""
    rows: list[tuple[Any, ...]] = []
    for e in events:
        if isinstance(e, StepStarted):
            rows.append(
                (run_id, e.position, e.name, "running", e.attempt, e.at, None, None, None, None)
            )
        elif isinstance(e, StepCompleted):
            rows.append(
                (
                    run_id,
                    e.position,
                    e.name,
                    "completed",
                    e.attempt,
                    e.at - e.duration,
                    e.at,
                    e.duration,
                    None,
                    None,
                )
            )
        elif isinstance(e, StepFailed):
            status = "failed" if e.retry_at is None else "retrying"
            rows.append(
                (
                    run_id,
                    e.position,
                    e.name,
                    status,
                    e.attempt,
                    e.at - e.duration,
                    e.at,
                    e.duration,
                    e.error.type,
                    e.error.message[:ERROR_MESSAGE_MAX],
                )
            )
    return rows


def _query_sql(q: RunsQuery) -> tuple[str, list[Any]]:
    """The SQL of a validated query and its parameters (values are always parameters)."""
    where: list[str] = []
    params: list[Any] = []
    if q.agent is not None:
        where.append("agent = ?")
        params.append(q.agent)
    if q.status:
        statuses = sorted(set(q.status))
        where.append(f"status IN ({', '.join('?' * len(statuses))})")
        params.extend(statuses)
    if q.liveness:
        states = sorted(set(q.liveness))
        where.append(f"liveness IN ({', '.join('?' * len(states))})")
        params.extend(states)
    if q.parent_run_id is not None:
        where.append("parent_run_id = ?")
        params.append(q.parent_run_id)
    if q.schedule is not None:
        # Scheduled runs' ids start with their schedule's name: the primary key narrows the
        # scan, the view's own field decides.
        where.append("run_id >= ? AND run_id < ? AND json_extract(view, '$.schedule') = ?")
        params.extend([f"{q.schedule}-at", f"{q.schedule}-au", q.schedule])
    if q.since is not None:
        where.append("updated_at >= ?")
        params.append(float(q.since))
    if q.after is not None:
        where.append("(updated_at, run_id) < (?, ?)")
        params.extend(decode_cursor(q.after))
    sql = (
        "SELECT updated_at, run_id, view FROM runs"
        + (" WHERE " + " AND ".join(where) if where else "")
        + " ORDER BY updated_at DESC, run_id DESC LIMIT ?"
    )
    params.append(q.limit + 1)
    return sql, params


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
                for statement in _SCHEMA.split(";"):
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
            for a in fresh:
                runs[a.view.run_id] = _run_row(a.view)  # the last view of a run wins
                steps.extend(_step_rows(a.view.run_id, a.events))
            try:
                await self._transaction(
                    (_UPSERT_STEP, steps),
                    (_UPSERT_RUN, list(runs.values())),
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
            async with self._db.execute(_INSERT_PENDING, _run_row(view)) as cur:
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
            await self._transaction((_SET_LIVENESS, [(state, run_id) for run_id, state in changes]))

    async def reset(self) -> None:
        """Empty every table and set the position to 0 (``--rebuild``), in one transaction."""
        async with self._write:
            await self._transaction(
                ("DELETE FROM steps", [()]),
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
            f"SELECT {_STEP_COLUMNS} FROM steps WHERE run_id = ? ORDER BY position", (run_id,)
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
        sql, params = _query_sql(q)
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
        page_sql, params = _query_sql(q)
        rows = await self._fetch("EXPLAIN QUERY PLAN " + page_sql, params)
        return [str(r[-1]) for r in rows]

    async def dump(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table, in key order: two models hold the same data exactly when
        their dumps are equal."""
        return {
            "meta": await self._fetch("SELECT key, value FROM meta ORDER BY key"),
            "runs": await self._fetch(f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY run_id"),
            "steps": await self._fetch(
                f"SELECT {_STEP_COLUMNS} FROM steps ORDER BY run_id, position"
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
