"""Run leases: which worker executes a run right now.

A lease is the single message on ``<prefix>.lease.<run_id>`` in a stream that keeps one message
per subject. Taking it is a compare-and-set on that subject's sequence, so two workers can
never both believe they won. Leases make conflicts rare and take-over fast; they are *not* what
correctness rests on: the event store's sequence fence is (docs/design.md). A worker that was
paused past its death (SIGSTOP, a long GC) is refused at its next append.

A lease names its worker and is not renewed: it is held while that worker's heartbeats go on
and list the run (``sojourn.schemas.health.lease_covered``), so its cost is two writes per
activation (take, release), not one per run per interval. Whether a worker is alive is the
acquirer's judgement (``holds``, from ``Membership``); a lease that names no worker (written
by an older version) is held until its ``expires_at``, a wall-clock time: keep clocks
NTP-synced; skew then only delays a take-over or causes a refused append, never two histories.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from sojourn.schemas.codec import decode_lease_holder, encode
from sojourn.schemas.wire import NO_DETAILS, LeaseHolder

from . import headers as h
from .connection import Broker, JetStreamError
from .names import Names

__all__ = [
    "NO_DETAILS",
    "HoldsLease",
    "Lease",
    "LeaseHolder",
    "LeaseStore",
    "Progress",
    "decode_lease",
]

HoldsLease = Callable[[LeaseHolder, str], bool | None]
"""Whether a lease (its holder, the run id) is held by a live worker; ``None``: cannot tell
(the lease names no worker), go by its ``expires_at``."""

_EXPECT = h.EXPECTED_LAST_SUBJECT_SEQUENCE


@dataclass(slots=True)
class Progress:
    """What an activation reports with each heartbeat (shared with its keepalive)."""

    step: str | None = None
    step_started_at: float | None = None
    details: msgspec.Raw | None = None
    changed: bool = False


@dataclass(slots=True)
class Lease:
    """A lease this process holds (mutable: ``seq`` moves on every renewal)."""

    run_id: str
    owner: str
    seq: int
    expires_at: float
    held: bool = True
    """Cleared when the holder is done: renewals stop even if a cancellation got lost."""
    acquired_at: float = 0.0
    worker: str = ""


decode_lease = decode_lease_holder
"""A lease message body (for readers of the leases stream, such as the watchdog); the same as
``sojourn.schemas.codec.decode_lease_holder``."""


class LeaseStore:
    """Acquire, renew and release run leases."""

    def __init__(
        self, broker: Broker, names: Names, *, worker: str = "", holds: HoldsLease | None = None
    ) -> None:
        """``worker``: the id whose heartbeats vouch for the leases taken here (none: the
        leases expire at ``expires_at`` and must be renewed). ``holds``: judges other
        workers' leases (none: by ``expires_at`` alone)."""
        self.broker = broker
        self.names = names
        self.worker = worker
        self.holds = holds
        # The sequence we last wrote for a run we released: lets the same worker take the run
        # again with one round trip (no read) in the common steady state.
        self._released: dict[str, int] = {}

    async def holder(self, run_id: str) -> tuple[int, LeaseHolder | None]:
        m = await self.broker.direct_get_last(self.names.leases_stream, self.names.lease(run_id))
        if m is None:
            return 0, None
        return m.seq, decode_lease_holder(m.data)

    async def acquire(
        self, run_id: str, owner: str, ttl: float, *, fresh: bool = False
    ) -> Lease | LeaseHolder:
        """Take the lease; return it, or the live holder that has it.

        ``fresh=True`` says the run was just created, so its lease subject is most likely
        empty: try a create-only write first and skip the read.
        """
        cached = 0 if fresh else self._released.pop(run_id, None)
        if cached is not None:
            lease = await self._write(run_id, owner, ttl, cached)
            if lease is not None:
                return lease
        seq, current = await self.holder(run_id)
        now = time.time()
        if (
            current is not None
            and current.owner not in (None, owner)
            and self._held(current, run_id, now)
        ):
            return current
        lease = await self._write(run_id, owner, ttl, seq)
        if lease is not None:
            return lease
        seq, current = await self.holder(run_id)
        return current or LeaseHolder(owner="?", expires_at=now + ttl)

    def _held(self, holder: LeaseHolder, run_id: str, now: float) -> bool:
        judged = self.holds(holder, run_id) if self.holds is not None else None
        return holder.expires_at > now if judged is None else judged

    async def renew(self, lease: Lease, ttl: float, progress: Progress | None = None) -> bool:
        """Extend a held lease (and heartbeat ``progress``); ``False`` means it was lost
        (someone else took it) or given up."""
        if not lease.held:
            return False
        renewed = await self._write(
            lease.run_id, lease.owner, ttl, lease.seq, progress, lease.acquired_at
        )
        if renewed is None:
            return False
        lease.seq, lease.expires_at = renewed.seq, renewed.expires_at
        return True

    async def release(self, lease: Lease) -> None:
        """Give the run up so any worker can take it at once (best effort)."""
        lease.held = False
        body = encode(LeaseHolder(owner=None, expires_at=0.0, heartbeat_at=time.time()))
        subject = self.names.lease(lease.run_id)
        ack = await self.broker.try_publish(subject, body, {_EXPECT: str(lease.seq)})
        if isinstance(ack, JetStreamError):
            # A renewal we gave up on may still have landed: if the lease is ours, release
            # that one, rather than leave the run blocked until the lease expires.
            seq, holder = await self.holder(lease.run_id)
            if holder is not None and holder.owner == lease.owner:
                ack = await self.broker.try_publish(subject, body, {_EXPECT: str(seq)})
        if not isinstance(ack, JetStreamError):
            self._released[lease.run_id] = ack.seq
            if len(self._released) > 1_000:
                self._released.pop(next(iter(self._released)))

    async def _write(
        self,
        run_id: str,
        owner: str,
        ttl: float,
        expected: int,
        progress: Progress | None = None,
        acquired_at: float = 0.0,
    ) -> Lease | None:
        now = time.time()
        acquired_at = acquired_at or now
        holder = LeaseHolder(
            owner=owner,
            worker=self.worker,
            expires_at=now + ttl,
            acquired_at=acquired_at,
            heartbeat_at=now,
            step=progress.step if progress else None,
            step_started_at=progress.step_started_at if progress else None,
            details=(progress.details if progress else None) or NO_DETAILS,
        )
        if progress is not None:
            progress.changed = False
        ack = await self.broker.try_publish(
            self.names.lease(run_id), encode(holder), {_EXPECT: str(expected)}
        )
        if isinstance(ack, JetStreamError):
            return None
        return Lease(
            run_id=run_id,
            owner=owner,
            seq=ack.seq,
            expires_at=now + ttl,
            acquired_at=acquired_at,
            worker=self.worker,
        )
