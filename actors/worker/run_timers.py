"""The broker timers of one activation's run: what wakes a parked run when no process is alive.

A wait with a deadline parks on a timer (a message schedule on the run's wake subject), written
before the wait is recorded, so a recorded wait never lacks its timer; a worker that keeps the
timer in process (``InProcessTimers``) writes the broker's copy ``timer_backstop`` later, as a
backstop. A retry's backoff parks the same way, and a run with a lifetime that parks past its
end gets a timer at that end. A wait that ended otherwise than by its timer has the timer
removed in the background, and a run that ends has all its timers removed when any may still
be stored.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from sojourn.broker.eventstore import Decision, EventStore
from sojourn.broker.timers import cancel_timers, schedule_timer
from sojourn.schemas.fairness import Fairness
from sojourn.schemas.priority import Priority

from ..core.state import OpRecord
from .appends import broker_io

__all__ = ["IN_PROCESS_BACKOFF", "LIFETIME_TIMER", "KeepTimer", "RunTimers"]

KeepTimer = Callable[[int, float, "list[Decision] | None"], bool]
"""Keep a wait's timer in process (its position, its deadline, the run's history if short:
the activation the timer starts need not read it); ``False``: not kept."""

LIFETIME_TIMER = "lifetime"
"""The timer id of the broker timer that wakes a parked run at the end of its lifetime."""

IN_PROCESS_BACKOFF = 5.0
"""Backoffs up to this many seconds also sleep in the worker (the timer is set regardless)."""


class RunTimers:
    """The timers one activation of ``run_id`` (of agent ``agent``) sets and removes.

    ``keep_timer``: the worker's in-process timers (``InProcessTimers.keep`` for this run),
    which take the timers of the waits this activation parks on. ``backstops``: waits whose
    broker timer is such a later copy (this activation was woken by the in-process one):
    removed once those waits have ended.
    """

    def __init__(
        self,
        *,
        store: EventStore,
        run_id: str,
        agent: str,
        keep_timer: KeepTimer | None,
        backstops: frozenset[int],
        priority: Callable[[], tuple[Priority, Fairness | None]],
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.agent = agent
        self.priority = priority
        """The run's priority and fairness key (read when a timer is set: the lane its wake
        fires on, and the key it carries)."""
        self.keep_timer = keep_timer
        self.backstops = backstops
        self.used = bool(backstops)
        """Whether this activation set a timer or was woken by one kept in process."""
        self._lifetime_set = False
        self._background: set[asyncio.Task[None]] = set()

    async def schedule(self, timer_id: str, at: float) -> None:
        """Set the broker timer ``timer_id`` of the run to wake it at ``at``.

        Raises:
            BrokerLost: the broker is away.
        """
        priority, fairness = self.priority()
        await broker_io(
            schedule_timer(
                self.store.broker,
                self.store.names,
                self.run_id,
                timer_id,
                at,
                agent=self.agent,
                priority=priority,
                fairness=fairness,
            )
        )
        self.used = True

    async def for_wait(
        self, position: int, deadline: float, decisions: list[Decision] | None
    ) -> None:
        """The timer of the wait at ``position``: kept in process if the worker takes it (with
        ``decisions``, the run's history if short), the broker's copy then a backstop."""
        fires_at = deadline
        keep = self.keep_timer
        if keep is not None and keep(position, deadline, decisions):
            fires_at += self.store.settings.timer_backstop  # woken in process, in time
        await self.schedule(str(position), fires_at)

    async def for_lifetime(self, ends: float | None, wakes_at: float | None) -> None:
        """Before the run parks (``wakes_at``: when its own timer wakes it, if it has one):
        a broker timer at the end of its lifetime (``ends``, if it has one), so that a run
        parked past it is woken, with no process alive, and ended. Not needed when the run
        wakes before that anyway."""
        if ends is None or self._lifetime_set or (wakes_at is not None and wakes_at < ends):
            return
        await self.schedule(LIFETIME_TIMER, ends)
        self._lifetime_set = True

    def cancel(self, position: int) -> None:
        """Drop a wait's timer in the background: a timer left behind only wakes the run for
        nothing (its wake finds the wait ended)."""
        self._later(self._purge(position))

    async def _purge(self, p: int) -> None:
        names = self.store.names
        with contextlib.suppress(Exception):
            await self.store.broker.api(
                f"$JS.API.STREAM.PURGE.{names.wake_stream}",
                {"filter": names.timer(self.run_id, str(p))},
            )

    def _later(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def drop_backstops(self, ops: tuple[OpRecord, ...]) -> None:
        """Remove the broker's copies of the in-process timers that woke this activation, of
        the waits that have ended since (and of steps that had waited for a slot of a shared
        limit and have started since)."""
        for p in self.backstops:
            op = ops[p] if p < len(ops) else None
            if op is None:
                continue
            if (op.kind == "wait" and op.status == "completed") or (
                op.kind == "step" and op.status != "throttled"
            ):
                self.cancel(p)

    def rebind(self, backstops: frozenset[int]) -> None:
        """A kept activation resumed for a new wake, woken by the in-process timers of
        ``backstops`` (if any)."""
        self.backstops = backstops
        self.used = self.used or bool(backstops)

    async def clear(self, ops: Iterable[OpRecord], *, lifetime: bool) -> None:
        """After the run's end: remove its timers, if any may still be stored (``lifetime``:
        the agent has a lifetime, so a lifetime timer may be)."""
        if self.used or lifetime or any(_may_be_stored(op) for op in ops):
            await cancel_timers(self.store.broker, self.store.names, self.run_id)


def _may_be_stored(op: OpRecord) -> bool:
    """Whether a timer of ``op`` may still be in the wake stream when its run ends: a wait with
    a deadline that ended otherwise than by it (cancelled, or by a signal whose own purge may
    have failed), or a step that was retried (a short backoff is waited out in the process,
    its timer left to fire). A wait that timed out was woken by its timer, which the broker
    removed when it fired; should it fire later after all, it wakes an ended run: nothing.
    (A run woken by its worker's in-process timer has ``backstops``: its activation removes
    the broker's later copy itself.)"""
    if op.kind == "wait":
        return op.deadline is not None and op.outcome != "timeout"
    return op.kind == "step" and op.attempts > 1
