"""``TimeSkipper``: moves a test environment's ``VirtualClock`` and fires what comes due.

The worker keeps no wait timer in process under a virtual clock: every deadline of a run is a
broker timer (a message schedule stored at its virtual time), and so is every schedule's next
fire. The broker would fire them when its own, real clock reaches that time; the skipper fires
them when the virtual clock does (``broker.timers.fire_timer``: the same message to the same
target, then the schedule removed). What the worker keeps on the clock itself (a short retry's
backoff, a run's lifetime) comes due through the clock.

Time is skipped only when the deployment is quiet: no run executing (other than one sleeping
on the clock), nothing waiting in a consumer, nothing stored for a while. Then the clock jumps
to the earliest deadline, fires what is due, and waits for quiet again: so deadlines come due
one after the other, in their order, each seeing what the one before it did
(docs/decisions/0035-virtual-time-in-tests.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

from sojourn.broker import Broker
from sojourn.broker.connection import JetStreamError
from sojourn.broker.names import Names
from sojourn.broker.tasks import cancel_and_wait
from sojourn.broker.timers import fire_timer, stored_timers

from ..worker.worker import Worker
from .clock import VirtualClock

__all__ = ["QUIET_LOOKS", "QUIET_WITHIN", "TimeSkipper"]

T = TypeVar("T")

CANCEL_GRACE: Final = 5.0
"""Seconds ``until`` gives the work it cancels to end (on an error or its own cancel)."""

QUIET_LOOKS: Final = 3
"""Looks in a row, ``LOOK_EVERY`` apart, that must find the deployment quiet and unchanged."""

QUIET_WITHIN: Final = 60.0
"""Real seconds a wait for quiet (``settle``, ``advance``) lasts at most before it raises
``TimeoutError`` naming what is still busy: a deployment that never quiets (a run looping
without a wait, a message nothing consumes) fails the test rather than hanging it."""

LOOK_EVERY: Final = 0.01
"""Real seconds between two looks."""

TIMER_RESOLUTION: Final = 0.001
"""A broker timer's time is stored to the millisecond (``@at``), cut short."""

PUMP_EVERY: Final = 0.05
"""Real seconds between two looks for broker timers that came due on the virtual clock."""


class TimeSkipper:
    """Moves ``clock`` for a deployment (its broker and names) served by ``worker()``."""

    def __init__(
        self, clock: VirtualClock, broker: Broker, names: Names, worker: Callable[[], Worker]
    ) -> None:
        self.clock = clock
        self.broker = broker
        self.names = names
        self.worker = worker
        self.jumps = 0
        """Times the clock was moved ahead to a deadline."""
        self._lock = asyncio.Lock()

    async def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` ahead, a deadline at a time: each deadline on the way
        comes due (and what it starts runs until quiet) before the next one."""
        if seconds < 0:
            raise ValueError("time only moves ahead")
        target = self.clock.now() + seconds
        async with self._lock:
            while True:
                await self.quiet()
                nxt = await self._next_deadline()
                if nxt is None or nxt > target:
                    break
                await self._jump(nxt)
            await self._jump(target)
            await self.quiet()

    async def until(self, work: Awaitable[T]) -> T:
        """Await ``work``, skipping to the next deadline whenever the deployment is quiet
        meanwhile (a run waiting on time is not waited for in real time)."""
        task = asyncio.ensure_future(work)
        try:
            while not task.done():
                async with self._lock:
                    if await self.quiet(give_up=task, within=None) and not task.done():
                        nxt = await self._next_deadline()
                        if nxt is not None:
                            await self._jump(nxt)
                            continue
                await asyncio.wait({task}, timeout=PUMP_EVERY)
            return task.result()
        finally:
            await cancel_and_wait(task, CANCEL_GRACE)

    async def jump_next(self, hold: Callable[[], Awaitable[bool]] | None = None) -> bool:
        """Once the deployment is quiet, jump to the next deadline and fire what is due;
        ``False``: there is none. ``hold``: asked once all is quiet, before the jump; ``True``
        there is something to do at this time first (no jump; returns ``True``)."""
        async with self._lock:
            await self.quiet()
            if hold is not None and await hold():
                return True
            nxt = await self._next_deadline()
            if nxt is None:
                return False
            await self._jump(nxt)
            return True

    async def pump(self) -> None:
        """Fire the broker timers that came due on the clock as real time passed (the
        broker's own clock is behind by what was skipped), for as long as it runs."""
        while True:
            await asyncio.sleep(PUMP_EVERY)
            if self._lock.locked():
                continue
            with contextlib.suppress(JetStreamError, TimeoutError, ConnectionError):
                await self._fire_due()

    async def quiet(
        self, give_up: asyncio.Future[Any] | None = None, within: float | None = QUIET_WITHIN
    ) -> bool:
        """Wait until the deployment is quiet (``QUIET_LOOKS`` looks in a row find nothing
        executing, nothing pending and nothing new stored). ``give_up``: stop waiting when it
        is done (returns ``False``). ``within``: real seconds before ``TimeoutError`` (``None``:
        no bound, for a wait ``give_up`` ends)."""
        last: tuple[int, ...] | None = None
        same = 0
        loop = asyncio.get_running_loop()
        deadline = None if within is None else loop.time() + within
        while same < QUIET_LOOKS:
            if give_up is not None and give_up.done():
                return False
            if deadline is not None and last is not None and loop.time() > deadline:
                executing, pending, firing = last[:3]
                raise TimeoutError(
                    f"the deployment did not quiet within {within:.0f} s: at the last look "
                    f"{executing} run(s) executing, {pending} message(s) pending in "
                    f"consumers, {firing} broker timer(s) due"
                    + (", and its streams still growing" if last[:3] == (0, 0, 0) else "")
                )
            look = await self._look()
            same = same + 1 if look == last and look[0] == look[1] == look[2] == 0 else 0
            last = look
            await asyncio.sleep(LOOK_EVERY)
        return True

    async def _look(self) -> tuple[int, ...]:
        """What changes while anything happens: runs executing (less those asleep on the
        clock), messages pending in consumers, timers the broker is firing (due on its own
        clock), the worker's counts of activations, the streams' last sequences."""
        w = self.worker()
        n = self.names
        pending = 0
        seqs: list[int] = []
        for stream in (n.inbox_stream, n.wake_stream, n.schedules_stream, n.events_stream):
            info = await self.broker.api(f"$JS.API.STREAM.INFO.{stream}")
            seqs.append(int(info.get("state", {}).get("last_seq", 0)))
            if stream == n.events_stream:
                continue
            listing = await self.broker.api(f"$JS.API.CONSUMER.LIST.{stream}")
            pending += sum(int(c.get("num_pending", 0)) for c in listing.get("consumers") or [])
        executing = max(0, w.executing - self.clock.sleeping)
        real = time.time()
        firing = sum(t.due <= real for t in await stored_timers(self.broker, self.names))
        return (executing, pending, firing, w.activations_completed, w.folds, *seqs)

    async def _next_deadline(self) -> float | None:
        # A stored time is to the millisecond, cut short: the deadline is within the next one.
        # One due on the real clock is being fired by the broker: no deadline to jump to.
        real = time.time()
        timers = await stored_timers(self.broker, self.names)
        dues = [t.due + TIMER_RESOLUTION for t in timers if t.due > real]
        kept = self.clock.next_deadline()
        if kept is not None:
            dues.append(kept)
        return min(dues, default=None)

    async def _jump(self, when: float) -> None:
        if when > self.clock.now():
            self.jumps += 1
        self.clock.jump_to(when)
        await self._fire_due()

    async def _fire_due(self) -> None:
        now, real = self.clock.now(), time.time()
        for t in await stored_timers(self.broker, self.names):
            if real < t.due <= now:  # one due on the real clock too is the broker's to fire
                await fire_timer(self.broker, self.names, t)
