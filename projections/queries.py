"""Listing queries of the SQLite read model: a ``RunsQuery`` checked, its SQL, and the cursors
of its pages (pure).

Listing order is most recently updated first (``updated_at`` descending, then ``run_id``
descending), paginated by key: ``RunsPage.next`` is an opaque cursor naming the last run of the
page, and the next page starts strictly after it. Every value of a query reaches SQL as a
parameter, never as text.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from typing import Any, Final

from sojourn.schemas.attributes import InvalidAttributes, validate_filter
from sojourn.schemas.errors import SojournError
from sojourn.schemas.health import LIVENESS_STATES
from sojourn.schemas.names import TOKEN_PATTERN, validate_schedule_name, validate_token
from sojourn.schemas.views import QUERY_LIMIT_MAX, RunsQuery
from sojourn.schemas.vocabulary import RUN_STATUSES

__all__ = [
    "CURSOR_MAX",
    "InvalidQuery",
    "decode_cursor",
    "encode_cursor",
    "query_sql",
    "validate_query",
]

CURSOR_MAX: Final = 256
"""The longest cursor accepted (one names an ``updated_at`` and a run id: ~200 characters)."""

_TOKEN = re.compile(TOKEN_PATTERN)
_CURSOR = re.compile(rf"[A-Za-z0-9_-]{{1,{CURSOR_MAX}}}")


class InvalidQuery(SojournError, ValueError):
    """A ``RunsQuery`` that cannot be answered: a limit out of range, a status or liveness not
    in the vocabulary, an agent or parent that is not a name token, a malformed cursor."""


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
    if q.attributes:
        try:
            validate_filter(q.attributes)
        except InvalidAttributes as e:
            raise InvalidQuery(e.message) from None
        if not all(isinstance(v, str) for v in q.attributes.values()):
            raise InvalidQuery("an attribute filter's values are their text")
    return q


def query_sql(q: RunsQuery) -> tuple[str, list[Any]]:
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
    for key, text in sorted(q.attributes.items()):
        # Each pair narrows by the attribute index (key, text, run_id); SQLite picks the
        # most selective of them and the other filters by their indexes or rows.
        where.append("run_id IN (SELECT run_id FROM run_attributes WHERE key = ? AND text = ?)")
        params.extend([key, text])
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
