"""The run listing service: answers ``<prefix>.query.runs`` from a projector's SQLite model.

Every projector runs one, in the queue group ``projectors``, so each request is answered by
exactly one of them (any: they all fold the same stream; ``RunsPage.position`` says how far the
answering one is). A request is a ``RunsQuery`` (JSON; an empty body asks with the defaults),
the answer a ``RunsPage`` or an ``IntakeError``, published on the request's reply subject, and
only on one that is a request/reply inbox (``valid_reply_subject``): a request cannot make the
service publish anywhere else.

Requests are hostile: one that is not JSON (or not one every reader reads alike: the checks
of ``schemas/guard.py``, answered with their codes), has unknown fields or values out of range,
or whose header block cannot be read gets an error answer and the service goes on. A page
that would not fit in one message (the broker's ``max_payload``) is cut short, with ``next``
naming where the rest starts.
"""

from __future__ import annotations

import logging
from typing import Final

import msgspec

from sojourn.broker import headers as h
from sojourn.broker.connection import BROKER_ERRORS, Broker
from sojourn.broker.delivery import Delivery, Subscription
from sojourn.broker.names import Names
from sojourn.schemas.codec import decode_runs_query, encode
from sojourn.schemas.errors import SojournError
from sojourn.schemas.guard import BodyRefused, check_json
from sojourn.schemas.names import valid_reply_subject
from sojourn.schemas.views import RunsPage
from sojourn.schemas.wire import ErrorBody, IntakeError

from .queries import encode_cursor, validate_query
from .sqlite import SqliteModel

__all__ = [
    "CODE_INTERNAL",
    "CODE_INVALID_JSON",
    "CODE_INVALID_QUERY",
    "CODE_TOO_LARGE",
    "QUEUE_GROUP",
    "REQUEST_MAX",
    "ListingService",
]

log = logging.getLogger("sojourn.projections.listing")

QUEUE_GROUP: Final = "projectors"

REQUEST_MAX: Final = 16 * 1024
"""The largest request read: a query is a few hundred bytes."""

CODE_INVALID_JSON: Final = "invalid_json"
CODE_INVALID_QUERY: Final = "invalid_query"
"""The code of a query with a wrong shape or value. Existing ``RejectCode`` words are used
until the vocabulary gains ``invalid_query``."""
CODE_TOO_LARGE: Final = "payload_too_large"
CODE_INTERNAL: Final = "internal"

_ENVELOPE: Final = 512
"""Bytes kept free in an answer for everything but the views (braces, ``next``, position)."""


def _error(code: str, message: str) -> bytes:
    return encode(IntakeError(error=ErrorBody(code=code, message=message)))


class ListingService:
    """Answers run listing requests from ``model`` until ``stop``."""

    def __init__(self, broker: Broker, names: Names, model: SqliteModel) -> None:
        self.broker = broker
        self.names = names
        self.model = model
        self._sub: Subscription | None = None
        self.answered = 0
        self.refused = 0

    async def start(self) -> None:
        """Subscribe (in the ``projectors`` queue group); requests are answered from now."""
        if self._sub is None:
            self._sub = await self.broker.subscribe(
                self.names.query_runs, queue=QUEUE_GROUP, cb=self._on_request
            )

    async def stop(self) -> None:
        """Stop answering (requests in flight may still be answered)."""
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except BROKER_ERRORS:
                log.debug("listing: unsubscribe failed (connection gone)", exc_info=True)

    async def _on_request(self, msg: Delivery) -> None:
        reply = msg.reply
        if not valid_reply_subject(reply):
            self.refused += 1
            log.debug("listing: request without a valid reply subject ignored")
            return
        try:
            if msg.header(h.GARBLED):
                self.refused += 1
                body = _error("invalid_headers", "the request's header block cannot be read")
            else:
                body = await self.answer(msg.data)
        except Exception:  # never let a request end the service
            log.exception("listing: answering a query failed")
            body = _error(CODE_INTERNAL, "the projector failed to answer; see its log")
        try:
            await self.broker.publish_core(reply, body)
        except BROKER_ERRORS:
            log.debug("listing: the answer could not be sent", exc_info=True)

    async def answer(self, data: bytes) -> bytes:
        """The answer to one request body: an encoded ``RunsPage`` or ``IntakeError``."""
        if len(data) > REQUEST_MAX:
            self.refused += 1
            return _error(CODE_TOO_LARGE, f"a query is at most {REQUEST_MAX} bytes")
        try:
            if data.strip():
                check_json(data, what="the query")
            q = decode_runs_query(data)
        except BodyRefused as e:  # not UTF-8, too deep, a key twice, a number out of range
            self.refused += 1
            return _error(e.code, e.message)
        except msgspec.ValidationError as e:
            self.refused += 1
            return _error(CODE_INVALID_QUERY, f"invalid query: {e}")
        except msgspec.DecodeError as e:
            self.refused += 1
            return _error(CODE_INVALID_JSON, f"a query is a JSON object: {e}")
        try:
            page = await self.model.query(validate_query(q))
        except (SojournError, ValueError) as e:
            self.refused += 1
            return _error(CODE_INVALID_QUERY, f"invalid query: {e}")
        body = self._fit(page)
        self.answered += 1
        return body

    def _fit(self, page: RunsPage) -> bytes:
        """``page`` encoded, cut short (``next`` set) if it would not fit one message."""
        body = encode(page)
        room = self.broker.max_payload
        if len(body) <= room:
            return body
        room -= _ENVELOPE
        kept = 0
        used = 0
        for view in page.runs:
            used += len(encode(view)) + 1
            if used > room:
                break
            kept += 1
        if kept == 0:
            return _error(
                CODE_TOO_LARGE,
                f"run {page.runs[0].run_id}'s view alone exceeds the broker's max_payload "
                f"({self.broker.max_payload} bytes)",
            )
        last = page.runs[kept - 1]
        cut = RunsPage(
            runs=page.runs[:kept],
            next=encode_cursor(last.updated_at, last.run_id),
            position=page.position,
        )
        return encode(cut)
