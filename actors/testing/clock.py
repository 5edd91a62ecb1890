"""``VirtualClock``: the runs' clock of a test environment, which can jump ahead.

It reads the real wall clock plus an offset that only grows: it never runs slower than real
time, so a broker timer written at a virtual deadline never fires before that deadline has
come on this clock either. ``jump_to`` moves it ahead at once; the callbacks set on it
(``call_at``) whose time has come then run, in the order of their times. Callbacks also run
as real time brings them due, like the loop's own timers.

``SojournEnv`` drives it: it jumps to the next deadline when every run waits on time, and
``env.advance`` moves it by hand, a deadline at a time (docs/decisions/
0035-virtual-time-in-tests.md).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any

from ..worker.clock import Clock

__all__ = ["VirtualClock"]


class _Call:
    """One callback set on a ``VirtualClock``; ``cancel()`` unsets it."""

    __slots__ = ("args", "callback", "cancelled", "clock", "real", "when")

    def __init__(
        self, clock: VirtualClock, when: float, callback: Callable[..., Any], args: tuple[Any, ...]
    ) -> None:
        self.clock = clock
        self.when = when
        self.callback = callback
        self.args = args
        self.cancelled = False
        self.real: asyncio.TimerHandle | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self.real is not None:
            self.real.cancel()
            self.real = None


class VirtualClock(Clock):
    """Wall time that a test moves ahead; starts at ``start`` (default: the real now)."""

    virtual = True

    def __init__(self, start: float | None = None) -> None:
        self._offset = 0.0 if start is None else max(0.0, start - time.time())
        self._calls: list[tuple[float, int, _Call]] = []
        self._order = itertools.count()
        self.sleeping = 0
        """Coroutines in ``sleep_until`` now (a run's short backoff): they wait on time."""

    def now(self) -> float:
        return time.time() + self._offset

    @property
    def skipped(self) -> float:
        """Seconds this clock has been moved ahead of the real one in all."""
        return self._offset

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> _Call:
        call = _Call(self, when, callback, args)
        heapq.heappush(self._calls, (when, next(self._order), call))
        loop = asyncio.get_running_loop()
        call.real = loop.call_later(max(when - self.now(), 0.0), self._run_due)
        return call

    async def sleep_until(self, when: float) -> None:
        if when <= self.now():
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not done.done():
                done.set_result(None)

        call = self.call_at(when, wake)
        self.sleeping += 1
        try:
            await done
        finally:
            self.sleeping -= 1
            call.cancel()

    def next_deadline(self) -> float | None:
        """The time of the earliest callback still set, if any."""
        while self._calls and self._calls[0][2].cancelled:
            heapq.heappop(self._calls)
        return self._calls[0][0] if self._calls else None

    def jump_to(self, when: float) -> None:
        """Move the clock ahead to ``when`` (nothing if it is there already) and run the
        callbacks due by then, earliest first."""
        ahead = when - self.now()
        if ahead > 0:
            self._offset += ahead
        self._run_due()

    def _run_due(self) -> None:
        now = self.now()
        while self._calls and self._calls[0][0] <= now:
            _, _, call = heapq.heappop(self._calls)
            if call.cancelled:
                continue
            call.cancel()  # its real-time handle is not needed any more
            call.callback(*call.args)
