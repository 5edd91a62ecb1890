"""One activation's hold on a run: the run's lease, the keepalive that renews it, what the
activation reports with each heartbeat, and the message that asked for the run.

A ``Tenancy`` is made for one activation and closed exactly once, by ``async with``: closing
stops the keepalive for good and releases the lease, whatever happened in between. The lease is
taken before the activation runs (a wake: ``acquire``) or, for a run the intake has just
created, in parallel with its first steps (``acquire_late``): nobody else can be running a run
that did not exist a moment ago, and should its lease be held after all, the activation is
fenced at its next append (docs/architecture.md, "The life of a run").

While the tenancy holds the lease, its keepalive restarts the delivery's ack deadline every
``period`` seconds. The lease itself is held by the worker's heartbeats; it is written again
only when a step reports progress (``ctx.heartbeat``), at most once a second, to carry it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from sojourn.broker.delivery import Delivery, NotADelivery
from sojourn.broker.leases import Lease, LeaseStore, Progress

from ._intake import HANDBACK_MAX_DELAY

__all__ = ["Tenancy", "times_delivered"]

log = logging.getLogger("sojourn.worker")


def times_delivered(delivery: Delivery) -> int:
    """How many times ``delivery`` has been delivered (1 the first time, and for a message
    that is not a consumer's)."""
    try:
        return delivery.num_delivered
    except NotADelivery:
        return 1


class Tenancy:
    """The lease of ``run_id`` held by the activation ``owner``, and ``delivery``, the wake or
    trigger that asked for the run (settled by the activation, kept alive here).

    Attributes:
        progress: what the activation reports with each heartbeat (its current step).
    """

    def __init__(
        self,
        leases: LeaseStore,
        run_id: str,
        owner: str,
        delivery: Delivery,
        *,
        ttl: float,
        period: float,
    ) -> None:
        self.leases = leases
        self.run_id = run_id
        self.owner = owner
        self.delivery = delivery
        self.ttl = ttl
        self.period = period
        self.progress = Progress()
        self._poke = asyncio.Event()
        self._held: list[Lease] = []
        self._keepalive: list[asyncio.Task[None]] = []
        self._late: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Tenancy:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def held(self) -> bool:
        """Whether the lease was taken (by ``acquire``, or by now by ``acquire_late``)."""
        return bool(self._held)

    def heartbeat(self) -> None:
        """A step reported progress: renew soon, with it."""
        self._poke.set()

    async def acquire(self) -> bool:
        """Take the lease now. ``False``: another activation holds it, and the delivery was
        handed back, to be looked at again about when that lease may have ended.

        The holder may be about to rest without seeing what this delivery is about (a signal
        that arrived as it parked), so the pause is short; it grows with the deliveries, so a
        long activation elsewhere costs little.
        """
        got = await self.leases.acquire(self.run_id, self.owner, self.ttl)
        if isinstance(got, Lease):
            self._hold(got)
            return True
        cap = min(HANDBACK_MAX_DELAY, 0.25 * times_delivered(self.delivery))
        delay = min(max(got.expires_at - time.time(), 0.05), max(1.0, cap))
        await self.delivery.nak(delay=delay)
        return False

    def acquire_late(self, on_refused: Callable[[], None]) -> None:
        """Take the lease in the background (a run just created); ``on_refused`` is called if
        another activation holds it. ``wait_late`` waits for the outcome."""
        self._late = asyncio.create_task(self._acquire_late(on_refused))

    async def wait_late(self) -> None:
        """Wait for ``acquire_late`` to finish (raising what it raised), if it was started."""
        if self._late is not None:
            await self._late

    async def _acquire_late(self, on_refused: Callable[[], None]) -> None:
        got = await self.leases.acquire(self.run_id, self.owner, self.ttl, fresh=True)
        if isinstance(got, Lease):
            self._hold(got)
        else:
            on_refused()

    def _hold(self, lease: Lease) -> None:
        self._held.append(lease)
        self._keepalive.append(asyncio.create_task(self._keep(lease)))

    async def close(self) -> None:
        """Stop renewing and release the lease (best effort: a lease left behind expires)."""
        if self._late is not None and not self._late.done():
            self._late.cancel()
        # Stop renewing for good before releasing. A cancel alone is not enough: on Python
        # 3.11 a cancel that lands as a renewal request completes can be swallowed
        # (asyncio.wait_for inside nats-py), and a renewal racing the release would then keep
        # the run leased forever with nobody working on it.
        for lease in self._held:
            lease.held = False
        self._poke.set()
        for t in self._keepalive:
            t.cancel()
        for t in self._keepalive:
            with contextlib.suppress(BaseException):
                await t
        for lease in self._held:
            with contextlib.suppress(Exception):
                await self.leases.release(lease)

    async def _keep(self, lease: Lease) -> None:
        """Heartbeat while the activation runs: renew the lease (with what the run is doing)
        and the delivery's ack deadline every ``period``, sooner when a step reports progress
        (at most once a second)."""
        soonest = min(1.0, self.period)
        last = time.monotonic()
        while lease.held:
            self._poke.clear()
            since = time.monotonic() - last
            due = soonest if self.progress.changed else self.period
            if since < due:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(due - since):
                        await self._poke.wait()
                continue  # look again: progress, the end of the activation, or time is up
            last = time.monotonic()
            try:
                # A lease that names its worker is held by the worker's heartbeats: it is
                # written again only to carry a step's reported progress.
                if (self.progress.changed or not lease.worker) and not await self.leases.renew(
                    lease, self.ttl, self.progress
                ):
                    log.warning("run %s: lease lost", lease.run_id)
                    return
                await self.delivery.in_progress()
            except Exception as e:
                log.debug("run %s: keepalive failed: %s", lease.run_id, e)
