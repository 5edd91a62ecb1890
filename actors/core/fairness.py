"""A weighted fair queue between keys (decision 0049): what a worker's fetch window hands out
next when it holds messages of several fairness keys.

Start-time fair queueing: every item gets a virtual start tag. A key that becomes backlogged
starts at the queue's virtual time (the tag of the item served last: no credit for the time it
was idle, no penalty either); each further item of a backlogged key starts where its previous
one ends, ``1/weight`` later. The item with the smallest tag goes next, ties in arrival order.
So a key of weight w gets w times the share of a weight-1 key while both are backlogged, and a
key that arrives late waits behind at most one item of each other key, whatever the weights:
ordering by finish tags instead would make a new weight-1 key wait behind up to w items of
every key of weight w.

Per key FIFO; O(log keys) per push and pop; memory is the items plus one entry per backlogged
key (a key whose items are all gone is forgotten). Pure: no I/O, no clock.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import Generic, TypeVar

__all__ = ["FairQueue"]

T = TypeVar("T")

_TICK = 720_720 << 40
"""A tag's unit (one item of weight 1), in integer ticks: exact for weights that divide
720720 (1 to 16 and many more), off by under 1e-12 for the others; integers never drift."""


class FairQueue(Generic[T]):
    """Items by key, handed out in weighted round-robin between keys, FIFO within a key."""

    def __init__(self) -> None:
        self._keys: dict[str, deque[tuple[int, int, T]]] = {}  # (arrival, weight, item)
        self._heap: list[tuple[int, int, str]] = []  # (head's tag, head's arrival, key)
        self._arrivals = itertools.count()
        self._now = 0  # virtual time: the tag of the item served last
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def keys(self) -> int:
        """How many keys have items."""
        return len(self._keys)

    def push(self, item: T, key: str, weight: int = 1) -> None:
        """Queue ``item`` under ``key``, whose share is ``weight`` (an int >= 1).

        Raises:
            ValueError: ``weight`` is not an int >= 1.
        """
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
            raise ValueError(f"a weight is an int >= 1, not {weight!r}")
        arrival = next(self._arrivals)
        items = self._keys.get(key)
        if items is None:  # newly backlogged: starts now
            items = self._keys[key] = deque()
            heapq.heappush(self._heap, (self._now, arrival, key))
        items.append((arrival, weight, item))
        self._len += 1

    def peek_key(self) -> str:
        """The key whose item ``pop`` returns next.

        Raises:
            IndexError: the queue is empty.
        """
        if not self._heap:
            raise IndexError("peek_key from an empty FairQueue")
        return self._heap[0][2]

    def pop(self) -> T:
        """The next item: the head of the key with the smallest start tag.

        Raises:
            IndexError: the queue is empty.
        """
        if not self._heap:
            raise IndexError("pop from an empty FairQueue")
        tag, _, key = heapq.heappop(self._heap)
        items = self._keys[key]
        _, weight, item = items.popleft()
        self._len -= 1
        self._now = tag
        if items:  # the next item starts where this one ends
            heapq.heappush(self._heap, (tag + _TICK // weight, items[0][0], key))
        else:
            del self._keys[key]
        return item
