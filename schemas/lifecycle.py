"""A run's lifecycle rules, pure and in one place: which event moves a run to which status, what
a run refuses (an anomaly), and what a parked run waits on.

Two folds apply them: the full run state (``sojourn.actors.core.state``, what replay reads) and the
compact run summary (``sojourn.projections.summary``, what the watchdog reads). Each keeps its
own fields, but neither decides a status or a wait by itself, so the two cannot drift apart.
No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from . import events as ev
from .vocabulary import TERMINAL, RunStatus, TerminalStatus, WaitingOn
from .wire import child_signal

__all__ = [
    "NOT_WAITING",
    "TERMINAL_EVENTS",
    "Waiting",
    "active",
    "awaited_signals",
    "child_notices",
    "end_status",
    "has_work",
    "next_status",
    "next_waiting",
    "out_of_place",
    "parked",
    "parked_on",
    "queued_at_start",
    "queued_on",
]

TERMINAL_EVENTS = (ev.RunCompleted, ev.RunFailed, ev.RunCancelled)
"""The events that end a run (``isinstance(e, TERMINAL_EVENTS)``); at most one per history."""


def end_status(event: ev.RunEvent) -> TerminalStatus | None:
    """The status ``event`` ends a run with, or ``None`` if it does not end one."""
    match event:
        case ev.RunCompleted():
            return "completed"
        case ev.RunFailed():
            return "failed"
        case ev.RunCancelled():
            return "cancelled"
    return None


def has_work(last: Sequence[ev.RunEvent]) -> bool:
    """Whether a run whose last stored decision holds ``last`` has work for a worker, as far as
    that decision tells: it neither ended nor parked on a wait or a retry, nor is suspended.
    A decision that changes no status (a signal recorded for a waiting run) says yes: a wake
    is only a hint, and a parked run woken for nothing parks again."""
    status: RunStatus = "pending"
    for event in last:
        status = next_status(status, event)
    return status in ("pending", "running")


def out_of_place(status: RunStatus, event: ev.RunEvent) -> str | None:
    """Why a run in ``status`` refuses ``event`` (the anomaly, in words), or ``None``.

    An ended run takes nothing more (a cancel request after the end is no anomaly: it is
    ignored); a run starts once; only a suspended run is resumed. The full fold also refuses
    operation events that do not fit its operation index (``sojourn.actors.core.state``)."""
    if status in TERMINAL:
        if isinstance(event, ev.CancelRequested):
            return None
        return f"{type(event).__name__} after the run ended"
    if isinstance(event, ev.RunStarted) and status != "new":
        return "RunStarted twice"
    if isinstance(event, ev.RunResumed) and status != "suspended":
        return "RunResumed while not suspended"
    return None


def active(status: RunStatus) -> RunStatus:
    """The status of a run that does something (a step, a wait that ended): ``running``, unless
    an operator's suspension holds it."""
    return "suspended" if status == "suspended" else "running"


def parked(status: RunStatus) -> RunStatus:
    """The status of a run that parks (a wait, a retry backoff): ``waiting``, unless suspended."""
    return "suspended" if status == "suspended" else "waiting"


def next_status(status: RunStatus, event: ev.RunEvent) -> RunStatus:
    """The status after ``event``, for an event the run takes (``out_of_place`` is ``None``).

    ``RunStarted`` and ``RunResumed`` make a run ``pending`` (a worker is to replay it); a step
    event or a completed wait makes it ``running`` and a wait or a failed attempt with a retry
    due makes it ``waiting`` (a suspended run stays ``suspended`` either way); ``RunSuspended``
    suspends it; the three ends end it. Signals, values, child starts and cancel requests leave
    the status as it is, and an ended run stays ended."""
    if status in TERMINAL:
        return status
    # By type, not ``match``: this runs for every event of every fold (class patterns cost
    # several times a set lookup).
    kind = type(event)
    if kind in _ACTIVE:
        return "suspended" if status == "suspended" else "running"
    to = _FIXED.get(kind)
    if to is not None:
        return to
    if isinstance(event, ev.StepFailed):
        return active(status) if event.retry_at is None else parked(status)
    if kind is ev.WaitStarted or kind is ev.StepThrottled:
        return parked(status)
    return status


_ACTIVE: frozenset[type] = frozenset({ev.StepStarted, ev.StepCompleted, ev.WaitCompleted})
_FIXED: dict[type, RunStatus] = {
    ev.RunStarted: "pending",
    ev.RunResumed: "pending",
    ev.RunSuspended: "suspended",
    ev.RunCompleted: "completed",
    ev.RunFailed: "failed",
    ev.RunCancelled: "cancelled",
}


# --- what a parked run waits on ---------------------------------------------------------------


class Waiting(NamedTuple):
    """What a run waits on (``WaitingOn`` entries, formatted) and until when."""

    on: tuple[str, ...] = ()
    deadline: float | None = None


NOT_WAITING = Waiting()


def parked_on(
    signals: tuple[str, ...], children: tuple[str, ...], deadline: float | None
) -> tuple[str, ...]:
    """What a run parked on a wait waits on: its signals, its child runs, its timer (in this
    order), as stored in ``waiting_on``."""
    return (
        *(WaitingOn.signal(n).format() for n in signals),
        *(WaitingOn.run(c).format() for c in children),
        *((WaitingOn.timer().format(),) if deadline is not None else ()),
    )


def next_waiting(on: tuple[str, ...], event: ev.RunEvent) -> Waiting | None:
    """What the run waits on after ``event`` (one it takes, in a run not ended), or ``None``
    when ``event`` leaves that as it is.

    A wait parks the run on its signals, children and deadline; a failed attempt with a retry
    due parks it on the retry (until ``retry_at``); the wait's completion, or the retried step
    starting again, ends the waiting."""
    if type(event) not in _WAITING_EVENTS:  # the bulk of a history: decided in one lookup
        return None
    if isinstance(event, ev.StepStarted):
        if on and (
            on == (WaitingOn.retry(event.name).format(),)
            or (event.limit is not None and on == (WaitingOn.limit(event.limit).format(),))
        ):
            return NOT_WAITING
    elif isinstance(event, ev.StepThrottled):
        return Waiting((WaitingOn.limit(event.limit).format(),), event.slot)
    elif isinstance(event, ev.StepFailed):
        if event.retry_at is not None:
            return Waiting((WaitingOn.retry(event.name).format(),), event.retry_at)
    elif isinstance(event, ev.WaitStarted):
        return Waiting(parked_on(event.signals, event.children, event.deadline), event.deadline)
    elif isinstance(event, ev.WaitCompleted):
        return NOT_WAITING
    elif isinstance(event, ev.RunStarted):
        return queued_at_start(event)
    elif isinstance(event, ev.RunAdmitted):
        return NOT_WAITING if queued_on(on) is not None else None
    return None


def queued_at_start(event: ev.RunStarted) -> Waiting | None:
    """What a run started queued on its concurrency key waits on (``queue:<key>``, decision
    0048), ``None`` for any other start."""
    c = event.concurrency
    if c is None or not c.ticket:
        return None
    return Waiting((WaitingOn.queue(c.key).format(),))


def queued_on(on: Sequence[str]) -> str | None:
    """The concurrency key a run waiting on ``on`` is queued on, ``None`` when it is not."""
    if len(on) == 1 and on[0].startswith("queue:"):
        return on[0][len("queue:") :]
    return None


_WAITING_EVENTS: frozenset[type] = frozenset(
    {
        ev.StepStarted,
        ev.StepFailed,
        ev.StepThrottled,
        ev.WaitStarted,
        ev.WaitCompleted,
        ev.RunStarted,
        ev.RunAdmitted,
    }
)


def awaited_signals(on: Iterable[str]) -> set[str]:
    """The signal names that would end the wait of a run waiting on ``on``: its signals and
    the end notices of its child runs (``sojourn-child.<run_id>``)."""
    wanted: set[str] = set()
    for text in on:
        w = WaitingOn.parse(text)
        if w.kind == "signal":
            wanted.add(w.target)
        elif w.kind == "run":
            wanted.add(child_signal(w.target))
    return wanted


def child_notices(on: Iterable[str]) -> set[str]:
    """The end notices of the child runs a wait waits on (consumed with a child outcome)."""
    out: set[str] = set()
    for text in on:
        w = WaitingOn.parse(text)
        if w.kind == "run":
            out.add(child_signal(w.target))
    return out
