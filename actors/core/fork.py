"""Forking a run (decision 0041): which of an old run's events a fork starts with (pure).

A fork re-executes a run from one position with the code deployed now. Its history begins
with a ``RunStarted`` of its own and then the old run's events of every position before that
one, copied in their order: replay returns their recorded results, and the code executes for
real from the fork's position on. ``plan_fork`` decides the cut:

- ``from_step`` N: the first event, in history order, of a position at or after N. N may be
  any position the run recorded, or the one after its last (everything recorded is reused).
- ``from_failure``: a failed run's last position when that is a failed step, else the
  position after its last (the code raised outside any step).

What is copied before the cut: the operations (steps, values, waits, child starts) and the
signals received, consumed or not. Not copied: the old run's requests and suspensions
(cancels, pauses, resumes, budget changes, its end): the fork is a new run, untouched by
what was asked of the old one. Refused (``ForkRefused``): a position beyond the history, a
run that did not fail (``from_failure``), a cut where an earlier position is still open (steps
run together with ``ctx.gather``, or a step in flight in a live run) and a cut inside a
cancelled run's compensation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sojourn.schemas import events as ev
from sojourn.schemas.wire import RejectCode

from .state import OpRecord, RunState, fold

__all__ = ["COPIED", "ForkPlan", "ForkRefused", "failure_position", "plan_fork"]

COPIED = (
    ev.StepStarted,
    ev.StepCompleted,
    ev.StepFailed,
    ev.ValueRecorded,
    ev.WaitStarted,
    ev.WaitCompleted,
    ev.ChildStarted,
    ev.SignalReceived,
)
"""The kinds of event a fork copies from the history before its cut."""

_POSITIONED = (
    ev.StepStarted,
    ev.StepCompleted,
    ev.StepFailed,
    ev.ValueRecorded,
    ev.WaitStarted,
    ev.WaitCompleted,
    ev.ChildStarted,
)


class ForkRefused(Exception):
    """A fork that cannot be made from this history: ``code`` is the intake's reject code."""

    def __init__(self, code: RejectCode, message: str) -> None:
        super().__init__(message)
        self.code: RejectCode = code
        self.message = message


@dataclass(frozen=True, slots=True)
class ForkPlan:
    """A fork decided: the old run's ``RunStarted``, the position the fork re-executes from,
    and the events it starts with after its own ``RunStarted``."""

    started: ev.RunStarted
    position: int
    copied: tuple[ev.RunEvent, ...]


def _settled(op: OpRecord) -> bool:
    """Whether an operation's outcome is recorded for good (replay returns it)."""
    if op.kind == "step":
        return op.status == "completed" or (op.status == "failed" and op.deadline is None)
    if op.kind == "wait":
        return op.status == "completed"
    return True  # a value, a child start: recorded once, settled at once


def failure_position(state: RunState) -> int:
    """Where a failed run failed: its last position if that is a step that failed for good,
    else the position after its last (the code raised outside any step)."""
    if state.ops:
        last = state.ops[-1]
        if last.kind == "step" and last.status == "failed" and last.deadline is None:
            return last.position
    return len(state.ops)


def plan_fork(
    run_id: str,
    events: Sequence[ev.RunEvent],
    *,
    from_step: int | None,
    from_failure: bool,
) -> ForkPlan:
    """The fork of the run whose whole history (so far) is ``events``.

    Raises:
        ForkRefused: ``invalid_fork`` (see the module's docstring), ``unknown_run`` for a
            history that does not start with a ``RunStarted``.
    """
    started = events[0] if events else None
    if not isinstance(started, ev.RunStarted):
        raise ForkRefused("unknown_run", f"run '{run_id}' has no history to fork")
    if (from_step is None) == (not from_failure):
        raise ForkRefused("invalid_fork", "a fork names a step (from_step) or from_failure")
    state = fold(events)
    frontier = len(state.ops)
    if from_failure:
        if state.status != "failed":
            raise ForkRefused(
                "invalid_fork",
                f"run '{run_id}' has not failed (it is {state.status}): fork it from a step",
            )
        position = failure_position(state)
    else:
        assert from_step is not None
        position = from_step
        if not 0 <= position <= frontier:
            raise ForkRefused(
                "invalid_fork",
                f"run '{run_id}' recorded positions 0 to {frontier - 1}: a fork starts at one "
                f"of them or at {frontier}, not at {position}",
            )
    cut = next(
        (i for i, e in enumerate(events) if isinstance(e, _POSITIONED) and e.position >= position),
        len(events),
    )
    head = events[1:cut]
    for e in head:
        if isinstance(e, ev.CancelTaken):
            raise ForkRefused(
                "invalid_fork",
                f"position {position} of run '{run_id}' comes after its code was stopped for "
                f"a cancel (at position {e.stopped_at}): fork from position {e.stopped_at} "
                "or earlier",
            )
    copied = tuple(e for e in head if isinstance(e, COPIED))
    prefix = fold([started, *copied])
    if prefix.anomalies:
        raise ForkRefused(
            "invalid_fork",
            f"run '{run_id}': its history before position {position} does not "
            f"fold cleanly ({prefix.anomalies[0]})",
        )
    open_ = [op.position for op in prefix.ops if not _settled(op)]
    if len(prefix.ops) != position or open_:
        first = open_[0] if open_ else len(prefix.ops)
        raise ForkRefused(
            "invalid_fork",
            f"run '{run_id}': position {first} was still open when position {position} began "
            f"(steps run together, or a step in flight): fork from position {first} or earlier",
        )
    return ForkPlan(started=started, position=position, copied=copied)
