"""Group commit: the appends of many runs that wait at the same time, stored as one batch.

Under load a worker has many runs appending at once, each its own fenced message on its own
subject. Sent one by one, each costs the server a publish, a flush to disk (``sync_interval:
always``) and an ack, and the worker an ack to read and a task to wake. ``GroupCommit`` sends
an append at once when none is in flight (a lone run's append is exactly what it was), and
while one is, it queues the others; when the one in flight is answered, everything queued goes
as one JetStream atomic batch (``Broker.try_publish_batch``): one flush and one ack for all of
them. Measured on one server with 100 writers of 10 fenced appends each: 13,000-16,000 appends
per second against 4,000-4,600 one by one, and half the client CPU per append.

Nothing about an append changes but its company. Each message keeps its own fence
(``Nats-Expected-Last-Subject-Sequence``) and ``Nats-Msg-Id``, and each caller gets the answer
it would have got alone:

- a stored batch: each message's sequence (a batch is stored contiguously, in order, so the
  ack's sequence, the last message's, gives every other one);
- a batch refused as a whole (one broken fence, one ``Nats-Msg-Id`` stored before, anything
  else the server says): every message is sent again on its own, at once, so each caller gets
  its own verdict (the conflict, the duplicate, the acknowledgement);
- no answer in time, a lost connection: that error, for each caller (an append retries with
  the same ``Nats-Msg-Id``, so a batch that did land is not stored twice).

A stream without atomic publish (``allow_atomic``: a deployment created before it, until
``sojourn topology --apply``; a server older than 2.12) answers the first batch "atomic
publish is disabled": batching stops for this connection, logged once, and appends go one by
one as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field

from sojourn.schemas.errors import JetStreamError, PermissionDenied

from .connection import BATCH_MAX, Broker
from .delivery import PublishAck

__all__ = ["BATCH_BYTES", "GroupCommit"]

log = logging.getLogger("sojourn.broker")

BATCH_BYTES = 4 * 1024 * 1024
"""Most bytes of message bodies one batch carries (the server holds a batch in memory until
its commit); a message larger than this alone goes in a batch of its own."""

_ATOMIC_DISABLED = "atomic publish is disabled"
"""What a stream without ``allow_atomic`` answers a batch (in its error's description)."""


@dataclass(slots=True)
class _Waiting:
    subject: str
    data: bytes
    headers: dict[str, str]
    timeout: float
    answer: asyncio.Future[PublishAck | JetStreamError] = field(repr=False)


class GroupCommit:
    """One connection's appends, grouped while one is in flight (see the module docstring).

    Attributes:
        batching: whether queued appends still go as batches (``False`` once the stream said
            it has no atomic publish).
        batches: batches stored (of two or more appends).
        batched: appends stored in them.
        refused: batches refused as a whole (their appends then sent one by one).
    """

    def __init__(self, broker: Broker) -> None:
        self._b = broker
        self._queue: deque[_Waiting] = deque()
        self._busy = False
        self._drain: asyncio.Task[None] | None = None  # held: a task nobody holds may vanish
        self.batching = True
        self.batches = 0
        self.batched = 0
        self.refused = 0

    async def publish(
        self, subject: str, data: bytes, headers: dict[str, str], *, timeout: float
    ) -> PublishAck | JetStreamError:
        """Append ``data`` to ``subject``: ``Broker.try_publish``'s contract (the ack or the
        stream's refusal, returned; the same errors raised).

        Raises:
            TimeoutError: no answer within ``timeout``.
            PermissionDenied: this connection may not publish to ``subject``.
        """
        if self._busy:
            answer: asyncio.Future[PublishAck | JetStreamError]
            answer = asyncio.get_running_loop().create_future()
            self._queue.append(_Waiting(subject, data, headers, timeout, answer))
            return await answer
        self._busy = True
        try:
            return await self._b.try_publish(subject, data, headers, timeout=timeout)
        finally:
            self._next()

    def _next(self) -> None:
        """The append in flight was answered: send what queued meanwhile, or be idle."""
        if self._queue:
            self._drain = asyncio.get_running_loop().create_task(self._send_queued())
        else:
            self._busy = False

    async def _send_queued(self) -> None:
        group: list[_Waiting] = []
        try:
            while group := self._take():
                await self._send(group)
        finally:
            self._busy = False
            self._drain = None
            # Only a cancelled drain (the loop shutting down) leaves callers waiting: they
            # are cancelled with it rather than left waiting forever.
            for w in [*group, *self._queue]:
                w.answer.cancel()
            self._queue.clear()

    def _take(self) -> list[_Waiting]:
        """The oldest queued appends whose callers still wait, as many as one batch holds."""
        group: list[_Waiting] = []
        size = 0
        while self._queue and len(group) < BATCH_MAX:
            w = self._queue[0]
            if w.answer.done():  # its caller was cancelled: never sent
                self._queue.popleft()
                continue
            if group and size + len(w.data) > BATCH_BYTES:
                break
            group.append(self._queue.popleft())
            size += len(w.data)
        return group

    async def _send(self, group: list[_Waiting]) -> None:
        if len(group) == 1 or not self.batching:
            await asyncio.gather(*(self._alone(w) for w in group))
            return
        try:
            ack = await self._b.try_publish_batch(
                [(w.subject, w.data, w.headers) for w in group],
                timeout=max(w.timeout for w in group),
            )
        except PermissionDenied:  # which subject? each says for itself
            ack = None
        except Exception as e:  # no answer, no connection: the same for every caller
            for w in group:
                _fail(w, e)
            return
        if isinstance(ack, PublishAck):
            self.batches += 1
            self.batched += len(group)
            first = ack.seq - len(group) + 1
            for i, w in enumerate(group):
                _settle(w, PublishAck(stream=ack.stream, seq=first + i, duplicate=False))
            return
        self.refused += 1
        if ack is not None and _ATOMIC_DISABLED in ack.description:
            self.batching = False
            log.info(
                "the events stream has no atomic publish: appends go one by one "
                "(`sojourn topology --apply` turns it on)"
            )
        await asyncio.gather(*(self._alone(w) for w in group))

    async def _alone(self, w: _Waiting) -> None:
        if w.answer.done():
            return
        try:
            ack = await self._b.try_publish(w.subject, w.data, w.headers, timeout=w.timeout)
        except Exception as e:
            _fail(w, e)
        else:
            _settle(w, ack)


# A caller cancelled meanwhile has no answer to receive: it goes nowhere.


def _settle(w: _Waiting, ack: PublishAck | JetStreamError) -> None:
    if not w.answer.done():
        w.answer.set_result(ack)


def _fail(w: _Waiting, error: Exception) -> None:
    if not w.answer.done():
        w.answer.set_exception(error)
