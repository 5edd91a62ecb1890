"""Screening and refusing inbox messages: what the intake will not act on, and how it says so.

``Refusals.screen`` looks at a message by itself (its subject, reply subject, delivery count,
size, header block and body bytes) as it arrives, so that a message refused by its bytes alone
is refused at once. A message refused, there or later by the intake (``Rejected``), is
dead-lettered with the reason (``worker/dead_letters.py``), answered on its
``Sojourn-Reply-To`` where it may be (an ``IntakeError``), and acknowledged: it is never retried.
``reply`` is how the intake and the scheduler answer any message.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import NamedTuple

from sojourn.broker import headers as h
from sojourn.broker.connection import Broker
from sojourn.broker.delivery import Delivery
from sojourn.broker.names import InboxSubject, Names
from sojourn.schemas.codec import encode
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import InvalidName
from sojourn.schemas.guard import BodyRefused, check_json
from sojourn.schemas.names import RESERVED_SIGNAL_PREFIX, inbox_prefix, valid_reply_subject
from sojourn.schemas.wire import ErrorBody, IntakeError, RejectCode

from .dead_letters import DlqKind, dead_letter, send_dead_letter

__all__ = ["REPLY_HEADER", "Refusals", "Rejected", "Screened", "dlq_kind", "reply"]

log = logging.getLogger("sojourn.intake")

REPLY_HEADER = h.REPLY_TO


class Screened(NamedTuple):
    """What ``Refusals.screen`` says of a message: its parsed subject (``None``: not an inbox
    subject), why it is refused (``None``: go on), and whether it may be answered."""

    inbox: InboxSubject | None
    rejected: Rejected | None
    answerable: bool


class Rejected(Exception):
    """A message the intake refuses: its reject code and the reason, in words."""

    def __init__(self, code: RejectCode, message: str) -> None:
        super().__init__(message)
        self.code: RejectCode = code
        self.message = message


_DLQ_KINDS: dict[str, DlqKind] = {
    "start": "start",
    "spawn": "start",
    "signal": "signal",
    "resume": "signal",
    "pause": "signal",
    "budget": "signal",
    "decide": "signal",
    "child": "signal",
    "update": "signal",
    "cancel": "cancel",
}


_ENVELOPES: Mapping[str, int] = {"signal": 0, "schedule": 2}
"""How many levels of a body are its message's own wrapping, above the value it carries
(``{"input": ...}`` is 1, a signal's payload is the body, a schedule request's input sits in
its spec): the depth limit (``guard.MAX_DEPTH``) is the value's. Every other kind: 1."""


def dlq_kind(kind: str) -> DlqKind:
    """The dead-letter subject of a message of inbox kind ``kind``."""
    return _DLQ_KINDS.get(kind, "other")


async def reply(broker: Broker, msg: Delivery, body: bytes) -> None:
    """Answer ``msg`` on its ``Sojourn-Reply-To``, if it has a valid one (best effort)."""
    reply_to = msg.header(REPLY_HEADER)
    if not reply_to or not valid_reply_subject(reply_to):
        return
    try:
        await broker.publish_core(reply_to, body)
    except Exception as e:  # an answer is a courtesy: it must not block the trigger
        log.warning("cannot answer on %r: %s", reply_to, e)


class Refusals:
    """Screens one worker's inbox messages and refuses those the intake will not act on."""

    def __init__(self, broker: Broker, names: Names, settings: Settings) -> None:
        self.broker = broker
        self.names = names
        self.settings = settings

    def _answerable(self, reply_to: str, sender: str | None) -> bool:
        """Whether the intake may answer a message from ``sender`` on ``reply_to`` (already a
        valid ``_INBOX.`` subject). Under authentication (this worker's connection has a user,
        so every sender is the broker's word) only in the sender's own inboxes,
        ``_INBOX.<sender>.``: a user may read only those, so no sender can push an answer into
        another user's pending request. Without authentication any inbox (anyone may read
        any)."""
        if self.broker.user is None or sender is None:
            return True
        return reply_to.startswith(inbox_prefix(sender) + ".")

    def screen(self, msg: Delivery) -> Screened:
        """The checks that need nothing but the message itself: its subject, reply subject,
        delivery count, size, header block and body bytes (``guard.check_json``), and a
        reserved signal name. Pure and quick (a body's check is one pass over it): the worker
        runs it as a message arrives, so that a message refused here is refused at once, not
        after the messages about the same run that came before it."""
        reply_to = msg.header(REPLY_HEADER)
        reply_ok = not reply_to or valid_reply_subject(reply_to)
        try:
            inbox = self.names.parse_inbox(msg.subject)
        except InvalidName as e:
            return Screened(None, Rejected("invalid_trigger", e.message), reply_ok)
        try:
            self._check(msg, inbox, reply_to, reply_ok)
        except Rejected as r:
            answerable = reply_ok and r.code != "invalid_reply_to"
            return Screened(inbox, r, answerable)
        return Screened(inbox, None, reply_ok)

    def _check(self, msg: Delivery, inbox: InboxSubject, reply_to: str, reply_ok: bool) -> None:
        if not reply_ok:
            raise Rejected(
                "invalid_reply_to",
                f"{REPLY_HEADER} must be a request/reply inbox (_INBOX.<tokens>, at most "
                "256 characters); nothing is answered elsewhere",
            )
        if reply_to and not self._answerable(reply_to, inbox.sender):
            raise Rejected(
                "invalid_reply_to",
                f"a message sent as {inbox.sender!r} is answered only in its inboxes "
                f"({inbox_prefix(inbox.sender)}.<tokens>); nothing is answered elsewhere",
            )
        if msg.num_delivered >= self.settings.max_deliveries:
            raise Rejected(
                "max_deliveries",
                f"delivered {msg.num_delivered} times without being settled "
                f"(Settings.max_deliveries = {self.settings.max_deliveries}); given up",
            )
        # A child's end notice carries the child's output, bounded by the largest value a
        # run may store: the user-facing limit must never refuse it.
        limit, what = (
            (self.settings.max_child_notice, "Settings.max_child_notice")
            if inbox.kind == "child"
            else (self.settings.max_payload, "Settings.max_payload")
        )
        if len(msg.data) > limit:
            raise Rejected(
                "payload_too_large",
                f"payload is {len(msg.data)} bytes; the limit is {limit} bytes ({what})",
            )
        if msg.header(h.GARBLED):
            raise Rejected(
                "invalid_headers",
                f"the message's header block cannot be parsed ({msg.header(h.GARBLED)})",
            )
        if msg.data.strip():
            try:
                check_json(msg.data, envelope=_ENVELOPES.get(inbox.kind, 1))
            except BodyRefused as e:
                raise Rejected(e.code, e.message) from None
        if inbox.kind == "signal" and inbox.name.startswith(RESERVED_SIGNAL_PREFIX):
            raise Rejected(
                "forbidden",
                f"signal names starting with {RESERVED_SIGNAL_PREFIX!r} are reserved: "
                "resume, decide and child notices travel on control subjects",
            )

    async def refuse(self, msg: Delivery, screened: Screened) -> None:
        """Settle a message ``screen`` refused: dead-lettered, answered where it may be,
        acked."""
        assert screened.rejected is not None
        kind = dlq_kind(screened.inbox.kind) if screened.inbox else "other"
        r = screened.rejected
        await self.reject(msg, kind, r.code, r.message, screened.answerable)

    async def refuse_malformed(
        self, msg: Delivery, error: BaseException, screened: Screened | None
    ) -> None:
        """Refuse a message whose bytes made a decoder fail where no check caught it first (a
        decode error, ``RecursionError``, a ``UnicodeError``): the message's fault, so it is
        dead-lettered and answered on its first delivery (where ``screen`` said it may be:
        ``None``, nowhere), never retried."""
        if isinstance(error, BodyRefused):
            code: RejectCode = error.code
        elif isinstance(error, RecursionError):
            code = "too_deep"
        elif isinstance(error, UnicodeError):
            code = "invalid_encoding"
        else:
            code = "invalid_json"
        inbox = screened.inbox if screened is not None else None
        kind = dlq_kind(inbox.kind) if inbox is not None else "other"
        message = f"the message cannot be read: {type(error).__name__}: {str(error)[:500]}"
        answer = screened is not None and screened.answerable
        await self.reject(msg, kind, code, message, answer)

    async def reject(
        self, msg: Delivery, kind: DlqKind, code: RejectCode, message: str, answer: bool = True
    ) -> None:
        """Settle a refused message: dead-lettered, answered (``answer``), acked."""
        record = dead_letter(
            msg, kind, code, message, limit=self.broker.max_payload or (1024 * 1024)
        )
        await send_dead_letter(self.broker, self.names, record)
        log.info("rejected %r: %s: %s", msg.subject[:200], code, message)
        if answer:
            error = IntakeError(error=ErrorBody(code=code, message=message))
            await reply(self.broker, msg, encode(error))
        await msg.ack()
