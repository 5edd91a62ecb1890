"""What every part of the ``Client`` shares: the connection and the stores on it, the
topology check before the first publish, who the client sends as, and publishing to the inbox
(with or without waiting for the intake's answer).

Clients never write run events. A start, a signal, a cancel, a control or a schedule request
is a message on the inbox stream: the JetStream publish ack is the durable receipt, even while
no worker is up; the intake answers on an inbox of the sender's when asked to.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Literal

import msgspec

from sojourn.broker import headers as h
from sojourn.broker.archive import ArchiveStore
from sojourn.broker.connection import Broker, JetStreamError
from sojourn.broker.eventstore import EventStore
from sojourn.broker.names import Names
from sojourn.broker.topology import ensure_topology
from sojourn.schemas.codec import decode_intake_reply
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import BrokerUnavailable, SojournError, UnknownAgent
from sojourn.schemas.events import Budget
from sojourn.schemas.names import validate_token
from sojourn.schemas.wire import BudgetBody, IntakeError, IntakeOk

__all__ = ["ClientBase", "TriggerRejected", "budget_body", "refuse_unknown", "rejected"]


FRESH_KEPT = 1024
"""Starts a client remembers for ``Client.result`` (the oldest is forgotten first)."""


class TriggerRejected(SojournError):
    """The intake refused a trigger; ``code`` is one of ``sojourn.schemas.REJECT_CODES``."""

    def __init__(self, code: str, message: str, *, run_id: str | None = None) -> None:
        super().__init__(f"{code}: {message}", run_id=run_id)
        self.code = code


def rejected(reply: IntakeError, run_id: str | None = None) -> SojournError:
    """The error to raise for the intake's refusal: ``UnknownAgent`` or ``TriggerRejected``."""
    if reply.error.code == "unknown_agent":
        return UnknownAgent(reply.error.message)
    return TriggerRejected(reply.error.code, reply.error.message, run_id=run_id)


def budget_body(budget: Budget | None) -> BudgetBody | None:
    """A budget as a start, a schedule or a budget change carries it: the limits it sets
    (``None`` when it sets none)."""
    if budget is None or budget.empty:
        return None
    limits = {k: v for k, v in msgspec.structs.asdict(budget).items() if v is not None}
    return BudgetBody(**limits)


def refuse_unknown(options: Mapping[str, object], known: type, where: str) -> None:
    """Refuse a keyword argument that the ``TypedDict`` ``known`` does not name, as Python
    refuses one a function does not take (mypy checks typed callers; this, every caller).

    Raises:
        TypeError: ``options`` holds a name ``known`` does not.
    """
    unknown = sorted(options.keys() - known.__annotations__.keys())
    if unknown:
        raise TypeError(f"{where}() got an unexpected keyword argument {unknown[0]!r}")


class ClientBase:
    """The connection of a ``Client`` and what all its parts use to send."""

    def __init__(
        self,
        broker: Broker,
        settings: Settings | None = None,
        *,
        owns_broker: bool = False,
        speaks_for: Iterable[str] = (),
    ) -> None:
        self.broker = broker
        self.settings = settings or Settings()
        self.names = Names(self.settings.prefix)
        self.store = EventStore(broker, self.names, self.settings)
        self.archive = ArchiveStore(broker, self.names)
        self.speaks_for: frozenset[str] = frozenset(
            validate_token(n, "name to speak for") for n in speaks_for
        )
        """Names this client may send as besides its connection's user (an HTTP gateway's
        callers). The broker's permissions decide (``AuthUser.speaks_for``); this only turns a
        name it would refuse into a ``ValueError`` before anything is published."""
        self._owns = owns_broker
        self._ready = False
        self._fresh: dict[str, float] = {}
        """Runs this client started itself (a trigger the inbox stored as new, not a
        duplicate), by id: when (``time.monotonic()``). ``Client.result`` reads it once."""

    def _started(self, run_id: str) -> None:
        """The inbox stored this client's new trigger for ``run_id`` (see ``_fresh``)."""
        fresh = self._fresh
        fresh[run_id] = time.monotonic()
        if len(fresh) > FRESH_KEPT:  # the oldest goes: a start nobody waits on is forgotten
            del fresh[next(iter(fresh))]

    def _just_started(self, run_id: str, within: float) -> bool:
        """Whether this client started ``run_id`` less than ``within`` seconds ago (forgotten
        once asked)."""
        at = self._fresh.pop(run_id, None)
        return at is not None and time.monotonic() - at < within

    async def _ensure(self) -> None:
        """Make sure the streams exist before the first publish: create the missing ones
        where this user may (never reconfigure existing ones: workers own their config).

        Raises:
            PermissionDenied: a stream is missing and this user may not create it (a client
                role: start a worker first), or the credentials are for another prefix.
        """
        if not self._ready:
            await ensure_topology(self.broker, self.names, self.settings, consumers=False)
            self._ready = True

    @property
    def identity(self) -> str | None:
        """Who this client is to sojourn: the authenticated NATS user of its connection, if
        any. Messages then travel on ``<prefix>.as.<user>...`` subjects, the only ones the
        broker lets that user publish on, so the history records who sent them."""
        return self.broker.user

    def _sender(self, claimed: str | None) -> str | None:
        """The sender token to publish as: the authenticated user, or one of the names it
        speaks for (``speaks_for``: the broker lets it), else what the caller claims (trusted
        only where the deployment has no authentication)."""
        if self.identity is not None:
            if claimed is None or claimed == self.identity:
                return self.identity
            if claimed in self.speaks_for:
                return claimed
            raise ValueError(
                f"this connection is authenticated as {self.identity!r}: it cannot send as "
                f"{claimed[:200]!r} (a gateway's user speaks only for the names it is given)"
            )
        return None if claimed is None else validate_token(claimed, "sender")

    async def _publish(self, subject: str, body: bytes, headers: dict[str, str]) -> bool:
        """Publish to the inbox; ``True`` when the broker says it is a duplicate."""
        try:
            ack = await self.broker.try_publish(subject, body, headers)
        except TimeoutError as e:
            raise BrokerUnavailable("the inbox did not acknowledge the trigger in time") from e
        if isinstance(ack, JetStreamError):
            raise BrokerUnavailable(f"the inbox did not store the trigger: {ack.description}")
        return ack.duplicate

    async def _publish_answered(
        self,
        subject: str,
        body: bytes,
        headers: dict[str, str],
        timeout: float,
        sender: str | None = None,
    ) -> IntakeOk | IntakeError | Literal["duplicate"] | None:
        """Publish to the inbox asking the intake to answer: its answer, ``"duplicate"`` when
        the broker already holds this very message (the intake answers only once), ``None``
        when no answer came within ``timeout`` (stored; no worker has taken it yet). The
        answer comes to an inbox of ``sender``'s, the only place the intake answers it."""
        inbox = self.broker.new_inbox(sender if self.identity is not None else None)
        sub = await self.broker.subscribe(inbox, max_msgs=1)
        try:
            if await self._publish(subject, body, {**headers, h.REPLY_TO: inbox}):
                return "duplicate"
            try:
                msg = await sub.next_msg(timeout=timeout)
            except TimeoutError:
                return None
        finally:
            await sub.unsubscribe()
        reply = decode_intake_reply(msg.data)
        assert isinstance(reply, IntakeOk | IntakeError)
        return reply

    def _operator(self, by: str | None) -> str:
        """The sender of a control message, which always has one."""
        return self._sender(by) or self.broker.sender("anonymous")
