"""``SlotGate``: a worker's execution slots, handed out most urgent first (decision 0049).

A semaphore whose waiters are served by priority (1 first), then in arrival order: when every
slot is taken and runs of several priorities wait, the slot that frees goes to the most urgent.
A worker's lanes each wait here before they take from the broker, so the lane of priority 1
fetches the moment a slot frees, ahead of a bulk lane that has waited longer.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools

from sojourn.schemas.priority import PRIORITY_DEFAULT

__all__ = ["SlotGate"]


class SlotGate:
    """``n`` slots; ``acquire(priority)`` waits for one, ``release()`` gives one back."""

    def __init__(self, n: int) -> None:
        self._free = n
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    @property
    def free(self) -> int:
        """Slots free now (0 while any waiter waits)."""
        return self._free

    def locked(self) -> bool:
        return self._free <= 0

    async def acquire(self, priority: int = PRIORITY_DEFAULT) -> None:
        """Take a slot, waiting behind every more urgent waiter and every earlier one of the
        same priority."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._order), fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # granted as it was cancelled: the slot goes to the next
            raise

    def release(self) -> None:
        """Give a slot back: to the most urgent waiter, or to the free count."""
        while self._waiters:
            _, _, fut = heapq.heappop(self._waiters)
            if not fut.done():
                fut.set_result(None)
                return
        self._free += 1
