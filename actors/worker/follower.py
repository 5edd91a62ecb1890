"""Following records a worker keeps a copy of: the agents' holds (``worker/holds.py``) and the
shared rate limits (``worker/limits.py``).

Such records are kept one to a subject in a stream (its last message is the record). A worker
reads them all at start, then hears of each change by a core subscription to the subjects (a
notice: the message as published), and reads them all again every ``REFRESH_EVERY`` seconds,
so that a notice missed (across a reconnect) is caught up. What a record means, and what to do
with it, is its keeper's: ``RecordFollower`` only hands it over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from sojourn.broker.connection import Broker
from sojourn.broker.delivery import OnDelivery, StoredMessage, Subscription
from sojourn.broker.follow import read_all
from sojourn.broker.tasks import STOP_GRACE, reap, settle_cancelled

__all__ = ["REFRESH_EVERY", "STOP_GRACE", "RecordFollower"]

log = logging.getLogger("sojourn.actors.worker.follower")

REFRESH_EVERY = 5.0
"""Seconds between full reads of the records (a notice missed is caught up)."""


class RecordFollower:
    """The records on ``subject_filter`` of ``stream`` followed for their keeper, and the
    keeper's background tasks.

    ``on_stored`` takes each record read from the stream (at start, then every
    ``REFRESH_EVERY`` seconds), ``on_notice`` each one published since the subscription;
    ``what`` names the records in the log.
    """

    def __init__(
        self,
        broker: Broker,
        stream: str,
        subject_filter: str,
        *,
        on_stored: Callable[[StoredMessage], None],
        on_notice: OnDelivery,
        what: str,
    ) -> None:
        self.broker = broker
        self.stream = stream
        self.subject_filter = subject_filter
        self.on_stored = on_stored
        self.on_notice = on_notice
        self.what = what
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sub: Subscription | None = None
        self._refresher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Subscribe to the notices, read every record, then read them all again every
        ``REFRESH_EVERY`` seconds."""
        self._sub = await self.broker.subscribe(self.subject_filter, cb=self.on_notice)
        await self.refresh()
        self._refresher = asyncio.create_task(self._refresh_loop())

    async def refresh(self) -> None:
        """Read every record now, handing each to ``on_stored`` in stream order."""
        for stored in await read_all(self.broker, self.stream, self.subject_filter):
            self.on_stored(stored)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_EVERY)
            try:
                await self.refresh()
            except Exception as e:  # the broker away for a while: the next round reads again
                log.debug("reading %s: %s", self.what, e)

    def later(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background until it ends or the follower stops."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        """Stop following: unsubscribe (no notice comes in after), then cancel the refresher
        and the background tasks and wait for them to end, at most ``STOP_GRACE`` seconds."""
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        running = list(self._tasks)
        if self._refresher is not None:
            running.append(self._refresher)
        await settle_cancelled(running, STOP_GRACE)

    def kill(self) -> None:
        """Stop at once, as the death of the process would (``Worker.kill``): the refresher
        and the background tasks are cancelled and reaped in the background; the subscription
        goes with the severed connection."""
        reap([*self._tasks, *([self._refresher] if self._refresher is not None else [])])
