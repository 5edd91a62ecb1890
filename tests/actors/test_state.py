"""The pure fold: ``evolve(state, event)`` and its fast twin ``fold(events)``.

Two kinds of generated histories drive the properties:

* *valid* histories, built the way a worker writes them (RunStarted first, operations at
  contiguous positions, in-doubt retries, suspend/resume pairs, at most one terminal event),
  together with what the generator knows the state must be;
* *arbitrary* sequences (any event, any order, any position), on which the fold must stay total
  and ``fold`` must still equal ``reduce(evolve)``.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any, get_args, get_type_hints

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sojourn.actors.state import TERMINAL, OpRecord, RunState, evolve, fold
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

NAMES = ("fetch", "compose", "send")
VALUE_KINDS: tuple[str, ...] = get_args(get_type_hints(ValueRecorded)["kind"])
SUSPEND_REASONS: tuple[str, ...] = get_args(get_type_hints(RunSuspended)["reason"])
OP_EVENTS = (StepStarted, StepCompleted, StepFailed, ValueRecorded)

raws = st.one_of(st.integers(-3, 3), st.text(max_size=3), st.none(), st.booleans()).map(
    lambda v: msgspec.Raw(msgspec.json.encode(v))
)
errors = st.builds(
    ErrorInfo, type=st.sampled_from(["ValueError", "KeyError"]), message=st.text(max_size=4)
)


def reduce_evolve(events: list[RunEvent], state: RunState | None = None) -> RunState:
    return functools.reduce(evolve, events, state or RunState())


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


@st.composite
def valid_histories(draw: st.DrawFn) -> tuple[list[RunEvent], Expected]:
    """A history a correct worker could have written, and the state it must fold to."""
    events: list[RunEvent] = []

    def emit(event: RunEvent) -> None:
        events.append(msgspec.structs.replace(event, at=float(len(events))))

    run_id = draw(st.sampled_from(["r1", "r-2"]))
    agent = draw(st.sampled_from(["greeter", "mailer"]))
    exp = Expected(run_id=run_id, agent=agent, input=draw(raws))
    emit(RunStarted(run_id=run_id, agent=agent, input=exp.input, code_version=None))

    def pause() -> None:
        reason = draw(st.sampled_from(SUSPEND_REASONS))
        emit(RunSuspended(reason=reason, detail="parked"))
        emit(RunResumed(by=draw(st.none() | st.just("ops"))))
        exp.status = "pending"  # resumed: waiting for a worker to replay it

    n = draw(st.integers(0, 10))
    for i in range(n):
        last = i == n - 1
        action = draw(st.sampled_from(["step", "step", "step", "value", "cancel", "pause"]))
        p = len(exp.ops)
        if action == "step":
            name = draw(st.sampled_from(NAMES))
            attempts = draw(st.integers(1, 3))  # attempts > 1: in-doubt restarts
            for attempt in range(1, attempts + 1):
                if attempt > 1 and draw(st.booleans()):
                    pause()  # parked as in doubt, then released by a human
                emit(StepStarted(position=p, name=name, attempt=attempt))
                exp.status = "running"
            # Only the last operation may stay open: the code waits for a step to finish.
            outcome = draw(st.sampled_from(["completed", "failed", *(["open"] if last else [])]))
            rec = OpRecord(position=p, kind="step", name=name, status="started", attempts=attempts)
            if outcome == "completed":
                result = draw(raws)
                emit(StepCompleted(position=p, name=name, attempt=attempts, result=result))
                rec = msgspec.structs.replace(rec, status="completed", result=result)
            elif outcome == "failed":
                error = draw(errors)
                emit(StepFailed(position=p, name=name, attempt=attempts, error=error))
                rec = msgspec.structs.replace(rec, status="failed", error=error)
            exp.ops.append(rec)
        elif action == "value":
            kind = draw(st.sampled_from(VALUE_KINDS))
            value = draw(raws)
            emit(ValueRecorded(position=p, kind=kind, value=value))  # type: ignore[arg-type]
            exp.ops.append(
                OpRecord(position=p, kind=kind, name=kind, status="recorded", result=value)
            )
        elif action == "cancel":
            reason = draw(st.sampled_from(["", "user asked"]))
            emit(CancelRequested(reason=reason, by=None))
            exp.cancel_requested = reason or "cancelled"
        else:
            pause()

    if draw(st.booleans()):  # an unmatched suspension (maybe ended by a cancel or a failure)
        reason = draw(st.sampled_from(SUSPEND_REASONS))
        emit(RunSuspended(reason=reason, detail="parked"))
        exp.status = "suspended"
        exp.suspended_reason = reason
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
ARBITRARY: dict[type, st.SearchStrategy[Any]] = {
    RunStarted: st.builds(
        RunStarted, run_id=st.sampled_from(["r1", "r2"]), agent=st.just("a"), input=raws
    ),
    RunCompleted: st.builds(RunCompleted, output=raws),
    RunFailed: st.builds(RunFailed, error=errors),
    CancelRequested: st.builds(CancelRequested, reason=st.sampled_from(["", "x"])),
    RunCancelled: st.builds(RunCancelled, reason=st.sampled_from(["", "y"])),
    RunSuspended: st.builds(
        RunSuspended, reason=st.sampled_from(SUSPEND_REASONS), detail=st.just("d")
    ),
    RunResumed: st.builds(RunResumed),
    StepStarted: st.builds(
        StepStarted, position=positions, name=st.sampled_from(NAMES), attempt=attempts
    ),
    StepCompleted: st.builds(
        StepCompleted,
        position=positions,
        name=st.sampled_from(NAMES),
        attempt=attempts,
        result=raws,
    ),
    StepFailed: st.builds(
        StepFailed, position=positions, name=st.sampled_from(NAMES), attempt=attempts, error=errors
    ),
    ValueRecorded: st.builds(
        ValueRecorded, position=positions, kind=st.sampled_from(VALUE_KINDS), value=raws
    ),
}
"""One strategy per member of the ``RunEvent`` union (checked by a test below)."""

any_event: st.SearchStrategy[RunEvent] = st.one_of(*ARBITRARY.values()).flatmap(
    lambda e: st.floats(0, 1e6, allow_nan=False).map(lambda at: msgspec.structs.replace(e, at=at))
)


@st.composite
def mutated_histories(draw: st.DrawFn) -> list[RunEvent]:
    """A valid history with arbitrary events inserted and some events dropped or duplicated:
    reaches the deep states a random sequence rarely gets to."""
    events = list(draw(valid_histories())[0])
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(events)))
        edit = draw(st.sampled_from(["insert", "drop", "duplicate", "end early"]))
        if edit == "end early":  # well-placed operations follow the terminal event
            events.insert(i, draw(st.sampled_from(ARBITRARY_TERMINAL)))
        elif edit == "insert":
            events.insert(i, draw(any_event))
        elif events and edit == "drop":
            del events[min(i, len(events) - 1)]
        elif events:
            j = min(i, len(events) - 1)
            events.insert(draw(st.integers(j, len(events))), events[j])
    return events


ARBITRARY_TERMINAL = (
    RunCompleted(output=msgspec.Raw(b"0")),
    RunFailed(error=ErrorInfo(type="E", message="m")),
    RunCancelled(),
)
arbitrary_histories = st.one_of(st.lists(any_event, max_size=30), mutated_histories())
any_histories = st.one_of(arbitrary_histories, valid_histories().map(lambda he: he[0]))


def test_the_arbitrary_strategy_covers_every_event_type() -> None:
    assert set(ARBITRARY) == set(get_args(RunEvent))


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
    events = [
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
    assert state.status == exp.status
    assert state.terminal == (exp.status in TERMINAL)
    assert state.ops == tuple(exp.ops)
    assert state.output == exp.output
    assert state.error == exp.error
    assert state.cancel_requested == exp.cancel_requested
    assert state.events == len(events)
    assert state.steps_completed == sum(isinstance(e, StepCompleted) for e in events)
    assert state.step_attempts == sum(isinstance(e, StepStarted) for e in events)
    assert state.started_at == events[0].at
    assert state.updated_at == events[-1].at
    assert state.ended_at == (events[-1].at if state.terminal else None)
    if exp.status == "suspended":
        assert state.suspended_reason == exp.suspended_reason

    # Each position holds its latest event (read from the events, not the bookkeeping above).
    latest: dict[int, Any] = {}
    for e in events:
        if isinstance(e, OP_EVENTS):
            latest[e.position] = e
    assert len(state.ops) == len(latest)
    for p, e in latest.items():
        op = state.op(p)
        assert op is not None
        assert op.position == p
        if isinstance(e, ValueRecorded):
            assert (op.kind, op.status, op.result) == (e.kind, "recorded", e.value)
            continue
        assert (op.kind, op.name, op.attempts) == ("step", e.name, e.attempt)
        assert op.status == {StepStarted: "started", StepCompleted: "completed"}.get(
            type(e), "failed"
        )


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
        match event:
            case RunStarted():
                assert state.status == "pending"
            case StepStarted() | StepCompleted() | StepFailed():
                assert state.status == "running"
            case ValueRecorded() | CancelRequested():
                assert state.status == before.status
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


# --- arbitrary sequences, event by event ------------------------------------------------------


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


# --- examples ---------------------------------------------------------------------------------

R1 = msgspec.Raw(b"1")
START = RunStarted(run_id="r1", agent="greeter", input=msgspec.Raw(b'{"name":"Ada"}'), at=10.0)


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
