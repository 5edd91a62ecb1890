"""A run's state as a pure fold of its events: ``evolve(state, event) -> state``.

No I/O, no clock, no randomness: the same events always give the same state, which is what
lets any worker rebuild any run, and what the hypothesis tests in tests/actors/test_state.py
check. ``fold`` is the fast path used by workers (it builds the operation index in one pass);
tests assert it always equals ``functools.reduce(evolve, events, RunState())``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import msgspec

from sojourn.schemas.events import (
    CancelRequested,
    ErrorInfo,
    RunCancelled,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunResumed,
    RunStarted,
    RunSuspended,
    StepCompleted,
    StepFailed,
    StepStarted,
    ValueRecorded,
)

__all__ = ["TERMINAL", "OpRecord", "RunState", "RunStatus", "evolve", "fold"]

RunStatus = Literal[
    "new", "pending", "running", "waiting", "suspended", "completed", "failed", "cancelled"
]
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})


class OpRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What history says happened at one position of the agent's code.

    ``kind`` is ``step`` or a value kind (``now``, ``uuid``, ``random``). For steps, ``status``
    is ``started`` (in doubt: it may have run), ``completed`` or ``failed``.
    """

    position: int
    kind: str
    name: str
    status: Literal["started", "completed", "failed", "recorded"]
    attempts: int = 0
    result: msgspec.Raw | None = None
    error: ErrorInfo | None = None


class RunState(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str = ""
    agent: str = ""
    code_version: str | None = None
    status: RunStatus = "new"
    input: msgspec.Raw | None = None
    output: msgspec.Raw | None = None
    error: ErrorInfo | None = None
    suspended_reason: str | None = None
    suspended_detail: str | None = None
    cancel_requested: str | None = None
    started_at: float = 0.0
    ended_at: float | None = None
    updated_at: float = 0.0
    ops: tuple[OpRecord, ...] = ()
    steps_completed: int = 0
    step_attempts: int = 0
    events: int = 0
    anomalies: tuple[str, ...] = ()

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def op(self, position: int) -> OpRecord | None:
        return self.ops[position] if 0 <= position < len(self.ops) else None


def _set_op(ops: tuple[OpRecord, ...], rec: OpRecord) -> tuple[OpRecord, ...] | None:
    """Place ``rec`` at its position; ``None`` when that would leave a gap (an anomaly)."""
    p = rec.position
    if p == len(ops):
        return (*ops, rec)
    if 0 <= p < len(ops):
        return (*ops[:p], rec, *ops[p + 1 :])
    return None


def _anomaly(state: RunState, text: str) -> RunState:
    return msgspec.structs.replace(state, anomalies=(*state.anomalies, text))


def evolve(state: RunState, event: RunEvent) -> RunState:  # noqa: C901 - one case per event type
    """Apply one event. Total: an out-of-place event is recorded as an anomaly, never raised."""
    s = msgspec.structs.replace(state, events=state.events + 1, updated_at=event.at)
    if s.terminal and not isinstance(event, CancelRequested):
        return _anomaly(s, f"{type(event).__name__} after the run ended")
    match event:
        case RunStarted():
            if s.status != "new":
                return _anomaly(s, "RunStarted twice")
            return msgspec.structs.replace(
                s, run_id=event.run_id, agent=event.agent, code_version=event.code_version,
                input=event.input, status="pending", started_at=event.at)
        case StepStarted():
            prev = s.op(event.position)
            rec = OpRecord(position=event.position, kind="step", name=event.name,
                           status="started", attempts=event.attempt)
            if prev is not None and (prev.kind != "step" or prev.status == "completed"):
                return _anomaly(s, f"step {event.position} started again after {prev.status}")
            ops = _set_op(s.ops, rec)
            if ops is None:
                return _anomaly(s, f"step {event.position} started out of order")
            return msgspec.structs.replace(s, ops=ops, status=_active(s),
                                           step_attempts=s.step_attempts + 1)
        case StepCompleted():
            rec = OpRecord(position=event.position, kind="step", name=event.name,
                           status="completed", attempts=event.attempt, result=event.result)
            ops = _set_op(s.ops, rec)
            if ops is None:
                return _anomaly(s, f"step {event.position} completed out of order")
            return msgspec.structs.replace(s, ops=ops, status=_active(s),
                                           steps_completed=s.steps_completed + 1)
        case StepFailed():
            rec = OpRecord(position=event.position, kind="step", name=event.name,
                           status="failed", attempts=event.attempt, error=event.error)
            ops = _set_op(s.ops, rec)
            if ops is None:
                return _anomaly(s, f"step {event.position} failed out of order")
            return msgspec.structs.replace(s, ops=ops, status=_active(s))
        case ValueRecorded():
            rec = OpRecord(position=event.position, kind=event.kind, name=event.kind,
                           status="recorded", result=event.value)
            ops = _set_op(s.ops, rec)
            if ops is None:
                return _anomaly(s, f"value {event.position} recorded out of order")
            return msgspec.structs.replace(s, ops=ops)
        case CancelRequested():
            if s.terminal:
                return s
            return msgspec.structs.replace(s, cancel_requested=event.reason or "cancelled")
        case RunSuspended():
            return msgspec.structs.replace(s, status="suspended", suspended_reason=event.reason,
                                           suspended_detail=event.detail)
        case RunResumed():
            if s.status != "suspended":
                return _anomaly(s, "RunResumed while not suspended")
            return msgspec.structs.replace(s, status="pending", suspended_reason=None,
                                           suspended_detail=None)
        case RunCompleted():
            return msgspec.structs.replace(s, status="completed", output=event.output,
                                           ended_at=event.at)
        case RunFailed():
            return msgspec.structs.replace(s, status="failed", error=event.error,
                                           ended_at=event.at)
        case RunCancelled():
            return msgspec.structs.replace(s, status="cancelled", ended_at=event.at,
                                           cancel_requested=event.reason or "cancelled")
    return _anomaly(s, f"unknown event {type(event).__name__}")  # pragma: no cover


def _active(s: RunState) -> RunStatus:
    return "suspended" if s.status == "suspended" else "running"


def fold(events: Iterable[RunEvent], state: RunState | None = None) -> RunState:
    """Fold many events. Equal to ``reduce(evolve, events, state)``, in linear time.

    Step and value events (the bulk of a long history) only touch the operation index, so they
    are applied to a list and the tuple is built once; every other event goes through
    ``evolve`` unchanged.
    """
    s = state or RunState()
    ops = list(s.ops)
    dirty = False
    for event in events:
        if isinstance(event, (StepStarted, StepCompleted, StepFailed, ValueRecorded)):
            if not s.terminal and _fast_ok(ops, event):
                s = _fast_apply(s, ops, event)
                dirty = True
                continue
        if dirty:
            s = msgspec.structs.replace(s, ops=tuple(ops))
            dirty = False
        s = evolve(s, event)
        ops = list(s.ops)
    if dirty:
        s = msgspec.structs.replace(s, ops=tuple(ops))
    return s


def _fast_ok(ops: list[OpRecord], event: RunEvent) -> bool:
    """True when ``event`` is an ordinary, in-order operation event (no anomaly to record)."""
    p = event.position  # type: ignore[union-attr]
    if not 0 <= p <= len(ops):
        return False
    if isinstance(event, StepStarted) and p < len(ops):
        prev = ops[p]
        return prev.kind == "step" and prev.status != "completed"
    return True


def _fast_apply(s: RunState, ops: list[OpRecord], event: RunEvent) -> RunState:
    match event:
        case StepStarted():
            rec = OpRecord(position=event.position, kind="step", name=event.name,
                           status="started", attempts=event.attempt)
            s = msgspec.structs.replace(s, status=_active(s), step_attempts=s.step_attempts + 1)
        case StepCompleted():
            rec = OpRecord(position=event.position, kind="step", name=event.name,
                           status="completed", attempts=event.attempt, result=event.result)
            s = msgspec.structs.replace(s, status=_active(s),
                                        steps_completed=s.steps_completed + 1)
        case StepFailed():
            rec = OpRecord(position=event.position, kind="step", name=event.name,
                           status="failed", attempts=event.attempt, error=event.error)
            s = msgspec.structs.replace(s, status=_active(s))
        case ValueRecorded():
            rec = OpRecord(position=event.position, kind=event.kind, name=event.kind,
                           status="recorded", result=event.value)
        case _:  # pragma: no cover - guarded by the caller
            raise AssertionError(event)
    if rec.position == len(ops):
        ops.append(rec)
    else:
        ops[rec.position] = rec
    return msgspec.structs.replace(s, events=s.events + 1, updated_at=event.at)
