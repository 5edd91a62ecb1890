"""Shared rate limits from a client: ``set_limit``, ``block_limit``, ``unblock_limit``,
``limits`` and ``limit`` (decision 0046).

A change is a request to a worker's intake (``<prefix>.as.<sender>.limit.<name>``, the admin
role where the deployment authenticates), answered with the limit's record once it is written;
reading needs no worker: the records are read from the agents stream.
"""

from __future__ import annotations

import uuid

from sojourn.broker import headers as h
from sojourn.broker.limits import LimitStore
from sojourn.schemas.codec import decode_limit_answer, encode
from sojourn.schemas.limits import (
    LIMIT_BLOCK_MAX,
    Limit,
    LimitAction,
    LimitRecord,
    LimitRequest,
    validate_limit_name,
)
from sojourn.schemas.wire import IntakeError

from .base import ClientBase, rejected

__all__ = ["LimitControls"]


class LimitControls(ClientBase):
    """``Client``'s shared rate limits."""

    async def set_limit(
        self, name: str, limit: Limit, *, timeout: float = 10.0, by: str | None = None
    ) -> LimitRecord:
        """Create shared limit ``name``, or change its rates (the slots granted already keep
        their times). An operator's setting holds against every worker's declaration.

        Raises:
            InvalidName: ``name`` is not a limit's name.
            TriggerRejected: the worker refused it (``invalid_limit``).
            TimeoutError: no worker answered within ``timeout`` (the request stays queued).
        """
        return await self._limit_request(name, LimitRequest(action="set", limit=limit), timeout, by)

    async def block_limit(
        self, name: str, seconds: float, *, timeout: float = 10.0, by: str | None = None
    ) -> LimitRecord:
        """Grant no slot of ``name`` for ``seconds`` (at most ``LIMIT_BLOCK_MAX``), as a
        provider's 429 does: requests granted a slot in that time ask again after it."""
        if not 0 < seconds <= LIMIT_BLOCK_MAX:
            raise ValueError(f"a block lasts more than 0 and at most {LIMIT_BLOCK_MAX:g} s")
        body = LimitRequest(action="block", seconds=seconds)
        return await self._limit_request(name, body, timeout, by)

    async def unblock_limit(
        self, name: str, *, timeout: float = 10.0, by: str | None = None
    ) -> LimitRecord:
        """Lift a block of ``name`` (slots granted meanwhile keep their times)."""
        return await self._limit_request(name, LimitRequest(action="unblock"), timeout, by)

    async def limits(self) -> list[LimitRecord]:
        """Every shared limit's record, by name."""
        await self._ensure()
        return await LimitStore(self.broker, self.names).all()

    async def limit(self, name: str) -> LimitRecord | None:
        """Limit ``name``'s record, or ``None`` when there is no such limit."""
        validate_limit_name(name)
        await self._ensure()
        rec, _ = await LimitStore(self.broker, self.names).get(name)
        return rec

    async def _limit_request(
        self, name: str, body: LimitRequest, timeout: float, by: str | None
    ) -> LimitRecord:
        validate_limit_name(name)
        await self._ensure()
        operator = self._operator(by)
        inbox = self.broker.new_inbox(operator if self.identity is not None else None)
        sub = await self.broker.subscribe(inbox, max_msgs=1)
        action: LimitAction = body.action
        try:
            headers = {h.REPLY_TO: inbox, h.MSG_ID: f"limit:{name}:{uuid.uuid4().hex}"}
            await self._publish(self.names.limit_request(name, operator), encode(body), headers)
            try:
                msg = await sub.next_msg(timeout=timeout)
            except TimeoutError:
                raise TimeoutError(
                    f"no worker answered the {action} of limit {name!r} within {timeout:g} s "
                    "(it stays queued: is a worker up?)"
                ) from None
        finally:
            await sub.unsubscribe()
        answer = decode_limit_answer(msg.data)
        if isinstance(answer, IntakeError):
            raise rejected(answer)
        return answer.record
