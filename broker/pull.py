"""Fetching from a durable pull consumer without holding a message back.

nats-py's ``fetch(batch > 1)`` shares one reply subject between all its pull requests. A status
answer that belongs to an earlier request (its ``408 Request Timeout``, arriving just after the
client gave up on it) is taken by the next fetch as its own answer, which then sends a second,
*lingering* request and, once a message arrives, waits for the rest of the batch until that
request expires: a message published to an idle consumer was held up to the whole fetch
timeout (measured: 9 of 150 messages held 168-573 ms with ``timeout=1.0``). Every start,
signal, wake and schedule fire went through that fetch.

Here each pull request has a reply subject of its own (``<inbox>.<n>``), and a status answers
only the request it names. Every request asks with ``no_wait`` and ``expires``: the server
waits up to ``expires`` for a first message, then delivers what the consumer has (up to the
batch) and ends the request at once with ``404 No Messages``, so a fetch returns as soon as
its messages are in, and never waits for a batch to fill. A message delivered to a request
the client already gave up on is not lost: every message, for any request, goes to one queue
that the next fetch serves first.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from sojourn.schemas.errors import JetStreamError

from .delivery import Delivery

__all__ = ["PULL_GRACE", "PullConsumer", "open_pull"]


PULL_GRACE = 0.5
"""Seconds a fetch waits past its timeout for its request's own end (the server's ``408``)
before giving up on it: a server slowed by load answers late, and a request the client gave up
on may still deliver (into the queue the next fetch serves, so nothing is lost either way)."""

_STATUS = "Status"
_DESCRIPTION = "Description"
_HEARTBEAT = "100"
_ENDS_QUIETLY = frozenset({"404", "408"})  # no messages (now, or before expires)
_EXPIRES_MARGIN_NS = 100_000  # the server's expiry comes a little before the client's
_LINGER = 0.02
"""Seconds a fetch that has messages waits for its request's end before it returns them: the
server ends a ``no_wait`` request right after what the consumer had, so this is only a bound,
for a request the server keeps open (one held by the consumer's ``max_ack_pending``)."""


class PullConsumer:
    """A bound durable pull consumer whose ``fetch`` returns ``[]`` when nothing is there
    (and raises ``PermissionDenied`` when the server refused the pull)."""

    def __init__(
        self,
        nc: NATS,
        next_subject: str,
        *,
        denied_since: Callable[[str, float], Exception | None] | None = None,
    ) -> None:
        self._nc = nc
        self._next = next_subject
        self._denied_since = denied_since
        self._inbox = nc.new_inbox()
        self._sub: Any = None
        self._ready: deque[Msg] = deque()
        self._ids = itertools.count(1)
        self._current = ""  # the reply subject of the request a fetch waits on
        self._ended: Exception | bool = False  # that request's end: True, or its error
        self._changed = asyncio.Event()
        self._request: tuple[int, float, bytes] = (0, 0.0, b"")
        """The last pull request's ``(batch, timeout, body)``: a fetch like the one before (the
        intake's every fetch) sends the same body without encoding it again."""

    async def open(self) -> PullConsumer:
        self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_message)
        return self

    async def _on_message(self, m: Msg) -> None:
        # A status comes from the server and has no reply subject; a stored message always has
        # one (its ack subject), whatever headers its publisher gave it: a ``Status: 503``
        # header on a message is the message's, never the end of a request.
        status = m.headers.get(_STATUS) if m.headers and not m.reply else None
        if not status:
            self._ready.append(m)  # whichever request it answers: the next fetch serves it
            self._changed.set()
            return
        if status == _HEARTBEAT or m.subject != self._current:
            return  # an idle heartbeat, or the end of a request nobody waits on any more
        if status in _ENDS_QUIETLY:
            self._ended = True
        else:  # 409 (consumer deleted, max waiting exceeded, leadership change ...), 503
            description = m.headers.get(_DESCRIPTION, "") if m.headers else ""
            self._ended = JetStreamError(
                f"pull from {self._next}: {status} {description}".rstrip(),
                code=int(status) if status.isdigit() else 0,
                err_code=0,
                description=description,
            )
        self._changed.set()

    async def fetch(self, batch: int, timeout: float) -> list[Delivery]:
        """Up to ``batch`` deliveries, as soon as there are any; ``[]`` after waiting up to
        ``timeout`` seconds for a first one.

        Raises:
            PermissionDenied: the server refused this user the pull.
            JetStreamError: the server ended the request with an error status (a deleted
                consumer, too many waiting requests ...).
        """
        if batch < 1 or timeout <= 0:
            raise ValueError(f"fetch needs batch >= 1 and timeout > 0, not {batch}, {timeout}")
        if self._sub is None:
            raise RuntimeError("PullConsumer.open() first")
        if self._current:
            raise RuntimeError("one fetch at a time per PullConsumer")
        if self._ready:
            return self._take(batch)
        started = time.monotonic()
        self._current = f"{self._inbox}.{next(self._ids)}"
        self._ended = False
        self._changed.clear()
        last_batch, last_timeout, body = self._request
        if batch != last_batch or timeout != last_timeout:
            request = {
                "batch": batch,
                "expires": max(1, int(timeout * 1e9) - _EXPIRES_MARGIN_NS),
                "no_wait": True,
            }
            body = json.dumps(request).encode()
            self._request = (batch, timeout, body)
        await self._nc.publish(self._next, body, reply=self._current)
        deadline = started + timeout + PULL_GRACE
        try:
            while not self._ended and len(self._ready) < batch:
                if self._ready:
                    deadline = min(deadline, time.monotonic() + _LINGER)
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.clear()
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except TimeoutError:
                    break
        finally:
            self._current = ""
        ended = self._ended
        if isinstance(ended, Exception) and not self._ready:
            raise ended
        if not self._ready:
            denied = self._denied_since(self._next, started) if self._denied_since else None
            if denied is not None:
                raise denied
        return self._take(batch)

    def _take(self, batch: int) -> list[Delivery]:
        n = min(batch, len(self._ready))
        return [Delivery(self._ready.popleft()) for _ in range(n)]

    async def close(self) -> None:
        """Stop receiving; messages received and not fetched are left unacknowledged (the
        server delivers them again after the consumer's ack wait)."""
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except Exception:
                pass


async def open_pull(
    nc: NATS,
    stream: str,
    consumer: str,
    denied_since: Callable[[str, float], Exception | None] | None = None,
) -> PullConsumer:
    """A ``PullConsumer`` for the durable ``consumer`` of ``stream``, subscribed and ready."""
    return await PullConsumer(
        nc, f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}", denied_since=denied_since
    ).open()
