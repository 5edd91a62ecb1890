"""The fetch window (decision 0049): a worker's loop takes starts and wakes through it, not
straight from the consumer, so a burst of one fairness key's messages does not starve another
key's that arrived after it.

``FairWindow.fetch`` has ``PullConsumer.fetch``'s meaning, but looks ahead: it takes what the
server has ready beyond what the loop asked for (up to ``window`` messages and ``window_bytes``
bytes held), keeps what it holds alive (``in_progress``), and hands messages out in weighted
round-robin between keys (``actors/core/fairness.py``), FIFO within a key. A message's key is
read leniently (``classify``): hostile headers are the default key, never an error.

Costs, measured on one host: a look-ahead that finds nothing takes 1.3-1.7 ms
(``PullConsumer`` always sends ``expires``, and the server ends an empty request
only at its expiry timer), so after one that came back short the window does not look again
for ``QUIET`` seconds; while it holds nothing it sends no look-ahead at all (the one blocking
fetch takes what is there), so an idle worker's lone message waits for nothing extra.

Held messages are not the worker's work yet but are delivered to it: other workers on the same
consumer cannot take them, and they count against the consumer's ``max_ack_pending`` (which
thus caps the look-ahead of all its workers together). ``close()`` leaves them unacknowledged:
the server delivers them again once their ack wait passes since their last ``in_progress``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from sojourn.broker.delivery import Delivery
from sojourn.broker.tasks import cancel_and_wait
from sojourn.schemas.fairness import FAIRNESS_WEIGHT_MAX, Fairness
from sojourn.schemas.fairness import classify as classify_fairness

from ..core.fairness import FairQueue

__all__ = ["NO_WAIT", "QUIET", "FairWindow", "Fetches"]

log = logging.getLogger("sojourn.worker")

NO_WAIT = 0.001
"""The timeout of a look-ahead fetch. ``PullConsumer`` asks the server to wait ``timeout`` less
0.1 ms: at 0.1 ms or less it asks for 1 ns and the server expires the request before it
delivers anything (measured: every such fetch came back empty with messages ready; 23 of 100
at 0.11 ms). An empty one costs the same ~1.3 ms at any timeout up to 1 ms."""

QUIET = 0.01
"""Seconds the window does not look ahead after a look-ahead that took all the server had: at
most this much later than otherwise does it see a newcomer while it holds messages, and at most
~15% of a loop's time goes on empty look-aheads."""

_HEADER_OVERHEAD = 4  # ": " and CRLF of a header line


class Fetches(Protocol):
    """What the window reads from: ``PullConsumer`` or anything with its ``fetch``."""

    async def fetch(self, batch: int, timeout: float) -> list[Delivery]: ...


class FairWindow:
    """A look-ahead over a pull consumer that hands messages out fairly between keys.

    Args:
        sub: the consumer (``PullConsumer``); the window is its only reader.
        window: messages held at most.
        window_bytes: bytes held at most (body and headers), give or take one message: a
            message larger than the whole bound is still taken, alone.
        keep_alive: seconds; every held message gets ``in_progress`` at least this often
            (pass the consumer's ack wait / 3).
        max_message: the largest message the consumer can deliver (the server's
            ``max_payload``): a look-ahead asks for no more messages than fit the byte bound
            at this size, since sizes are known only once delivered.
        classify: a message's fairness from its headers; must not raise (if it does, or
            returns nonsense, the message goes to the default key, weight 1).
    """

    def __init__(
        self,
        sub: Fetches,
        *,
        window: int = 4096,
        window_bytes: int = 32 * 2**20,
        keep_alive: float,
        max_message: int = 2**20,
        classify: Callable[[Mapping[str, str]], Fairness] = classify_fairness,
    ) -> None:
        if window < 1 or window_bytes < 1 or max_message < 1 or not keep_alive > 0:
            raise ValueError("window, window_bytes, max_message and keep_alive must be > 0")
        self._sub = sub
        self._window = window
        self._window_bytes = window_bytes
        self._keep_alive = keep_alive
        self._max_message = max_message
        self._classify = classify
        self._queue: FairQueue[Delivery] = FairQueue()
        self._held: dict[Delivery, tuple[float, int]] = {}  # (last kept alive, size), by then
        self._quiet_until = 0.0
        self._keeper: asyncio.Task[None] | None = None
        self._closed = False
        self.held_bytes = 0
        """Bytes of the messages held (bodies and headers)."""
        self.kept_alive = 0
        """``in_progress`` sent for held messages so far."""

    @property
    def held(self) -> int:
        """Messages held: delivered to this worker, not handed out yet."""
        return len(self._queue)

    async def fetch(self, batch: int, timeout: float) -> list[Delivery]:
        """Up to ``batch`` messages, fairly between keys; ``[]`` after waiting up to
        ``timeout`` seconds for a first one when none is held.

        Raises what the consumer's ``fetch`` raises (``PermissionDenied``, ``JetStreamError``)
        when nothing is held; a look-ahead's error while holding messages is logged, and the
        held messages are handed out.
        """
        if batch < 1 or timeout <= 0:
            raise ValueError(f"fetch needs batch >= 1 and timeout > 0, not {batch}, {timeout}")
        if self._closed:
            raise RuntimeError("the FairWindow is closed")
        if self._keeper is None:
            self._keeper = asyncio.create_task(self._keep_held_alive())
        if not self._queue:
            lone = await self._top_up(timeout)
            if lone is not None:
                return [lone]
        elif time.monotonic() >= self._quiet_until:
            await self._top_up(NO_WAIT)
        return [self._take() for _ in range(min(batch, len(self._queue)))]

    async def close(self) -> None:
        """Stop keeping held messages alive and forget them, unacknowledged: the server
        delivers them again after the consumer's ack wait. The consumer is not closed."""
        self._closed = True
        keeper, self._keeper = self._keeper, None
        await cancel_and_wait(keeper)
        self._queue = FairQueue()
        self._held.clear()
        self.held_bytes = 0

    # --- inside ------------------------------------------------------------------------------

    def _room(self) -> int:
        """How many messages a fetch may ask for now (0: the window is full)."""
        count = self._window - len(self._queue)
        free = self._window_bytes - self.held_bytes
        if count <= 0 or (self._queue and free <= 0):
            return 0
        return min(count, max(1, free // self._max_message))

    async def _top_up(self, timeout: float) -> Delivery | None:
        """Take chunks while there is room and the server sends full ones: the first waiting
        up to ``timeout`` for a message, the others not waiting. An error is raised only when
        nothing is held; otherwise logged, and the held messages are served.

        Returns the message of a lone delivery into an empty window, not held: one message
        has nothing to be fair to (a quiet worker's every start), so it is handed out as it
        came, without weighing its key."""
        while (room := self._room()) > 0:
            try:
                got = await self._sub.fetch(batch=room, timeout=timeout)
            except Exception as e:
                if not self._queue:
                    raise
                log.warning("fetch window: look-ahead failed (%s); serving what is held", e)
                self._quiet_until = time.monotonic() + QUIET
                return None
            if len(got) < room:  # the server had no more
                self._quiet_until = time.monotonic() + QUIET
                if len(got) == 1 and not self._queue:
                    return got[0]
                for msg in got:
                    self._hold(msg)
                return None
            for msg in got:
                self._hold(msg)
            timeout = NO_WAIT
        return None

    def _hold(self, msg: Delivery) -> None:
        key, weight = self._key_of(msg)
        size = _size(msg)
        self._queue.push(msg, key, weight)
        self._held[msg] = (time.monotonic(), size)
        self.held_bytes += size

    def _key_of(self, msg: Delivery) -> tuple[str, int]:
        try:
            f = self._classify(msg.headers)
            key, weight = f.key, f.weight
        except Exception:
            return "", 1
        if not isinstance(key, str):
            key = ""
        if type(weight) is not int or not 1 <= weight <= FAIRNESS_WEIGHT_MAX:
            weight = 1
        return key, weight

    def _take(self) -> Delivery:
        msg = self._queue.pop()
        _, size = self._held.pop(msg)
        self.held_bytes -= size
        return msg

    async def _keep_held_alive(self) -> None:
        """Every ``keep_alive / 2``: ``in_progress`` for each message not kept alive for as long
        (so none goes ``keep_alive`` without one). Errors are logged, never raised."""
        every = self._keep_alive / 2
        while not self._closed:  # also ends on the flag: a cancel can be swallowed
            await asyncio.sleep(every)
            try:
                await self._sweep(time.monotonic() - every)
            except Exception:
                log.exception("fetch window: keep-alive sweep failed; continuing")

    async def _sweep(self, due: float) -> None:
        stale: list[Delivery] = []
        for msg, (touched, _) in self._held.items():  # oldest first
            if touched > due:
                break
            stale.append(msg)
        failed: Exception | None = None
        for msg in stale:
            entry = self._held.pop(msg, None)
            if entry is None:
                continue  # handed out meanwhile
            self._held[msg] = (time.monotonic(), entry[1])  # to the end: newest
            try:
                await msg.in_progress()
                self.kept_alive += 1
            except Exception as e:
                failed = e
        if failed is not None:
            log.warning("fetch window: in_progress failed for held messages: %s", failed)


def _size(msg: Delivery) -> int:
    """Body and header bytes (headers counted as text; 0 for what cannot be measured)."""
    try:
        headers = msg.headers
        extra = sum(len(k) + len(v) + _HEADER_OVERHEAD for k, v in headers.items())
        return len(msg.data) + extra
    except Exception:
        return 0
