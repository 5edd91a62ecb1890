"""Liveness: is a run doing what it should, from its history plus its owner's heartbeats?

From the outside, a run that is merely not running looks exactly like one whose process died.
The difference is in what history says the run is doing: a run parked on a signal, a timer, a
child or a retry is *waiting*, and needs no process at all; only a run with work to do needs an
owner, and only an owner that holds a run has to heartbeat. So a legitimately waiting run is
never flagged, however long it waits, and a run with work is flagged as soon as its owner goes
silent and nobody took over (``stalled``), or nobody holds it at all (``orphaned``). A wait
whose wake is due and did not happen is ``overdue``; a run that cannot move without a human
is ``wedged``.

``classify`` is pure: the same inputs give the same answer, so it is tested exhaustively.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from sojourn.schemas.concurrency import queued_detail
from sojourn.schemas.health import Liveness, LivenessState, WedgeRecord, WorkerBeat, lease_covered
from sojourn.schemas.lifecycle import queued_on
from sojourn.schemas.vocabulary import SuspendReason
from sojourn.schemas.wire import LeaseHolder

from .summary import RunSummary

__all__ = ["WEDGING_SUSPENSIONS", "Listed", "Thresholds", "claim", "classify", "holders"]

WEDGING_SUSPENSIONS: frozenset[SuspendReason] = frozenset(
    {"nondeterminism", "poison", "crash_loop"}
)
"""Suspension reasons no resume can fix without a code change: reported as ``wedged``."""


@dataclass(frozen=True, slots=True)
class Thresholds:
    stall_after: float
    overdue_after: float


Listed = tuple[WorkerBeat, float]
"""A worker's last beat that lists a run, and when that worker began the run (its clock)."""


def holders(beats: Iterable[WorkerBeat]) -> dict[str, Listed]:
    """Which worker holds each run, by the beats: the one whose beat lists it and that began
    it last (a beat listing a run another worker took over since is older than the take)."""
    out: dict[str, Listed] = {}
    for beat in beats:
        if beat.stopped:
            continue
        for r in beat.runs:
            since = r.since or beat.started_at
            if r.run_id not in out or since >= out[r.run_id][1]:
                out[r.run_id] = (beat, since)
    return out


def claim(listed: Listed | None, progress: LeaseHolder | None) -> LeaseHolder | None:
    """A run's owner, in the shape ``classify`` judges: the worker whose beat lists it (and
    what that activation reported of its step, if the progress record is that activation's);
    without one, only a lease an older version wrote (naming no worker) still counts."""
    if listed is None:
        if progress is not None and progress.owner is not None and not progress.worker:
            return progress
        return None
    beat, since = listed
    if progress is not None and progress.worker == beat.worker_id and progress.acquired_at == since:
        return progress
    return LeaseHolder(owner=beat.worker_id, worker=beat.worker_id, acquired_at=since)


def classify(
    s: RunSummary,
    lease: LeaseHolder | None,
    now: float,
    limits: Thresholds,
    wedge: WedgeRecord | None = None,
    worker: WorkerBeat | None = None,
) -> Liveness:
    """The liveness of one run at ``now``. ``worker`` is the last heartbeat of the lease's
    worker: while it vouches for the lease (``lease_covered``), each beat is the run's."""

    def make(state: LivenessState, **fields: Any) -> Liveness:
        return Liveness(
            run_id=s.run_id,
            agent=s.agent,
            status=s.status,
            state=state,
            checked_at=now,
            on=s.waiting_on,
            deadline=s.deadline,
            **fields,
        )

    if s.terminal:
        return make("ended", since=s.ended_at)
    if wedge is not None and (wedge.permanent or s.last_seq <= wedge.seq):
        return make("wedged", reason=f"{wedge.code}: {wedge.reason}", since=wedge.at)
    if s.status == "suspended":
        reason = s.suspended_reason or "suspended"
        text = f"{reason}: {s.suspended_detail}" if s.suspended_detail else reason
        state: LivenessState = "wedged" if reason in WEDGING_SUSPENSIONS else "suspended"
        return make(state, reason=text, since=s.last_event_at)

    owner = lease.owner if lease is not None else None
    beat = (lease.heartbeat_at or lease.acquired_at) if lease is not None else 0.0
    if lease is not None and lease_covered(lease, worker, s.run_id):
        assert worker is not None
        beat = max(beat, worker.at)
    fresh = owner is not None and now - beat <= limits.stall_after
    held = owner is not None and lease is not None and lease.expires_at > now
    if lease is not None and owner is not None and fresh:
        running = make(
            "running",
            owner=owner,
            last_heartbeat=beat,
            step=lease.step or s.step,
            details=_details(lease),
            since=lease.acquired_at or beat,
        )
    else:
        running = None

    if s.status == "waiting":
        # A worker is on it right now (resuming it): its beat lists the run and was written
        # after the run parked (a beat from before is the activation that parked it, which
        # the next beat no longer lists).
        if running is not None and (worker is None or worker.at > s.last_event_at):
            return running
        late = _late_wake(s, now, limits.overdue_after)
        if late is not None:
            return make("overdue", reason=late[1], since=late[0])
        return make("waiting", since=s.waiting_since)

    # pending or running: the run has work to do, so someone must hold it and heartbeat.
    if running is not None:
        return running
    queued = queued_on(s.waiting_on) if s.status == "pending" else None
    if queued is not None:  # waits in its concurrency key's queue: nobody holds it (0048)
        return make("pending", reason=queued_detail(queued, None), since=s.waiting_since)
    if lease is not None and owner is not None:
        # Its owner went silent and nobody took over (yet): a paused or dead worker.
        if lease.worker:
            expiry = f"its worker {lease.worker} has not heartbeat since"
        elif held:
            expiry = f"its lease runs out in {lease.expires_at - now:.1f}s"
        else:
            expiry = f"its lease ran out {now - lease.expires_at:.1f}s ago"
        return make(
            "stalled",
            reason=f"owner {owner} silent for {now - beat:.1f}s; {expiry}",
            owner=owner,
            last_heartbeat=beat,
            step=lease.step or s.step,
            details=_details(lease),
            since=beat,
        )
    idle_since = max(s.last_event_at, beat)
    if now - idle_since <= limits.stall_after:
        return make("pending", since=idle_since)
    return make(
        "orphaned",
        reason=f"work pending for {now - idle_since:.1f}s and no worker holds it",
        since=idle_since,
    )


def _details(lease: LeaseHolder) -> msgspec.Raw | None:
    return None if bytes(lease.details) == b"null" else lease.details


def _late_wake(s: RunSummary, now: float, grace: float) -> tuple[float, str] | None:
    """When (and why) a waiting run should have been woken more than ``grace`` ago."""
    if s.deadline is not None and now - s.deadline > grace:
        return s.deadline, f"wake due {now - s.deadline:.1f}s ago has not happened"
    sig = s.due_signal()
    if sig is not None and now - sig.at > grace:
        return sig.at, f"signal '{sig.name}' arrived {now - sig.at:.1f}s ago and has not woken it"
    return None
