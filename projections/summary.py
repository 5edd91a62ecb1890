"""A compact run summary folded from a run's events: what liveness and dashboards need.

The full run state (``sojourn.actors.core.state``) keeps every operation so replay can hand results
back to the code; a watchdog that follows every run of a deployment needs far less: status,
what the run waits for and until when, the signals it has not consumed yet, its current step
and a few counters. This fold keeps exactly that, in constant space per run, and like the full
one it is pure (``summarize(summary, event, seq) -> summary``), total (an event that does not
fit is counted, never raised) and tested against the full fold (tests/projections).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import msgspec

from sojourn.schemas import events as ev
from sojourn.schemas.attributes import decode_upsert, merge_attributes
from sojourn.schemas.codec import decode_spend
from sojourn.schemas.fairness import Fairness
from sojourn.schemas.lifecycle import (
    awaited_signals,
    child_notices,
    next_status,
    next_waiting,
    out_of_place,
)
from sojourn.schemas.priority import PRIORITY_DEFAULT, Priority
from sojourn.schemas.steps import StepRecord
from sojourn.schemas.views import CHILDREN_SHOWN, ERROR_MESSAGE_MAX, ViewError
from sojourn.schemas.vocabulary import (
    ATTRIBUTES_KIND,
    LLM_STEP,
    POLL_WAIT,
    SPEND_KIND,
    TERMINAL,
    RunStatus,
    SuspendReason,
    WaitKey,
    suspend_reason,
)
from sojourn.schemas.wire import CHILD_SIGNAL, DECIDE_SIGNAL

from .steplist import decided, step_ended, step_started

__all__ = ["CHILD_SIGNAL", "POLL_WAIT", "RunSummary", "summarize", "summarize_all"]
# ``CHILD_SIGNAL`` (``sojourn.schemas.wire``) and ``POLL_WAIT`` (``sojourn.schemas.vocabulary``)
# are defined there and re-exported here for the callers that import them from this module.


class PendingSignal(msgspec.Struct, frozen=True, array_like=True):
    signal_id: str
    name: str
    at: float


class RunSummary(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str = ""
    agent: str = ""
    priority: Priority = PRIORITY_DEFAULT
    """The run's priority (``RunStarted.priority``): the lane the watchdog re-wakes it on."""
    fairness: Fairness | None = None
    """Its fairness key and weight (``RunStarted.fairness``), which that wake carries."""
    parent_run_id: str | None = None
    schedule: str | None = None
    scheduled_at: float | None = None
    forked_from: str | None = None
    forked_at: int | None = None
    """A fork's origin: the run and the position (``RunStarted.forked_from``)."""
    status: RunStatus = "new"
    """``new``, ``pending``, ``running``, ``waiting``, ``suspended`` or a terminal status."""
    started_at: float = 0.0
    ended_at: float | None = None
    last_seq: int = 0
    last_event_at: float = 0.0
    events: int = 0
    decisions: int = 0
    bytes: int = 0
    waiting_on: tuple[str, ...] = ()
    """``WaitingOn`` entries, formatted, as in the full fold (``WaitingOn.parse`` reads them)."""
    waiting_since: float | None = None
    deadline: float | None = None
    signals: tuple[PendingSignal, ...] = ()
    suspended_reason: SuspendReason | None = None
    """Why the run is suspended (``RunSuspended.reason``, read with ``suspend_reason``)."""
    suspended_detail: str | None = None
    cancel_requested: bool = False
    step: str | None = None
    """The step started and not yet settled (in doubt if the run is not running it)."""
    step_position: int | None = None
    step_started_at: float | None = None
    step_attempt: int = 0
    """The attempt of ``step`` (0 when no step is open)."""
    step_attempts: int = 0
    """Step attempts started, retries and in-doubt re-runs included."""
    steps_done: int = 0
    """Steps completed."""
    retries: int = 0
    in_doubt: int = 0
    """Steps started again after an attempt whose end was never recorded."""
    idle_polls: int = 0
    spent_usd: float = 0.0
    spent_tokens: int = 0
    budget_usd: float | None = None
    budget_tokens: int | None = None
    """The budget ``RunStarted`` recorded (per grant), ``None`` without one."""
    budget_grants: int = 1
    """How many times the budget was granted: once at the start, and again by each resume of
    a ``budget`` suspension (what ``actors/core/state.py`` counts as ``budget_resumes``)."""
    children: tuple[str, ...] = ()
    """The first ``CHILDREN_SHOWN`` child run ids, in the order they were started."""
    children_count: int = 0
    error: ViewError | None = None
    """Why the run failed, or why the last attempt of its current step failed (the message
    cut to ``ERROR_MESSAGE_MAX`` characters); cleared by a completed step, a new step, or an
    end that is not a failure."""
    code_version: str | None = None
    attributes: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)
    """The run's search attributes: ``RunStarted.attributes`` with every
    ``ctx.set_attributes`` upsert applied (as the full fold)."""
    anomalies: int = 0
    # the step list and every budget kind (decision 0040; ``steplist.steps_of`` reads them)
    step_list: tuple[StepRecord, ...] = ()
    """The latest ``STEPS_KEPT`` step positions (``steplist``), in position order."""
    steps_total: int = 0
    """Step positions started."""
    budget: ev.Budget | None = None
    """Every limit in effect per grant: ``RunStarted``'s budget, each ``BudgetChanged``
    replacing limits (as the full fold)."""
    carried: ev.Carried | None = None
    """What the run's continue-as-new chain used before it (``RunStarted.carried``)."""
    spent_input_tokens: int = 0
    spent_output_tokens: int = 0
    model_calls: int = 0
    """Step attempts of kind ``llm``."""
    queue_ticket: int = 0
    """A run queued on its concurrency key at its start: its place in the key's queue
    (``RunStarted.concurrency.ticket``, decision 0048); ``waiting_on`` says while it waits."""

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def due_signal(self) -> PendingSignal | None:
        """The earliest buffered signal the run's current wait is waiting for, if any."""
        wanted = awaited_signals(self.waiting_on)
        for sig in self.signals:
            if sig.name in wanted:
                return sig
        return None


def summarize(s: RunSummary, event: ev.RunEvent) -> RunSummary:
    """Apply one event. Status and waiting follow ``sojourn.schemas.lifecycle``, the rules the
    full fold applies too."""
    rep = msgspec.structs.replace
    s = rep(s, events=s.events + 1, last_event_at=max(s.last_event_at, event.at))
    if out_of_place(s.status, event) is not None:
        return rep(s, anomalies=s.anomalies + 1)
    if s.terminal:
        return s  # a cancel request after the end: ignored
    match event:
        case ev.RunStarted():
            s = rep(
                s,
                run_id=s.run_id or event.run_id,
                agent=sys.intern(event.agent),  # one copy per agent name, not per run
                priority=event.priority,
                fairness=event.fairness,
                parent_run_id=event.parent_run_id,
                schedule=event.schedule,
                scheduled_at=event.scheduled_at,
                forked_from=None if event.forked_from is None else event.forked_from.run_id,
                forked_at=None if event.forked_from is None else event.forked_from.position,
                started_at=event.at,
                code_version=event.code_version,
                budget_usd=event.budget.usd if event.budget else event.budget_usd,
                budget_tokens=event.budget.tokens if event.budget else event.budget_tokens,
                budget=_started_budget(event),
                carried=event.carried,
                attributes=dict(event.attributes or {}),
                queue_ticket=0 if event.concurrency is None else event.concurrency.ticket,
            )
        case ev.BudgetChanged():
            b = event.budget
            return rep(
                s,
                budget_usd=s.budget_usd if b.usd is None else b.usd,
                budget_tokens=s.budget_tokens if b.tokens is None else b.tokens,
                budget=(s.budget or ev.Budget()).over(b),
            )
        case ev.StepStarted():
            in_doubt = s.step is not None and s.step_position == event.position
            retry = event.attempt > 1 and not in_doubt
            listed, total = step_started(s.step_list, s.steps_total, event)
            s = rep(
                s,
                step_list=listed,
                steps_total=total,
                model_calls=s.model_calls + (event.kind == LLM_STEP),
                step=event.name,
                step_position=event.position,
                step_started_at=event.at,
                step_attempt=event.attempt,
                step_attempts=s.step_attempts + 1,
                retries=s.retries + retry,
                in_doubt=s.in_doubt + in_doubt,
                # a later attempt of a step keeps showing why the one before failed
                error=s.error if event.attempt > 1 else None,
            )
        case ev.StepCompleted():
            listed = step_ended(s.step_list, event)
            s = _step_closed(s, steps_done=s.steps_done + 1, error=None, step_list=listed)
            s = _charged(s, event.usage)
        case ev.StepFailed():
            error = _error(event.error.type, event.error.message)
            listed = step_ended(s.step_list, event)
            s = _charged(_step_closed(s, error=error, step_list=listed), event.usage)
        case ev.StepThrottled():  # waits for a slot of a shared limit: ``waiting_on`` says
            pass
        case ev.WaitStarted():
            s = rep(s, idle_polls=s.idle_polls + (WaitKey.parse(event.key).kind == "poll"))
        case ev.WaitCompleted():
            if event.signal_id is not None:
                s = rep(s, signals=tuple(x for x in s.signals if x.signal_id != event.signal_id))
            elif event.outcome == "child":
                # The child's notification may have been buffered: it is consumed with the wait.
                done = child_notices(s.waiting_on)
                s = rep(s, signals=tuple(x for x in s.signals if x.name not in done))
        case ev.SignalReceived():
            if event.name.startswith(DECIDE_SIGNAL):
                s = rep(s, step_list=decided(s.step_list, event))
            if any(x.signal_id == event.signal_id for x in s.signals):
                return s
            sig = PendingSignal(event.signal_id, event.name, event.at)
            return rep(s, signals=(*s.signals, sig))
        case ev.ValueRecorded():
            if event.kind == ATTRIBUTES_KIND:
                merged = merge_attributes(s.attributes, decode_upsert(event.value))
                return rep(s, attributes=merged)
            spent = decode_spend(event.value) if event.kind == SPEND_KIND else None
            if spent is None:
                return s
            return rep(
                s, spent_usd=s.spent_usd + spent.usd, spent_tokens=s.spent_tokens + spent.tokens
            )
        case ev.ChildStarted():
            shown = s.children
            if len(shown) < CHILDREN_SHOWN:
                shown = (*shown, event.child_run_id)
            return rep(s, children=shown, children_count=s.children_count + 1)
        case ev.CancelRequested():
            return rep(s, cancel_requested=True)
        case ev.CancelTaken():  # the compensation's steps that follow say what runs
            return s
        case ev.RunSuspended():
            reason = suspend_reason(event.reason)
            s = rep(s, suspended_reason=reason, suspended_detail=event.detail)
        case ev.RunResumed():
            grants = s.budget_grants + (event.grant and s.suspended_reason == "budget")
            s = rep(s, suspended_reason=None, suspended_detail=None, budget_grants=grants)
        case ev.RunFailed():
            failed = _ended(s, next_status(s.status, event), event.at)
            return rep(failed, error=_error(event.error.type, event.error.message))
        case ev.RunCompleted() | ev.RunCancelled():
            return rep(_ended(s, next_status(s.status, event), event.at), error=None)
        case ev.RunAdmitted():  # out of its key's queue (decision 0048): ``waiting_on`` says
            pass
        case _:  # pragma: no cover
            return rep(s, anomalies=s.anomalies + 1)
    return _lifecycle(s, event)


def _charged(s: RunSummary, usage: ev.Usage | None) -> RunSummary:
    """``s`` with what a step attempt charged added to its spending."""
    if usage is None:
        return s
    return msgspec.structs.replace(
        s,
        spent_usd=s.spent_usd + usage.usd,
        spent_tokens=s.spent_tokens + usage.tokens,
        spent_input_tokens=s.spent_input_tokens + usage.input_tokens,
        spent_output_tokens=s.spent_output_tokens + usage.output_tokens,
    )


def _started_budget(event: ev.RunStarted) -> ev.Budget | None:
    """The limits a start recorded (as the full fold reads them)."""
    if event.budget is not None:
        return event.budget
    if event.budget_usd is None and event.budget_tokens is None:
        return None
    return ev.Budget(usd=event.budget_usd, tokens=event.budget_tokens)


def _lifecycle(s: RunSummary, event: ev.RunEvent) -> RunSummary:
    """Status and waiting after an event the run takes (``sojourn.schemas.lifecycle``); a new
    wait (or retry backoff) starts ``waiting_since``."""
    status = next_status(s.status, event)
    waiting = next_waiting(s.waiting_on, event)
    if waiting is None:
        return s if status == s.status else msgspec.structs.replace(s, status=status)
    began = isinstance(event, (ev.WaitStarted, ev.StepFailed, ev.StepThrottled, ev.RunStarted))
    return msgspec.structs.replace(
        s,
        status=status,
        waiting_on=waiting.on,
        waiting_since=event.at if began else None,
        deadline=waiting.deadline,
    )


def _ended(s: RunSummary, status: RunStatus, at: float) -> RunSummary:
    """An ended run waits on nothing and buffers nothing (the full fold keeps its last wait:
    replay never reads it, and liveness never looks at an ended run)."""
    return _step_closed(
        s,
        status=status,
        ended_at=at,
        waiting_on=(),
        waiting_since=None,
        deadline=None,
        signals=(),
    )


def _step_closed(s: RunSummary, **changes: Any) -> RunSummary:
    """``s`` with no open step (it ended, or the run did), and ``changes``."""
    return msgspec.structs.replace(
        s, step=None, step_position=None, step_started_at=None, step_attempt=0, **changes
    )


def _error(type_: str, message: str) -> ViewError:
    return ViewError(type=type_[:ERROR_MESSAGE_MAX], message=message[:ERROR_MESSAGE_MAX])


def close_decision(s: RunSummary, seq: int, size: int) -> RunSummary:
    """Account for the stored message that carried the events just applied."""
    return msgspec.structs.replace(s, last_seq=seq, decisions=s.decisions + 1, bytes=s.bytes + size)


def summarize_all(
    decisions: Iterable[tuple[int, int, Iterable[ev.RunEvent]]], s: RunSummary | None = None
) -> RunSummary:
    """Fold decisions given as ``(seq, size_in_bytes, events)``: equal to applying
    ``summarize`` to each event and ``close_decision`` to each decision, in time linear in the
    events and the signals buffered in ``s``.

    ``summarize`` copies the tuple of buffered signals for each signal that arrives or is
    consumed (and scans it for the id), so a run that buffers thousands would fold in quadratic
    time. Here, from the first signal event on, they are kept aside (``_Pending``) while
    ``s.signals`` stays empty (``summarize`` only adds to it or filters it, never decides from
    it), and put back once at the end.
    """
    s = s or RunSummary()
    pending: _Pending | None = None
    aside = True  # False: ``s`` holds an id twice (not built by ``summarize``): no shortcut
    for seq, size, events in decisions:
        for e in events:
            ended = s.terminal
            if not ended and isinstance(e, (ev.SignalReceived, ev.WaitCompleted)):
                if pending is None and aside:
                    if len({x.signal_id for x in s.signals}) == len(s.signals):
                        pending = _Pending(s.signals)
                        s = msgspec.structs.replace(s, signals=())
                    else:
                        aside = False
                if pending is not None and isinstance(e, ev.WaitCompleted):
                    pending.complete(e, s.waiting_on)
            s = summarize(s, e)
            if pending is not None:
                if s.signals:  # the signal ``summarize`` just buffered
                    pending.add(s.signals[0])
                    s = msgspec.structs.replace(s, signals=())
                elif s.terminal and not ended:
                    pending.clear()  # an ended run buffers nothing
        s = close_decision(s, seq, size)
    return s if pending is None else msgspec.structs.replace(s, signals=pending.records())


class _Pending:
    """The buffered signals while ``summarize_all`` folds: by id, in arrival order (an id is
    buffered once, as ``summarize`` does), with the ids by name for the child end notices a
    child wait consumes."""

    __slots__ = ("_by_id", "_by_name")

    def __init__(self, signals: tuple[PendingSignal, ...]) -> None:
        self._by_id: dict[str, PendingSignal] = {}
        self._by_name: dict[str, list[str]] = {}  # may name ids consumed since: checked
        for x in signals:
            self.add(x)

    def add(self, x: PendingSignal) -> None:
        if x.signal_id not in self._by_id:
            self._by_id[x.signal_id] = x
            self._by_name.setdefault(x.name, []).append(x.signal_id)

    def complete(self, e: ev.WaitCompleted, waiting_on: tuple[str, ...]) -> None:
        """What ``summarize`` does to the buffered signals on ``e`` in a run not ended."""
        if e.signal_id is not None:
            self._by_id.pop(e.signal_id, None)
        elif e.outcome == "child":
            for name in child_notices(waiting_on):
                for sid in self._by_name.pop(name, ()):
                    x = self._by_id.get(sid)
                    if x is not None and x.name == name:
                        del self._by_id[sid]

    def clear(self) -> None:
        self._by_id.clear()
        self._by_name.clear()

    def records(self) -> tuple[PendingSignal, ...]:
        return tuple(self._by_id.values())
