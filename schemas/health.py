"""Health records: worker heartbeats, the liveness of a run, the watchdog's action claims.

These are not run events (they never enter a run's history): they describe the processes
around the runs, and they are read by the watchdog, ``sojourn status`` and dashboards. Like the
events they are closed, versioned by field defaults, and JSON on the wire (docs/wire.md).
"""

from __future__ import annotations

from typing import Literal, get_args

import msgspec

from .priority import PRIORITY_DEFAULT, Priority
from .wire import LeaseHolder

__all__ = [
    "BEAT_RUNS_MAX",
    "LIVENESS_STATES",
    "ActiveRun",
    "LeaderRecord",
    "Liveness",
    "LivenessState",
    "WatchClaim",
    "WedgeRecord",
    "WorkerBeat",
    "lease_covered",
    "vouches",
]

LivenessState = Literal[
    "pending",
    "running",
    "waiting",
    "suspended",
    "stalled",
    "orphaned",
    "overdue",
    "wedged",
    "ended",
]
LIVENESS_STATES: tuple[LivenessState, ...] = get_args(LivenessState)
"""Every liveness state, in the order dashboards list them.

- ``pending``: has work to do and no owner yet, for less than the stall threshold.
- ``running``: an owner holds the run and heartbeats.
- ``waiting``: parked on signals, a timer, a child or a retry; nothing is late.
- ``suspended``: parked for a human (a cap, a budget, an in-doubt step, a manual suspend).
- ``stalled``: an owner holds the run but has been silent past the stall threshold.
- ``orphaned``: has work to do and no owner has held it for the stall threshold.
- ``overdue``: a wake that should have happened has not (a timer due, a signal arrived).
- ``wedged``: cannot make progress without a human: non-determinism, an undecodable event,
  or too many failed activations.
- ``ended``: completed, failed or cancelled.
"""


class ActiveRun(msgspec.Struct, frozen=True, array_like=True):
    """A run a worker is executing, as its heartbeat lists it: ``[run_id, agent, since,
    priority]`` (``since``: when the activation began, by the worker's clock; 0 from older
    workers; ``priority``: the run's, whose lane a takeover wakes it on, once known; the default
    from older workers)."""

    run_id: str
    agent: str
    since: float = 0.0
    priority: Priority = PRIORITY_DEFAULT


BEAT_RUNS_MAX = 4096
"""Runs one heartbeat lists at most (about 300 KiB), and so the most runs a worker executes at
once (its ``concurrency``): a beat lists every run its worker holds, so a run it does not list
is a run it does not hold."""


class WorkerBeat(msgspec.Struct, frozen=True, kw_only=True):
    """A worker's heartbeat: the one message on ``<prefix>.worker.<token>``. Its ``runs`` are
    the runs the worker holds: while its beats go on, no other worker executes them; when they
    stop, other workers take them over (docs/decisions/0018-claims-without-lease-writes.md)."""

    worker_id: str
    host: str = ""
    pid: int = 0
    agents: tuple[str, ...] = ()
    active: int = 0
    capacity: int = 0
    started_at: float = 0.0
    at: float = 0.0
    interval: float = 0.0
    stopped: bool = False
    """Set by the last beat of a worker that stopped gracefully (it is not "down")."""
    runs: tuple[ActiveRun, ...] = ()
    """The runs it executes (at most ``BEAT_RUNS_MAX``), each with its agent."""
    events_seq: int = -1
    """An events-stream sequence every decision this worker writes after this beat lands
    above: a run it claims after the beat, which the beat cannot list, is found from there
    should the worker die (-1 from older workers: not looked for)."""
    answers: bool = False
    """Whether it answers on its presence subject (``Names.presence``) while connected, so
    that others may ask the server whether its connection is gone. ``False`` from a worker of
    an older version: only its heartbeats tell."""


class Liveness(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a run is doing now, from its history plus its owner's heartbeats."""

    run_id: str
    state: LivenessState
    agent: str = ""
    status: str = ""
    """The run's status from its history (``running``, ``waiting``, ...)."""
    reason: str | None = None
    """Why a run is suspended, stalled, orphaned, overdue or wedged, in words."""
    owner: str | None = None
    last_heartbeat: float | None = None
    step: str | None = None
    """The step the owner reported running at its last heartbeat."""
    details: msgspec.Raw | None = None
    """What the step last reported with ``ctx.heartbeat(details)``."""
    on: tuple[str, ...] = ()
    since: float | None = None
    deadline: float | None = None
    checked_at: float = 0.0

    @property
    def flagged(self) -> bool:
        """Whether this state needs attention (an alert, a re-wake or a human)."""
        return self.state in ("stalled", "orphaned", "overdue", "wedged")


class WatchClaim(msgspec.Struct, frozen=True, kw_only=True):
    """The last action a watchdog took on a run (``<prefix>.watch.<run_id>``).

    Written with a compare-and-set on the subject, so of several watchdogs that see the same
    problem exactly one acts on it.
    """

    run_id: str
    state: LivenessState
    event_seq: int
    by: str
    at: float


class WedgeRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A worker gave up on a run (``<prefix>.wedge.<run_id>``): the run is wedged until its
    history moves past ``seq`` (or for good, when ``permanent``)."""

    run_id: str
    code: str
    """``poison`` (an event that cannot be decoded) or ``max_deliveries`` (activations kept
    failing outside the agent's code)."""
    reason: str
    seq: int
    permanent: bool = False
    at: float = 0.0


class LeaderRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Who leads the processes of a role (``<prefix>.leader.<role>``), until when, and how far
    it got. Taken and renewed by compare-and-set on the subject; written without a TTL, so a
    projector that comes back after any outage knows where the last leader stopped.

    For the projector: every view of a decision up to events-stream sequence ``position`` is
    written (its change message and its KV entry); writes of decisions after ``horizon`` have
    not begun. Between the two a new leader checks the KV entry and the last change message of
    each run before writing, so nothing is written twice or left out.
    """

    owner: str
    expires_at: float
    position: int = 0
    horizon: int = 0
    at: float = 0.0


def vouches(beat: WorkerBeat | None, run_id: str, since: float) -> bool:
    """Whether ``beat``, a worker's last heartbeat, says the worker may still hold ``run_id``,
    which it began working on at ``since`` (its own clock, so no clocks of different hosts are
    compared): the beat lists the run, or it was written before then (the next one will say).
    A graceful stop vouches for nothing: a stopping worker lets go of every run."""
    if beat is None or beat.stopped:
        return False
    return since >= beat.at or any(r.run_id == run_id for r in beat.runs)


def lease_covered(holder: LeaseHolder, beat: WorkerBeat | None, run_id: str) -> bool:
    """Whether ``beat``, the last heartbeat of the lease's worker, vouches for the lease: it
    lists the run, or it was written before the lease was taken (both times are the same
    worker's clock, so no clocks of different hosts are compared). A graceful stop vouches for
    nothing: a stopping worker releases its leases, and one it failed to release is free."""
    if beat is None or holder.owner is None or beat.worker_id != holder.worker:
        return False
    return vouches(beat, run_id, holder.acquired_at)
