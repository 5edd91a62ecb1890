"""What the run machine answers: the actions its caller carries out, and the two exceptions
that unwind agent code.

``Machine`` (``sojourn.actors.core.machine``) answers each journaled call with one of these
actions; ``StepTurn`` and ``WaitTurn`` (``steps``, ``waits``) answer the calls that take more
than one turn. The caller performs the action (decodes a result, raises, runs an attempt, sets a
timer, parks, starts a child, looks children up) and reports back. Plain data, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec

from sojourn.schemas.events import RunSuspended, StepStarted, WaitStarted
from sojourn.schemas.vocabulary import BudgetLimit

__all__ = [
    "Attempt",
    "AwaitSlot",
    "Backoff",
    "ChildStart",
    "InDoubtPolicy",
    "LookupChildren",
    "Park",
    "Parked",
    "Raise",
    "Reconcile",
    "Reserve",
    "Return",
    "RunCancelledInterrupt",
    "StepAction",
    "Suspend",
    "WaitAction",
]


class Parked(BaseException):
    """Unwinds agent code when the run parks on a wait (not catchable by ``except Exception``).

    The run's position and wake condition are recorded; no coroutine is kept anywhere.
    """


class RunCancelledInterrupt(BaseException):
    """Unwinds agent code when a cancel was requested (not catchable by ``except Exception``)."""


# --- actions ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Return:
    """The operation has its result (recorded before, or just now): decode it and go on."""

    result: msgspec.Raw


@dataclass(slots=True)
class Raise:
    """Raise ``error`` into the agent's code (a recorded or final failure)."""

    error: BaseException


@dataclass(slots=True)
class Attempt:
    """Append ``started`` (with whatever is pending), then run the step's function."""

    position: int
    attempt: int
    in_doubt: bool
    started: StepStarted


@dataclass(slots=True)
class Backoff:
    """A retry is due at ``retry_at``: set the timer, store the failure, wait or park."""

    position: int
    retry_at: float


@dataclass(slots=True)
class Reserve:
    """Ask the shared rate limit ``limit`` for a slot for the step at ``position`` (I/O: the
    worker's ``SharedLimits``), then report it with ``StepTurn.granted``."""

    position: int
    limit: str


@dataclass(slots=True)
class AwaitSlot:
    """Wait for the step's slot at ``slot``: in this activation when ``park`` is false (it is
    near), else on a timer with the run parked (its ``StepThrottled`` is recorded)."""

    position: int
    slot: float
    park: bool


@dataclass(slots=True)
class Suspend:
    """Append ``event`` and park: the run waits for a human (``sojourn resume``/``decide``)."""

    event: RunSuspended
    unit: BudgetLimit | None = None
    """For a budget: the limit that was reached (``usd``, ``steps``...)."""


@dataclass(slots=True)
class ChildStart:
    """Publish the child's start, then tell the machine (``child_started``)."""

    position: int
    child_id: str


@dataclass(slots=True)
class Reconcile:
    """Ask the step's reconcile function whether its in-doubt attempt did the work."""

    position: int
    key: str


@dataclass(slots=True)
class Park:
    """Set the wait's timer (if ``deadline``), append ``event`` (if any), then ask again."""

    position: int
    deadline: float | None
    event: WaitStarted | None


@dataclass(slots=True)
class LookupChildren:
    """Read these children's histories: one may have ended without its notice reaching us."""

    children: tuple[str, ...]


StepAction = Return | Raise | Attempt | Backoff | Suspend | Reconcile | Reserve | AwaitSlot
WaitAction = Park | LookupChildren
InDoubtPolicy = Literal["retry", "ask", "reconcile"]
