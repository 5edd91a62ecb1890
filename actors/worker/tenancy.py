"""One activation's hold on a run: the keepalive of the message that asked for the run, and
what the activation reports about its current step.

A worker holds a run by executing it: its heartbeat lists the runs it executes, and no other
worker starts an activation of a run a live worker's beat lists, nor settles an open step such
a worker may still be running (docs/decisions/0018-claims-without-lease-writes.md). So an
activation writes nothing to hold its run. What a ``Tenancy`` does is keep the wake or trigger
being worked on alive (``in_progress()`` every ``period``, so its consumer does not redeliver
it while the run executes) and write a step's reported progress (``ctx.heartbeat``), at most
once a second, for operators. It is made for one activation and closed exactly once, by
``async with``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from sojourn.broker.delivery import Delivery, NotADelivery
from sojourn.broker.eventstore import Decision
from sojourn.broker.progress import Progress, ProgressStore
from sojourn.broker.tasks import cancel_and_wait
from sojourn.schemas.events import StepStarted

from ..ops import metrics
from .appends import EXTERNAL_EVENTS

__all__ = ["Tenancy", "count_redelivery", "held_step", "times_delivered"]

log = logging.getLogger("sojourn.worker")

PROGRESS_EVERY = 1.0
"""Seconds between two progress records of one activation, at least."""


def held_step(history: list[Decision]) -> tuple[str, float] | None:
    """The worker whose activation wrote the run's last own decision, and when, if that
    decision ends by starting a step: that worker may be running the step right now.

    Decisions of external events (a signal, a cancel request: written by the intake) are
    skipped; any other later decision means the step's activation was over. An activation's
    writer is ``<worker_id>.<n>``.
    """
    for d in reversed(history):
        own = [e for e in d.events if not isinstance(e, EXTERNAL_EVENTS)]
        if not own:
            continue
        last = own[-1]
        if not isinstance(last, StepStarted):
            return None
        worker, dot, _n = d.writer.rpartition(".")
        return (worker, last.at) if dot else None
    return None


def times_delivered(delivery: Delivery) -> int:
    """How many times ``delivery`` has been delivered (1 the first time, and for a message
    that is not a consumer's)."""
    try:
        return delivery.num_delivered
    except NotADelivery:
        return 1


def count_redelivery(msg: Delivery, consumer: str) -> None:
    """Count ``msg`` in ``sojourn_redeliveries_total{consumer}`` if it was delivered before."""
    with contextlib.suppress(NotADelivery):
        if msg.num_delivered > 1:
            metrics.REDELIVERIES.labels(consumer).inc()


class Tenancy:
    """The activation ``owner`` of ``run_id`` and ``delivery``, the wake or trigger that asked
    for the run (settled by the activation, kept alive here).

    Attributes:
        progress: what the activation reports with each heartbeat (its current step).
        since: when the activation began (wall clock), as its worker's beats list it: a
            progress record counts while a beat lists the run with that same ``since``.
    """

    def __init__(
        self,
        reports: ProgressStore,
        run_id: str,
        owner: str,
        delivery: Delivery,
        *,
        period: float,
        since: float,
    ) -> None:
        self.reports = reports
        self.run_id = run_id
        self.owner = owner
        self.delivery = delivery
        self.period = period
        self.since = since
        self.progress = Progress()
        self._loop = asyncio.get_running_loop()
        now = self._loop.time()
        self._kept_at = now
        self._reported_at = now - PROGRESS_EVERY
        self._open = True
        # Nothing runs until something is due: most activations end before the first
        # keepalive, and a timer costs a fraction of a task that waits on an event.
        self._timer: asyncio.TimerHandle | None = self._loop.call_at(now + period, self._fire)
        self._work: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Tenancy:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def heartbeat(self) -> None:
        """A step reported progress: record it soon."""
        if self._open and self._work is None:
            self._arm()

    async def close(self) -> None:
        """Stop the keepalive for good."""
        self._open = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._work is not None:
            await cancel_and_wait(self._work)

    def _due(self) -> float:
        """When the next keepalive or progress record is due (loop time)."""
        due = self._kept_at + self.period
        if self.progress.changed:
            due = min(due, self._reported_at + PROGRESS_EVERY)
        return due

    def _arm(self) -> None:
        """Set the timer for what is due next, unless it is set for that or earlier."""
        due = self._due()
        if self._timer is not None:
            if self._timer.when() <= due:
                return
            self._timer.cancel()
        self._timer = self._loop.call_at(due, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if self._open and self._work is None:
            self._work = self._loop.create_task(self._keep(), name=f"keepalive {self.run_id}")

    async def _keep(self) -> None:
        """Restart the delivery's ack deadline if ``period`` has passed since the last time,
        and record a step's reported progress (at most every ``PROGRESS_EVERY``); then set
        the timer for the next."""
        try:
            now = self._loop.time()
            if self.progress.changed and now >= self._reported_at + PROGRESS_EVERY:
                self._reported_at = now
                await self.reports.report(self.run_id, self.owner, self.since, self.progress)
            if now >= self._kept_at + self.period:
                self._kept_at = now
                await self.delivery.in_progress()
        except Exception as e:
            log.debug("run %s: keepalive failed: %s", self.run_id, e)
        finally:
            self._work = None
        if self._open:
            self._arm()
