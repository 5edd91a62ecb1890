"""Concurrency keys as a client sees them (decision 0048): ``queue`` (a key's slots and the
head of its queue) and ``queued`` (where a queued run stands).

A run queued on its key is ``pending`` in its history (``waiting_on`` ``queue:<key>``); its
place is counted here, live, from the key's queue in the broker: two counted reads, whatever
the queue's depth. Nothing is written.
"""

from __future__ import annotations

from typing import Any

import msgspec

from sojourn.broker.concurrency import ConcurrencyStore
from sojourn.schemas.concurrency import (
    ConcurrencyBody,
    QueuedRun,
    QueueListing,
    concurrency_fault,
    key_token,
    queued_detail,
)
from sojourn.schemas.flow import key_fault
from sojourn.schemas.names import validate_token

from ..core.state import RunState
from .base import ClientBase

__all__ = ["QUEUE_SHOWN_MAX", "ConcurrencyReads", "concurrency_body"]

QUEUE_SHOWN_MAX = 1000
"""The most queued runs one ``queue`` call lists (``depth`` counts them all)."""


def concurrency_body(given: ConcurrencyBody | dict[str, Any] | None) -> ConcurrencyBody | None:
    """``StartOptions.concurrency`` as the wire body, checked as the intake would.

    Raises:
        ValueError: not ``{"key": str, "limit": int}`` or out of bounds.
    """
    if given is None:
        return None
    if isinstance(given, ConcurrencyBody):
        body = given
    else:
        try:
            body = msgspec.convert(given, ConcurrencyBody, strict=True)
        except msgspec.ValidationError as e:
            raise ValueError(f'concurrency is {{"key": str, "limit": int}}: {e}') from None
    why = concurrency_fault(body)
    if why is not None:
        raise ValueError(why)
    return body


class ConcurrencyReads(ClientBase):
    """``Client``'s reads of concurrency keys."""

    async def queue(self, agent: str, key: str, *, first: int = 20) -> QueueListing:
        """The key's slots (the runs holding one) and its queue: its depth and the ``first``
        runs queued, oldest (next to be admitted) first.

        Raises:
            InvalidName: ``agent`` is not a valid name.
            ValueError: ``key`` is not a valid key, ``first`` out of 0..``QUEUE_SHOWN_MAX``.
        """
        validate_token(agent, "agent name")
        why = key_fault(key)
        if why is not None:
            raise ValueError(why)
        if not 0 <= first <= QUEUE_SHOWN_MAX:
            raise ValueError(f"first is from 0 to {QUEUE_SHOWN_MAX}")
        await self._ensure()
        store = ConcurrencyStore(self.broker, self.names)
        token = key_token(key)
        rec, _ = await store.slots(agent, token)
        if rec is not None and (rec.agent, rec.key) != (agent, key):
            rec = None
        depth = await store.depth(agent, token)
        entries = await store.first(agent, token, first) if first and depth else []
        queued = tuple(
            QueuedRun(run_id=e.run_id, position=i, queued_at=e.at)
            for i, (e, _) in enumerate(
                ((e, s) for e, s in entries if (e.agent, e.key) == (agent, key)), 1
            )
        )
        return QueueListing(
            agent=agent,
            key=key,
            limit=None if rec is None else rec.limit,
            holders=() if rec is None else rec.holders,
            depth=depth,
            queued=queued,
        )

    async def queued(self, state: RunState) -> tuple[str, int | None] | None:
        """Where a run queued on its concurrency key stands: its key and position (1: next
        to be admitted; ``None``: it just left the queue), or ``None`` when ``state`` is not
        queued."""
        c = state.concurrency
        if not state.queued or c is None or not c.ticket:
            return None
        store = ConcurrencyStore(self.broker, self.names)
        position = await store.position(state.agent, key_token(c.key), c.ticket)
        return c.key, position

    async def queued_detail(self, state: RunState) -> str | None:
        """``queued on key K, position P`` for a queued run, ``None`` for any other."""
        where = await self.queued(state)
        return None if where is None else queued_detail(*where)
