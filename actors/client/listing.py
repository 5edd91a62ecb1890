"""Listing runs: the client side of the run listing service (``<prefix>.query.runs``).

The projector answers from its SQLite model (``sojourn.projections.listing``); this sends a
``RunsQuery`` and reads back a ``RunsPage``. Arguments are checked here first, so a bad one is
a ``ValueError`` in the caller's process and never a round trip; the answer is checked too (it
comes off the wire).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from sojourn.broker.connection import BROKER_ERRORS, Broker
from sojourn.broker.names import Names
from sojourn.projections.sqlite import InvalidQuery, validate_query
from sojourn.schemas.attributes import InvalidAttributes, validate_filter
from sojourn.schemas.codec import decode_json, encode
from sojourn.schemas.errors import SojournError
from sojourn.schemas.health import LivenessState
from sojourn.schemas.views import RunsPage, RunsQuery
from sojourn.schemas.vocabulary import RunStatus
from sojourn.schemas.wire import IntakeError

__all__ = ["list_runs"]

_START_ONE = "start `sojourn projector` (or `sojourn dev`, which runs one)"


async def list_runs(
    broker: Broker,
    names: Names,
    *,
    agent: str | None = None,
    status: Iterable[RunStatus] = (),
    liveness: Iterable[LivenessState] = (),
    since: float | None = None,
    limit: int = 100,
    after: str | None = None,
    parent_run_id: str | None = None,
    schedule: str | None = None,
    attributes: Mapping[str, Any] | None = None,
    timeout: float = 5.0,
) -> RunsPage:
    """One page of runs matching every filter given, most recently updated first.

    Args:
        since: only runs updated at or after this unix time.
        attributes: only runs with each of these search attributes (key to value, compared
            by their text: ``sojourn.schemas.attributes.attribute_text``).
        limit: at most this many runs (1 to ``QUERY_LIMIT_MAX``).
        after: the ``next`` of the previous page, to read the one after it.

    Raises:
        InvalidName: ``agent`` or ``parent_run_id`` is not a name token.
        ValueError: another argument is out of range (``InvalidQuery``).
        SojournError: no projector answered (start one), or it refused the query.
    """
    if isinstance(status, str) or isinstance(liveness, str):
        raise ValueError("status and liveness take a sequence of values, not one string")
    q = validate_query(
        RunsQuery(
            agent=agent,
            status=tuple(status),
            liveness=tuple(liveness),
            parent_run_id=parent_run_id,
            schedule=schedule,
            attributes=_attribute_filter(attributes),
            since=since,
            after=after,
            limit=limit,
        )
    )
    subject = names.query_runs
    try:
        msg = await broker.request(subject, encode(q), timeout=timeout)
    except TimeoutError:
        raise SojournError(
            f"no projector answered the run listing on {subject} within {timeout:g}s: {_START_ONE}"
        ) from None
    except BROKER_ERRORS as e:
        raise SojournError(
            f"nobody answered the run listing on {subject} ({e}): {_START_ONE}"
        ) from e
    return _page(msg.data, subject)


def _attribute_filter(attributes: Mapping[str, Any] | None) -> dict[str, str]:
    """A filter of values (or their text) as the query carries it: key to value text."""
    if not attributes:
        return {}
    try:
        return validate_filter(attributes)
    except InvalidAttributes as e:
        raise InvalidQuery(e.message) from None


def _page(data: bytes, subject: str) -> RunsPage:
    try:
        raw = decode_json(data)
        if isinstance(raw, dict) and "error" in raw:
            refused = msgspec.convert(raw, IntakeError)
            raise SojournError(
                f"the run listing refused the query: {refused.error.message} ({refused.error.code})"
            )
        page: RunsPage = msgspec.convert(raw, RunsPage)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise SojournError(f"the run listing on {subject} answered something else: {e}") from e
    return page
