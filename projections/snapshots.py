"""When the leading projector stores a snapshot of its run model, and storing it.

The leader stores its run model (``RunModel.snapshot``) in the object store
``<PREFIX>_SNAPSHOTS`` every ``every`` seconds or ``decisions`` decisions, whichever comes
first, and at a graceful stop, and only at a point where every view of a decision up to the
snapshot's position is written: so a snapshot at position P means that the views up to P are
all written. The projector decides where that point is; this module keeps the schedule and
stores one snapshot at a time, in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import msgspec

from sojourn.broker.connection import Broker
from sojourn.broker.names import Names
from sojourn.schemas.errors import SojournError
from sojourn.schemas.snapshot import ModelSnapshot

from .model import write_snapshot
from .summary import RunSummary

__all__ = ["Snapshots"]

log = logging.getLogger("sojourn.projector")


class Snapshots:
    """The run model's snapshots as one projector stores them.

    Args:
        broker: the projector's connection (asked for at each store: it is made at start).
        names: the deployment's names.
        replicas: the snapshot store's replica count (``Settings.replicas``).
        stream_created: the events stream's creation time as last read (a snapshot names
            the stream it was taken from).
        every / decisions: store one after this many seconds or this many decisions since
            the last one, whichever comes first; ``every=0`` stores none.

    Attributes:
        written: snapshots stored by this projector.
        position: the position of the last snapshot this projector stored or started from.
    """

    def __init__(
        self,
        broker: Callable[[], Broker],
        names: Names,
        *,
        replicas: int,
        stream_created: Callable[[], str],
        every: float,
        decisions: int,
    ) -> None:
        self._broker = broker
        self._names = names
        self._replicas = replicas
        self._stream_created = stream_created
        self.every = every
        self.decisions = max(1, decisions)
        self.written = 0
        self.position = 0
        self._next = 0.0
        self._task: asyncio.Task[None] | None = None

    def start_clock(self) -> None:
        """The next one is due ``every`` seconds from now."""
        self._next = time.monotonic() + self.every

    def due(self, end: int, position: int) -> bool:
        """Whether to take a snapshot of the model at ``position`` now, the views being
        written up to ``end`` once the batch in hand is."""
        if not self.every or end < position:
            return False
        if self._task is not None and not self._task.done():
            return False  # one at a time
        if position <= self.position:
            return False
        return time.monotonic() >= self._next or position - self.position >= self.decisions

    def store(self, snap: ModelSnapshot[RunSummary]) -> None:
        """Store ``snap`` in the background (the views go on being written meanwhile)."""
        self._next = time.monotonic() + self.every
        self.position = snap.position
        self._task = asyncio.create_task(self.put(snap), name="sojourn-projector-snapshot")

    async def settle(self) -> None:
        """Wait for the snapshot being stored, if any (its failure is logged, not raised)."""
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await self._task

    async def put(self, snap: ModelSnapshot[RunSummary]) -> None:
        """Store ``snap`` now; a failure is logged (the next start only reads more)."""
        snap = msgspec.structs.replace(snap, stream_created=self._stream_created())
        try:
            size = await write_snapshot(self._broker(), self._names, snap, replicas=self._replicas)
        except (SojournError, TimeoutError) as e:
            log.warning("projector: the snapshot at %d was not stored: %s", snap.position, e)
            return
        self.written += 1
        log.info(
            "projector: snapshot at sequence %d stored (%d live runs, %d bytes)",
            snap.position,
            len(snap.runs),
            size,
        )
