"""How one step call is carried out: attempts, retries and their backoff, in-doubt settlement.

``Machine.step`` answers a step history has not settled with a ``StepTurn``; the caller asks it
``next`` (run an attempt, back off until a retry is due, settle an in-doubt attempt by policy,
operator decision or the crash-loop rule) and reports how the attempt ended (``returned``,
``raised``, ``interrupted``, ``reconciled``). Failures are recorded as data (``error_info``,
clipped to ``ERROR_TEXT_MAX``), so a replay raises the same ``StepError``. Pure.
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import Any, Protocol

import msgspec

from sojourn.schemas.errors import (
    OutcomeUnknown,
    PayloadTooLarge,
    RetryableError,
    StepError,
    TerminalError,
)
from sojourn.schemas.events import (
    ErrorInfo,
    RunEvent,
    RunSuspended,
    StepCompleted,
    StepFailed,
    StepStarted,
    StepThrottled,
    Usage,
)
from sojourn.schemas.limits import LimitRecord
from sojourn.schemas.vocabulary import StepKind
from sojourn.schemas.wire import InDoubtDecision

from .actions import (
    Attempt,
    AwaitSlot,
    Backoff,
    InDoubtPolicy,
    Raise,
    Reconcile,
    Reserve,
    Return,
    StepAction,
    Suspend,
)
from .journal import Execute, Journal
from .limits import Limits
from .ratelimit import LIMIT_SLEEP_MAX, Grant, usable
from .retry import DEFAULT_RETRYABLE, RetryPolicy

__all__ = [
    "ERROR_TEXT_MAX",
    "StepHost",
    "StepTurn",
    "clip_text",
    "error_info",
    "failure_text",
    "retry_delay",
    "step_error",
]

ERROR_TEXT_MAX = 4000
"""Characters of an error message (and of a traceback's tail) kept in history: a failure
recorded as data stays small, and so does the end notice of a failed child."""


def clip_text(text: str, limit: int = ERROR_TEXT_MAX) -> str:
    """``text``, cut to ``limit`` characters with a note saying so."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters cut]"


def error_info(e: BaseException) -> ErrorInfo:
    """An exception as recorded data: its type name, message (clipped) and traceback tail."""
    return ErrorInfo(
        type=clip_text(type(e).__name__, 200),
        message=clip_text(str(e)),
        traceback="".join(traceback.format_exception(e))[-ERROR_TEXT_MAX:],
    )


def failure_text(name: str, attempts: int, err: ErrorInfo) -> str:
    """The ``StepError`` message: built from recorded data only, so replay says the same."""
    return f"step '{name}' failed after {attempts} attempt(s): {err.type}: {err.message}"


def step_error(name: str, attempts: int, err: ErrorInfo, run_id: str) -> StepError:
    """What the agent's code gets for step ``name`` of run ``run_id`` failed for good after
    ``attempts`` attempts, the last with ``err`` (live, or as history recorded it)."""
    return StepError(
        failure_text(name, attempts, err), error_type=err.type, run_id=run_id, step=name
    )


def retry_delay(e: BaseException, policy: RetryPolicy | None, attempt: int) -> float | None:
    """Seconds until the next attempt, or ``None`` when the failure is final."""
    if isinstance(e, TerminalError):
        return None
    if isinstance(e, RetryableError):
        p = policy or DEFAULT_RETRYABLE
        if attempt >= p.attempts:
            return None
        return e.retry_after if e.retry_after is not None else p.delay(attempt)
    if policy is None or attempt >= policy.attempts or not isinstance(e, policy.retry_on):
        return None
    return policy.delay(attempt)


class StepHost(Protocol):
    """What a ``StepTurn`` asks of the run machine that made it (``Machine``): the run's id,
    limits and journal, operator decisions, the budget, and the recording of what happened."""

    @property
    def run_id(self) -> str: ...

    @property
    def limits(self) -> Limits: ...

    @property
    def journal(self) -> Journal: ...

    def record(self, *events: RunEvent) -> None:
        """Queue ``events`` to be stored."""

    def decision(self, position: int, attempt: int) -> InDoubtDecision | None:
        """An operator's decision about attempt ``attempt`` of the in-doubt step at
        ``position``, if one was sent."""

    def oversized(self, raw: bytes, what: str) -> PayloadTooLarge | None:
        """The error to record if ``raw`` is too large to store, else ``None``."""

    def over_budget(self, now: float, kind: StepKind | None = None) -> Suspend | None:
        """The suspension due now if the run has used up a limit of its budget."""

    def attempted(self, kind: StepKind) -> None:
        """A live step execution of ``kind`` starts: count it."""

    def charged(self, usage: Usage | None) -> None:
        """A live step attempt ended having charged ``usage``: count it."""

    def stop(self, position: int, compensate_at: int | None = None) -> None:
        """The code stops at ``position`` (a cancel interrupted it)."""

    def limit_record(self, name: str) -> LimitRecord | None:
        """The shared rate limit ``name`` as the worker knows it now (``None``: unknown)."""


class StepTurn:
    """How one step call is carried out: attempts, backoffs, in-doubt settlement."""

    __slots__ = (
        "_done",
        "_in_doubt",
        "_m",
        "_settled",
        "kind",
        "limit",
        "name",
        "plan",
        "policy",
    )

    def __init__(
        self,
        machine: StepHost,
        name: str,
        plan: Execute,
        in_doubt: InDoubtPolicy,
        policy: RetryPolicy | None,
        kind: StepKind = "step",
        limit: str | None = None,
    ) -> None:
        self._m = machine
        self.kind = kind
        self.limit = limit
        """The shared rate limit each attempt takes a slot of (``@step(limit=...)``)."""
        self.name = name
        self.plan = plan
        self.policy = policy
        self._in_doubt = in_doubt
        self._settled = False  # the in-doubt policy of this plan has been applied
        self._done: Return | Raise | None = None

    @property
    def key(self) -> str:
        """The step's idempotency key: the same on every attempt, worker and restart."""
        return f"{self._m.run_id}/{self.plan.position}"

    @property
    def crash_loop(self) -> bool:
        limit = self._m.limits.crash_loop_limit
        return self.plan.in_doubt and 0 < limit <= self.plan.interrupted

    def next(self, now: float) -> StepAction:
        """What to do now: run an attempt, wait for a retry, settle an in-doubt attempt."""
        if self._done is not None:
            return self._done
        plan = self.plan
        if plan.retry_at is not None and plan.retry_at > now:
            self.plan = Execute(position=plan.position, attempt=plan.attempt, in_doubt=False)
            return Backoff(plan.position, plan.retry_at)
        if plan.in_doubt and not self._settled:
            self._settled = True
            settle = self._settle(now)
            if settle is not None:
                return settle
        over = self._m.over_budget(now, self.kind)
        if over is not None:
            return over
        slot: float | None = None
        if self.limit is not None:
            wait = self._slot(now)
            if wait is not None:
                return wait
            assert self.plan.grant is not None
            slot = self.plan.grant.slot
        self._m.attempted(self.kind)
        started = StepStarted(
            position=plan.position,
            name=self.name,
            attempt=plan.attempt,
            kind=self.kind,
            at=now,
            limit=self.limit,
            slot=slot,
        )
        return Attempt(plan.position, plan.attempt, plan.in_doubt, started)

    def _slot(self, now: float) -> Reserve | AwaitSlot | None:
        """For a step with a limit: ask for a slot (none yet, or the one it has was overtaken
        by a block or missed), wait for it, or ``None``: it has begun, start the attempt."""
        assert self.limit is not None
        plan = self.plan
        grant = plan.grant
        if grant is not None and (
            grant.limit != self.limit or not usable(grant, self._m.limit_record(self.limit), now)
        ):
            grant = None
            self.plan = dataclasses.replace(plan, grant=None)
        if grant is None:
            return Reserve(plan.position, self.limit)
        if grant.slot > now:
            return AwaitSlot(plan.position, grant.slot, park=grant.slot - now > LIMIT_SLEEP_MAX)
        return None

    def granted(self, grant: Grant, now: float) -> None:
        """The limit granted the slot ``grant`` (after a ``Reserve``): a slot further off than
        ``LIMIT_SLEEP_MAX`` is recorded (``StepThrottled``) and the run parks until it."""
        plan = self.plan
        self.plan = dataclasses.replace(plan, grant=grant)
        if grant.slot - now > LIMIT_SLEEP_MAX:
            self._m.record(
                StepThrottled(
                    position=plan.position,
                    name=self.name,
                    attempt=plan.attempt,
                    limit=grant.limit,
                    slot=grant.slot,
                    epoch=grant.epoch,
                    at=now,
                )
            )

    def _settle(self, now: float) -> StepAction | None:
        """Apply the in-doubt policy; ``None`` means run the step again.

        A step cut off ``crash_loop_limit`` times in a row is probably what kills its worker (a
        segfault, running out of memory): running it again would take down worker after
        worker. Whatever its policy, it then waits for a human, like ``in_doubt="ask"``.
        """
        m, plan = self._m, self.plan
        policy = "ask" if self.crash_loop else self._in_doubt
        if policy == "retry":
            return None
        if policy == "reconcile":
            return Reconcile(plan.position, self.key)
        decision = m.decision(plan.position, plan.attempt - 1)
        if decision is None:
            decide = (
                f"decide with `sojourn decide {m.run_id} {plan.position} "
                "retry|skip|fail [--result JSON]`"
            )
            where = f"step '{self.name}' at position {plan.position} (key {self.key})"
            if self.crash_loop:
                return Suspend(
                    RunSuspended(
                        reason="crash_loop",
                        detail=f"{where} was cut off {plan.interrupted} times in a row: it may "
                        "be what kills its worker; " + decide,
                        at=now,
                    )
                )
            return Suspend(
                RunSuspended(
                    reason="in_doubt",
                    detail=f"{where} started but its end was never recorded; " + decide,
                    at=now,
                )
            )
        if decision.action == "retry":
            return None
        if decision.action == "skip":
            return self._without_running(decision.result, now)
        err = ErrorInfo(
            type="InDoubtFailed", message=f"failed by decision of {decision.by or 'an operator'}"
        )
        return self._fail_in_doubt(err, now)

    def reconciled(self, found: msgspec.Raw | None, now: float) -> None:
        """The reconcile function's answer: the result the earlier attempt produced, or
        ``None`` (it did not do the work: run the step again)."""
        if found is not None:
            self._done = self._without_running(found, now)

    def _without_running(self, raw: msgspec.Raw, now: float) -> Return | Raise:
        """Settle an in-doubt step with a known result: its earlier attempt did the work."""
        too_big = self._m.oversized(raw, f"the result of step '{self.name}'")
        if too_big is not None:
            return self._fail_in_doubt(error_info(too_big), now, cause=too_big)
        return self._completed(raw, self.plan.attempt - 1, now)

    def _fail_in_doubt(
        self, err: ErrorInfo, now: float, cause: BaseException | None = None
    ) -> Raise:
        """Record the earlier, in-doubt attempt as failed with ``err``."""
        attempt = self.plan.attempt - 1
        self._record_failure(err, attempt, now)
        return self._raise(err, attempt, cause)

    def returned(
        self, raw: msgspec.Raw, duration: float, now: float, usage: Usage | None = None
    ) -> Return | Raise:
        """The attempt returned ``raw`` having charged ``usage``: record it (a result too
        large to store fails the step for good: another attempt would most likely return the
        same)."""
        self._m.charged(usage)
        too_big = self._m.oversized(raw, f"the result of step '{self.name}'")
        if too_big is not None:
            outcome = self._failed(too_big, None, duration, now, usage)
            assert outcome is not None
            return outcome
        return self._completed(raw, self.plan.attempt, now, duration=duration, usage=usage)

    def interrupted(self, error: ErrorInfo, duration: float, now: float) -> None:
        """The attempt was interrupted by a cancel (cancelled, or abandoned in its thread):
        recorded as failed, never retried; the code stops here (``RunCancelledInterrupt``)."""
        plan, m = self.plan, self._m
        self._record_failure(error, plan.attempt, now, duration=duration)
        m.stop(plan.position, max(plan.position + 1, m.journal.position))

    def raised(
        self, e: BaseException, duration: float, now: float, usage: Usage | None = None
    ) -> Raise | None:
        """The attempt raised ``e`` having charged ``usage``: record the failure; ``None``
        means a retry is due (ask ``next`` again), else the ``StepError`` for the code.

        ``OutcomeUnknown`` under an in-doubt policy other than ``retry``: nothing is recorded,
        the attempt stays started and unended (in doubt, as if its worker had died) and
        ``next`` settles it by the policy (``ask`` suspends the run)."""
        self._m.charged(usage)
        if isinstance(e, OutcomeUnknown) and self._in_doubt != "retry":
            plan = self.plan
            self.plan = Execute(
                position=plan.position,
                attempt=plan.attempt + 1,
                in_doubt=True,
                interrupted=plan.interrupted + 1,
            )
            self._settled = False
            return None
        delay = retry_delay(e, self.policy, self.plan.attempt)
        return self._failed(e, delay, duration, now, usage)

    def _failed(
        self,
        e: BaseException,
        delay: float | None,
        duration: float,
        now: float,
        usage: Usage | None = None,
    ) -> Raise | None:
        plan = self.plan
        err = error_info(e)
        retry_at = None if delay is None else now + delay
        self._record_failure(
            err, plan.attempt, now, duration=duration, retry_at=retry_at, usage=usage
        )
        if retry_at is not None:
            self.plan = Execute(
                position=plan.position, attempt=plan.attempt + 1, in_doubt=False, retry_at=retry_at
            )
            return None
        return self._raise(err, plan.attempt, e)

    def _completed(self, raw: msgspec.Raw, attempt: int, now: float, **more: Any) -> Return:
        """Record that attempt ``attempt`` returned ``raw`` (with ``more`` fields): done."""
        self._record(StepCompleted, attempt, now, result=raw, **more)
        self._done = Return(raw)
        return self._done

    def _record_failure(self, err: ErrorInfo, attempt: int, now: float, **more: Any) -> None:
        """Record that attempt ``attempt`` failed with ``err`` (with ``more`` fields)."""
        self._record(StepFailed, attempt, now, error=err, **more)

    def _record(
        self, end: type[StepCompleted | StepFailed], attempt: int, now: float, **fields: Any
    ) -> None:
        """Record how attempt ``attempt`` of this step ended: ``end`` with ``fields``."""
        self._m.record(
            end(position=self.plan.position, name=self.name, attempt=attempt, at=now, **fields)
        )

    def _raise(self, err: ErrorInfo, attempts: int, cause: BaseException | None) -> Raise:
        """Done: the step failed for good after ``attempts`` attempts, the last with ``err``."""
        error = step_error(self.name, attempts, err, self._m.run_id)
        error.__cause__ = cause
        self._done = Raise(error)
        return self._done
