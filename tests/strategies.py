"""Hypothesis strategies shared by the tests of the folds, the codec and the vocabulary.

* run histories: *valid* ones, built the way a worker writes them, with what the generator
  knows the folded state must be (``valid_histories``); *arbitrary* sequences (any event, any
  order, any position: ``any_event``, ``arbitrary_histories``, ``any_histories``); and
  signal-heavy ones (``signal_histories``). Used by tests/actors/core/test_state.py,
  tests/actors/core/test_journal.py and tests/projections/test_summary.py;
* events and wire messages derived from the schema itself (``struct_strategy``,
  ``schema_events``), used by tests/schemas/test_codec.py;
* wait keys and waiting entries (``wait_keys_typed``, ``waiting_entries``), used by
  tests/schemas/test_vocabulary.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, get_args

import msgspec
import msgspec.inspect as mi
from hypothesis import strategies as st

from sojourn.schemas.events import (
    Budget,
    BudgetChanged,
    CancelRequested,
    CancelTaken,
    Carried,
    ChildStarted,
    ConcurrencyInfo,
    ErrorInfo,
    PauseLifted,
    PauseRequested,
    RunAdmitted,
    RunCancelled,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunResumed,
    RunStarted,
    RunSuspended,
    SignalReceived,
    StepCompleted,
    StepFailed,
    StepStarted,
    StepThrottled,
    UpdateCompleted,
    UpdateRejected,
    UpdateRequested,
    Usage,
    ValueRecorded,
    WaitCompleted,
    WaitStarted,
)
from sojourn.schemas.vocabulary import (
    CHILD_STATUSES,
    STEP_KINDS,
    SUSPEND_REASONS,
    VALUE_KINDS,
    WAIT_OUTCOMES,
    WaitingOn,
    WaitKey,
    WaitOutcome,
)
from sojourn.schemas.wire import CHILD_SIGNAL, BudgetBody, child_signal

if TYPE_CHECKING:
    from sojourn.actors.core.state import OpRecord, SignalRecord
# The full fold's records are imported where the valid histories are built, not here: the
# schema tests use this module too, and must not need the actor layer to import.

__all__ = [
    "ARBITRARY",
    "ARBITRARY_TERMINAL",
    "ARBITRARY_TERMINAL_TYPES",
    "CHILD_AGENTS",
    "CHILD_SIGNAL",
    "CHILD_STATUSES",
    "EVENT_TYPES",
    "NAMES",
    "NULL",
    "OP_EVENTS",
    "SIGNAL_NAMES",
    "START",
    "SUSPEND_REASONS",
    "VALUE_KINDS",
    "WAIT_OUTCOMES",
    "Expected",
    "OpEvent",
    "any_event",
    "any_histories",
    "arbitrary_histories",
    "attempts",
    "child_ids",
    "child_signal",
    "deadlines",
    "errors",
    "json_values",
    "mutated_histories",
    "positions",
    "raws",
    "run_ids",
    "schema_events",
    "signal_histories",
    "signal_ids",
    "signal_names",
    "signal_record",
    "struct_strategy",
    "valid_histories",
    "wait_keys",
    "wait_keys_typed",
    "waiting_entries",
    "waiting_on",
]

NAMES = ("fetch", "compose", "send")
# ``SUSPEND_REASONS``, ``VALUE_KINDS``, ``WAIT_OUTCOMES`` and ``CHILD_STATUSES`` come from the
# vocabulary (sojourn.schemas.vocabulary). The event fields of the first two are plain strings
# (so a newer value never breaks an older reader); these are the values the code writes today.

SIGNAL_NAMES = ("approve", "docs.signed")
CHILD_AGENTS = ("it-provision", "mailer")
OP_EVENTS = (
    StepStarted,
    StepCompleted,
    StepFailed,
    StepThrottled,
    ValueRecorded,
    WaitStarted,
    WaitCompleted,
    ChildStarted,
)
OpEvent = (
    StepStarted
    | StepCompleted
    | StepFailed
    | StepThrottled
    | ValueRecorded
    | WaitStarted
    | WaitCompleted
    | ChildStarted
)
"""An event of ``OP_EVENTS``: one that records an operation at a position."""
NULL = msgspec.Raw(b"null")

raws = st.one_of(st.integers(-3, 3), st.text(max_size=3), st.none(), st.booleans()).map(
    lambda v: msgspec.Raw(msgspec.json.encode(v))
)
errors = st.builds(
    ErrorInfo, type=st.sampled_from(["ValueError", "KeyError"]), message=st.text(max_size=4)
)
# 0.0 on purpose (and explicitly: hypothesis rarely draws it from the range): a deadline at the
# epoch is still a deadline (``is not None``).
deadlines = st.just(0.0) | st.floats(0, 2e9, allow_nan=False, allow_infinity=False)

update_ids = st.sampled_from(["u1", "u2"])
UPDATE_NAMES = ("plan", "add")

E = TypeVar("E", bound=RunEvent)
EVENT_TYPES: tuple[type[Any], ...] = get_args(RunEvent)


def waiting_on(
    signals: tuple[str, ...], children: tuple[str, ...], deadline: float | None
) -> tuple[str, ...]:
    """What a run parked on a wait is waiting for, in the documented order."""
    return (
        *(f"signal:{n}" for n in signals),
        *(f"run:{c}" for c in children),
        *(("timer",) if deadline is not None else ()),
    )


def signal_record(e: SignalReceived) -> SignalRecord:
    from sojourn.actors.core.state import SignalRecord

    return SignalRecord(
        name=e.name, payload=e.payload, signal_id=e.signal_id, at=e.at, sent_by=e.sent_by
    )


# --- valid histories --------------------------------------------------------------------------


@dataclass
class Expected:
    """What the generator of a valid history knows the folded state must be."""

    run_id: str
    agent: str
    input: msgspec.Raw
    status: str = "pending"
    ops: list[OpRecord] = field(default_factory=list)
    cancel_requested: str | None = None
    output: msgspec.Raw | None = None
    error: ErrorInfo | None = None
    suspended_reason: str | None = None
    parent_run_id: str | None = None
    waiting_on: tuple[str, ...] = ()
    deadline: float | None = None
    signals: list[SignalRecord] = field(default_factory=list)
    """Received and not yet consumed by a wait, oldest first."""
    children: list[str] = field(default_factory=list)


@st.composite
def valid_histories(draw: st.DrawFn) -> tuple[list[RunEvent], Expected]:
    """A history a correct worker could have written, and the state it must fold to."""
    from sojourn.actors.core.state import OpRecord

    events: list[RunEvent] = []

    def emit(event: E) -> E:
        event = msgspec.structs.replace(event, at=float(len(events)))
        events.append(event)
        return event

    run_id = draw(st.sampled_from(["r1", "r-2"]))
    agent = draw(st.sampled_from(["greeter", "mailer"]))
    exp = Expected(
        run_id=run_id,
        agent=agent,
        input=draw(raws),
        parent_run_id=draw(st.none() | st.just("parent-1")),
    )
    emit(
        RunStarted(
            run_id=run_id,
            agent=agent,
            input=exp.input,
            code_version=None,
            parent_run_id=exp.parent_run_id,
        )
    )
    # A child's end signal has a fixed id (``child-end:<child>``): the intake takes it once.
    ended: set[str] = set()

    def pause() -> None:
        reason = draw(st.sampled_from(SUSPEND_REASONS))
        emit(RunSuspended(reason=reason, detail="parked"))
        emit(RunResumed(by=draw(st.none() | st.just("ops"))))
        exp.status = "pending"  # resumed: waiting for a worker to replay it

    def cancel() -> None:
        reason = draw(st.sampled_from(["", "user asked"]))
        emit(CancelRequested(reason=reason, by=None))
        exp.cancel_requested = reason or exp.cancel_requested or "cancelled"

    def sendable(names: tuple[str, ...]) -> list[str]:
        """Of ``names``, the signals that may still arrive."""
        prefix = CHILD_SIGNAL + "."
        return [n for n in names if not n.startswith(prefix) or n[len(prefix) :] not in ended]

    def receive(name: str | None = None) -> None:
        """The intake appends a signal (any time before the end); it is buffered."""
        if name is None:
            name = draw(
                st.sampled_from(sendable((*SIGNAL_NAMES, *map(child_signal, exp.children))))
            )
        if name.startswith(CHILD_SIGNAL + "."):
            child = name[len(CHILD_SIGNAL) + 1 :]
            ended.add(child)
            signal_id = f"child-end:{child}"
        else:
            signal_id = f"sig-{len(events)}"  # unique: the intake deduplicates by id
        e = emit(
            SignalReceived(
                name=name,
                payload=draw(raws),
                signal_id=signal_id,
                sent_by=draw(st.none() | st.just("hr-portal")),
            )
        )
        exp.signals.append(signal_record(e))

    def start_child(last: bool) -> None:
        """``ctx.start_child``, often followed at once by the wait for it (``ctx.child``)."""
        p = len(exp.ops)
        child = f"{run_id}-c{p}"
        name = draw(st.sampled_from(CHILD_AGENTS))
        emit(ChildStarted(position=p, child_run_id=child, agent=name))
        exp.ops.append(
            OpRecord(
                position=p,
                kind="child",
                name=name,
                status="completed",
                result=msgspec.Raw(msgspec.json.encode(child)),
            )
        )
        exp.children.append(child)
        if draw(st.booleans()):
            wait(last, awaited=child)

    def wait(last: bool, awaited: str | None = None) -> None:
        """``Context._wait``: done at once if it can be (a buffered signal, a passed deadline, an
        ended child), else parked (``WaitStarted``) and completed on a later activation.
        ``awaited``: a child run to wait for (``ChildHandle.result()``)."""
        p = len(exp.ops)
        shape = (
            "child"
            if awaited
            else draw(
                st.sampled_from(["sleep", "signal", "select", *(["child"] * bool(exp.children))])
            )
        )
        deadline = draw(st.none() | deadlines)
        children: tuple[str, ...] = ()
        signals: tuple[str, ...]
        if shape == "sleep":
            key, signals, deadline = "sleep", (), draw(deadlines)
        elif shape == "signal":
            name = draw(st.sampled_from(SIGNAL_NAMES))
            key, signals = f"signal:{name}", (name,)
        elif shape == "select":
            names = draw(st.lists(st.sampled_from(SIGNAL_NAMES), min_size=1, unique=True))
            key, signals = "select:" + "|".join(names), tuple(names)
        else:
            child = awaited or draw(st.sampled_from(exp.children))
            key, signals, children, deadline = (
                f"child:{child}",
                (child_signal(child),),
                (child,),
                None,
            )

        def buffered() -> SignalRecord | None:
            # The executor takes the oldest buffered signal the wait listens to, first.
            return next((r for r in exp.signals if r.name in signals), None)

        at_once: list[WaitOutcome] = []
        if deadline is not None:
            at_once.append("timeout")  # the deadline had already passed
        if children:
            at_once.append("child")  # the child had already ended
        parked = buffered() is None and (not at_once or draw(st.booleans()))
        outcome: WaitOutcome
        if parked:
            emit(
                WaitStarted(
                    position=p, key=key, signals=signals, deadline=deadline, children=children
                )
            )
            exp.ops.append(
                OpRecord(
                    position=p,
                    kind="wait",
                    name=key,
                    status="waiting",
                    signals=signals,
                    deadline=deadline,
                    children=children,
                )
            )
            exp.status = "waiting"
            exp.waiting_on = waiting_on(signals, children, deadline)
            exp.deadline = deadline
            for _ in range(draw(st.integers(0, 3))):  # while parked
                what = draw(st.sampled_from(["signal", "signal", "cancel", "pause"]))
                if what == "signal":
                    receive()
                elif what == "cancel":
                    cancel()
                else:
                    pause()  # e.g. parked by an operator, then resumed
            if last and draw(st.booleans()):
                return  # still parked
            if buffered() is not None:
                outcome = "signal"  # it woke the run
            else:
                outcome = draw(
                    st.sampled_from([*(["signal"] if sendable(signals) else []), *at_once])
                )
                if outcome == "signal":
                    receive(draw(st.sampled_from(sendable(signals))))
        else:
            outcome = "signal" if buffered() is not None else draw(st.sampled_from(at_once))
        rec = OpRecord(position=p, kind="wait", name=key, status="completed", outcome=outcome)
        if outcome == "signal":
            sig = buffered()
            assert sig is not None
            emit(
                WaitCompleted(
                    position=p,
                    key=key,
                    outcome="signal",
                    payload=sig.payload,
                    signal=sig.name,
                    signal_id=sig.signal_id,
                )
            )
            exp.signals.remove(sig)  # consumed
            rec = msgspec.structs.replace(rec, result=sig.payload, detail=sig.name)
        elif outcome == "timeout":
            emit(WaitCompleted(position=p, key=key, outcome="timeout", payload=NULL))
            rec = msgspec.structs.replace(rec, result=NULL)
        else:
            status = draw(st.sampled_from(CHILD_STATUSES))
            payload = draw(raws)
            emit(
                WaitCompleted(
                    position=p, key=key, outcome="child", payload=payload, child_status=status
                )
            )
            rec = msgspec.structs.replace(rec, result=payload, detail=status)
        if parked:
            exp.ops[p] = rec
        else:
            exp.ops.append(rec)
        exp.status = "running"
        exp.waiting_on, exp.deadline = (), None

    n = draw(st.integers(0, 10))
    actions = [
        "step",
        "step",
        "value",
        "cancel",
        "pause",
        "signal",
        "wait",
        "wait",
        "child",
        "child",
    ]
    for i in range(n):
        last = i == n - 1
        action = draw(st.sampled_from([*actions, *(["wait"] * 3 if last else [])]))
        p = len(exp.ops)
        if action == "step":
            name = draw(st.sampled_from(NAMES))
            attempts = draw(st.integers(1, 3))  # attempts > 1: in-doubt restarts
            for attempt in range(1, attempts + 1):
                if attempt > 1 and draw(st.booleans()):
                    pause()  # parked as in doubt, then released by a human
                limit = None
                if draw(st.integers(0, 3)) == 0:  # waited for a slot of a shared limit
                    limit = "api"
                    emit(StepThrottled(position=p, name=name, attempt=attempt, limit=limit, slot=5))
                emit(StepStarted(position=p, name=name, attempt=attempt, limit=limit))
                exp.status = "running"
            # Only the last operation may stay open: the code waits for a step to finish.
            outcome = draw(st.sampled_from(["completed", "failed", *(["open"] if last else [])]))
            # While open, every attempt before the last one was cut off mid-step; an ended step
            # keeps no count.
            rec = OpRecord(
                position=p,
                kind="step",
                name=name,
                status="started",
                attempts=attempts,
                interrupted=attempts - 1,
            )
            if outcome == "completed":
                result = draw(raws)
                emit(StepCompleted(position=p, name=name, attempt=attempts, result=result))
                rec = msgspec.structs.replace(rec, status="completed", result=result, interrupted=0)
            elif outcome == "failed":
                error = draw(errors)
                emit(StepFailed(position=p, name=name, attempt=attempts, error=error))
                rec = msgspec.structs.replace(rec, status="failed", error=error, interrupted=0)
            exp.ops.append(rec)
        elif action == "value":
            kind = draw(st.sampled_from(VALUE_KINDS))
            value = draw(raws)
            emit(ValueRecorded(position=p, kind=kind, value=value))
            exp.ops.append(
                OpRecord(position=p, kind=kind, name=kind, status="recorded", result=value)
            )
        elif action == "cancel":
            cancel()
        elif action == "signal":
            receive()
        elif action == "wait":
            wait(last)
        elif action == "child":
            start_child(last)
        else:
            pause()

    if draw(st.booleans()):  # an unmatched suspension (maybe ended by a cancel or a failure)
        reason = draw(st.sampled_from(SUSPEND_REASONS))
        emit(RunSuspended(reason=reason, detail="parked"))
        exp.status = "suspended"
        exp.suspended_reason = reason
    if draw(st.booleans()):
        receive()  # a signal may arrive up to the end (suspended or not)
    terminal = draw(st.sampled_from([None, "completed", "failed", "cancelled"]))
    if terminal == "completed":
        exp.output = draw(raws)
        emit(RunCompleted(output=exp.output))
    elif terminal == "failed":
        exp.error = draw(errors)
        emit(RunFailed(error=exp.error))
    elif terminal == "cancelled":
        reason = draw(st.sampled_from(["", "user asked"]))
        emit(RunCancelled(reason=reason))
        exp.cancel_requested = reason or "cancelled"
    if terminal is not None:
        exp.status = terminal
    return events, exp


# --- arbitrary sequences ----------------------------------------------------------------------

positions = st.integers(-2, 5)
attempts = st.integers(0, 3)
# Few keys, names and ids, so that arbitrary events often refer to each other (a completion
# matching a wait, a signal id consumed, received twice, ...).
wait_keys = st.sampled_from(
    ["sleep", "poll", "signal:approve", "select:approve|docs.signed", "child:c0"]
)
signal_ids = st.sampled_from(["s0", "s1", "s2"])
child_ids = st.sampled_from(["c0", "c1"])
counts = st.integers(0, 10**6)
usages: st.SearchStrategy[Usage] = st.builds(
    Usage,
    input_tokens=counts,
    output_tokens=counts,
    usd=st.floats(0, 100, allow_nan=False),
    requests=st.integers(0, 5),
    model=st.none() | st.sampled_from(["m1", "m2"]),
)
limits_int = st.none() | st.integers(1, 10**9)
budgets: st.SearchStrategy[Budget] = st.builds(
    Budget,
    usd=st.none() | st.floats(0.01, 1e6, allow_nan=False),
    tokens=limits_int,
    input_tokens=limits_int,
    output_tokens=limits_int,
    steps=limits_int,
    tool_calls=limits_int,
    polls=limits_int,
    wall_seconds=st.none() | st.floats(1, 1e9, allow_nan=False),
)
concurrency_keys = st.sampled_from(["tenant-1", "t:2"])
concurrencies: st.SearchStrategy[ConcurrencyInfo] = st.builds(
    ConcurrencyInfo, key=concurrency_keys, limit=st.integers(1, 3), ticket=st.integers(0, 9)
)
"""A run's concurrency key (decision 0048): ``ticket`` 0 took a slot at its start, else it
was queued."""
ARBITRARY: dict[type, st.SearchStrategy[Any]] = {
    RunStarted: st.builds(
        RunStarted,
        run_id=st.sampled_from(["r1", "r2"]),
        agent=st.just("a"),
        input=raws,
        parent_run_id=st.none() | st.just("p"),
        concurrency=st.none() | concurrencies,
    ),
    RunCompleted: st.builds(RunCompleted, output=raws),
    RunFailed: st.builds(RunFailed, error=errors),
    CancelRequested: st.builds(
        CancelRequested, reason=st.sampled_from(["", "x"]), terminate=st.booleans()
    ),
    CancelTaken: st.builds(
        CancelTaken,
        reason=st.sampled_from(["", "x"]),
        stopped_at=st.integers(0, 5),
        compensate_at=st.integers(0, 6),
    ),
    BudgetChanged: st.builds(BudgetChanged, budget=budgets),
    PauseRequested: st.builds(PauseRequested, reason=st.sampled_from(["", "x"])),
    PauseLifted: st.builds(PauseLifted),
    RunCancelled: st.builds(RunCancelled, reason=st.sampled_from(["", "y"])),
    RunSuspended: st.builds(
        RunSuspended, reason=st.sampled_from(SUSPEND_REASONS), detail=st.just("d")
    ),
    RunResumed: st.builds(RunResumed),
    RunAdmitted: st.builds(RunAdmitted, key=concurrency_keys, ticket=st.integers(0, 9)),
    StepStarted: st.builds(
        StepStarted,
        position=positions,
        name=st.sampled_from(NAMES),
        attempt=attempts,
        kind=st.sampled_from(STEP_KINDS),
    ),
    StepCompleted: st.builds(
        StepCompleted,
        position=positions,
        name=st.sampled_from(NAMES),
        attempt=attempts,
        result=raws,
        usage=st.none() | usages,
    ),
    StepFailed: st.builds(
        StepFailed,
        position=positions,
        name=st.sampled_from(NAMES),
        attempt=attempts,
        error=errors,
        retry_at=st.none() | st.sampled_from([0.0, 5.0]),
        usage=st.none() | usages,
    ),
    StepThrottled: st.builds(
        StepThrottled,
        position=positions,
        name=st.sampled_from(NAMES),
        attempt=attempts,
        limit=st.sampled_from(["api", "openai"]),
        slot=st.sampled_from([0.0, 5.0]),
        epoch=st.integers(0, 2),
    ),
    ValueRecorded: st.builds(
        ValueRecorded, position=positions, kind=st.sampled_from(VALUE_KINDS), value=raws
    ),
    WaitStarted: st.builds(
        WaitStarted,
        position=positions,
        key=wait_keys,
        signals=st.lists(st.sampled_from(SIGNAL_NAMES), max_size=2).map(tuple),
        deadline=st.none() | st.sampled_from([0.0, 5.0]),
        children=st.lists(child_ids, max_size=2).map(tuple),
    ),
    WaitCompleted: st.builds(
        WaitCompleted,
        position=positions,
        key=wait_keys,
        outcome=st.sampled_from(WAIT_OUTCOMES),
        payload=raws,
        signal=st.none() | st.sampled_from(SIGNAL_NAMES),
        signal_id=st.none() | signal_ids,
        child_status=st.none() | st.sampled_from(CHILD_STATUSES),
    ),
    SignalReceived: st.builds(
        SignalReceived,
        name=st.sampled_from(SIGNAL_NAMES),
        payload=raws,
        signal_id=signal_ids,
        sent_by=st.none() | st.just("x"),
    ),
    ChildStarted: st.builds(
        ChildStarted,
        position=positions,
        child_run_id=child_ids,
        agent=st.sampled_from(CHILD_AGENTS),
    ),
    UpdateRequested: st.builds(
        UpdateRequested,
        update_id=update_ids,
        name=st.sampled_from(UPDATE_NAMES),
        payload=raws,
        sent_by=st.none() | st.just("x"),
    ),
    UpdateCompleted: st.builds(
        UpdateCompleted,
        update_id=update_ids,
        name=st.sampled_from(UPDATE_NAMES),
        position=positions,
        answer=raws,
        error=st.none() | errors,
    ),
    UpdateRejected: st.builds(
        UpdateRejected,
        update_id=update_ids,
        name=st.sampled_from(UPDATE_NAMES),
        code=st.sampled_from(["rejected", "unknown_update"]),
    ),
}
"""One strategy per member of the ``RunEvent`` union (checked by a test below)."""

any_event: st.SearchStrategy[RunEvent] = st.one_of(*ARBITRARY.values()).flatmap(
    lambda e: st.floats(0, 1e6, allow_nan=False).map(lambda at: msgspec.structs.replace(e, at=at))
)


REWRITES: dict[type, dict[str, st.SearchStrategy[Any]]] = {
    StepStarted: {"name": st.sampled_from(NAMES), "attempt": attempts},
    StepCompleted: {"name": st.sampled_from(NAMES), "result": raws},
    StepFailed: {"name": st.sampled_from(NAMES), "error": errors},
    StepThrottled: {"name": st.sampled_from(NAMES), "slot": st.sampled_from([1.0, 7.0])},
    ValueRecorded: {"kind": st.sampled_from(VALUE_KINDS), "value": raws},
    WaitStarted: {"key": wait_keys, "deadline": st.none() | deadlines},
    WaitCompleted: {"key": wait_keys, "outcome": st.sampled_from(WAIT_OUTCOMES), "payload": raws},
    ChildStarted: {"child_run_id": child_ids, "agent": st.sampled_from(CHILD_AGENTS)},
}
"""For an operation event: fields to change in a later, conflicting event at its position."""


@st.composite
def mutated_histories(draw: st.DrawFn) -> list[RunEvent]:
    """A valid history with arbitrary events inserted and some events dropped or duplicated, or
    contradicted (a later event at the same position that says something else): reaches the
    deep states a random sequence rarely gets to."""
    events = list(draw(valid_histories())[0])
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(events)))
        edit = draw(
            st.sampled_from(
                ["insert", "drop", "duplicate", "end early", "suspend", "rewrite", "rewrite"]
            )
        )
        if edit == "end early":  # well-placed operations follow the terminal event
            events.insert(i, draw(st.sampled_from(ARBITRARY_TERMINAL)))
        elif edit == "insert":
            events.insert(i, draw(any_event))
        elif events and edit == "drop":
            del events[min(i, len(events) - 1)]
        elif edit == "suspend":  # an operator's suspension racing the worker
            events.insert(i, RunSuspended(reason="manual", detail="operator"))
        elif edit == "rewrite":
            op_indices = [k for k, e in enumerate(events) if isinstance(e, OP_EVENTS)]
            if op_indices:
                j = draw(st.sampled_from(op_indices))
                fields = REWRITES[type(events[j])]
                name = draw(st.sampled_from(sorted(fields)))
                other = msgspec.structs.replace(events[j], **{name: draw(fields[name])})
                # anywhere after the position opened (e.g. while its wait is still parked)
                p = events[j].position  # type: ignore[union-attr]
                first = next(
                    k for k, e in enumerate(events) if isinstance(e, OP_EVENTS) and e.position == p
                )
                events.insert(draw(st.integers(first + 1, len(events))), other)
        elif events:
            j = min(i, len(events) - 1)
            events.insert(draw(st.integers(j, len(events))), events[j])
    return events


ARBITRARY_TERMINAL: tuple[RunEvent, ...] = (
    RunCompleted(output=msgspec.Raw(b"0")),
    RunFailed(error=ErrorInfo(type="E", message="m")),
    RunCancelled(),
)
ARBITRARY_TERMINAL_TYPES = (RunCompleted, RunFailed, RunCancelled)
arbitrary_histories = st.one_of(st.lists(any_event, max_size=30), mutated_histories())
any_histories = st.one_of(arbitrary_histories, valid_histories().map(lambda he: he[0]))


# --- many buffered signals --------------------------------------------------------------------

START = RunStarted(run_id="r1", agent="greeter", input=msgspec.Raw(b'{"name":"Ada"}'), at=10.0)


@st.composite
def signal_histories(draw: st.DrawFn) -> list[RunEvent]:
    """Signal-heavy sequences: many signals (ids and names reused, so some arrive twice),
    waits that take them by id (or name an id never buffered), child waits that the children's
    end notices may end, child starts, a cancel, sometimes an end with events after it."""
    events: list[RunEvent] = []

    def emit(event: E) -> None:
        events.append(msgspec.structs.replace(event, at=float(len(events))))

    emit(START)
    ids = st.sampled_from([f"s{i}" for i in range(6)])
    names = st.sampled_from((*SIGNAL_NAMES, child_signal("c0"), child_signal("c1")))
    p = 0
    open_wait: WaitStarted | None = None
    for _ in range(draw(st.integers(0, 60))):
        what = draw(
            st.sampled_from(["signal"] * 5 + ["take"] * 3 + ["park", "child", "cancel", "end"])
        )
        if what == "signal":
            emit(SignalReceived(name=draw(names), payload=draw(raws), signal_id=draw(ids)))
        elif what == "take":
            key = open_wait.key if open_wait is not None else "signal:approve"
            emit(
                WaitCompleted(
                    position=open_wait.position if open_wait is not None else p,
                    key=key,
                    outcome=draw(st.sampled_from(["signal", "signal", "child", "timeout"])),
                    payload=draw(raws),
                    signal=draw(st.none() | names),
                    signal_id=draw(st.none() | ids),
                )
            )
            if open_wait is None:
                p += 1
            open_wait = None
        elif what == "park" and open_wait is None:
            child = draw(child_ids)
            open_wait = WaitStarted(
                position=p,
                key=f"child:{child}",
                signals=(child_signal(child),),
                children=(child,),
                deadline=draw(st.none() | st.just(5.0)),
            )
            emit(open_wait)
            p += 1
        elif what == "child" and open_wait is None:
            emit(ChildStarted(position=p, child_run_id=draw(child_ids), agent="mailer"))
            p += 1
        elif what == "cancel":
            emit(CancelRequested(reason="x"))
        elif what == "end" and draw(st.booleans()):
            emit(draw(st.sampled_from(ARBITRARY_TERMINAL)))
    return events


# --- strategies derived from the schema itself ------------------------------------------------
# Built from msgspec's own view of each type, so a new event or field is covered without
# touching this file (a field of a kind not handled below fails loudly).

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
json_raws = json_values.map(lambda v: msgspec.Raw(msgspec.json.encode(v)))


def strategy_for(t: mi.Type) -> st.SearchStrategy[Any]:
    match t:
        case mi.NoneType():
            return st.none()
        case mi.BoolType():
            return st.booleans()
        case mi.IntType():
            return st.integers(-(2**63), 2**63 - 1)
        case mi.FloatType():
            return st.floats(allow_nan=False, allow_infinity=False)
        case mi.StrType():
            return st.text(max_size=8)
        case mi.BytesType():
            return st.binary(max_size=16)
        case mi.RawType():
            return json_raws
        case mi.LiteralType():
            return st.sampled_from(t.values)
        case mi.UnionType():
            return st.one_of(*(strategy_for(u) for u in t.types))
        case mi.VarTupleType():
            return st.lists(strategy_for(t.item_type), max_size=3).map(tuple)
        case mi.DictType():
            return st.dictionaries(strategy_for(t.key_type), strategy_for(t.value_type), max_size=3)
        case mi.StructType() if t.cls in VALIDATED:
            return VALIDATED[t.cls]
        case mi.StructType():
            required = {f.name: strategy_for(f.type) for f in t.fields if f.required}
            optional = {f.name: strategy_for(f.type) for f in t.fields if not f.required}
            return st.fixed_dictionaries(required, optional=optional).map(lambda kw: t.cls(**kw))
    raise NotImplementedError(f"no strategy for {t!r}: add one to strategy_for")


VALIDATED: dict[type, st.SearchStrategy[Any]] = {
    Carried: st.builds(
        Carried,
        usd=st.floats(0, 100, allow_nan=False),
        tokens=counts,
        steps=counts,
        started_at=st.floats(0, 1e9, allow_nan=False),
    ),
    Budget: budgets,
    BudgetBody: budgets.map(lambda b: BudgetBody(**msgspec.structs.asdict(b))),
    Usage: usages,
}
"""Structs whose fields are validated on construction: drawn valid."""


def struct_strategy(cls: type[Any]) -> st.SearchStrategy[Any]:
    return strategy_for(mi.type_info(cls))


schema_events: st.SearchStrategy[Any] = st.one_of(*(struct_strategy(cls) for cls in EVENT_TYPES))
"""Any event, every field drawn from its schema type (a new event or field is covered)."""


# --- wait keys and what a run waits on --------------------------------------------------------

_TOKEN_ALPHABET = "abcXYZ019_-"
tokens = st.text(_TOKEN_ALPHABET, min_size=1, max_size=6)
signal_names = st.lists(tokens, min_size=1, max_size=3).map(".".join)
"""Valid signal names: dot-separated tokens (``validate_signal_name``)."""
run_ids = st.builds(
    lambda t, c: f"{t}-c{c}" if c is not None else t, tokens, st.none() | st.integers(0, 99)
)
"""Valid run ids, parents' and children's (one token each)."""

wait_keys_typed: st.SearchStrategy[WaitKey] = st.one_of(
    st.just(WaitKey.sleep()),
    st.just(WaitKey.poll()),
    signal_names.map(WaitKey.signal),
    st.lists(signal_names, min_size=1, max_size=4).map(lambda ns: WaitKey.select(*ns)),
    run_ids.map(WaitKey.child),
)
"""Every key a writer of today makes, through the constructors."""

waiting_entries: st.SearchStrategy[WaitingOn] = st.one_of(
    signal_names.map(WaitingOn.signal),
    run_ids.map(WaitingOn.run),
    st.just(WaitingOn.timer()),
    st.sampled_from(NAMES).map(WaitingOn.retry),
    st.sampled_from(["api", "openai"]).map(WaitingOn.limit),
)
"""Every entry of ``waiting_on`` a fold makes, through the constructors."""
