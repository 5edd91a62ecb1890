"""The runs' clock: the wall time a worker stamps on what its runs record and waits against.

Every instant a run records or compares (an event's ``at``, a wait's deadline, a retry's
``retry_at``, ``ctx.now()``, a signal's arrival, a schedule's fire) is read from the worker's
``Clock``, and every timer the worker keeps in its process (in-process wait timers, a short
retry's backoff, a run's lifetime) is set on it. ``Clock`` is the real wall clock. A test
environment gives the worker a clock of its own (``sojourn.actors.testing.VirtualClock``) that
can jump ahead, so a run that sleeps for three days is tested in a moment
(docs/decisions/0035-virtual-time-in-tests.md).

What is not a run's time stays on the real clocks: heartbeats, leases, ack deadlines,
liveness, dead-letter records, retries of broker requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Clock", "Timer"]


class Timer(Protocol):
    """A callback set on a clock; ``cancel()`` unsets it (``asyncio.TimerHandle`` is one)."""

    def cancel(self) -> None: ...


class Clock:
    """The real wall clock (``time.time``), with timers on the event loop's."""

    virtual = False
    """Whether the clock can jump ahead of the real one (a test environment's)."""

    def now(self) -> float:
        """Wall seconds since the epoch."""
        return time.time()

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> Timer:
        """Call ``callback(*args)`` on the running loop once ``now()`` reaches ``when``
        (wall seconds). The loop's clock is monotonic and may run a little ahead of the wall
        clock: a callback that cares compares ``now()`` with ``when`` again."""
        loop = asyncio.get_running_loop()
        return loop.call_later(max(when - self.now(), 0.0), callback, *args)

    async def sleep_until(self, when: float) -> None:
        """Return once ``now()`` has reached ``when``."""
        left = when - self.now()
        if left > 0:
            await asyncio.sleep(left)
