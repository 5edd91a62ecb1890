"""The lifecycle rules both folds apply (the full state, the run summary), on their own."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sojourn.schemas.events import (
    CancelRequested,
    ChildStarted,
    ErrorInfo,
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
    ValueRecorded,
    WaitCompleted,
    WaitStarted,
)
from sojourn.schemas.lifecycle import (
    NOT_WAITING,
    TERMINAL_EVENTS,
    Waiting,
    awaited_signals,
    child_notices,
    end_status,
    has_work,
    next_status,
    next_waiting,
    out_of_place,
    parked_on,
)
from sojourn.schemas.vocabulary import RUN_STATUSES, TERMINAL, RunStatus
from tests.strategies import any_event

R = msgspec.Raw(b"1")
BOOM = ErrorInfo(type="E", message="m")


@pytest.mark.parametrize(
    ("event", "from_running", "from_suspended"),
    [
        (RunStarted(run_id="r", agent="a", input=R), "pending", "pending"),
        (RunResumed(), "pending", "pending"),
        (StepStarted(position=0, name="s"), "running", "suspended"),
        (StepCompleted(position=0, name="s", result=R), "running", "suspended"),
        (StepFailed(position=0, name="s", error=BOOM), "running", "suspended"),
        (StepFailed(position=0, name="s", error=BOOM, retry_at=5.0), "waiting", "suspended"),
        (WaitStarted(position=0, key="sleep", deadline=1.0), "waiting", "suspended"),
        (WaitCompleted(position=0, key="sleep", outcome="timeout", payload=R), "running",
         "suspended"),
        (ValueRecorded(position=0, kind="now", value=R), "running", "suspended"),
        (ChildStarted(position=0, child_run_id="c", agent="a"), "running", "suspended"),
        (SignalReceived(name="n", payload=R, signal_id="s"), "running", "suspended"),
        (CancelRequested(), "running", "suspended"),
        (RunSuspended(reason="cap", detail="d"), "suspended", "suspended"),
        (RunCompleted(output=R), "completed", "completed"),
        (RunFailed(error=BOOM), "failed", "failed"),
        (RunCancelled(), "cancelled", "cancelled"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, msgspec.Struct) else v,
)  # fmt: skip
def test_next_status(event: RunEvent, from_running: RunStatus, from_suspended: RunStatus) -> None:
    assert next_status("running", event) == from_running
    assert next_status("suspended", event) == from_suspended


@given(st.sampled_from(RUN_STATUSES), any_event)
def test_an_ended_run_stays_ended_and_refuses_all_but_a_cancel_request(
    status: RunStatus, event: RunEvent
) -> None:
    after = next_status(status, event)
    assert after in RUN_STATUSES
    why = out_of_place(status, event)
    if status in TERMINAL:
        assert after == status
        assert (why is None) == isinstance(event, CancelRequested)
    if isinstance(event, TERMINAL_EVENTS):
        assert after == (end_status(event) if status not in TERMINAL else status)
    else:
        assert end_status(event) is None


def test_has_work_judges_a_run_by_its_last_decision() -> None:
    """What a fire's handler wakes a run of an earlier fire for: work left, not a rest."""
    start = RunStarted(run_id="r", agent="a", input=R)
    step = StepStarted(position=0, name="s")
    done = StepCompleted(position=0, name="s", result=R)
    assert has_work([start])  # created, never executed
    assert has_work([done, step])  # between steps
    assert has_work([SignalReceived(name="n", payload=R, signal_id="s")])  # says nothing
    assert has_work([RunResumed()])
    assert not has_work([done, WaitStarted(position=1, key="sleep", deadline=1.0)])
    assert not has_work([StepFailed(position=0, name="s", error=BOOM, retry_at=5.0)])
    assert not has_work([RunSuspended(reason="cap", detail="d")])
    for end in (RunCompleted(output=R), RunFailed(error=BOOM), RunCancelled()):
        assert not has_work([done, end])


def test_out_of_place() -> None:
    start = RunStarted(run_id="r", agent="a", input=R)
    assert out_of_place("new", start) is None
    assert out_of_place("pending", start) == "RunStarted twice"
    assert out_of_place("running", RunResumed()) == "RunResumed while not suspended"
    assert out_of_place("suspended", RunResumed()) is None
    assert out_of_place("completed", RunResumed()) == "RunResumed after the run ended"
    assert out_of_place("failed", CancelRequested()) is None


def test_next_waiting() -> None:
    wait = WaitStarted(
        position=1, key="select:a|b", signals=("a", "b"), children=("c",), deadline=9.0
    )
    assert next_waiting((), wait) == Waiting(("signal:a", "signal:b", "run:c", "timer"), 9.0)
    assert parked_on((), (), 0.0) == ("timer",)  # a deadline at the epoch is still one
    retry = StepFailed(position=0, name="send", error=BOOM, retry_at=5.0)
    assert next_waiting((), retry) == Waiting(("retry:send",), 5.0)
    assert next_waiting((), StepFailed(position=0, name="send", error=BOOM)) is None
    assert next_waiting(("retry:send",), StepStarted(position=0, name="send")) == NOT_WAITING
    assert next_waiting(("retry:send",), StepStarted(position=0, name="other")) is None
    assert next_waiting(("retry:send", "timer"), StepStarted(position=0, name="send")) is None
    done = WaitCompleted(position=1, key="sleep", outcome="timeout", payload=R)
    assert next_waiting(("timer",), done) == NOT_WAITING
    assert next_waiting(("timer",), RunCompleted(output=R)) is None


def test_awaited_signals_and_child_notices() -> None:
    on = ("signal:go", "run:r1-c0", "timer", "retry:s", "junk")
    assert awaited_signals(on) == {"go", "sojourn-child.r1-c0"}
    assert child_notices(on) == {"sojourn-child.r1-c0"}
    assert awaited_signals(()) == set() == child_notices(())
