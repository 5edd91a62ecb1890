"""Step progress: what a run's step reported with ``ctx.heartbeat``, for operators to see.

Who executes a run is not written per run: the executing worker's heartbeat lists it
(docs/decisions/0018-claims-without-lease-writes.md), and the event store's sequence fence keeps
one history whatever happens. What a step reports about itself (``ctx.heartbeat(details)``) is
written here, as the one message on ``<prefix>.lease.<run_id>`` (a stream that keeps one
message per subject), at most once a second per run and only when a step reports. A record
counts only while its worker's beats list the run; readers (the watchdog, ``sojourn status``)
judge that, so a record left behind by an ended activation needs no release.

The subject and stream keep the name ``lease`` they had when a run's owner was written there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import msgspec

from sojourn.schemas.codec import decode_lease_holder, encode
from sojourn.schemas.wire import NO_DETAILS, LeaseHolder

from .connection import Broker
from .names import Names

__all__ = ["NO_DETAILS", "LeaseHolder", "Progress", "ProgressStore", "decode_lease"]


@dataclass(slots=True)
class Progress:
    """What an activation reports with each heartbeat (shared with its keepalive)."""

    step: str | None = None
    step_started_at: float | None = None
    details: msgspec.Raw | None = None
    changed: bool = False


decode_lease = decode_lease_holder
"""A progress message body (for readers of the stream, such as the watchdog); the same as
``sojourn.schemas.codec.decode_lease_holder``."""


class ProgressStore:
    """Write and read the progress records of runs."""

    def __init__(self, broker: Broker, names: Names, *, worker: str = "") -> None:
        """``worker``: the id whose heartbeats list the runs reported on here."""
        self.broker = broker
        self.names = names
        self.worker = worker

    async def last(self, run_id: str) -> LeaseHolder | None:
        """The last progress record of ``run_id`` (``None``: nothing was reported, or what is
        there is not a record: anyone may publish on a deployment without authentication, and
        readers judge such a run as the watchdog does, without a report)."""
        m = await self.broker.direct_get_last(self.names.leases_stream, self.names.lease(run_id))
        if m is None:
            return None
        try:
            return decode_lease_holder(m.data)
        except msgspec.MsgspecError:
            return None

    async def report(self, run_id: str, owner: str, since: float, progress: Progress) -> None:
        """Record what the activation ``owner`` (begun at ``since``) is doing now."""
        now = time.time()
        holder = LeaseHolder(
            owner=owner,
            worker=self.worker,
            acquired_at=since,
            heartbeat_at=now,
            step=progress.step,
            step_started_at=progress.step_started_at,
            details=progress.details or NO_DETAILS,
        )
        progress.changed = False
        await self.broker.publish(self.names.lease(run_id), encode(holder))
