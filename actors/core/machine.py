"""The run machine: what a run records and does next, decided without I/O.

``Context`` (the agent's handle) asks the machine at every journaled call; the machine answers
with an *action* (return this recorded result, start attempt n, back off until t, suspend for
this reason, park on this wait, start this child, look up these children) and with the events
to record, which it queues in ``pending``. The caller performs the action and reports what
happened (the step returned or raised, a reconcile function answered, a child's outcome was
found, a park let a signal in); the machine records that and answers again. ``Activation``
is the only code that turns those actions into broker I/O.

The machine itself keeps an activation's position and what it took (signals, children, polls,
live spending) and decides cancels, compensation, lifetime, values, patches and the budget; the
actions are in ``actions``, what bounds a run in ``limits``, and the calls that take several
turns in ``steps`` (``StepTurn``: attempts, retries, in-doubt settlement) and ``waits``
(``WaitTurn``: signals, select, deadlines, children). A turn holds this machine as what its own
module asks of it (``StepHost``, ``WaitHost``), so those modules do not import this one.

Everything here is a plain function of the folded history, the code's calls and the times
the caller passes in: no clock, no event loop, no broker. That is what lets retries, in-doubt
policies, crash loops, waits, select, cancel, children, budgets and caps be tested
exhaustively (tests/actors/core/test_machine.py), and what ``sojourn replay`` runs, with a journal
that stops at the first operation history has not recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from sojourn.schemas.codec import decode_decision, to_raw
from sojourn.schemas.errors import NondeterminismError, PayloadTooLarge
from sojourn.schemas.events import (
    Budget,
    CancelTaken,
    Carried,
    ChildStarted,
    ErrorInfo,
    RunCancelled,
    RunEvent,
    RunSuspended,
    StepFailed,
    StepStarted,
    Usage,
    ValueRecorded,
)
from sojourn.schemas.holds import AgentHold
from sojourn.schemas.limits import LimitRecord
from sojourn.schemas.vocabulary import PATCH_KIND, SPEND_KIND, StepKind, ValueKind
from sojourn.schemas.wire import InDoubtDecision, decide_signal

from .actions import ChildStart, InDoubtPolicy, Return, RunCancelledInterrupt, Suspend
from .journal import Execute, Journal, OpenWait, Recorded, RecordedFailure, RecordedWait
from .limits import (
    Limits,
    budget_suspension,
    chain_spending,
    format_duration,
    used_up,
    with_attempt,
    with_usage,
)
from .retry import RetryPolicy
from .state import OpRecord, RunState, SignalRecord
from .steps import StepTurn, step_error
from .waits import WaitTurn, child_run_id

__all__ = ["Machine"]

P = TypeVar("P")
A = TypeVar("A", bound=str)


def _open(op: OpRecord) -> bool:
    """Whether an operation history recorded is not settled: a step started and never ended,
    with a retry due or waiting for a slot of a shared limit, a wait still waiting."""
    if op.kind == "wait":
        return op.status == "waiting"
    if op.kind != "step":
        return False
    return op.status in ("started", "throttled") or (
        op.status == "failed" and op.deadline is not None
    )


@dataclass(slots=True)
class Machine:
    """One activation's decisions, from the folded history onwards.

    ``state`` is the history as folded when the activation began plus what other parties
    appended since (cancel requests, signals: the driver folds them in when it rebases); the
    machine's own events go to ``pending`` until the driver stores them.
    """

    state: RunState
    run_id: str = ""
    """The run's id (``state.run_id`` when not given)."""
    limits: Limits = field(default_factory=Limits)
    stop_at_frontier: bool = False
    """Replay only: raise ``ReplayFrontier`` at the first operation history lacks."""
    on_record: Callable[[], None] | None = None
    """Called after events are queued (the driver arms its flush timer)."""
    held: Callable[[], AgentHold | None] | None = None
    """The hold of the run's agent now (``sojourn pause --agent``), as the driver knows it."""
    limit_records: Callable[[str], LimitRecord | None] | None = None
    """The shared rate limits as the driver knows them now (a block a 429 imposed)."""
    journal: Journal = field(init=False)
    pending: list[RunEvent] = field(default_factory=list)
    consumed: set[str] = field(default_factory=set)
    """Ids of buffered signals taken by waits in this activation."""
    children: list[str] = field(default_factory=list)
    """Children started in this activation."""
    polls: int = 0
    live: Carried = field(default_factory=Carried)
    """What this activation's live operations used (history's is in ``state``; ``polls`` are
    counted apart, in ``polls``)."""
    nondeterminism: NondeterminismError | None = None
    fatal: PayloadTooLarge | None = None
    patches: dict[str, bool] = field(default_factory=dict)
    compensating: bool = False
    """The agent's code was stopped for a cancel and its compensation runs."""
    expired: str | None = None
    """Why the run is past its lifetime (``expire``), once it is."""
    stopped: tuple[int, int] | None = None
    """Where a cancel stopped the code live: (the position it stopped at, the position the
    compensation starts at)."""

    def __post_init__(self) -> None:
        self.run_id = self.run_id or self.state.run_id
        self.journal = Journal(self.state, stop_at_frontier=self.stop_at_frontier)

    @property
    def replaying(self) -> bool:
        return self.journal.replaying

    def record(self, *events: RunEvent) -> None:
        self.pending.extend(events)
        if self.on_record is not None:
            self.on_record()

    def check(self) -> None:
        """Before every journaled operation: stop if the run cannot go on."""
        if self.fatal is not None:
            raise self.fatal
        if self.cancel_due():
            self.stop(self.journal.position)
            raise RunCancelledInterrupt()

    # --- cancel, compensation, lifetime ------------------------------------------------------

    def cancel_reason(self) -> str | None:
        """Why the run is to end cancelled (a cancel request, or its lifetime), or ``None``."""
        s = self.state
        if s.cancel_requested is not None:
            return s.cancel_requested
        if s.cancel_taken is not None:
            return s.cancel_taken.reason
        return self.expired

    def cancel_due(self) -> bool:
        """Whether the code must stop before its next operation: a cancel (or the lifetime)
        ends the agent's code, a terminate also its compensation.

        The code of an agent with a compensation is stopped where the cancel was taken live
        (the recorded ``CancelTaken``, else the first operation history has not settled), so
        that a replay hands the compensation the same positions; any other run stops at once.
        """
        if self.compensating:
            return self.state.terminate_requested
        if self.cancel_reason() is None:
            return False
        if self.limits.compensates and not self.state.terminate_requested:
            return self.journal.position >= self._frontier()
        return True

    def _frontier(self) -> int:
        taken = self.state.cancel_taken
        if taken is not None:
            return taken.stopped_at
        ops = self.state.ops
        if ops and _open(ops[-1]):
            return len(ops) - 1
        return len(ops)

    def stop(self, position: int, compensate_at: int | None = None) -> None:
        """The code stops at ``position`` (the first stop counts; a replay's is recorded)."""
        if self.stopped is not None:
            return
        taken = self.state.cancel_taken
        if taken is not None:
            self.stopped = (taken.stopped_at, taken.compensate_at)
            return
        if compensate_at is None:  # history holds an (open) operation here: after it
            compensate_at = position + 1 if position < len(self.state.ops) else position
        self.stopped = (position, compensate_at)

    def start_dropped(self, started: StepStarted) -> None:
        """A cancel came in as this step was to start: its start was not stored. The
        compensation takes its position, unless an earlier attempt is recorded there."""
        p = started.position
        self.stop(p, p + 1 if started.attempt > 1 else p)

    def take_cancel(self, now: float) -> bool:
        """The agent's code was stopped for a cancel: ``True`` if its compensation is to run
        now (recorded as ``CancelTaken``, or replayed from it), ``False`` if the run ends at
        once (no compensation, a terminate, or the compensation itself was stopped)."""
        if not self.limits.compensates or self.compensating or self.state.terminate_requested:
            return False
        taken = self.state.cancel_taken
        if taken is None:
            stop, at = self.stopped or (self.journal.position, self.journal.position)
            ops = self.state.ops
            if stop < len(ops) and ops[stop].kind == "step" and ops[stop].status == "started":
                # An attempt left in doubt by a worker that died: it is not run again.
                rec = ops[stop]
                self.record(
                    StepFailed(
                        position=stop,
                        name=rec.name,
                        attempt=rec.attempts,
                        error=ErrorInfo(
                            type="Cancelled",
                            message="the run was cancelled while this attempt was in doubt "
                            "(its worker stopped): it is not run again",
                        ),
                        at=now,
                    )
                )
            reason = self.cancel_reason() or ""
            self.record(CancelTaken(reason=reason, stopped_at=stop, compensate_at=at, at=now))
        else:
            at = taken.compensate_at
        self.journal.position = at
        self.compensating = True
        return True

    def cancelled(self, now: float, error: ErrorInfo | None = None) -> RunCancelled:
        """The run's end for a cancel: terminated, or cancelled (with what its compensation
        raised, if it did)."""
        reason = self.cancel_reason() or ""
        if self.state.terminate_requested:
            said = "" if reason in ("", "cancelled") else f": {reason}"
            return RunCancelled(reason=f"terminated{said}", terminated=True, at=now)
        return RunCancelled(reason=reason, compensation_error=error, at=now)

    def lifetime_ends(self) -> float | None:
        """When the run's lifetime ends (wall clock), or ``None`` without one."""
        life = self.limits.lifetime
        if life is None or not self.state.started_at:
            return None
        return self.state.started_at + life

    def expire(self, now: float) -> bool:
        """Whether the run is past its lifetime at ``now`` (then it is cancelled, reason
        naming the lifetime, at its next operation)."""
        if self.expired is None:
            ends = self.lifetime_ends()
            if ends is not None and now >= ends:
                life = self.limits.lifetime or 0.0
                self.expired = f"lifetime of {format_duration(life)} exceeded"
        return self.expired is not None

    def _ask(self, plan: Callable[[A], P], arg: A) -> P:
        """The journal's ``plan`` for the next operation; a divergence is kept (the first one,
        even if the agent's code catches the exception) and raised."""
        try:
            return plan(arg)
        except NondeterminismError as e:
            if self.nondeterminism is None:
                self.nondeterminism = e
            raise

    def oversized(self, raw: bytes, what: str) -> PayloadTooLarge | None:
        """The error to record if ``raw`` is too large to store, else ``None``."""
        limit = self.limits.max_value
        if len(raw) <= limit:
            return None
        return PayloadTooLarge(
            f"{what} is {len(raw)} bytes; the limit for one stored value is {limit} bytes "
            f"({self.limits.max_value_why}): store large data elsewhere and pass a reference",
            run_id=self.run_id,
        )

    # --- steps ------------------------------------------------------------------------------

    def step(
        self,
        name: str,
        in_doubt: InDoubtPolicy,
        retry: RetryPolicy | None,
        kind: StepKind = "step",
        limit: str | None = None,
    ) -> Return | StepTurn:
        """A step call: its recorded result, or a turn that decides how to run it.

        Raises:
            StepError: history recorded the step as failed for good.
            NondeterminismError: history recorded another operation here.
        """
        self.check()
        plan = self._ask(self.journal.step, name)
        if isinstance(plan, Recorded):
            return Return(plan.result)
        if isinstance(plan, RecordedFailure):
            raise step_error(name, plan.attempts, plan.error, self.run_id)
        return StepTurn(self, name, plan, in_doubt, retry or self.limits.retry, kind, limit)

    def limit_record(self, name: str) -> LimitRecord | None:
        """The shared rate limit ``name`` as the driver knows it now."""
        return None if self.limit_records is None else self.limit_records(name)

    def decision(self, position: int, attempt: int) -> InDoubtDecision | None:
        """An operator's decision about attempt ``attempt`` of the in-doubt step at
        ``position`` (signal ``sojourn-decide.<position>.<attempt>``: a later attempt in
        doubt asks again). A malformed one counts as none."""
        name = decide_signal(position, attempt)
        for rec in reversed(self.state.signals):
            if rec.name == name:
                try:
                    return decode_decision(bytes(rec.payload))
                except msgspec.MsgspecError:
                    return None
        return None

    # --- values, patches, spend and caps -------------------------------------------------------

    def value(self, kind: ValueKind, make: Callable[[], Any], now: float) -> Return:
        """``ctx.now()`` and the like: the recorded value, or ``make()`` recorded now.

        Raises:
            PayloadTooLarge: the value is too large to store (the run then fails with it).
        """
        self.check()
        plan = self._ask(self.journal.value, kind)
        if isinstance(plan, Recorded):
            return Return(plan.result)
        raw = to_raw(make())
        too_big = self.oversized(raw, f"the value of ctx.{kind}()")
        if too_big is not None:
            if self.fatal is None:
                self.fatal = too_big
            raise too_big
        self.record(ValueRecorded(position=plan.position, kind=kind, value=raw, at=now))
        return Return(raw)

    def patched(self, change_id: str, now: float) -> bool:
        """Whether this run takes the new branch of change ``change_id``: yes for code that
        reaches the change live (a marker is recorded), no for a run whose history went
        through that point before the change (nothing recorded there). The answer is the same
        for every call with the same id in one run, and the same on every replay."""
        self.check()
        known = self.patches.get(change_id)
        if known is not None:
            return known
        found = self._ask(self.journal.patch, change_id)
        if isinstance(found, Execute):
            self.record(
                ValueRecorded(
                    position=found.position, kind=PATCH_KIND, value=to_raw(change_id), at=now
                )
            )
        taken = found is not None
        self.patches[change_id] = taken
        return taken

    def deprecate_patch(self, change_id: str) -> None:
        """Code that only keeps the new branch of ``change_id``: step over the marker that runs
        started under ``patched`` have, record nothing for new runs."""
        self.check()
        self.journal.skip_patch(change_id)
        self.patches[change_id] = True

    def count_poll(self, what: str, now: float) -> Suspend | None:
        """One more ``ctx.poll`` check: past the run's allowance, suspend it (reason ``cap``)."""
        self.polls += 1
        if self.replaying:
            return None
        budget = self.budget()
        if budget is not None and budget.polls is not None:
            allowed = budget.polls * self.state.grants
            polls = self.polls + (self.state.carried or Carried()).polls
            if polls > allowed:
                return Suspend(budget_suspension("polls", polls - 1, allowed, now), unit="polls")
        cap = self.limits.poll_cap
        allowance = cap * (1 + self.state.cap_resumes)
        if self.polls > allowance:
            return Suspend(
                RunSuspended(
                    reason="cap",
                    detail=f"poll cap of {cap} checks reached (polling {what}); "
                    f"`sojourn resume RUN` allows another {cap}",
                    at=now,
                )
            )
        return None

    def spend(self, usd: float, tokens: int, now: float) -> tuple[bool, Suspend | None]:
        """Record spending (journaled as a ``spend`` value). Returns whether it was live (not
        replayed), and the suspension due when the total reaches the run's budget."""
        live = not self.replaying
        self.value(SPEND_KIND, lambda: {"usd": usd, "tokens": tokens}, now)
        if not live:
            return live, None
        spent = self.live
        self.live = msgspec.structs.replace(
            spent, usd=spent.usd + usd, tokens=spent.tokens + tokens
        )
        return live, self.over_budget(now)

    def charged(self, usage: Usage | None) -> None:
        """A live step attempt ended having charged ``usage``: count it."""
        if usage is not None:
            self.live = with_usage(self.live, usage)

    def attempted(self, kind: StepKind) -> None:
        """A live step execution of ``kind`` starts: count it."""
        self.live = with_attempt(self.live, kind)

    def chain_spending(self) -> Carried:
        """What the run used (history, this activation's live steps) plus what its chain's
        earlier runs used: the run's budget holds it, and a continued run carries it on."""
        return chain_spending(self.state, self.live, self.polls)

    def budget(self) -> Budget | None:
        """The run's budget in effect: its own as recorded, else its agent's."""
        return self.state.budget or self.limits.budget

    def over_budget(self, now: float, kind: StepKind | None = None) -> Suspend | None:
        """The suspension due now, checked before a step of ``kind`` (``None``: after
        spending) and after every ``ctx.spend``: an operator's pause of the run or of its
        agent (reason ``manual``), or a used-up limit of the run's budget (``limits.used_up``)."""
        pause = self.state.pause
        if pause is not None and kind is not None:
            by = f" by {pause.by}" if pause.by else ""
            why = f": {pause.reason}" if pause.reason else ""
            return Suspend(
                RunSuspended(
                    reason="manual",
                    detail=f"paused{by}{why}; `sojourn unpause {self.run_id}` goes on",
                    at=now,
                )
            )
        hold = self.held() if self.held is not None and kind is not None else None
        if hold is not None:
            return Suspend(RunSuspended(reason="manual", detail=hold.detail(), at=now))
        budget = self.budget()
        if budget is None:
            return None
        return used_up(budget, self.chain_spending(), self.state.grants, now, kind)

    # --- waits and children ------------------------------------------------------------------

    def wait(
        self,
        key: str,
        *,
        signals: tuple[str, ...] = (),
        deadline: Callable[[], float | None] = lambda: None,
        children: tuple[str, ...] = (),
    ) -> RecordedWait | WaitTurn | None:
        """A wait: how it ended (``None``: it timed out), or a turn that decides it now.

        ``deadline`` is asked only for a wait history has not recorded (a recorded one keeps
        its deadline).
        """
        self.check()
        plan = self._ask(self.journal.wait, key)
        if isinstance(plan, RecordedWait):
            return None if plan.outcome == "timeout" else plan
        assert isinstance(plan, OpenWait)
        due = plan.recorded.deadline if plan.recorded is not None else deadline()
        return WaitTurn(self, plan.position, key, signals, due, children, plan.recorded is None)

    def find_signal(self, names: tuple[str, ...]) -> SignalRecord | None:
        for rec in self.state.signals:
            if rec.name in names and rec.signal_id not in self.consumed:
                return rec
        return None

    def child(self, agent: str) -> Return | ChildStart:
        """A child start: its recorded run id, or the child to start now."""
        self.check()
        plan = self._ask(self.journal.child, agent)
        if isinstance(plan, Recorded):
            return Return(plan.result)
        return ChildStart(plan.position, child_run_id(self.run_id, plan.position))

    def child_started(self, start: ChildStart, agent: str, now: float) -> None:
        """The child's start was published: record it."""
        self.children.append(start.child_id)
        self.record(
            ChildStarted(position=start.position, child_run_id=start.child_id, agent=agent, at=now)
        )
