"""The layout of the SQLite read model: its tables, the statements that write them, and a
run's view and a decision's steps as rows (pure).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, Literal, get_args

import msgspec

from sojourn.schemas.attributes import attribute_text
from sojourn.schemas.codec import encode
from sojourn.schemas.events import (
    RunEvent,
    RunStarted,
    StepCompleted,
    StepFailed,
    StepStarted,
    ValueRecorded,
)
from sojourn.schemas.views import ERROR_MESSAGE_MAX, RunView, ViewError
from sojourn.schemas.vocabulary import ATTRIBUTES_KIND, RUN_STATUSES

__all__ = [
    "ATTRIBUTE_COLUMNS",
    "DELETE_ATTRIBUTES",
    "INSERT_ATTRIBUTE",
    "INSERT_PENDING",
    "RUN_COLUMNS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "SET_LIVENESS",
    "STEP_COLUMNS",
    "STEP_STATUSES",
    "UPSERT_RUN",
    "UPSERT_STEP",
    "StepRow",
    "StepStatus",
    "attribute_rows",
    "changes_attributes",
    "run_row",
    "step_rows",
]

SCHEMA_VERSION: Final = 1
"""The layout of the tables. A file of another version is refused (rebuild it: delete it and
let the projector fill a new one from the events stream). ``run_attributes`` came later
without a new version: ``open`` creates it in an older file, whose runs, recorded before
attributes existed, have none."""

StepStatus = Literal["running", "completed", "failed", "retrying"]
"""A step's state in the ``steps`` table: started and not settled; its last attempt completed;
its last attempt failed for good; its last attempt failed and a retry is due."""
STEP_STATUSES: tuple[StepStatus, ...] = get_args(StepStatus)


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


_STATUS_CHECK = ", ".join(f"'{s}'" for s in RUN_STATUSES)
_STEP_CHECK = ", ".join(f"'{s}'" for s in STEP_STATUSES)

SCHEMA = f"""
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
CREATE TABLE IF NOT EXISTS run_attributes (
    run_id TEXT NOT NULL,
    key    TEXT NOT NULL,
    text   TEXT NOT NULL,
    PRIMARY KEY (run_id, key)
) STRICT, WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS run_attributes_by_value ON run_attributes (key, text, run_id);
"""

DELETE_ATTRIBUTES = "DELETE FROM run_attributes WHERE run_id = ?"
INSERT_ATTRIBUTE = "INSERT INTO run_attributes (run_id, key, text) VALUES (?, ?, ?)"
ATTRIBUTE_COLUMNS = "run_id, key, text"

RUN_COLUMNS = (
    "run_id, agent, status, liveness, parent_run_id, started_at, updated_at, ended_at, step, "
    "steps_done, attempts, spent_usd, spent_tokens, budget_usd, budget_tokens, error_type, "
    "error_message, last_seq, view"
)
_RUN_VALUES = ", ".join("?" * len(RUN_COLUMNS.split(",")))
_UPDATE_RUN = ", ".join(
    f"{c} = excluded.{c}" for c in (c.strip() for c in RUN_COLUMNS.split(",")) if c != "run_id"
)
UPSERT_RUN = (
    f"INSERT INTO runs ({RUN_COLUMNS}) VALUES ({_RUN_VALUES}) "
    f"ON CONFLICT (run_id) DO UPDATE SET {_UPDATE_RUN} "
    "WHERE excluded.last_seq >= runs.last_seq"  # views of a run only move forward
)
INSERT_PENDING = (
    f"INSERT INTO runs ({RUN_COLUMNS}) VALUES ({_RUN_VALUES}) ON CONFLICT (run_id) DO NOTHING"
)
UPSERT_STEP = """
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
SET_LIVENESS = (
    "UPDATE runs SET liveness = ?1, view = json_set(view, '$.liveness', ?1) "
    "WHERE run_id = ?2 AND liveness IS NOT ?1"
)
STEP_COLUMNS = (
    "run_id, position, name, status, attempts, started_at, ended_at, duration, error_type, "
    "error_message"
)


def run_row(view: RunView) -> tuple[Any, ...]:
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


def step_rows(run_id: str, events: Iterable[RunEvent]) -> list[tuple[Any, ...]]:
    """The step-table upserts of one decision, in order (``UPSERT_STEP`` merges them)."""
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


def changes_attributes(events: Iterable[RunEvent]) -> bool:
    """Whether a decision may change its run's attributes (a start, or an upsert)."""
    return any(
        isinstance(e, RunStarted) or (isinstance(e, ValueRecorded) and e.kind == ATTRIBUTES_KIND)
        for e in events
    )


def attribute_rows(view: RunView) -> list[tuple[str, str, str]]:
    """The ``run_attributes`` rows of a run's view: one per key, its value's filter text."""
    return [(view.run_id, k, attribute_text(v)) for k, v in sorted(view.attributes.items())]
