"""The run machine's cancel decisions, with no event loop and no server: where the code stops,
where a compensation's operations go (live and on replay), terminate, lifetime."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sojourn.actors.core.actions import Return, RunCancelledInterrupt
from sojourn.actors.core.limits import Limits, format_duration
from sojourn.actors.core.steps import StepTurn
from sojourn.schemas.events import (
    CancelRequested,
    CancelTaken,
    ErrorInfo,
    RunEvent,
    StepFailed,
    StepStarted,
    WaitStarted,
)
from tests.actors.core.test_machine import T0, Sim, attempt, ok_step, raw

COMPENSATES = Limits(compensates=True)
CANCEL = CancelRequested(reason="user", at=T0)
INTERRUPTED = ErrorInfo(type="Cancelled", message="the run was cancelled")


def taken(sim: Sim) -> CancelTaken:
    found = [e for e in sim.history if isinstance(e, CancelTaken)]
    assert len(found) == 1, found
    return found[0]


def stopped(sim: Sim, call: str = "b") -> None:
    with pytest.raises(RunCancelledInterrupt):
        sim.machine.step(call, "retry", None)


# --- without a compensation: the code stops at once ------------------------------------------


def test_without_a_compensation_a_cancel_stops_even_a_replay_at_once() -> None:
    sim = Sim()
    ok_step(sim, "a", 1)
    sim.store()
    sim.history.append(CANCEL)
    m = sim.activate()
    stopped(sim, "a")  # not replayed: nothing is to run again
    assert not m.take_cancel(T0)
    assert m.pending == []
    end = m.cancelled(T0)
    assert end.reason == "user" and not end.terminated and end.compensation_error is None


# --- with a compensation: the code replays to where the cancel was taken ----------------------


def test_a_live_cancel_between_steps_records_where_the_code_stopped() -> None:
    sim = Sim(limits=COMPENSATES)
    ok_step(sim, "a", 1)
    sim.arrive(CANCEL)
    stopped(sim)
    m = sim.machine
    assert m.take_cancel(T0)
    sim.store()
    assert (taken(sim).stopped_at, taken(sim).compensate_at) == (1, 1)
    assert ok_step(sim, "refund", "r") == "r"  # compensation steps run; the cancel is not due
    sim.store()
    assert [op.name for op in sim.state.ops] == ["a", "refund"]


def test_a_replay_runs_the_code_up_to_the_recorded_stop_then_the_compensation() -> None:
    sim = Sim(limits=COMPENSATES)
    ok_step(sim, "a", 1)
    ok_step(sim, "b", 2)
    sim.arrive(CANCEL)
    stopped(sim, "c")
    sim.machine.take_cancel(T0)
    ok_step(sim, "refund", "r")
    sim.store()
    # A new activation (after a crash in the compensation) replays everything, runs nothing.
    m = sim.activate()
    assert ok_step(sim, "a", "x") == 1
    assert ok_step(sim, "b", "x") == 2
    stopped(sim, "c")
    assert m.take_cancel(T0)
    assert m.pending == []  # the stop was recorded before
    assert ok_step(sim, "refund", "x") == "r"
    assert ok_step(sim, "more", "m") == "m"  # live again, at the next position
    assert m.pending  # recorded
    m.journal.finish()


def test_an_interrupted_step_is_recorded_failed_and_the_compensation_follows_it() -> None:
    sim = Sim(limits=COMPENSATES)
    ok_step(sim, "a", 1)
    turn = sim.machine.step("slow", "retry", None)
    assert isinstance(turn, StepTurn)
    attempt(sim, turn)
    sim.arrive(CANCEL)
    turn.interrupted(INTERRUPTED, 3.0, T0)
    assert sim.machine.take_cancel(T0)
    sim.store()
    assert (taken(sim).stopped_at, taken(sim).compensate_at) == (1, 2)
    failed = [e for e in sim.history if isinstance(e, StepFailed)]
    assert [(e.position, e.error.type, e.retry_at) for e in failed] == [(1, "Cancelled", None)]
    ok_step(sim, "refund", "r")
    sim.store()
    m = sim.activate()  # replay: the interrupted step raises the cancel, not its failure
    ok_step(sim, "a", "x")
    stopped(sim, "slow")
    assert m.take_cancel(T0) and m.pending == []
    assert ok_step(sim, "refund", "x") == "r"


def test_a_start_dropped_for_a_cancel_gives_its_position_to_the_compensation() -> None:
    sim = Sim(limits=COMPENSATES)
    turn = sim.machine.step("a", "retry", None)
    assert isinstance(turn, StepTurn)
    action = turn.next(sim.now)
    assert not isinstance(action, Return)
    assert isinstance(action.started, StepStarted)  # type: ignore[union-attr]
    sim.arrive(CANCEL)  # seen by the append, which then drops the start
    sim.machine.start_dropped(action.started)  # type: ignore[union-attr]
    assert sim.machine.take_cancel(T0)
    sim.store()
    assert (taken(sim).stopped_at, taken(sim).compensate_at) == (0, 0)
    ok_step(sim, "refund", "r")
    sim.store()
    assert [op.name for op in sim.state.ops] == ["refund"]


def test_an_in_doubt_step_at_the_stop_is_closed_not_run_again() -> None:
    sim = Sim(limits=COMPENSATES)
    ok_step(sim, "a", 1)
    turn = sim.machine.step("slow", "retry", None)
    assert isinstance(turn, StepTurn)
    attempt(sim, turn)  # and the worker dies
    sim.store()
    sim.history.append(CANCEL)
    m = sim.activate()
    ok_step(sim, "a", "x")
    stopped(sim, "slow")
    assert m.take_cancel(T0)
    sim.store()
    assert (taken(sim).stopped_at, taken(sim).compensate_at) == (1, 2)
    closed = [e for e in sim.history if isinstance(e, StepFailed)]
    assert [(e.position, e.attempt, e.error.type) for e in closed] == [(1, 1, "Cancelled")]
    ok_step(sim, "refund", "r")
    sim.store()
    assert sim.state.anomalies == ()


def test_a_parked_run_stops_at_its_open_wait() -> None:
    sim = Sim(limits=COMPENSATES)
    ok_step(sim, "a", 1)
    sim.store(WaitStarted(position=1, key="sleep", deadline=T0 + 3600, at=T0))
    sim.history.append(CANCEL)
    m = sim.activate()
    ok_step(sim, "a", "x")
    with pytest.raises(RunCancelledInterrupt):
        m.wait("sleep")
    assert m.take_cancel(T0)
    sim.store()
    assert (taken(sim).stopped_at, taken(sim).compensate_at) == (1, 2)
    ok_step(sim, "refund", "r")
    sim.store()
    assert sim.state.anomalies == ()


@given(
    steps=st.integers(0, 6),
    tail=st.sampled_from(["none", "in_doubt", "wait", "retry"]),
)
def test_compensation_positions_never_overlap_the_codes(steps: int, tail: str) -> None:
    """Whatever the run was doing when cancelled, replaying its code stops at the first
    unsettled operation and the compensation takes the positions after everything recorded."""
    sim = Sim(limits=COMPENSATES)
    for i in range(steps):
        ok_step(sim, f"s{i}", i)
    sim.store()
    p = steps
    extra: list[RunEvent] = []
    if tail == "in_doubt":
        extra = [StepStarted(position=p, name="t", attempt=1, at=T0)]
    elif tail == "wait":
        extra = [WaitStarted(position=p, key="sleep", deadline=T0 + 60, at=T0)]
    elif tail == "retry":
        err = ErrorInfo(type="E", message="")
        extra = [
            StepStarted(position=p, name="t", attempt=1, at=T0),
            StepFailed(position=p, name="t", attempt=1, error=err, retry_at=T0 + 60, at=T0),
        ]
    sim.history.extend([*extra, CANCEL])
    m = sim.activate()
    for i in range(steps):
        assert ok_step(sim, f"s{i}", "x") == i
    stopped(sim, "t")
    assert m.take_cancel(T0)
    sim.store()
    recorded = len(sim.state.ops)
    assert taken(sim).stopped_at == p
    assert taken(sim).compensate_at == recorded == p + (tail != "none")
    ok_step(sim, "refund", "r")
    sim.store()
    assert [op.name for op in sim.state.ops][-1] == "refund"
    assert sim.state.anomalies == ()


# --- terminate ---------------------------------------------------------------------------------


def test_terminate_skips_the_compensation_and_says_so() -> None:
    sim = Sim(limits=COMPENSATES)
    ok_step(sim, "a", 1)
    sim.store()
    sim.arrive(CancelRequested(reason="runaway", terminate=True, at=T0))
    stopped(sim)
    m = sim.machine
    assert not m.take_cancel(T0)
    assert m.pending == []
    end = m.cancelled(T0)
    assert end.terminated and end.reason == "terminated: runaway"


def test_a_terminate_stops_a_compensation_under_way() -> None:
    sim = Sim(limits=COMPENSATES)
    sim.arrive(CANCEL)
    stopped(sim, "a")
    m = sim.machine
    assert m.take_cancel(T0)
    ok_step(sim, "refund", "r")
    assert not m.cancel_due()
    sim.arrive(CancelRequested(terminate=True, at=T0))
    assert m.cancel_due()
    stopped(sim, "refund2")
    assert not m.take_cancel(T0)  # not again
    end = m.cancelled(T0)
    assert end.terminated and end.reason == "terminated: user"


# --- lifetime ----------------------------------------------------------------------------------


def test_a_run_past_its_lifetime_is_cancelled_with_the_lifetime_named() -> None:
    sim = Sim(limits=Limits(lifetime=90))
    m = sim.machine
    assert m.lifetime_ends() == T0 + 90
    assert not m.expire(T0 + 89.9)
    ok_step(sim, "a", 1)
    assert m.expire(T0 + 90)
    stopped(sim)
    end = m.cancelled(T0 + 90)
    assert end.reason == "lifetime of 1m30s exceeded" and not end.terminated


def test_without_a_lifetime_nothing_expires() -> None:
    m = Sim().machine
    assert m.lifetime_ends() is None and not m.expire(T0 + 1e9)


def test_a_lifetime_cancel_runs_the_compensation_like_any_cancel() -> None:
    sim = Sim(limits=Limits(lifetime=10, compensates=True))
    ok_step(sim, "a", 1)
    sim.machine.expire(T0 + 11)
    stopped(sim)
    assert sim.machine.take_cancel(T0 + 11)
    sim.store()
    assert taken(sim).reason == "lifetime of 10s exceeded"
    # A replay (after a crash) knows the reason from history, whatever its own clock says.
    m = sim.activate()
    ok_step(sim, "a", "x")
    stopped(sim)
    assert m.cancel_reason() == "lifetime of 10s exceeded"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.25, "0.25s"), (1.5, "1.5s"), (2, "2s"), (90061, "1d1h1m1s"), (7 * 86400, "7d")],
)
def test_durations_read_well(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_the_events_round_trip() -> None:
    from sojourn.schemas.codec import decode_events, encode_events

    events: list[RunEvent] = [
        CancelTaken(reason="x", stopped_at=3, compensate_at=4, at=T0),
        CancelRequested(reason="y", terminate=True, at=T0),
    ]
    assert decode_events(encode_events(events)) == events
    assert msgspec.json.decode(encode_events(events))[0]["type"] == "run.cancel_taken.v1"
    assert raw(None) == raw(None)
