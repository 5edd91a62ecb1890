"""Replay: match the operations an agent's code performs against what its history recorded.

Sans-I/O. The ``Journal`` is handed the folded state of a run and answers, for each operation
the code makes in order, "here is the recorded outcome" or "this is new: execute it (attempt
n)". It is also where non-determinism is caught: if position 3 was recorded as step ``send``
and the code now calls ``compose`` at position 3, that is a ``NondeterminismError`` naming both
(the DBOS-style check). Nothing is ever written on a mismatch; the executor parks the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from sojourn.schemas.codec import from_raw, to_raw
from sojourn.schemas.errors import NondeterminismError
from sojourn.schemas.events import ErrorInfo
from sojourn.schemas.vocabulary import PATCH_KIND, ValueKind, WaitOutcome, value_op

from .ratelimit import Grant
from .state import OpRecord, RunState

__all__ = [
    "Execute",
    "Journal",
    "OpenWait",
    "Recorded",
    "RecordedFailure",
    "RecordedWait",
    "ReplayFrontier",
    "describe_op",
]


class ReplayFrontier(BaseException):
    """Raised by a journal that stops at the frontier (``sojourn replay``): the code reached
    an operation history has not decided, so everything before it replayed."""

    def __init__(self, position: int) -> None:
        super().__init__(position)
        self.position = position


@dataclass(frozen=True, slots=True)
class Recorded:
    """The operation already completed: return this recorded result without running it."""

    position: int
    result: msgspec.Raw


@dataclass(frozen=True, slots=True)
class RecordedFailure:
    """The step already failed for good: raise this recorded error without running it."""

    position: int
    error: ErrorInfo
    attempts: int


@dataclass(frozen=True, slots=True)
class Execute:
    """New work: run it live. ``attempt`` > 1 means an earlier attempt may have run (in doubt)."""

    position: int
    attempt: int
    in_doubt: bool
    retry_at: float | None = None
    interrupted: int = 0
    """In doubt: how many attempts in a row were cut off mid-step (this one included)."""
    grant: Grant | None = None
    """The slot of a shared rate limit this attempt was granted (recorded ``StepThrottled``,
    or granted in this activation), if it waits for one."""


@dataclass(frozen=True, slots=True)
class RecordedWait:
    """The wait already ended: return what it ended with."""

    position: int
    outcome: WaitOutcome
    payload: msgspec.Raw
    signal: str | None
    sent_by: str | None = None
    """For a signal: who sent it (``SignalReceived.sent_by``)."""
    sender_verified: bool | None = None
    """For a signal: whether the broker authenticated ``sent_by`` (``None``: not recorded)."""


@dataclass(frozen=True, slots=True)
class OpenWait:
    """A wait to decide now: new (``recorded`` is None) or recorded as still waiting."""

    position: int
    recorded: OpRecord | None


_Open = TypeVar("_Open", Execute, OpenWait)
_NULL = to_raw(None)


class Journal:
    """Hands out positions in call order and checks them against recorded history."""

    def __init__(self, state: RunState, *, stop_at_frontier: bool = False) -> None:
        self._ops = state.ops
        self._run_id = state.run_id
        self._stop = stop_at_frontier
        self.position = 0
        self.claim: Callable[[str], None] | None = None
        """Asked before an operation takes a position, with its kind (``step``, ``value``,
        ``wait``, ``child``, ``patch``); it may refuse by raising. ``ctx.gather`` sets it while
        its branches run: only there can the order of calls depend on timing."""

    def _claim(self, kind: str) -> None:
        if self.claim is not None:
            self.claim(kind)

    @property
    def recorded(self) -> int:
        """How many operations history records."""
        return len(self._ops)

    @property
    def replaying(self) -> bool:
        """True while the code has not yet passed the last recorded operation."""
        return self.position < len(self._ops)

    def _take(self) -> tuple[int, OpRecord | None]:
        p = self.position
        self.position += 1
        return p, (self._ops[p] if p < len(self._ops) else None)

    def _new(self, p: int) -> Execute:
        if self._stop:
            raise ReplayFrontier(p)
        return Execute(position=p, attempt=1, in_doubt=False)

    def _open(self, plan: _Open) -> _Open:
        if self._stop:
            raise ReplayFrontier(plan.position)
        return plan

    def _mismatch(self, p: int, rec: OpRecord, wanted: str) -> NondeterminismError:
        was = describe_op(rec)
        return NondeterminismError(
            f"run {self._run_id}: operation {p} was recorded as {was} but the code now "
            f"calls {wanted}; the agent's code changed in a way that does not replay "
            "(version it, or finish old runs on the old code)",
            run_id=self._run_id,
            step=wanted,
            seq=p,
        )

    def step(self, name: str) -> Recorded | RecordedFailure | Execute:
        self._claim("step")
        p, rec = self._take()
        if rec is None:
            return self._new(p)
        if rec.kind != "step" or rec.name != name:
            raise self._mismatch(p, rec, f"step '{name}'")
        if rec.status == "completed":
            assert rec.result is not None
            return Recorded(position=p, result=rec.result)
        if rec.status == "throttled":  # a slot of a shared limit was granted, not yet used
            assert rec.limit is not None and rec.deadline is not None
            grant = Grant(rec.limit, rec.deadline, rec.epoch)
            attempt = rec.attempts + 1
            return self._open(
                Execute(p, attempt, in_doubt=False, interrupted=rec.interrupted, grant=grant)
            )
        if rec.status == "failed":
            assert rec.error is not None
            if rec.deadline is not None:  # a retry is due at ``deadline``
                retry = Execute(
                    position=p, attempt=rec.attempts + 1, in_doubt=False, retry_at=rec.deadline
                )
                return self._open(retry)
            return RecordedFailure(position=p, error=rec.error, attempts=rec.attempts)
        doubt = Execute(
            position=p, attempt=rec.attempts + 1, in_doubt=True, interrupted=rec.interrupted + 1
        )
        return self._open(doubt)

    def value(self, kind: ValueKind) -> Recorded | Execute:
        self._claim("value")
        p, rec = self._take()
        if rec is None:
            return self._new(p)
        if rec.kind != value_op(kind) or rec.name != kind:  # a value's name is its kind's text
            raise self._mismatch(p, rec, f"ctx.{kind}()")
        assert rec.result is not None
        return Recorded(position=p, result=rec.result)

    def wait(self, key: str) -> RecordedWait | OpenWait:
        self._claim("wait")
        p, rec = self._take()
        if rec is None:
            return self._open(OpenWait(position=p, recorded=None))
        if rec.kind != "wait" or rec.name != key:
            raise self._mismatch(p, rec, f"a wait on {key}")
        if rec.status == "waiting":
            return self._open(OpenWait(position=p, recorded=rec))
        assert rec.result is not None and rec.outcome is not None  # both from its WaitCompleted
        # ``detail`` is the signal's name for a signal outcome but the child's status for a
        # child outcome; live (``WaitTurn.child_ended``) the latter has no signal.
        signal = rec.detail if rec.outcome == "signal" else None
        return RecordedWait(
            position=p,
            outcome=rec.outcome,
            payload=rec.result,
            signal=signal,
            sent_by=rec.sent_by,
            sender_verified=rec.sender_verified,
        )

    def patch(self, change_id: str) -> Recorded | Execute | None:
        """``ctx.patched(change_id)``: the recorded marker (new branch), a marker to record now
        (new branch, live code), or ``None`` (old branch: history went on without the marker;
        no position is taken)."""
        self._claim("patch")
        p = self.position
        rec = self._ops[p] if p < len(self._ops) else None
        if rec is None:
            self.position += 1
            return self._new(p)
        if _is_marker(rec, change_id):
            self.position += 1
            assert rec.result is not None
            return Recorded(position=p, result=rec.result)
        return None

    def skip_patch(self, change_id: str) -> None:
        """``ctx.deprecate_patch(change_id)``: step over the marker if history has it here."""
        self._claim("patch")
        p = self.position
        if p < len(self._ops) and _is_marker(self._ops[p], change_id):
            self.position += 1

    def child(self, agent: str) -> Recorded | Execute:
        self._claim("child")
        p, rec = self._take()
        if rec is None:
            return self._new(p)
        if rec.kind != "child" or rec.name != agent:
            raise self._mismatch(p, rec, f"a child run of '{agent}'")
        assert rec.result is not None
        return Recorded(position=p, result=rec.result)

    def finish(self) -> None:
        """The code returned: every recorded operation must have been replayed."""
        if self.position < len(self._ops):
            rec = self._ops[self.position]
            was = describe_op(rec)
            raise NondeterminismError(
                f"run {self._run_id}: the code finished after {self.position} operations but "
                f"history records {len(self._ops)} (next: {was} at {self.position})",
                run_id=self._run_id,
                seq=self.position,
            )


def _is_marker(rec: OpRecord, change_id: str) -> bool:
    if rec.kind != PATCH_KIND or rec.result is None:
        return False
    try:
        return bool(from_raw(rec.result, str) == change_id)
    except msgspec.MsgspecError:
        return False


def describe_op(rec: OpRecord) -> str:
    if rec.kind == PATCH_KIND:
        try:
            change: str | None = from_raw(rec.result or _NULL, str)
        except msgspec.MsgspecError:
            change = None
        return f"ctx.patched({change!r})"
    if rec.kind == "step":
        return f"step '{rec.name}'"
    if rec.kind == "wait":
        return f"a wait on {rec.name}"
    if rec.kind == "child":
        return f"a child run of '{rec.name}'"
    return f"ctx.{rec.name}()"  # a value: its name is its kind as recorded
