"""A run's state as a pure fold of its events: ``evolve(state, event) -> state``.

No I/O, no clock, no randomness: the same events always give the same state, which is what
lets any worker rebuild any run, and what the hypothesis tests in tests/actors/core/test_state.py
check. ``fold`` is the fast path used by workers (it builds the operation index, the buffered
signals and the children in one pass); tests assert it always equals
``functools.reduce(evolve, events, RunState())``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from sojourn.schemas import events as ev
from sojourn.schemas.attributes import decode_upsert, merge_attributes
from sojourn.schemas.codec import decode_spend
from sojourn.schemas.fairness import Fairness
from sojourn.schemas.lifecycle import (
    next_status,
    next_waiting,
    out_of_place,
    queued_at_start,
    queued_on,
)
from sojourn.schemas.priority import PRIORITY_DEFAULT, Priority
from sojourn.schemas.vocabulary import (
    ATTRIBUTES_KIND,
    LLM_STEP,
    SPEND_KIND,
    TERMINAL,
    OpStatus,
    RunStatus,
    SuspendReason,
    suspend_reason,
    value_op,
)

from .records import OpRecord, SignalRecord, UpdateRecord

__all__ = [
    "TERMINAL",
    "OpRecord",
    "RunState",
    "RunStatus",
    "SignalRecord",
    "UpdateRecord",
    "evolve",
    "fold",
]
# ``RunStatus`` and ``TERMINAL`` are defined once, in ``sojourn.schemas.vocabulary``; the status
# and waiting rules, in ``sojourn.schemas.lifecycle`` (shared with the run summary's fold).


class RunState(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str = ""
    agent: str = ""
    code_version: str | None = None
    status: RunStatus = "new"
    input: msgspec.Raw | None = None
    output: msgspec.Raw | None = None
    error: ev.ErrorInfo | None = None
    suspended_reason: SuspendReason | None = None
    pause: ev.PauseRequested | None = None
    """An operator's pause not lifted yet: the run suspends itself at its next step."""
    """Why the run is suspended (``RunSuspended.reason``, read with ``suspend_reason``)."""
    suspended_detail: str | None = None
    cancel_requested: str | None = None
    terminate_requested: bool = False
    """A cancel asked to end the run without its compensation (``sojourn terminate``)."""
    cancel_taken: ev.CancelTaken | None = None
    """Where the agent's code was stopped for a cancel whose compensation runs (replay stops
    the code there again, then replays the compensation)."""
    started_at: float = 0.0
    ended_at: float | None = None
    updated_at: float = 0.0
    ops: tuple[OpRecord, ...] = ()
    steps_completed: int = 0
    step_attempts: int = 0
    events: int = 0
    anomalies: tuple[str, ...] = ()
    waiting_on: tuple[str, ...] = ()
    """``WaitingOn`` entries, formatted (``signal:<name>``, ``run:<id>``, ``timer``,
    ``retry:<step>``): read them with ``WaitingOn.parse``."""
    deadline: float | None = None
    signals: tuple[SignalRecord, ...] = ()
    updates: tuple[UpdateRecord, ...] = ()
    """Every update the run received, in arrival order, with how it was decided."""
    children: tuple[str, ...] = ()
    parent_run_id: str | None = None
    cap_resumes: int = 0
    budget_resumes: int = 0
    spent_usd: float = 0.0
    """What the run's ``ctx.spend`` calls recorded, summed (``spend`` values)."""
    spent_tokens: int = 0
    """Tokens: ``ctx.spend(tokens=...)`` plus every step's charged input and output tokens."""
    spent_input_tokens: int = 0
    spent_output_tokens: int = 0
    model_calls: int = 0
    """Step executions of kind ``llm`` (model requests); the rest of ``step_attempts`` are
    tool calls."""
    carried: ev.Carried | None = None
    """What the earlier runs of its continue-as-new chain used (``RunStarted.carried``)."""
    budget: ev.Budget | None = None
    """The run's budget in effect: ``RunStarted.budget`` (or, for a run started before that was
    recorded, its ``budget_usd``/``budget_tokens``), each ``BudgetChanged`` replacing limits."""
    budget_usd: float | None = None
    """The agent's budget as ``RunStarted`` recorded it: one grant (``granted_usd`` counts
    the grants); ``None`` without one, or for a run started before budgets were recorded."""
    budget_tokens: int | None = None
    previous_run_id: str | None = None
    """The run this one continues (``ctx.continue_as_new``), if any."""
    chain_root: str | None = None
    """The first run of this run's continue-as-new chain (``None``: this run is the first)."""
    generation: int = 1
    continued_as: str | None = None
    """Set when the run ended by continuing as new: the run that carries on."""
    forked_from: ev.ForkOrigin | None = None
    """Set on a fork (``RunStarted.forked_from``): the run and position it was forked from."""
    schedule: str | None = None
    """The schedule that started the run (``RunStarted.schedule``), if any."""
    scheduled_at: float | None = None
    """Its fire time (``RunStarted.scheduled_at``), Unix seconds."""
    attributes: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)
    """The run's search attributes: ``RunStarted.attributes`` with every
    ``ctx.set_attributes`` upsert (value kind ``attributes``) applied in order."""
    traceparent: str | None = None
    """The trace context the run was started in (``RunStarted.traceparent``)."""
    tracestate: str | None = None
    concurrency: ev.ConcurrencyInfo | None = None
    """The run's concurrency key (``RunStarted.concurrency``, decision 0048); while
    ``waiting_on`` is ``queue:<key>`` it is queued (``queued``)."""
    priority: Priority = PRIORITY_DEFAULT
    """The run's priority (``RunStarted.priority``, decision 0049): the lane of its wakes."""
    fairness: Fairness | None = None
    """The run's fairness key (``RunStarted.fairness``), which its wakes carry."""

    @property
    def queued(self) -> bool:
        """Whether the run waits in its concurrency key's queue (not admitted yet)."""
        return queued_on(self.waiting_on) is not None and self.status == "pending"

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def tool_calls(self) -> int:
        """Step executions that were not model requests."""
        return self.step_attempts - self.model_calls

    @property
    def grants(self) -> int:
        """How many times the run's budget was granted: once at the start, once more for each
        resume of a budget suspension (as the machine's budget checks count them)."""
        return 1 + self.budget_resumes

    @property
    def granted_usd(self) -> float | None:
        """The usd budget in effect (every grant), ``None`` without one."""
        usd = self.budget.usd if self.budget is not None else self.budget_usd
        return None if usd is None else usd * self.grants

    @property
    def granted_tokens(self) -> int | None:
        """The token budget in effect (every grant), ``None`` without one."""
        tokens = self.budget.tokens if self.budget is not None else self.budget_tokens
        return None if tokens is None else tokens * self.grants

    @property
    def buffered_signals(self) -> int:
        """How many received signals no wait has consumed yet (``len(signals)``, O(1))."""
        return len(self.signals)

    def op(self, position: int) -> OpRecord | None:
        return self.ops[position] if 0 <= position < len(self.ops) else None


def _anomaly(state: RunState, text: str) -> RunState:
    return msgspec.structs.replace(state, anomalies=(*state.anomalies, text))


def evolve(state: RunState, event: ev.RunEvent) -> RunState:
    """Apply one event. Total: an out-of-place event is recorded as an anomaly, never raised."""
    s = msgspec.structs.replace(state, events=state.events + 1, updated_at=event.at)
    why = out_of_place(s.status, event)
    if why is not None:
        return _anomaly(s, why)
    match event:
        case ev.RunStarted():
            return msgspec.structs.replace(
                s,
                run_id=event.run_id,
                agent=event.agent,
                code_version=event.code_version,
                input=event.input,
                status=next_status(s.status, event),
                started_at=event.at,
                parent_run_id=event.parent_run_id,
                budget_usd=event.budget_usd,
                budget_tokens=event.budget_tokens,
                budget=_started_budget(event),
                carried=event.carried,
                previous_run_id=event.previous_run_id,
                chain_root=event.chain_root,
                generation=event.generation,
                forked_from=event.forked_from,
                schedule=event.schedule,
                scheduled_at=event.scheduled_at,
                attributes=dict(event.attributes or {}),
                traceparent=event.traceparent,
                tracestate=event.tracestate,
                concurrency=event.concurrency,
                priority=event.priority,
                fairness=event.fairness,
                waiting_on=() if (q := queued_at_start(event)) is None else q.on,
            )
        case ev.RunAdmitted():
            if not s.queued or s.concurrency is None or s.concurrency.key != event.key:
                return _anomaly(s, "RunAdmitted while not queued on its key")
            return _lifecycle(s, event)
        case ev.BudgetChanged():
            base = s.budget or ev.Budget()
            return msgspec.structs.replace(s, budget=base.over(event.budget))
        case ev.SignalReceived():
            return msgspec.structs.replace(s, signals=(*s.signals, _signal_record(event)))
        case ev.UpdateRequested() | ev.UpdateCompleted() | ev.UpdateRejected():
            return _update(s, event)
        case (
            ev.StepStarted()
            | ev.StepCompleted()
            | ev.StepFailed()
            | ev.StepThrottled()
            | ev.ValueRecorded()
            | ev.WaitStarted()
            | ev.WaitCompleted()
            | ev.ChildStarted()
        ):
            why = _misplaced(s.ops, event)
            if why is not None:
                return _anomaly(s, why)
            ops = list(s.ops)
            s = _apply_op(s, ops, event)
            return msgspec.structs.replace(s, ops=tuple(ops))
        case ev.CancelRequested():
            if s.terminal:
                return s
            return msgspec.structs.replace(
                s,
                # a later request without a reason keeps the earlier one's
                cancel_requested=event.reason or s.cancel_requested or "cancelled",
                terminate_requested=s.terminate_requested or event.terminate,
            )
        case ev.CancelTaken():
            if s.cancel_taken is not None:
                return _anomaly(s, "CancelTaken twice")
            return msgspec.structs.replace(s, cancel_taken=event)
        case ev.RunSuspended():
            return msgspec.structs.replace(
                s,
                status=next_status(s.status, event),
                suspended_reason=suspend_reason(event.reason),
                suspended_detail=event.detail,
            )
        case ev.PauseRequested():
            return s if s.terminal else msgspec.structs.replace(s, pause=event)
        case ev.PauseLifted():
            return msgspec.structs.replace(s, pause=None)
        case ev.RunResumed():
            return msgspec.structs.replace(
                s,
                status=next_status(s.status, event),
                pause=None,
                suspended_reason=None,
                suspended_detail=None,
                cap_resumes=s.cap_resumes + (event.grant and s.suspended_reason == "cap"),
                budget_resumes=s.budget_resumes + (event.grant and s.suspended_reason == "budget"),
            )
        case ev.RunCompleted():
            return msgspec.structs.replace(
                s,
                status=next_status(s.status, event),
                output=event.output,
                ended_at=event.at,
                continued_as=event.continued_as,
            )
        case ev.RunFailed():
            return msgspec.structs.replace(
                s, status=next_status(s.status, event), error=event.error, ended_at=event.at
            )
        case ev.RunCancelled():
            return msgspec.structs.replace(
                s,
                status=next_status(s.status, event),
                ended_at=event.at,
                cancel_requested=event.reason or "cancelled",
            )
    return _anomaly(s, f"unknown event {type(event).__name__}")  # pragma: no cover


def _update(
    s: RunState, event: ev.UpdateRequested | ev.UpdateCompleted | ev.UpdateRejected
) -> RunState:
    """An update received (once per id: a repeat changes nothing) or decided (once)."""
    at = next((i for i, u in enumerate(s.updates) if u.update_id == event.update_id), None)
    if isinstance(event, ev.UpdateRequested):
        if at is not None:
            return s
        record = UpdateRecord(
            update_id=event.update_id,
            name=event.name,
            payload=event.payload,
            sent_by=event.sent_by,
            sender_verified=event.sender_verified,
        )
        return msgspec.structs.replace(s, updates=(*s.updates, record))
    if at is None or s.updates[at].outcome != "pending":
        return _anomaly(s, f"update {event.update_id!r} decided twice or never received")
    if isinstance(event, ev.UpdateCompleted):
        decided = msgspec.structs.replace(
            s.updates[at],
            outcome="completed",
            position=event.position,
            answer=event.answer,
            error=event.error,
        )
    else:
        decided = msgspec.structs.replace(
            s.updates[at], outcome="rejected", code=event.code, message=event.message
        )
    updates = (*s.updates[:at], decided, *s.updates[at + 1 :])
    return msgspec.structs.replace(s, updates=updates)


def _started_budget(event: ev.RunStarted) -> ev.Budget | None:
    if event.budget is not None:
        return event.budget
    if event.budget_usd is None and event.budget_tokens is None:
        return None
    return ev.Budget(usd=event.budget_usd, tokens=event.budget_tokens)


def _charged(s: RunState, usage: ev.Usage | None) -> RunState:
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


def _signal_record(event: ev.SignalReceived) -> SignalRecord:
    return SignalRecord(
        name=event.name,
        payload=event.payload,
        signal_id=event.signal_id,
        at=event.at,
        sent_by=event.sent_by,
        sender_verified=event.sender_verified,
        traceparent=event.traceparent,
    )


_OP_EVENTS = (
    ev.StepStarted,
    ev.StepCompleted,
    ev.StepFailed,
    ev.StepThrottled,
    ev.ValueRecorded,
    ev.WaitStarted,
    ev.WaitCompleted,
    ev.ChildStarted,
)
_OpEvent = (
    ev.StepStarted
    | ev.StepCompleted
    | ev.StepFailed
    | ev.StepThrottled
    | ev.ValueRecorded
    | ev.WaitStarted
    | ev.WaitCompleted
    | ev.ChildStarted
)


def fold(events: Iterable[ev.RunEvent], state: RunState | None = None) -> RunState:
    """Fold many events. Equal to ``reduce(evolve, events, state)``, in linear time.

    ``evolve`` copies a tuple for every event that grows one, so the fields that grow along a
    history are kept in mutable form here and turned into tuples once, at the end: the
    operation index (step and value events, the bulk of a long history), the buffered signals
    (a run may buffer thousands before a wait takes them) and the children. Every other event
    goes through ``evolve`` unchanged.

    While buffered signals or children are held aside, ``s.signals`` and ``s.children`` are
    empty: ``evolve`` and ``_apply_op`` only ever append to them or filter them (never decide
    anything from them), so they then only add to an empty tuple, which is cheap, and what they
    add is moved aside at once.
    """
    s = state or RunState()
    # Copied at the first operation event: folding signals into a long run's state (a kept
    # activation, the intake) does not copy its operation index.
    ops: list[OpRecord] | tuple[OpRecord, ...] = s.ops
    synced = True  # whether ``s.ops`` holds what ``ops`` holds
    signals: _Buffered | None = None  # once set, the buffered signals (``s.signals`` is empty)
    children: list[str] | None = None  # once set, the children (``s.children`` is empty)
    for event in events:
        if isinstance(event, ev.SignalReceived) and not s.terminal:
            if signals is None:
                signals, s = _Buffered(s.signals), msgspec.structs.replace(s, signals=())
            signals.add(_signal_record(event))
            s = msgspec.structs.replace(s, events=s.events + 1, updated_at=event.at)
            continue
        if isinstance(event, _OP_EVENTS):
            if not s.terminal and _misplaced(ops, event) is None:
                if isinstance(event, ev.WaitCompleted) and event.signal_id is not None:
                    if signals is None:
                        signals, s = _Buffered(s.signals), msgspec.structs.replace(s, signals=())
                    signals.consume(event.signal_id)
                elif isinstance(event, ev.ChildStarted) and children is None:
                    children, s = list(s.children), msgspec.structs.replace(s, children=())
                s = msgspec.structs.replace(s, events=s.events + 1, updated_at=event.at)
                if isinstance(ops, tuple):
                    ops = list(ops)
                s = _apply_op(s, ops, event)
                if children is not None and s.children:  # the child ``_apply_op`` just added
                    children.extend(s.children)
                    s = msgspec.structs.replace(s, children=())
                synced = False
                continue
            # An anomaly: ``evolve`` describes it from the operation index, so sync that first.
            # (An anomaly never changes the index, so ``ops`` stays right afterwards.)
            if not synced:
                s = msgspec.structs.replace(s, ops=tuple(ops))
                synced = True
        # Run-level events neither read nor change the operation index, so ``s.ops`` may be
        # stale here: rebuilding the tuple for each of them made interleaved histories
        # quadratic.
        s = evolve(s, event)
    if not synced:
        s = msgspec.structs.replace(s, ops=tuple(ops))
    if signals is not None:
        s = msgspec.structs.replace(s, signals=signals.records())
    if children is not None:
        s = msgspec.structs.replace(s, children=tuple(children))
    return s


class _Buffered:
    """Buffered signals while folding: arrival order kept, a signal consumed by id in O(1).

    Like ``evolve``: a signal is buffered however often its id arrives (the intake deduplicates
    by id; the fold takes the history as written), and a consumption removes every buffered
    signal with its id.
    """

    __slots__ = ("_by_id", "_next", "_records")

    def __init__(self, records: Iterable[SignalRecord]) -> None:
        self._records: dict[int, SignalRecord] = {}  # by arrival number: insertion ordered
        self._by_id: dict[str, list[int]] = {}
        self._next = 0
        for rec in records:
            self.add(rec)

    def add(self, rec: SignalRecord) -> None:
        self._records[self._next] = rec
        self._by_id.setdefault(rec.signal_id, []).append(self._next)
        self._next += 1

    def consume(self, signal_id: str) -> None:
        for k in self._by_id.pop(signal_id, ()):
            del self._records[k]

    def records(self) -> tuple[SignalRecord, ...]:
        return tuple(self._records.values())


def _misplaced(ops: Sequence[OpRecord], event: _OpEvent) -> str | None:
    """Why ``event`` does not fit the operation index (an anomaly), or ``None`` if it does.

    Positions are contiguous: an event opens the next position or revisits an earlier one. A
    step may start again (attempt n+1) while in doubt or after a failure; a completion or a
    failure closes the step started at its position, under the same name; a value is recorded
    once. Anything else would silently rewrite what replay already handed to the code.
    """
    verb = _VERB[type(event)]
    p = event.position
    if p == len(ops):
        return None
    if not 0 <= p < len(ops):
        return f"{_NOUN[type(event)]} {p} {verb} out of order"
    prev = ops[p]
    if prev.kind == "step":
        was = f"step '{prev.name}'"
    elif prev.kind in ("wait", "child"):
        was = f"{prev.kind} {prev.name}"
    else:  # a value: its name is its kind as recorded ("value now", not "now now")
        was = f"value {prev.name}"
    if isinstance(event, ev.WaitCompleted):
        if prev.kind == "wait" and prev.name == event.key and prev.status == "waiting":
            return None
        return f"wait {p} completed over {was} ({prev.status})"
    if isinstance(event, (ev.WaitStarted, ev.ChildStarted)):
        return f"{_NOUN[type(event)]} {p} {verb} again over {was} ({prev.status})"
    if isinstance(event, ev.ValueRecorded):
        return f"value {p} recorded again over {was} ({prev.status})"
    if prev.kind != "step" or prev.name != event.name:
        return f"step {p} '{event.name}' {verb} over {was} ({prev.status})"
    if isinstance(event, (ev.StepStarted, ev.StepThrottled)):
        ok = prev.status != "completed"
    else:
        ok = prev.status == "started"
    return None if ok else f"step {p} {verb} again after {prev.status}"


_VERB: dict[type, str] = {
    ev.StepStarted: "started",
    ev.StepThrottled: "throttled",
    ev.StepCompleted: "completed",
    ev.StepFailed: "failed",
    ev.ValueRecorded: "recorded",
    ev.WaitStarted: "started",
    ev.WaitCompleted: "completed",
    ev.ChildStarted: "started",
}
_NOUN: dict[type, str] = {
    ev.StepStarted: "step",
    ev.StepThrottled: "step",
    ev.StepCompleted: "step",
    ev.StepFailed: "step",
    ev.ValueRecorded: "value",
    ev.WaitStarted: "wait",
    ev.WaitCompleted: "wait",
    ev.ChildStarted: "child",
}


def _apply_op(s: RunState, ops: list[OpRecord], event: ev.RunEvent) -> RunState:
    """Apply an operation event that fits (see ``_misplaced``) to ``ops`` in place; return ``s``
    with status, waiting and counters updated (its ``ops`` field is the caller's to set)."""
    match event:
        case ev.StepStarted():
            prev = ops[event.position] if event.position < len(ops) else None
            rec = _step_record(event, "started", interrupted=_cut_off(prev))
            s = msgspec.structs.replace(
                s,
                step_attempts=s.step_attempts + 1,
                model_calls=s.model_calls + (event.kind == LLM_STEP),
            )
        case ev.StepCompleted():
            rec = _step_record(event, "completed", result=event.result)
            s = _charged(
                msgspec.structs.replace(s, steps_completed=s.steps_completed + 1), event.usage
            )
        case ev.StepFailed():
            rec = _step_record(event, "failed", error=event.error, deadline=event.retry_at)
            s = _charged(s, event.usage)
        case ev.StepThrottled():
            prev = ops[event.position] if event.position < len(ops) else None
            rec = OpRecord(
                position=event.position,
                kind="step",
                name=event.name,
                status="throttled",
                attempts=event.attempt - 1,
                deadline=event.slot,
                limit=event.limit,
                epoch=event.epoch,
                interrupted=_cut_off(prev),
            )
        case ev.ValueRecorded():
            rec = OpRecord(
                position=event.position,
                kind=value_op(event.kind),
                name=event.kind,
                status="recorded",
                result=event.value,
            )
            if event.kind == ATTRIBUTES_KIND:
                s = msgspec.structs.replace(
                    s, attributes=merge_attributes(s.attributes, decode_upsert(event.value))
                )
            if event.kind == SPEND_KIND:
                spent = decode_spend(event.value)
                if spent is not None:
                    s = msgspec.structs.replace(
                        s,
                        spent_usd=s.spent_usd + spent.usd,
                        spent_tokens=s.spent_tokens + spent.tokens,
                    )
        case ev.WaitStarted():
            rec = _wait_record(
                event,
                "waiting",
                signals=event.signals,
                deadline=event.deadline,
                children=event.children,
            )
        case ev.WaitCompleted():
            rec = _wait_record(
                event,
                "completed",
                result=event.payload,
                outcome=event.outcome,
                detail=event.signal if event.outcome == "signal" else event.child_status,
                sent_by=event.sent_by,
                sender_verified=event.sender_verified,
            )
            if event.signal_id is not None:
                signals = tuple(r for r in s.signals if r.signal_id != event.signal_id)
                s = msgspec.structs.replace(s, signals=signals)
        case ev.ChildStarted():
            rec = OpRecord(
                position=event.position,
                kind="child",
                name=event.agent,
                status="completed",
                result=msgspec.Raw(msgspec.json.encode(event.child_run_id)),
            )
            s = msgspec.structs.replace(s, children=(*s.children, event.child_run_id))
        case _:  # pragma: no cover - guarded by the callers
            raise AssertionError(event)
    if rec.position == len(ops):
        ops.append(rec)
    else:
        ops[rec.position] = rec
    return _lifecycle(s, event)


def _cut_off(prev: OpRecord | None) -> int:
    """Attempts in a row cut off mid-step at a step about to start again (or to wait for a
    slot of a shared limit first): one more if the last attempt never ended."""
    if prev is None:
        return 0
    if prev.status == "started":
        return prev.interrupted + 1
    return prev.interrupted if prev.status == "throttled" else 0


def _step_record(
    event: ev.StepStarted | ev.StepCompleted | ev.StepFailed, status: OpStatus, **fields: Any
) -> OpRecord:
    """The record of the step ``event`` is about, at the attempt it names, with ``fields``."""
    return OpRecord(
        position=event.position,
        kind="step",
        name=event.name,
        status=status,
        attempts=event.attempt,
        **fields,
    )


def _wait_record(
    event: ev.WaitStarted | ev.WaitCompleted, status: OpStatus, **fields: Any
) -> OpRecord:
    """The record of the wait ``event`` is about, under its key, with ``fields``."""
    return OpRecord(position=event.position, kind="wait", name=event.key, status=status, **fields)


def _lifecycle(s: RunState, event: ev.RunEvent) -> RunState:
    """Status and waiting after an event the run takes: the shared rules of
    ``sojourn.schemas.lifecycle``."""
    status = next_status(s.status, event)
    waiting = next_waiting(s.waiting_on, event)
    if waiting is not None:
        return msgspec.structs.replace(
            s, status=status, waiting_on=waiting.on, deadline=waiting.deadline
        )
    return s if status == s.status else msgspec.structs.replace(s, status=status)
