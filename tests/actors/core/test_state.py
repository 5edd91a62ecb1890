"""The pure fold: ``evolve(state, event)`` and its fast twin ``fold(events)``.

Two kinds of generated histories drive the properties:

* *valid* histories, built the way a worker writes them (RunStarted first, operations at
  contiguous positions, in-doubt retries, suspend/resume pairs, durable waits that park and
  complete, buffered signals consumed by waits, child runs, at most one terminal event),
  together with what the generator knows the state must be;
* *arbitrary* sequences (any event, any order, any position), on which the fold must stay total
  and ``fold`` must still equal ``reduce(evolve)``.
"""

from __future__ import annotations

import functools
import time
from typing import get_args

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sojourn.actors.core.state import TERMINAL, OpRecord, RunState, SignalRecord, evolve, fold
from sojourn.schemas.events import (
    BudgetChanged,
    CancelRequested,
    CancelTaken,
    ChildStarted,
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
    ValueRecorded,
    WaitCompleted,
    WaitStarted,
)
from tests.strategies import (
    ARBITRARY,
    ARBITRARY_TERMINAL_TYPES,
    CHILD_SIGNAL,
    NULL,
    OP_EVENTS,
    START,
    Expected,
    OpEvent,
    any_histories,
    arbitrary_histories,
    child_signal,
    signal_histories,
    signal_record,
    valid_histories,
    waiting_on,
)

# The strategies (valid, arbitrary and signal-heavy histories) live in tests/strategies.py,
# shared with the journal's and the run summary's tests.


def reduce_evolve(events: list[RunEvent], state: RunState | None = None) -> RunState:
    return functools.reduce(evolve, events, state or RunState())


def test_the_arbitrary_strategy_covers_every_event_type() -> None:
    assert set(ARBITRARY) == set(get_args(RunEvent))


def test_the_op_events_here_are_the_operation_events_of_the_union() -> None:
    # Every event with a position is an operation of the agent's code, but an update's
    # decision, whose position is the wait it was applied at (decision 0042).
    positional = {t for t in get_args(RunEvent) if "position" in t.__struct_fields__}
    assert positional - {UpdateCompleted} == set(OP_EVENTS)


# --- fold equals reduce(evolve) ---------------------------------------------------------------


@given(any_histories, st.data())
def test_fold_equals_reduce_of_evolve_at_once_or_in_two_chunks(
    events: list[RunEvent], data: st.DataObject
) -> None:
    once = fold(events)
    assert once == reduce_evolve(events)  # evolve is total: reduce raising fails this too
    cut = data.draw(st.integers(0, len(events)), label="cut")
    a, b = events[:cut], events[cut:]
    assert fold(b, fold(a)) == once
    assert reduce_evolve(b, fold(a)) == once
    assert fold(b, reduce_evolve(a)) == once


def test_fold_accepts_an_iterator() -> None:
    events: list[RunEvent] = [
        RunStarted(run_id="r", agent="a", input=msgspec.Raw(b"1")),
        StepStarted(position=0, name="s"),
    ]
    assert fold(iter(events)) == fold(events)
    assert fold(e for e in events) == reduce_evolve(events)


# --- properties of valid histories ------------------------------------------------------------


@given(valid_histories())
def test_a_valid_history_folds_to_what_was_written(
    history: tuple[list[RunEvent], Expected],
) -> None:
    events, exp = history
    state = fold(events)
    assert state == reduce_evolve(events)
    assert state.anomalies == ()
    assert state.run_id == exp.run_id
    assert state.agent == exp.agent
    assert state.input == exp.input
    assert state.parent_run_id == exp.parent_run_id
    assert state.status == exp.status
    assert state.terminal == (exp.status in TERMINAL)
    assert state.ops == tuple(exp.ops)
    assert state.output == exp.output
    assert state.error == exp.error
    assert state.cancel_requested == exp.cancel_requested
    assert state.waiting_on == exp.waiting_on
    assert state.deadline == exp.deadline
    assert state.signals == tuple(exp.signals)
    assert state.children == tuple(exp.children)
    assert state.events == len(events)
    assert state.steps_completed == sum(isinstance(e, StepCompleted) for e in events)
    assert state.step_attempts == sum(isinstance(e, StepStarted) for e in events)
    assert state.started_at == events[0].at
    assert state.updated_at == events[-1].at
    assert state.ended_at == (events[-1].at if state.terminal else None)
    if exp.status == "suspended":
        assert state.suspended_reason == exp.suspended_reason

    # Each position holds its latest event (read from the events, not the bookkeeping above).
    latest: dict[int, OpEvent] = {}
    for e in events:
        if isinstance(e, OP_EVENTS):
            latest[e.position] = e
    assert len(state.ops) == len(latest)
    for p, e in latest.items():
        op = state.op(p)
        assert op is not None
        assert op.position == p
        match e:
            case ValueRecorded():
                assert (op.kind, op.status, op.result) == (e.kind, "recorded", e.value)
            case WaitStarted():
                assert (op.kind, op.name, op.status) == ("wait", e.key, "waiting")
                assert (op.signals, op.deadline, op.children) == (e.signals, e.deadline, e.children)
            case WaitCompleted():
                assert (op.kind, op.name, op.status) == ("wait", e.key, "completed")
                assert (op.outcome, op.result) == (e.outcome, e.payload)
            case ChildStarted():
                assert (op.kind, op.name, op.status) == ("child", e.agent, "completed")
                assert op.result is not None
                assert msgspec.json.decode(op.result) == e.child_run_id
            case StepThrottled():  # attempts: those made before it, none yet for this one
                assert (op.kind, op.name, op.attempts) == ("step", e.name, e.attempt - 1)
                assert (op.status, op.limit, op.deadline, op.epoch) == (
                    "throttled",
                    e.limit,
                    e.slot,
                    e.epoch,
                )
            case _:
                assert (op.kind, op.name, op.attempts) == ("step", e.name, e.attempt)
                assert op.status == {StepStarted: "started", StepCompleted: "completed"}.get(
                    type(e), "failed"
                )

    # Buffered signals: received and not consumed, in arrival order (from the events alone).
    consumed = {e.signal_id for e in events if isinstance(e, WaitCompleted)}
    received = [signal_record(e) for e in events if isinstance(e, SignalReceived)]
    assert state.signals == tuple(r for r in received if r.signal_id not in consumed)
    # A run is parked iff its last operation is an open wait (or a step waiting for a slot).
    open_wait = bool(state.ops) and state.ops[-1].status in ("waiting", "throttled")
    assert (state.waiting_on != ()) == open_wait
    if state.status == "waiting":
        assert open_wait


@given(valid_histories())
def test_status_along_a_valid_history(history: tuple[list[RunEvent], Expected]) -> None:
    """Every prefix of a valid history is valid: check the status after each event."""
    events, _ = history
    state = RunState()
    assert state.status == "new"
    for event in events:
        before = state
        state = evolve(state, event)
        assert state.anomalies == ()
        assert state.signals == before.signals or isinstance(event, (SignalReceived, WaitCompleted))
        match event:
            case RunStarted():
                assert state.status == "pending"
            case StepStarted() | StepCompleted() | StepFailed():
                assert state.status == "running"
            case StepThrottled():
                parked = "suspended" if before.status == "suspended" else "waiting"
                assert state.status == parked
                assert (state.waiting_on, state.deadline) == ((f"limit:{event.limit}",), event.slot)
            case ValueRecorded() | CancelRequested():
                assert state.status == before.status
            case WaitStarted():
                parked = "suspended" if before.status == "suspended" else "waiting"
                assert state.status == parked
                assert state.waiting_on == waiting_on(event.signals, event.children, event.deadline)
                assert state.deadline == event.deadline
                assert state.op(event.position) == OpRecord(
                    position=event.position,
                    kind="wait",
                    name=event.key,
                    status="waiting",
                    signals=event.signals,
                    deadline=event.deadline,
                    children=event.children,
                )
            case WaitCompleted():
                assert state.status == "running"
                assert (state.waiting_on, state.deadline) == ((), None)
                assert state.op(event.position) == OpRecord(
                    position=event.position,
                    kind="wait",
                    name=event.key,
                    status="completed",
                    result=event.payload,
                    outcome=event.outcome,
                    detail=event.signal if event.outcome == "signal" else event.child_status,
                )
                if event.outcome == "signal":
                    # it consumed exactly one buffered signal: the one it names
                    (sig,) = [r for r in before.signals if r.signal_id == event.signal_id]
                    assert (sig.name, sig.payload) == (event.signal, event.payload)
                    assert state.signals == tuple(r for r in before.signals if r is not sig)
                else:
                    assert state.signals == before.signals
            case SignalReceived():
                assert state.status == before.status
                assert state.signals == (*before.signals, signal_record(event))
            case ChildStarted():
                assert state.status == before.status
                assert state.children == (*before.children, event.child_run_id)
                assert state.op(event.position) == OpRecord(
                    position=event.position,
                    kind="child",
                    name=event.agent,
                    status="completed",
                    result=msgspec.Raw(msgspec.json.encode(event.child_run_id)),
                )
            case RunSuspended():
                assert state.status == "suspended"
            case RunResumed():
                assert state.status == "pending"
            case RunCompleted():
                assert state.status == "completed"
            case RunFailed():
                assert state.status == "failed"
            case RunCancelled():
                assert state.status == "cancelled"
        # The same wait event while an operator holds the run suspended keeps it suspended.
        if isinstance(event, (WaitStarted, WaitCompleted)):
            held = evolve(evolve(before, RunSuspended(reason="manual", detail="op")), event)
            assert (held.status, held.anomalies) == ("suspended", ())
        # ... and what may not follow: an open wait completes under its own key, and once.
        if isinstance(event, WaitStarted):
            other = WaitCompleted(
                position=event.position, key=f"{event.key}!", outcome="timeout", payload=NULL
            )
            assert evolve(state, other).anomalies == (
                f"wait {event.position} completed over wait {event.key} (waiting)",
            )
        if isinstance(event, WaitCompleted):
            assert evolve(state, event).anomalies == (
                f"wait {event.position} completed over wait {event.key} (completed)",
            )
        # a step that waited for a slot of a limit stops waiting as it starts
        slot = (f"limit:{event.limit}",) if isinstance(event, StepStarted) else None
        took_slot = slot is not None and before.waiting_on == slot
        if took_slot:
            assert (state.waiting_on, state.deadline) == ((), None)
        elif not isinstance(event, (WaitStarted, WaitCompleted, StepThrottled)):
            assert (state.waiting_on, state.deadline) == (before.waiting_on, before.deadline)
        if not isinstance(event, ChildStarted):
            assert state.children == before.children


# --- arbitrary sequences, event by event ------------------------------------------------------

BOOKKEEPING = {"events", "updated_at", "anomalies"}
SPENDING = {"spent_usd", "spent_tokens", "spent_input_tokens", "spent_output_tokens"}
"""What a step attempt's charged ``usage`` adds to."""
MAY_CHANGE: dict[type, set[str]] = {
    RunStarted: {"run_id", "agent", "code_version", "input", "status", "started_at"}
    | {"parent_run_id", "budget_usd", "budget_tokens", "budget", "carried"}
    | {"concurrency", "waiting_on"},  # a run queued on its concurrency key (decision 0048)
    RunAdmitted: {"waiting_on", "deadline"},  # out of its key's queue
    BudgetChanged: {"budget"},
    PauseRequested: {"pause"},
    PauseLifted: {"pause"},
    RunCompleted: {"status", "output", "ended_at"},
    RunFailed: {"status", "error", "ended_at"},
    CancelRequested: {"cancel_requested", "terminate_requested"},
    CancelTaken: {"cancel_taken"},
    RunCancelled: {"status", "ended_at", "cancel_requested"},
    RunSuspended: {"status", "suspended_reason", "suspended_detail"},
    RunResumed: {"status", "suspended_reason", "suspended_detail", "cap_resumes", "pause"}
    | {"budget_resumes"},  # a resume after a cap or a budget suspension grants another allowance
    StepStarted: {"ops", "status", "step_attempts", "waiting_on", "deadline"}  # a retry began
    | {"model_calls"},
    StepCompleted: {"ops", "status", "steps_completed"} | SPENDING,
    StepFailed: {"ops", "status", "waiting_on", "deadline"} | SPENDING,  # ``retry_at``: backing off
    StepThrottled: {"ops", "status", "waiting_on", "deadline"},  # waiting for a slot of a limit
    ValueRecorded: {"ops", "spent_usd", "spent_tokens"},  # a ``spend`` value adds to the spend
    WaitStarted: {"ops", "status", "waiting_on", "deadline"},
    WaitCompleted: {"ops", "status", "waiting_on", "deadline", "signals"},
    SignalReceived: {"signals"},
    ChildStarted: {"ops", "children"},
    UpdateRequested: {"updates"},
    UpdateCompleted: {"updates"},
    UpdateRejected: {"updates"},
}
"""The fields of the state each event may change (besides the bookkeeping)."""


def test_every_event_type_says_what_it_may_change() -> None:
    assert set(MAY_CHANGE) == set(get_args(RunEvent))


def _changed(before: RunState, after: RunState) -> set[str]:
    a, b = msgspec.structs.asdict(before), msgspec.structs.asdict(after)
    return {k for k in a if a[k] != b[k]} - BOOKKEEPING


@given(arbitrary_histories)
def test_evolve_is_total_and_nothing_after_the_end_changes_the_outcome(
    events: list[RunEvent],
) -> None:
    state = RunState()
    for event in events:
        before, state = state, evolve(state, event)  # never raises
        assert state.events == before.events + 1
        assert state.updated_at == event.at
        assert [op.position for op in state.ops] == list(range(len(state.ops)))
        if not before.terminal:
            continue
        # Only the bookkeeping moves; status, output, error, ops, ... stay as they were.
        rest = msgspec.structs.replace(
            state, events=before.events, updated_at=before.updated_at, anomalies=before.anomalies
        )
        assert rest == before
        assert state.events == before.events + 1
        if isinstance(event, CancelRequested):
            assert state.anomalies == before.anomalies  # ignored: the run already ended
        else:
            assert state.anomalies[:-1] == before.anomalies
            assert len(state.anomalies) == len(before.anomalies) + 1
            assert "after the run ended" in state.anomalies[-1]


def check_frame(before: RunState, state: RunState, event: RunEvent) -> None:
    """Each event changes only what it may (``MAY_CHANGE``); an anomaly changes nothing."""
    changed = _changed(before, state)
    assert state.anomalies[: len(before.anomalies)] == before.anomalies
    if len(state.anomalies) > len(before.anomalies):
        assert len(state.anomalies) == len(before.anomalies) + 1
        assert changed == set(), state.anomalies[-1]
    else:
        assert changed <= MAY_CHANGE[type(event)]


def check_never_rewritten(before: RunState, state: RunState, event: RunEvent) -> None:
    """What replay was handed is final: a completed step, a recorded value, a completed wait and
    a started child; a waiting wait only ever becomes that wait completed."""
    assert len(state.ops) >= len(before.ops)
    for old, new in zip(before.ops, state.ops, strict=False):
        if old.status in ("completed", "recorded"):
            assert new == old
        elif old.status == "waiting" and new != old:
            assert isinstance(event, WaitCompleted)
            assert (new.kind, new.name, new.status) == ("wait", old.name, "completed")


def check_waiting(before: RunState, state: RunState, event: RunEvent) -> None:
    # Only a human (``RunResumed``) lifts a suspension; the end of the run replaces it.
    if before.status == "suspended" and state.status != "suspended":
        assert isinstance(event, (RunResumed, *ARBITRARY_TERMINAL_TYPES))
    # A deadline is what a timer, a retry backoff or a limit's slot waits for, and only a
    # deadline is.
    timed = [w for w in state.waiting_on if w == "timer" or w.startswith(("retry:", "limit:"))]
    assert bool(timed) == (state.deadline is not None)
    # Only a WaitStarted, a failed attempt with a retry due or a step waiting for a slot of
    # a limit makes a run wait, and each leaves its operation behind.
    if state.status == "waiting":
        assert any(
            op.status in ("waiting", "throttled")
            or (op.status == "failed" and op.deadline is not None)
            for op in state.ops
        )
    # The children are the run ids recorded by the child operations, in order.
    assert state.children == tuple(
        msgspec.json.decode(op.result or b"") for op in state.ops if op.kind == "child"
    )


def check_signals(
    before: RunState, state: RunState, event: RunEvent, received: list[SignalRecord]
) -> None:
    # Buffered signals are received ones, in arrival order (a subsequence).
    it = iter(received)
    assert all(any(r == x for x in it) for r in state.signals)
    # A completion that fits removes the signal it consumed (and only that one).
    accepted = len(state.anomalies) == len(before.anomalies)
    if isinstance(event, WaitCompleted) and accepted and event.signal_id is not None:
        assert all(r.signal_id != event.signal_id for r in state.signals)
    if not isinstance(event, (SignalReceived, WaitCompleted)):
        assert state.signals == before.signals


@given(arbitrary_histories)
def test_invariants_event_by_event(events: list[RunEvent]) -> None:
    """The ``check_*`` properties above, after every event of arbitrary sequences (one walk:
    generating the sequences is what costs)."""
    state = RunState()
    received: list[SignalRecord] = []
    for event in events:
        before, state = state, evolve(state, event)
        if isinstance(event, SignalReceived) and not before.terminal:
            received.append(signal_record(event))
        check_frame(before, state, event)
        check_never_rewritten(before, state, event)
        check_waiting(before, state, event)
        check_signals(before, state, event, received)


# --- examples ---------------------------------------------------------------------------------

R1 = msgspec.Raw(b"1")


def test_a_new_state() -> None:
    s = RunState()
    assert (s.status, s.terminal, s.ops, s.events, s.anomalies) == ("new", False, (), 0, ())
    assert s.op(0) is None
    assert s.op(-1) is None


def test_a_completed_run() -> None:
    events: list[RunEvent] = [
        START,
        StepStarted(position=0, name="fetch", at=11.0),
        StepCompleted(position=0, name="fetch", result=msgspec.Raw(b'"page"'), at=12.0),
        ValueRecorded(position=1, kind="now", value=msgspec.Raw(b'"2024-01-01T00:00:00Z"')),
        StepStarted(position=2, name="send", at=13.0),
        StepStarted(position=2, name="send", attempt=2, at=14.0),
        StepCompleted(position=2, name="send", attempt=2, result=R1, at=15.0),
        RunCompleted(output=msgspec.Raw(b'"done"'), at=16.0),
    ]
    assert fold(events) == RunState(
        run_id="r1",
        agent="greeter",
        status="completed",
        input=msgspec.Raw(b'{"name":"Ada"}'),
        output=msgspec.Raw(b'"done"'),
        started_at=10.0,
        ended_at=16.0,
        updated_at=16.0,
        ops=(
            OpRecord(
                position=0,
                kind="step",
                name="fetch",
                status="completed",
                attempts=1,
                result=msgspec.Raw(b'"page"'),
            ),
            OpRecord(
                position=1,
                kind="now",
                name="now",
                status="recorded",
                result=msgspec.Raw(b'"2024-01-01T00:00:00Z"'),
            ),
            OpRecord(
                position=2, kind="step", name="send", status="completed", attempts=2, result=R1
            ),
        ),
        steps_completed=2,
        step_attempts=3,
        events=8,
    )


def test_an_in_doubt_step_and_a_failed_step() -> None:
    boom = ErrorInfo(type="ValueError", message="boom")
    state = fold(
        [
            START,
            StepStarted(position=0, name="charge"),
            StepFailed(position=0, name="charge", error=boom),
            StepStarted(position=1, name="refund", attempt=1),
        ]
    )
    assert state.status == "running"
    assert state.ops == (
        OpRecord(position=0, kind="step", name="charge", status="failed", attempts=1, error=boom),
        OpRecord(position=1, kind="step", name="refund", status="started", attempts=1),
    )
    assert state.steps_completed == 0
    assert state.anomalies == ()


def test_suspend_resume_and_cancel() -> None:
    suspended = fold([START, RunSuspended(reason="in_doubt", detail="step 0 may have run")])
    assert suspended.status == "suspended"
    assert (suspended.suspended_reason, suspended.suspended_detail) == (
        "in_doubt",
        "step 0 may have run",
    )
    resumed = evolve(suspended, RunResumed(by="ops"))
    assert (resumed.status, resumed.suspended_reason, resumed.suspended_detail) == (
        "pending",
        None,
        None,
    )
    assert resumed.anomalies == ()
    asked = evolve(resumed, CancelRequested(reason="user"))
    assert (asked.status, asked.cancel_requested) == ("pending", "user")
    done = evolve(asked, RunCancelled(at=99.0))
    assert (done.status, done.cancel_requested, done.ended_at) == ("cancelled", "cancelled", 99.0)


def test_a_step_event_while_suspended_keeps_the_run_suspended() -> None:
    state = fold(
        [START, RunSuspended(reason="manual", detail="x"), StepStarted(position=0, name="a")]
    )
    assert state.status == "suspended"
    assert state.anomalies == ()


@pytest.mark.parametrize(
    "late",
    [
        StepStarted(position=0, name="more"),
        StepCompleted(position=0, name="more", result=R1),
        StepFailed(position=0, name="more", error=ErrorInfo(type="E", message="m")),
        ValueRecorded(position=0, kind="now", value=R1),
        RunCompleted(output=msgspec.Raw(b"2")),
        RunFailed(error=ErrorInfo(type="E", message="m")),
        RunSuspended(reason="manual", detail="x"),
        RunResumed(),
        RunStarted(run_id="r1", agent="greeter", input=R1),
        WaitStarted(position=0, key="sleep", deadline=1.0),
        WaitCompleted(position=0, key="sleep", outcome="timeout", payload=NULL),
        SignalReceived(name="approve", payload=R1, signal_id="s1"),
        ChildStarted(position=0, child_run_id="r1-c0", agent="mailer"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_event_after_run_completed_is_an_anomaly(late: RunEvent) -> None:
    late = msgspec.structs.replace(late, at=30.0)
    done = fold([START, RunCompleted(output=R1, at=20.0)])
    after = evolve(done, late)
    assert fold([late], done) == after
    assert fold([START, RunCompleted(output=R1, at=20.0), late]) == after
    assert after.anomalies == (f"{type(late).__name__} after the run ended",)
    assert (after.status, after.output, after.ended_at) == ("completed", R1, 20.0)
    assert after.ops == ()
    assert (after.events, after.updated_at) == (3, 30.0)


def test_cancel_requested_after_the_end_is_ignored() -> None:
    done = fold([START, RunCompleted(output=R1)])
    after = evolve(done, CancelRequested(reason="late", at=5.0))
    assert after.anomalies == ()
    assert after.cancel_requested is None
    assert msgspec.structs.replace(after, events=2, updated_at=done.updated_at) == done


def test_step_started_after_step_completed_is_an_anomaly() -> None:
    events: list[RunEvent] = [
        START,
        StepStarted(position=0, name="a"),
        StepCompleted(position=0, name="a", result=R1),
        StepStarted(position=0, name="a", attempt=2),
    ]
    state = fold(events)
    assert state.anomalies == ("step 0 started again after completed",)
    assert state.op(0) == OpRecord(
        position=0, kind="step", name="a", status="completed", attempts=1, result=R1
    )
    assert state.step_attempts == 1


@pytest.mark.parametrize("p", [2, -1])
def test_a_position_gap_is_an_anomaly(p: int) -> None:
    events: list[RunEvent] = [
        START,
        StepStarted(position=0, name="a"),
        StepCompleted(position=0, name="a", result=R1),
        StepStarted(position=p, name="b"),
        StepCompleted(position=p, name="b", result=R1),
        ValueRecorded(position=p, kind="uuid", value=R1),
    ]
    state = fold(events)
    assert state.anomalies == (
        f"step {p} started out of order",
        f"step {p} completed out of order",
        f"value {p} recorded out of order",
    )
    assert len(state.ops) == 1
    assert (state.steps_completed, state.step_attempts) == (1, 1)
    assert state == reduce_evolve(events)


# These three were silently accepted before (the completed result at a position was rewritten).


def test_a_second_completion_is_an_anomaly() -> None:
    events: list[RunEvent] = [
        START,
        StepStarted(position=0, name="a"),
        StepCompleted(position=0, name="a", result=R1),
        StepCompleted(position=0, name="a", result=msgspec.Raw(b"2")),
        StepFailed(position=0, name="a", error=ErrorInfo(type="E", message="m")),
    ]
    state = fold(events)
    assert state.anomalies == (
        "step 0 completed again after completed",
        "step 0 failed again after completed",
    )
    assert state.op(0) == OpRecord(
        position=0, kind="step", name="a", status="completed", attempts=1, result=R1
    )
    assert state.steps_completed == 1
    assert state == reduce_evolve(events)


def test_a_value_never_overwrites_an_operation() -> None:
    events: list[RunEvent] = [
        START,
        StepStarted(position=0, name="a"),
        StepCompleted(position=0, name="a", result=R1),
        ValueRecorded(position=1, kind="now", value=R1),
        ValueRecorded(position=0, kind="uuid", value=msgspec.Raw(b'"u"')),
        ValueRecorded(position=1, kind="now", value=msgspec.Raw(b"2")),
        StepCompleted(position=1, name="b", result=R1),
    ]
    state = fold(events)
    assert state.anomalies == (
        "value 0 recorded again over step 'a' (completed)",
        "value 1 recorded again over value now (recorded)",
        "step 1 'b' completed over value now (recorded)",
    )
    assert [(op.kind, op.result) for op in state.ops] == [("step", R1), ("now", R1)]
    assert state == reduce_evolve(events)


def test_a_step_closes_under_the_name_it_started_with() -> None:
    events: list[RunEvent] = [
        START,
        StepStarted(position=0, name="a"),
        StepCompleted(position=0, name="b", result=R1),
        StepStarted(position=0, name="c", attempt=2),
    ]
    state = fold(events)
    assert state.anomalies == (
        "step 0 'b' completed over step 'a' (started)",
        "step 0 'c' started over step 'a' (started)",
    )
    assert state.op(0) == OpRecord(position=0, kind="step", name="a", status="started", attempts=1)
    assert state == reduce_evolve(events)


def test_a_failed_step_may_be_started_again() -> None:
    # A retry after a failure (retry policies): not an anomaly.
    events: list[RunEvent] = [
        START,
        StepStarted(position=0, name="a"),
        StepFailed(position=0, name="a", error=ErrorInfo(type="E", message="m")),
        StepStarted(position=0, name="a", attempt=2),
        StepCompleted(position=0, name="a", attempt=2, result=R1),
    ]
    state = fold(events)
    assert state.anomalies == ()
    assert state.op(0) == OpRecord(
        position=0, kind="step", name="a", status="completed", attempts=2, result=R1
    )


def test_events_before_run_started() -> None:
    state = fold([CancelRequested(reason="early"), START, START])
    assert state.cancel_requested == "early"
    assert state.status == "pending"
    assert state.anomalies == ("RunStarted twice",)


def test_fold_continues_from_a_given_state() -> None:
    head = fold([START, StepStarted(position=0, name="a")])
    tail: list[RunEvent] = [StepCompleted(position=0, name="a", result=R1)]
    assert fold(tail, head) == fold([START, StepStarted(position=0, name="a"), *tail])
    assert head.op(0) == OpRecord(position=0, kind="step", name="a", status="started", attempts=1)


# --- waits, signals and children, by example --------------------------------------------------


def signal(name: str, sid: str, payload: bytes = b"1", at: float = 0.0) -> SignalReceived:
    return SignalReceived(name=name, payload=msgspec.Raw(payload), signal_id=sid, at=at)


def test_a_signal_wait_parks_then_consumes_the_oldest_matching_signal() -> None:
    other = signal("docs.signed", "s1", b'"doc"', at=11.0)
    first = signal("approve", "s2", b'"yes"', at=13.0)
    second = signal("approve", "s3", b'"again"', at=14.0)
    parked = fold(
        [
            START,
            other,
            WaitStarted(
                position=0, key="signal:approve", signals=("approve",), deadline=99.0, at=12.0
            ),
        ]
    )
    assert parked.status == "waiting"
    assert (parked.waiting_on, parked.deadline) == (("signal:approve", "timer"), 99.0)
    assert parked.op(0) == OpRecord(
        position=0,
        kind="wait",
        name="signal:approve",
        status="waiting",
        signals=("approve",),
        deadline=99.0,
    )
    assert parked.signals == (
        SignalRecord(name="docs.signed", payload=msgspec.Raw(b'"doc"'), signal_id="s1", at=11.0),
    )
    done = fold(
        [
            first,
            second,
            WaitCompleted(
                position=0,
                key="signal:approve",
                outcome="signal",
                payload=msgspec.Raw(b'"yes"'),
                signal="approve",
                signal_id="s2",
                at=15.0,
            ),
        ],
        parked,
    )
    assert done.anomalies == ()
    assert (done.status, done.waiting_on, done.deadline) == ("running", (), None)
    assert [r.signal_id for r in done.signals] == ["s1", "s3"]
    assert done.op(0) == OpRecord(
        position=0,
        kind="wait",
        name="signal:approve",
        status="completed",
        result=msgspec.Raw(b'"yes"'),
        outcome="signal",
        detail="approve",
    )


def test_a_wait_may_complete_without_parking() -> None:
    events: list[RunEvent] = [
        START,
        signal("approve", "s1"),
        WaitCompleted(
            position=0,
            key="signal:approve",
            outcome="signal",
            payload=R1,
            signal="approve",
            signal_id="s1",
        ),
        WaitCompleted(position=1, key="sleep", outcome="timeout", payload=NULL),
    ]
    state = fold(events)
    assert state.anomalies == ()
    assert (state.status, state.signals, state.waiting_on) == ("running", (), ())
    assert [(op.outcome, op.detail) for op in state.ops] == [
        ("signal", "approve"),
        ("timeout", None),
    ]


def test_a_child_run_and_the_wait_for_it() -> None:
    child = "r1-c0"
    events: list[RunEvent] = [
        START,
        ChildStarted(position=0, child_run_id=child, agent="it-provision"),
        WaitStarted(
            position=1, key=f"child:{child}", signals=(child_signal(child),), children=(child,)
        ),
    ]
    state = fold(events)
    assert state.status == "waiting"
    assert state.children == (child,)
    assert state.op(0) == OpRecord(
        position=0, kind="child", name="it-provision", status="completed", result=raw_json(child)
    )
    assert state.waiting_on == (f"signal:{CHILD_SIGNAL}.{child}", f"run:{child}")
    assert state.deadline is None
    ended = evolve(
        state,
        WaitCompleted(
            position=1,
            key=f"child:{child}",
            outcome="child",
            payload=msgspec.Raw(b'{"status":"failed"}'),
            child_status="failed",
        ),
    )
    assert (ended.status, ended.waiting_on, ended.anomalies) == ("running", (), ())
    assert ended.op(1) == OpRecord(
        position=1,
        kind="wait",
        name=f"child:{child}",
        status="completed",
        result=msgspec.Raw(b'{"status":"failed"}'),
        outcome="child",
        detail="failed",
    )
    assert ended.children == (child,)


def raw_json(v: object) -> msgspec.Raw:
    return msgspec.Raw(msgspec.json.encode(v))


def test_a_deadline_at_zero_is_still_a_timer() -> None:
    state = fold([START, WaitStarted(position=0, key="sleep", deadline=0.0)])
    assert (state.waiting_on, state.deadline) == (("timer",), 0.0)


def test_a_wait_while_suspended_keeps_the_run_suspended() -> None:
    suspended = fold([START, RunSuspended(reason="manual", detail="x")])
    parked = evolve(suspended, WaitStarted(position=0, key="sleep", deadline=5.0))
    assert (parked.status, parked.waiting_on, parked.anomalies) == ("suspended", ("timer",), ())
    resumed = evolve(parked, RunResumed())
    assert (resumed.status, resumed.waiting_on, resumed.deadline) == ("pending", ("timer",), 5.0)
    woken = evolve(resumed, WaitCompleted(position=0, key="sleep", outcome="timeout", payload=NULL))
    assert (woken.status, woken.waiting_on, woken.deadline) == ("running", (), None)
    # and a completion that lands while suspended does not lift the suspension
    still = fold(
        [
            RunSuspended(reason="manual", detail="y"),
            WaitCompleted(position=0, key="sleep", outcome="timeout", payload=NULL),
        ],
        parked,
    )
    assert (still.status, still.waiting_on, still.anomalies) == ("suspended", (), ())


def test_misplaced_wait_and_child_events_are_anomalies() -> None:
    events: list[RunEvent] = [
        START,
        *(StepStarted(position=0, name="a"), StepCompleted(position=0, name="a", result=R1)),
        signal("approve", "s1"),
        WaitCompleted(  # over a completed step: does not consume the signal either
            position=0,
            key="sleep",
            outcome="signal",
            payload=R1,
            signal="approve",
            signal_id="s1",
        ),
        WaitStarted(position=1, key="sleep", deadline=9.0),
        WaitCompleted(position=1, key="signal:approve", outcome="timeout", payload=NULL),
        WaitStarted(position=1, key="sleep", deadline=10.0),
        ChildStarted(position=1, child_run_id="r1-c1", agent="mailer"),
        StepStarted(position=1, name="sleep"),
        WaitCompleted(position=1, key="sleep", outcome="timeout", payload=NULL),
        WaitCompleted(position=1, key="sleep", outcome="timeout", payload=NULL),
        ChildStarted(position=2, child_run_id="r1-c2", agent="mailer"),
        StepStarted(position=2, name="mailer"),
        ValueRecorded(position=2, kind="now", value=R1),
        WaitStarted(position=7, key="sleep"),
        ChildStarted(position=-1, child_run_id="r1-c9", agent="mailer"),
    ]
    state = fold(events)
    assert state.anomalies == (
        "wait 0 completed over step 'a' (completed)",
        "wait 1 completed over wait sleep (waiting)",
        "wait 1 started again over wait sleep (waiting)",
        "child 1 started again over wait sleep (waiting)",
        "step 1 'sleep' started over wait sleep (waiting)",
        "wait 1 completed over wait sleep (completed)",
        "step 2 'mailer' started over child mailer (completed)",
        "value 2 recorded again over child mailer (completed)",
        "wait 7 started out of order",
        "child -1 started out of order",
    )
    assert [r.signal_id for r in state.signals] == ["s1"]
    assert state.children == ("r1-c2",)
    assert [(op.kind, op.status) for op in state.ops] == [
        ("step", "completed"),
        ("wait", "completed"),
        ("child", "completed"),
    ]
    assert state.op(1) is not None and state.op(1).deadline is None  # type: ignore[union-attr]
    assert state == reduce_evolve(events)


def test_started_run_records_its_parent() -> None:
    state = fold([RunStarted(run_id="r1-c0", agent="a", input=R1, parent_run_id="r1")])
    assert state.parent_run_id == "r1"


# --- performance ------------------------------------------------------------------------------


def _long_history(n: int, *, every: RunEvent | None = None) -> list[RunEvent]:
    events: list[RunEvent] = [START]
    p = 0
    while len(events) < n - 1:
        events.append(StepStarted(position=p, name="s"))
        events.append(StepCompleted(position=p, name="s", result=R1))
        if every is not None:
            events.append(every)
        events.append(ValueRecorded(position=p + 1, kind="random", value=R1))
        p += 2
    events = events[: n - 1]
    events.append(RunCompleted(output=R1))
    return events


@pytest.mark.parametrize(
    "every", [None, CancelRequested(reason="again")], ids=["ops-only", "run-events-interleaved"]
)
def test_fold_of_a_20k_event_history(every: RunEvent | None) -> None:
    """No time assertion: a quadratic fold would take minutes here, a linear one ~50 ms."""
    events = _long_history(20_000, every=every)
    t0 = time.perf_counter()
    state = fold(events)
    elapsed = time.perf_counter() - t0
    assert state.events == 20_000
    assert state.status == "completed"
    assert state.anomalies == ()
    assert len(state.ops) == len({e.position for e in events if isinstance(e, OP_EVENTS)})
    print(
        f"fold of {len(events)} events ({'ops only' if every is None else 'interleaved'}): "
        f"{elapsed * 1000:.0f} ms"
    )


# --- many buffered signals --------------------------------------------------------------------


@settings(max_examples=300, derandomize=True, deadline=None)
@given(signal_histories(), st.data())
def test_fold_equals_reduce_of_evolve_with_many_signals(
    events: list[RunEvent], data: st.DataObject
) -> None:
    once = fold(events)
    assert once == reduce_evolve(events)
    assert once.buffered_signals == len(once.signals)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(events)), max_size=3), label="cuts"))
    state = RunState()
    for a, b in zip([0, *cuts], [*cuts, len(events)], strict=True):
        state = fold(events[a:b], state)
    assert state == once


def _signals(n: int, *, offset: int = 0) -> list[SignalReceived]:
    names = ("approve", "docs.signed")
    return [
        signal(names[i % 2], f"sig-{i}", b"%d" % i, at=float(i)) for i in range(offset, offset + n)
    ]


def test_twenty_thousand_buffered_signals_fold_in_order_and_are_taken_by_id() -> None:
    """No time assertion (that belongs to ``python -m bench.folds``): this checks what the
    linear fold computes when a run has buffered 20,000 signals and waits take half of them."""
    n = 20_000
    received = _signals(n)
    state = fold([START, *received])
    assert state.buffered_signals == n
    assert state.signals == tuple(map(signal_record, received))
    assert state.events == n + 1 and state.updated_at == received[-1].at
    assert state.anomalies == ()

    # Waits take every other signal, newest first, by id; a second copy of signal 1 arrives
    # (the fold keeps what was written: the intake is what deduplicates) and is taken with it.
    taken = [
        WaitCompleted(
            position=k,
            key=f"signal:{r.name}",
            outcome="signal",
            payload=r.payload,
            signal=r.name,
            signal_id=r.signal_id,
        )
        for k, r in enumerate(reversed(received[1::2]))
    ]
    again = signal("docs.signed", "sig-1", b"1", at=float(n))
    history: list[RunEvent] = [START, *received, again, *taken]
    done = fold(history)
    assert done.buffered_signals == n // 2
    assert done.signals == tuple(map(signal_record, received[0::2]))
    assert len(done.ops) == n // 2 and done.status == "running"
    assert [op.detail for op in done.ops[:2]] == ["docs.signed", "docs.signed"]
    # in chunks (as a worker folds a cached history plus its tail) and from a folded state
    third = len(history) // 3
    assert fold(history[2 * third :], fold(history[third : 2 * third], fold(history[:third]))) == (
        done
    )
    # one event at a time, from a state holding all 20,000 (evolve is linear per event)
    assert evolve(state, again).signals == (*state.signals, signal_record(again))
    assert evolve(state, taken[0]).signals == state.signals[:-1]  # the newest, at position 0


def test_many_children_fold_in_order() -> None:
    starts = [
        ChildStarted(position=p, child_run_id=f"r1-c{p}", agent="mailer") for p in range(5_000)
    ]
    state = fold([START, *starts, signal("approve", "s1")])
    assert state.children == tuple(f"r1-c{p}" for p in range(5_000))
    assert state.buffered_signals == 1
    assert fold(starts[2_500:], fold([START, *starts[:2_500]])).children == state.children
