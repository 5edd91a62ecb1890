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
import time

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
        self._poke = asyncio.Event()
        self._open = True
        self._keepalive = asyncio.create_task(self._keep(), name=f"keepalive {run_id}")

    async def __aenter__(self) -> Tenancy:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def heartbeat(self) -> None:
        """A step reported progress: record it soon."""
        self._poke.set()

    async def close(self) -> None:
        """Stop the keepalive for good."""
        self._open = False
        self._poke.set()
        await cancel_and_wait(self._keepalive)

    async def _keep(self) -> None:
        """While the activation runs: restart the delivery's ack deadline every ``period``,
        and record a step's reported progress (at most every ``PROGRESS_EVERY``)."""
        last_kept = time.monotonic()
        last_report = last_kept - PROGRESS_EVERY
        while self._open:
            self._poke.clear()
            now = time.monotonic()
            due = last_kept + self.period
            if self.progress.changed:
                due = min(due, last_report + PROGRESS_EVERY)
            if now < due:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(due - now):
                        await self._poke.wait()
                continue  # look again: progress, the end of the activation, or time is up
            try:
                if self.progress.changed and now >= last_report + PROGRESS_EVERY:
                    last_report = now
                    await self.reports.report(self.run_id, self.owner, self.since, self.progress)
                if now >= last_kept + self.period:
                    last_kept = now
                    await self.delivery.in_progress()
            except Exception as e:
                log.debug("run %s: keepalive failed: %s", self.run_id, e)
