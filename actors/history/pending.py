"""Runs still pending in the inbox: a start stored and not yet taken, so no history yet.

Read by the client (``Client.pending``, ``watch``) and by the intake (a cancel that waits for
its run's start); it only reads the inbox stream, so the client needs no worker module.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec

from sojourn.broker.connection import Broker
from sojourn.broker.delivery import StoredMessage
from sojourn.broker.names import Names
from sojourn.schemas.codec import decode_start
from sojourn.schemas.errors import InvalidName
from sojourn.schemas.names import reserved_run_id
from sojourn.schemas.priority import PRIORITY_DEFAULT, Priority

__all__ = ["INBOX_SCAN", "PendingRun", "find_pending", "scan_inbox"]

INBOX_SCAN = 16
"""Stored messages looked at per filter when the inbox is searched for a run's start or
cancels: enough for any real run, and a bound on what a flood of junk can cost."""


class PendingRun(msgspec.Struct, frozen=True, kw_only=True):
    """A run whose start is stored in the inbox and not yet taken: it has no history yet.

    Attributes:
        agent: the agent its start names.
        queued_at: when the inbox stored the start (unix seconds).
        inbox_seq: the start's inbox sequence.
        sender: the ``as.<sender>`` token of the start's subject (``None``: anonymous).
        priority: the lane it waits on (decision 0049).
    """

    run_id: str
    agent: str
    queued_at: float
    inbox_seq: int
    sender: str | None = None
    priority: Priority = PRIORITY_DEFAULT


async def find_pending(
    broker: Broker, names: Names, run_id: str, *, max_payload: int
) -> PendingRun | None:
    """The oldest start of ``run_id`` stored in the inbox that names it in its subject
    (``<prefix>[.as.<sender>].start.<agent>.<run_id>``), or ``None``.

    The inbox is a work queue: a start stays stored until a worker settles it, so one found
    here was not taken yet. A stored start the intake would refuse at once (not a start of
    this run, oversized, a body that is not a start or names another run or a parent) does
    not make a run pending. Whether the run has a history is the caller's to know: a start
    that created its run stays stored until the run first rests.
    """
    if reserved_run_id(run_id) is not None:
        return None  # only a spawn (continue_as_new) makes such a run: its start names none

    async def first(subject: str) -> PendingRun | None:
        async for m in scan_inbox(broker, names.inbox_stream, subject):
            pending = _pending_start(names, m, run_id, max_payload)
            if pending is not None:
                return pending
        return None

    # Each form and lane at once: a look costs one round trip, not one per filter.
    looks = await asyncio.gather(*(first(s) for s in names.pending_starts(run_id)))
    found = [p for p in looks if p is not None]
    return min(found, key=lambda p: p.inbox_seq) if found else None


def _pending_start(
    names: Names, m: StoredMessage, run_id: str, max_payload: int
) -> PendingRun | None:
    if len(m.data) > max_payload:
        return None
    try:
        inbox = names.parse_inbox(m.subject)
    except InvalidName:
        return None
    if inbox.kind != "start" or inbox.name != run_id:
        return None
    try:
        trigger = decode_start(m.data)
    except msgspec.MsgspecError:
        return None
    if trigger.parent_run_id is not None or trigger.run_id not in (None, run_id):
        return None
    return PendingRun(
        run_id=run_id,
        agent=inbox.target,
        queued_at=m.time,
        inbox_seq=m.seq,
        sender=inbox.sender,
        priority=inbox.priority,
    )


async def scan_inbox(broker: Broker, stream: str, subject: str) -> AsyncIterator[StoredMessage]:
    """The messages stored on ``subject`` (wildcards allowed), oldest first, at most
    ``INBOX_SCAN``: one direct get each, so an oversized one costs one answer, not a batch."""
    seq = 1
    for _ in range(INBOX_SCAN):
        msgs, _more = await broker.direct_get_batch(stream, subject, seq, 1)
        if not msgs:
            return
        yield msgs[0]
        seq = msgs[0].seq + 1
