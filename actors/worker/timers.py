"""Timers kept in the worker's process, with the broker's copy as the backstop.

A run that parks with a deadline has its timer written to the broker (a message schedule that
wakes it, whatever happens to this process). The broker fires the schedules of one stream one
at a time, on a 250 ms tick, each stored with an fsync, and each fired wake is one more
delivery to fetch and ack: under load that is seconds of lateness
(docs/decisions/0019-timers-in-process.md). So the worker that parks a run with a deadline
less than ``IN_PROCESS_HORIZON`` ahead keeps the timer itself too, and the broker's copy is
written for ``Settings.timer_backstop`` seconds later: when the deadline comes, the worker
wakes the run in process (no fire, no wake message), and the activation removes the broker's
copy once the wait has ended. If the worker died, the broker's copy wakes the run, that much
late.

``InProcessTimers`` only keeps time: due timers come out of ``due()`` in deadline order, and
the worker decides what to do with them. It holds at most ``IN_PROCESS_MAX`` timers; beyond,
timers stay with the broker alone (at their deadline). With a timer it may keep the run's
history as its parking activation left it (short ones, ``KEPT_DECISIONS_MAX`` decisions in
all), so that the activation it starts reads only what came after.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from sojourn.broker.eventstore import Decision

from .clock import Clock, Timer

__all__ = ["IN_PROCESS_HORIZON", "IN_PROCESS_MAX", "DueTimer", "InProcessTimers"]

IN_PROCESS_HORIZON = 300.0
"""Seconds ahead within which a deadline is kept in process (a longer sleep has nothing to
gain from it: the broker's tick and queue are seconds at worst)."""

IN_PROCESS_MAX = 100_000
"""Timers one worker keeps in process at most (about 200 bytes each)."""

KEPT_DECISIONS_MAX = 50_000
"""Decisions of run histories kept with the timers, in all, at most (a few hundred bytes
each): beyond, a timer keeps no history and its activation reads the run's."""


@dataclass(frozen=True, slots=True)
class DueTimer:
    """A timer that came due: the run to wake, its agent, and the wait's position."""

    run_id: str
    agent: str
    position: int
    deadline: float
    history: list[Decision] | None = None
    """The run's history as the activation that parked it left it (short ones only): the
    activation this timer starts uses it as it is, and the events fence refuses its first
    append if anything was appended since (it then reads what)."""
    tries: int = 0
    """Times it was put back because another worker held the run."""


class InProcessTimers:
    """The timers this worker keeps, by run; due ones are queued for ``due()``."""

    def __init__(
        self, backstop: float, *, horizon: float = IN_PROCESS_HORIZON, clock: Clock | None = None
    ) -> None:
        self.backstop = backstop
        self.clock = clock or Clock()
        """The runs' clock, deadlines are on (``worker/clock.py``)."""
        self.horizon = horizon
        self._handles: dict[str, dict[int, Timer]] = {}
        self._counted: dict[Timer, int] = {}
        """The history decisions counted for each kept timer (its list may grow after)."""
        self._count = 0
        self._kept = 0
        """Decisions held by the kept histories (as counted when each timer was kept)."""
        self._due: deque[DueTimer] = deque()
        self._queued: dict[str, list[DueTimer]] = {}
        """Due timers queued per run: a run dropped meanwhile has its queued ones skipped."""
        self._ready = asyncio.Event()
        self._closed = False

    def __len__(self) -> int:
        return self._count

    def keep(
        self,
        run_id: str,
        agent: str,
        position: int,
        deadline: float,
        history: list[Decision] | None = None,
    ) -> bool:
        """Keep the timer of the wait at ``position`` (replacing one kept for it). ``False``:
        not kept (disabled, too far ahead, too many, closed); the broker's copy must then fire
        at the deadline itself."""
        left = deadline - self.clock.now()
        if self._closed or self.backstop <= 0 or left > self.horizon:
            return False
        timers = self._handles.setdefault(run_id, {})
        old = timers.pop(position, None)
        if old is not None:
            old.cancel()
            self._forget(old)
        elif self._count >= IN_PROCESS_MAX:
            if not timers:
                del self._handles[run_id]
            return False
        if history is not None and self._kept + len(history) > KEPT_DECISIONS_MAX:
            history = None
        due = DueTimer(run_id, agent, position, deadline, history)
        handle = self.clock.call_at(deadline, self._fire, due)
        timers[position] = handle
        self._counted[handle] = counted = len(history) if history else 0
        self._count += 1
        self._kept += counted
        return True

    def drop(self, run_id: str) -> None:
        """Forget the run's timers, kept or already due (an activation of it begins: it keeps
        what it still needs when it parks again)."""
        for handle in self._handles.pop(run_id, {}).values():
            handle.cancel()
            self._forget(handle)
        self._queued.pop(run_id, None)

    def put_back(self, timer: DueTimer, delay: float) -> None:
        """Look at a due timer again in ``delay`` seconds."""
        if not self._closed:
            again = DueTimer(
                timer.run_id, timer.agent, timer.position, timer.deadline, None, timer.tries + 1
            )
            asyncio.get_running_loop().call_later(delay, self._queue, again)

    async def due(self) -> DueTimer:
        """The next timer that came due (waits for one), skipping those of runs dropped
        since."""
        while True:
            while not self._due:
                self._ready.clear()
                await self._ready.wait()
            timer = self._due.popleft()
            queued = self._queued.get(timer.run_id, [])
            if not any(t is timer for t in queued):
                continue  # dropped: an activation of the run began meanwhile
            queued.remove(timer)
            if not queued:
                del self._queued[timer.run_id]
            return timer

    def close(self) -> None:
        """Forget every timer (the worker stops: the broker's copies fire instead)."""
        self._closed = True
        for run_id in list(self._handles):
            self.drop(run_id)
        self._due.clear()
        self._queued.clear()

    def _forget(self, handle: Timer) -> None:
        self._count -= 1
        self._kept -= self._counted.pop(handle, 0)

    def _fire(self, timer: DueTimer) -> None:
        timers = self._handles.get(timer.run_id)
        early = timer.deadline - self.clock.now()
        if early > 0 and timers is not None and timer.position in timers:
            # The loop's clock (monotonic, coarse) ran ahead of the wall clock the deadline
            # is in: a run woken now would only park again. Wait the rest.
            old = timers[timer.position]
            new = self.clock.call_at(timer.deadline, self._fire, timer)
            timers[timer.position] = new
            self._counted[new] = self._counted.pop(old, 0)
            return
        handle = timers.pop(timer.position, None) if timers is not None else None
        if handle is not None:
            self._forget(handle)
            if not timers:
                del self._handles[timer.run_id]
        self._queue(timer)

    def _queue(self, timer: DueTimer) -> None:
        if not self._closed:
            self._due.append(timer)
            self._queued.setdefault(timer.run_id, []).append(timer)
            self._ready.set()
