"""The run machine, with no event loop and no server.

Each test builds a history, asks the machine what to do, plays the part of the driver (it
"stores" pending events by appending them to the history, advances a fake clock) and checks
both the actions and that the events the machine recorded fold to what it claimed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sojourn.actors.core.actions import (
    Attempt,
    Backoff,
    ChildStart,
    LookupChildren,
    Park,
    Raise,
    Reconcile,
    Return,
    RunCancelledInterrupt,
    Suspend,
)
from sojourn.actors.core.journal import RecordedWait, ReplayFrontier
from sojourn.actors.core.limits import Limits
from sojourn.actors.core.machine import Machine
from sojourn.actors.core.retry import RetryPolicy
from sojourn.actors.core.state import RunState, fold
from sojourn.actors.core.steps import StepTurn
from sojourn.actors.core.waits import WaitTurn, child_run_id
from sojourn.schemas.codec import encode, to_raw
from sojourn.schemas.errors import (
    NondeterminismError,
    PayloadTooLarge,
    RetryableError,
    StepError,
    TerminalError,
)
from sojourn.schemas.events import (
    Budget,
    CancelRequested,
    RunEvent,
    RunResumed,
    RunStarted,
    RunSuspended,
    SignalReceived,
    StepStarted,
    WaitCompleted,
    WaitStarted,
)
from sojourn.schemas.wire import DECIDE_SIGNAL, InDoubtDecision

RUN = "r1"
T0 = 1_000_000.0


def raw(v: object) -> msgspec.Raw:
    return to_raw(v)


def started() -> RunStarted:
    return RunStarted(run_id=RUN, agent="a", input=raw(None), at=T0)


@dataclass
class Sim:
    """The driver's part: a history, a clock, and the machine of the current activation."""

    limits: Limits = field(default_factory=Limits)
    history: list[RunEvent] = field(default_factory=lambda: [started()])
    now: float = T0
    machine: Machine = field(init=False)

    def __post_init__(self) -> None:
        self.activate()

    def activate(self) -> Machine:
        self.machine = Machine(fold(self.history), limits=self.limits)
        return self.machine

    def store(self, *events: RunEvent) -> None:
        """Append what the machine has pending plus ``events`` (one decision)."""
        m = self.machine
        self.history.extend([*m.pending, *events])
        m.pending.clear()

    def arrive(self, *events: RunEvent) -> None:
        """Others append (a signal, a cancel): the driver folds them in, as on a rebase."""
        self.history.extend(events)
        self.machine.state = fold(events, self.machine.state)

    @property
    def state(self) -> RunState:
        s = fold(self.history)
        assert s.anomalies == (), s.anomalies
        return s


def attempt(sim: Sim, turn: StepTurn) -> Attempt:
    action = turn.next(sim.now)
    assert isinstance(action, Attempt), action
    sim.store(action.started)
    return action


def ok_step(sim: Sim, name: str, value: object) -> Any:
    turn = sim.machine.step(name, "retry", None)
    if isinstance(turn, Return):
        return msgspec.json.decode(turn.result)
    attempt(sim, turn)
    done = turn.returned(raw(value), 0.01, sim.now)
    assert isinstance(done, Return)
    return value


# --- steps and retries -------------------------------------------------------------------------


def test_a_new_step_starts_then_records_its_result_and_replays_it() -> None:
    sim = Sim()
    turn = sim.machine.step("send", "retry", None)
    assert isinstance(turn, StepTurn)
    action = attempt(sim, turn)
    assert (action.position, action.attempt, action.in_doubt) == (0, 1, False)
    assert turn.key == f"{RUN}/0"
    assert isinstance(turn.returned(raw({"id": 7}), 0.5, sim.now), Return)
    sim.store()
    op = sim.state.ops[0]
    assert (op.status, op.attempts, bytes(op.result or b"")) == ("completed", 1, b'{"id":7}')
    replay = sim.activate().step("send", "retry", None)
    assert isinstance(replay, Return) and bytes(replay.result) == b'{"id":7}'
    assert sim.machine.pending == []


def test_a_retryable_failure_backs_off_then_runs_the_next_attempt() -> None:
    sim = Sim()
    policy = RetryPolicy(retry_on=(ValueError,), attempts=3, initial_interval=10.0, jitter=0.0)
    turn = sim.machine.step("charge", "retry", policy)
    assert isinstance(turn, StepTurn)
    attempt(sim, turn)
    assert turn.raised(ValueError("flaky"), 0.1, sim.now) is None  # a retry is due
    backoff = turn.next(sim.now)
    assert isinstance(backoff, Backoff) and backoff.retry_at == pytest.approx(T0 + 10.0)
    sim.store()
    op = sim.state.ops[0]
    assert op.status == "failed" and op.deadline == pytest.approx(T0 + 10.0)
    # A new activation after the timer: attempt 2 runs at once (no second backoff).
    sim.now += 10.0
    turn = sim.activate().step("charge", "retry", policy)
    assert isinstance(turn, StepTurn)
    action = attempt(sim, turn)
    assert (action.attempt, action.in_doubt) == (2, False)
    turn.returned(raw("ch_1"), 0.1, sim.now)
    sim.store()
    assert (sim.state.ops[0].status, sim.state.ops[0].attempts) == ("completed", 2)


def test_a_woken_activation_before_the_retry_is_due_backs_off_again() -> None:
    sim = Sim()
    policy = RetryPolicy(retry_on=(ValueError,), attempts=2, initial_interval=60.0, jitter=0.0)
    turn = sim.machine.step("s", "retry", policy)
    assert isinstance(turn, StepTurn)
    attempt(sim, turn)
    turn.raised(ValueError("x"), 0.0, sim.now)
    sim.store()
    sim.now += 1.0
    again = sim.activate().step("s", "retry", policy)
    assert isinstance(again, StepTurn)
    assert isinstance(again.next(sim.now), Backoff)
    assert isinstance(again.next(sim.now), Attempt)  # after the backoff, the attempt


def test_a_final_failure_raises_a_step_error_that_replays_identically() -> None:
    sim = Sim()
    turn = sim.machine.step("s", "retry", RetryPolicy(retry_on=(ValueError,), attempts=5))
    assert isinstance(turn, StepTurn)
    attempt(sim, turn)
    final = turn.raised(TerminalError("no such card"), 0.0, sim.now)
    assert isinstance(final, Raise) and isinstance(final.error, StepError)
    sim.store()
    with pytest.raises(StepError) as replayed:
        sim.activate().step("s", "retry", None)
    assert str(replayed.value) == str(final.error)
    assert sim.state.ops[0].status == "failed"


def test_retryable_errors_retry_even_without_a_policy_up_to_the_default() -> None:
    sim = Sim()
    turn = sim.machine.step("s", "retry", None)
    assert isinstance(turn, StepTurn)
    for n in (1, 2):
        attempt(sim, turn)
        assert turn.raised(RetryableError("429", retry_after=0.0), 0.0, sim.now) is None, n
    attempt(sim, turn)
    assert isinstance(turn.raised(RetryableError("429"), 0.0, sim.now), Raise)
    sim.store()
    assert sim.state.ops[0].attempts == 3


def test_a_result_too_large_to_store_fails_the_step_for_good() -> None:
    sim = Sim(limits=Limits(max_value=16, retry=RetryPolicy(retry_on=(Exception,), attempts=9)))
    turn = sim.machine.step("s", "retry", None)
    assert isinstance(turn, StepTurn)
    attempt(sim, turn)
    done = turn.returned(raw("x" * 100), 0.0, sim.now)
    assert isinstance(done, Raise) and "PayloadTooLarge" in str(done.error)
    sim.store()
    assert sim.state.ops[0].status == "failed" and sim.state.ops[0].deadline is None


# --- in doubt ---------------------------------------------------------------------------------


def crashed_mid_step(sim: Sim, name: str = "s", times: int = 1) -> None:
    """``times`` attempts of ``name`` at position 0 started and never ended."""
    for n in range(times):
        sim.history.append(StepStarted(position=0, name=name, attempt=n + 1, at=sim.now))


def test_in_doubt_retry_runs_again_with_the_same_key() -> None:
    sim = Sim()
    crashed_mid_step(sim)
    turn = sim.activate().step("s", "retry", None)
    assert isinstance(turn, StepTurn) and turn.plan.in_doubt
    action = turn.next(sim.now)
    assert isinstance(action, Attempt) and (action.attempt, action.in_doubt) == (2, True)
    assert turn.key == f"{RUN}/0"


def decide(action: str, result: object = None) -> SignalReceived:
    body = InDoubtDecision(action=action, result=raw(result), by="ops")  # type: ignore[arg-type]
    return SignalReceived(
        name=f"{DECIDE_SIGNAL}.0.1", payload=msgspec.Raw(encode(body)), signal_id="d1"
    )


def test_in_doubt_ask_suspends_until_a_decision() -> None:
    sim = Sim()
    crashed_mid_step(sim)
    turn = sim.activate().step("s", "ask", None)
    assert isinstance(turn, StepTurn)
    action = turn.next(sim.now)
    assert isinstance(action, Suspend) and action.event.reason == "in_doubt"
    assert f"sojourn decide {RUN} 0" in action.event.detail


@pytest.mark.parametrize("choice", ["skip", "fail", "retry"])
def test_in_doubt_decisions(choice: str) -> None:
    sim = Sim()
    crashed_mid_step(sim)
    sim.history += [
        RunSuspended(reason="in_doubt", detail="", at=T0),
        decide(choice, {"ok": 1}),
        RunResumed(by="ops", at=T0),
    ]
    turn = sim.activate().step("s", "ask", None)
    assert isinstance(turn, StepTurn)
    action = turn.next(sim.now)
    sim.store()
    op = sim.state.ops[0]
    if choice == "skip":
        assert isinstance(action, Return) and bytes(action.result) == b'{"ok":1}'
        assert (op.status, op.attempts) == ("completed", 1)
    elif choice == "fail":
        assert isinstance(action, Raise) and "InDoubtFailed" in str(action.error)
        assert (op.status, op.attempts) == ("failed", 1)
    else:
        assert isinstance(action, Attempt) and action.attempt == 2


def test_a_decision_about_another_attempt_does_not_count() -> None:
    sim = Sim()
    crashed_mid_step(sim, times=2)  # attempt 2 is in doubt now; the decision is about 1
    sim.history.append(decide("skip"))
    turn = sim.activate().step("s", "ask", None)
    assert isinstance(turn, StepTurn)
    assert isinstance(turn.next(sim.now), Suspend)


def test_a_malformed_decision_counts_as_none() -> None:
    sim = Sim()
    crashed_mid_step(sim)
    sim.history.append(
        SignalReceived(name=f"{DECIDE_SIGNAL}.0.1", payload=raw("nonsense"), signal_id="d")
    )
    turn = sim.activate().step("s", "ask", None)
    assert isinstance(turn, StepTurn) and isinstance(turn.next(sim.now), Suspend)


def test_a_crash_loop_waits_for_a_human_whatever_the_policy() -> None:
    sim = Sim(limits=Limits(crash_loop_limit=3))
    crashed_mid_step(sim, times=2)
    turn = sim.activate().step("s", "retry", None)
    assert isinstance(turn, StepTurn)
    assert isinstance(turn.next(sim.now), Attempt)  # cut off twice: not a loop yet
    sim.history.append(StepStarted(position=0, name="s", attempt=3, at=T0))
    turn = sim.activate().step("s", "retry", None)
    assert isinstance(turn, StepTurn)
    action = turn.next(sim.now)
    assert isinstance(action, Suspend) and action.event.reason == "crash_loop"
    assert "cut off 3 times" in action.event.detail


def test_crash_loop_detection_can_be_switched_off() -> None:
    sim = Sim(limits=Limits(crash_loop_limit=0))
    crashed_mid_step(sim, times=9)
    turn = sim.activate().step("s", "retry", None)
    assert isinstance(turn, StepTurn) and isinstance(turn.next(sim.now), Attempt)


def test_reconcile_settles_with_the_found_result_or_runs_again() -> None:
    for found, expect in ((raw("done-elsewhere"), Return), (None, Attempt)):
        sim = Sim()
        crashed_mid_step(sim)
        turn = sim.activate().step("s", "reconcile", None)
        assert isinstance(turn, StepTurn)
        action = turn.next(sim.now)
        assert isinstance(action, Reconcile) and action.key == f"{RUN}/0"
        turn.reconciled(found, sim.now)
        assert isinstance(turn.next(sim.now), expect)


# --- waits ------------------------------------------------------------------------------------


def signal(name: str, sid: str, payload: object = None) -> SignalReceived:
    return SignalReceived(name=name, payload=raw(payload), signal_id=sid, at=T0)


def test_a_buffered_signal_ends_a_wait_at_once_oldest_first() -> None:
    sim = Sim()
    sim.history += [signal("go", "s1", 1), signal("go", "s2", 2)]
    m = sim.activate()
    turn = m.wait("signal:go", signals=("go",))
    assert isinstance(turn, WaitTurn)
    got = turn.next(sim.now)
    assert isinstance(got, RecordedWait) and bytes(got.payload) == b"1"
    second = m.wait("signal:go", signals=("go",))
    assert isinstance(second, WaitTurn)
    got2 = second.next(sim.now)
    assert isinstance(got2, RecordedWait) and bytes(got2.payload) == b"2"
    sim.store()
    assert sim.state.signals == ()


def test_a_wait_parks_once_then_takes_a_signal_that_came_while_parking() -> None:
    sim = Sim()
    turn = sim.machine.wait("signal:go", signals=("go",), deadline=lambda: T0 + 60)
    assert isinstance(turn, WaitTurn)
    park = turn.next(sim.now)
    assert isinstance(park, Park) and park.deadline == T0 + 60
    assert isinstance(park.event, WaitStarted)
    sim.store(park.event)
    assert not turn.signal_waiting()
    sim.arrive(signal("go", "s1", "hi"))
    assert turn.signal_waiting()
    got = turn.next(sim.now)
    assert isinstance(got, RecordedWait) and got.signal == "go"
    sim.store()
    assert sim.state.ops[0].status == "completed"


def test_reparking_does_not_record_the_wait_twice() -> None:
    sim = Sim()
    turn = sim.machine.wait("sleep", deadline=lambda: T0 + 5)
    assert isinstance(turn, WaitTurn)
    first = turn.next(sim.now)
    again = turn.next(sim.now)
    assert isinstance(first, Park) and first.event is not None
    assert isinstance(again, Park) and again.event is None


def test_a_recorded_wait_keeps_its_deadline_and_times_out_when_it_passed() -> None:
    sim = Sim()
    turn = sim.machine.wait("sleep", deadline=lambda: T0 + 5)
    assert isinstance(turn, WaitTurn)
    park = turn.next(sim.now)
    assert isinstance(park, Park)
    sim.store(park.event)  # type: ignore[arg-type]
    sim.now += 6
    woken = sim.activate().wait("sleep", deadline=lambda: pytest.fail("asked again"))
    assert isinstance(woken, WaitTurn) and woken.deadline == T0 + 5
    assert woken.next(sim.now) is None  # timed out
    sim.store()
    assert sim.activate().wait("sleep") is None  # replays as a timeout


def test_select_takes_the_first_of_several_signals() -> None:
    sim = Sim()
    sim.history += [signal("other", "o"), signal("no", "n1", "deny"), signal("yes", "y1")]
    turn = sim.activate().wait("select:yes|no", signals=("yes", "no"))
    assert isinstance(turn, WaitTurn)
    got = turn.next(sim.now)
    assert isinstance(got, RecordedWait) and got.signal == "no"


def test_a_wait_on_a_child_looks_it_up_once_before_parking() -> None:
    sim = Sim()
    child = child_run_id(RUN, 0)
    turn = sim.machine.wait(
        f"child:{child}", signals=(f"sojourn-child.{child}",), children=(child,)
    )
    assert isinstance(turn, WaitTurn)
    assert turn.next(sim.now) == LookupChildren((child,))
    assert isinstance(turn.next(sim.now, looked=True), Park)
    got = turn.child_ended(raw({"status": "completed"}), "completed", sim.now)
    assert got.outcome == "child"
    sim.store()
    assert sim.state.ops[0].status == "completed"


# --- children, cancel, values, budgets and caps ----------------------------------------------


def test_a_child_gets_a_deterministic_id_and_replays_it() -> None:
    sim = Sim()
    ok_step(sim, "before", 1)
    start = sim.machine.child("worker")
    assert start == ChildStart(1, f"{RUN}-c1")
    sim.machine.child_started(start, "worker", sim.now)
    sim.store()
    assert sim.state.children == (f"{RUN}-c1",)
    m = sim.activate()
    ok_step(sim, "before", 1)
    again = m.child("worker")
    assert isinstance(again, Return) and msgspec.json.decode(again.result) == f"{RUN}-c1"


def test_child_ids_stay_valid_when_nesting_is_deep() -> None:
    deep = "r" * 120
    assert len(child_run_id(deep, 12345)) <= 128
    assert child_run_id(deep, 3) == child_run_id(deep, 3) != child_run_id(deep, 4)


def test_a_cancel_request_stops_the_next_operation() -> None:
    sim = Sim()
    ok_step(sim, "a", 1)
    sim.arrive(CancelRequested(reason="user", at=T0))
    with pytest.raises(RunCancelledInterrupt):
        sim.machine.step("b", "retry", None)
    with pytest.raises(RunCancelledInterrupt):
        sim.machine.wait("sleep")


def test_values_are_recorded_once_and_replayed() -> None:
    sim = Sim()
    got = sim.machine.value("random", lambda: 0.25, sim.now)
    assert bytes(got.result) == b"0.25"
    sim.store()
    again = sim.activate().value("random", lambda: pytest.fail("made again"), sim.now)
    assert bytes(again.result) == b"0.25"


def test_a_value_too_large_is_fatal_even_if_the_code_catches_it() -> None:
    sim = Sim(limits=Limits(max_value=8))
    with pytest.raises(PayloadTooLarge):
        sim.machine.value("uuid", lambda: "x" * 50, sim.now)
    with pytest.raises(PayloadTooLarge):
        sim.machine.step("next", "retry", None)


def test_a_budget_suspends_once_reached_and_a_resume_grants_it_again() -> None:
    sim = Sim(limits=Limits(budget=Budget(usd=1.0)))
    assert sim.machine.spend(0.6, 10, sim.now) == (True, None)
    live, over = sim.machine.spend(0.5, 10, sim.now)
    assert live and isinstance(over, Suspend) and over.unit == "usd"
    assert over.event.reason == "budget" and over.event.limit == "usd"
    assert "usd used up: 1.1 of 1" in over.event.detail
    sim.store(over.event)
    sim.history.append(RunResumed(by="ops", at=T0))
    m = sim.activate()
    assert m.spend(0.6, 10, sim.now) == (False, None)  # replayed: no new verdict
    assert m.spend(0.5, 10, sim.now) == (False, None)
    assert m.spend(0.5, 0, sim.now)[1] is None  # 1.6 of 2.0
    assert isinstance(m.spend(0.5, 0, sim.now)[1], Suspend)  # 2.1 of 2.0


def test_a_token_budget() -> None:
    sim = Sim(limits=Limits(budget=Budget(tokens=100)))
    _, over = sim.machine.spend(0.0, 100, sim.now)
    assert isinstance(over, Suspend) and over.unit == "tokens"


def test_the_poll_cap_suspends_and_each_resume_allows_another_cap() -> None:
    sim = Sim(limits=Limits(poll_cap=2))
    m = sim.machine
    assert m.count_poll("job", sim.now) is None
    assert m.count_poll("job", sim.now) is None
    capped = m.count_poll("job", sim.now)
    assert isinstance(capped, Suspend) and capped.event.reason == "cap"
    sim.store(capped.event)
    sim.history.append(RunResumed(at=T0))
    m = sim.activate()
    assert all(m.count_poll("job", sim.now) is None for _ in range(4))
    assert isinstance(m.count_poll("job", sim.now), Suspend)


# --- replay, divergence and patches ----------------------------------------------------------


def test_a_changed_step_is_a_divergence_naming_both_operations() -> None:
    sim = Sim()
    ok_step(sim, "send", 1)
    sim.store()
    m = sim.activate()
    with pytest.raises(NondeterminismError) as e:
        m.step("compose", "retry", None)
    assert "operation 0 was recorded as step 'send'" in str(e.value)
    assert "step 'compose'" in str(e.value)
    assert m.nondeterminism is e.value  # kept even if the code catches it


def test_a_journal_that_stops_at_the_frontier() -> None:
    sim = Sim()
    ok_step(sim, "a", 1)
    sim.store()
    m = Machine(fold(sim.history), stop_at_frontier=True)
    assert isinstance(m.step("a", "retry", None), Return)
    with pytest.raises(ReplayFrontier) as e:
        m.step("b", "retry", None)
    assert e.value.position == 1


def test_patched_takes_the_new_branch_for_new_runs_and_records_a_marker() -> None:
    sim = Sim()
    assert sim.machine.patched("v2", sim.now) is True
    assert sim.machine.patched("v2", sim.now) is True  # the same answer, no second marker
    ok_step(sim, "new_step", 1)
    sim.store()
    ops = sim.state.ops
    assert [(o.kind, o.name) for o in ops] == [("patch", "patch"), ("step", "new_step")]
    m = sim.activate()  # replays: the marker is there
    assert m.patched("v2", sim.now) is True
    assert isinstance(m.step("new_step", "retry", None), Return)


def test_patched_takes_the_old_branch_for_runs_recorded_before_the_change() -> None:
    sim = Sim()
    ok_step(sim, "old_step", 1)
    sim.store()
    m = sim.activate()
    assert m.patched("v2", sim.now) is False  # history went on without the marker here
    assert m.pending == []
    assert isinstance(m.step("old_step", "retry", None), Return)
    assert m.patched("v2", sim.now) is False  # same answer for the whole run


def test_an_old_run_that_reaches_the_change_live_takes_the_new_branch() -> None:
    sim = Sim()
    ok_step(sim, "before", 1)
    sim.store()
    m = sim.activate()
    ok_step(sim, "before", 1)
    assert m.patched("v2", sim.now) is True


def test_deprecate_patch_steps_over_the_marker_and_records_nothing_new() -> None:
    sim = Sim()
    sim.machine.patched("v2", sim.now)
    ok_step(sim, "new_step", 1)
    sim.store()
    m = sim.activate()
    m.deprecate_patch("v2")
    assert isinstance(m.step("new_step", "retry", None), Return)
    fresh = Sim()
    fresh.machine.deprecate_patch("v2")
    ok_step(fresh, "new_step", 1)
    fresh.store()
    assert [o.kind for o in fresh.state.ops] == ["step"]


def test_removing_a_patch_too_early_is_a_divergence_that_names_it() -> None:
    sim = Sim()
    sim.machine.patched("v2", sim.now)
    sim.store()
    with pytest.raises(NondeterminismError, match=r"ctx.patched\('v2'\)"):
        sim.activate().step("new_step", "retry", None)


# --- random outcome sequences ----------------------------------------------------------------

Outcome = Literal["ok", "retryable", "terminal", "crash"]


@dataclass
class Script:
    """A random agent: ``steps`` steps in a row, each attempt's outcome drawn in advance."""

    steps: int
    outcomes: Iterator[Outcome]
    in_doubt: Literal["retry", "ask"]
    in_process: bool
    """Short backoffs sleep in the activation (else every backoff parks the run)."""


def run_activation(sim: Sim, script: Script, policy: RetryPolicy) -> str:
    """One activation of the script's agent; returns how it rested."""
    m = sim.activate()
    for n in range(script.steps):
        try:
            turn = m.step(f"s{n}", script.in_doubt, policy)
        except StepError:
            return "failed"
        if isinstance(turn, Return):
            assert msgspec.json.decode(turn.result) == n
            continue
        while True:
            action = turn.next(sim.now)
            if isinstance(action, Return):
                assert msgspec.json.decode(action.result) == n
                break
            if isinstance(action, Raise):
                sim.store()
                return "failed"
            if isinstance(action, Backoff):
                sim.store()
                sim.now = max(sim.now, action.retry_at)  # the timer fires
                if script.in_process:
                    continue
                return "parked"
            if isinstance(action, Suspend):
                sim.store(action.event)
                return "suspended"
            assert isinstance(action, Attempt)
            sim.store(action.started)
            outcome = next(script.outcomes, "ok")
            if outcome == "crash":
                return "crashed"  # the worker died mid-step: nothing more stored
            if outcome == "ok":
                turn.returned(raw(n), 0.0, sim.now)
            else:
                err = RetryableError("429") if outcome == "retryable" else TerminalError("no")
                turn.raised(err, 0.0, sim.now)
    sim.store()
    return "completed"


@settings(max_examples=300, deadline=None)
@given(
    steps=st.integers(1, 6),
    outcomes=st.lists(st.sampled_from(["ok", "retryable", "terminal", "crash"]), max_size=30),
    in_doubt=st.sampled_from(["retry", "ask"]),
    in_process=st.booleans(),
)
def test_random_outcomes_fold_to_what_the_machine_claimed(
    steps: int, outcomes: list[Outcome], in_doubt: Literal["retry", "ask"], in_process: bool
) -> None:
    policy = RetryPolicy(retry_on=(ValueError,), attempts=3, initial_interval=1.0, jitter=0.0)
    sim = Sim(limits=Limits(crash_loop_limit=3))
    script = Script(steps, iter(outcomes), in_doubt, in_process)
    rests: list[str] = []
    for _ in range(60):
        rest = run_activation(sim, script, policy)
        rests.append(rest)
        state = sim.state  # no anomalies, whatever happened
        if rest in ("completed", "failed", "suspended"):
            break
    else:
        pytest.fail(f"never came to rest: {rests}")
    # Attempts at each position are 1, 2, 3, ... in order.
    for p in range(len(state.ops)):
        tried = [e.attempt for e in sim.history if isinstance(e, StepStarted) and e.position == p]
        assert tried == list(range(1, len(tried) + 1))
    done = [o for o in state.ops if o.status == "completed"]
    # Steps complete in order, each with the value its code returned.
    assert [o.name for o in done] == [f"s{n}" for n in range(len(done))]
    assert all(msgspec.json.decode(o.result or b"") == n for n, o in enumerate(done))
    for op in state.ops:
        assert op.attempts <= 3 or op.status != "failed" or op.deadline is None
    if rest == "completed":
        assert len(done) == steps
    elif rest == "failed":
        last = state.ops[-1]
        assert last.status == "failed" and last.deadline is None
    else:
        assert state.status == "suspended"
        assert state.suspended_reason in ("in_doubt", "crash_loop")
        assert state.ops[-1].status == "started"
        if in_doubt == "retry":
            assert state.suspended_reason == "crash_loop"
            assert state.ops[-1].interrupted + 1 >= 3
    # Replaying the whole history with the journal stopped at the frontier never diverges.
    m = Machine(state, stop_at_frontier=True)
    for n in range(steps):
        try:
            got = m.step(f"s{n}", in_doubt, policy)
        except (StepError, ReplayFrontier):
            break
        assert isinstance(got, Return)


WAITS: list[tuple[str, tuple[str, ...]]] = [
    ("signal:a", ("a",)),
    ("select:a|b", ("a", "b")),
    ("signal:b", ("b",)),
    ("select:b|c", ("b", "c")),
] * 2

names = st.sampled_from(["a", "b", "c"])


@settings(max_examples=300, deadline=None)
@given(
    before=st.lists(names, max_size=8),
    during=st.lists(names, max_size=12),
    reactivate=st.lists(st.booleans(), min_size=len(WAITS), max_size=len(WAITS)),
)
def test_random_signal_arrivals_are_each_consumed_once_oldest_first(
    before: list[str], during: list[str], reactivate: list[bool]
) -> None:
    """Signals buffered before a wait or arriving while it is parked, activations replaced at
    random: each wait takes the oldest matching signal not yet taken, exactly as a plain list
    model says, and no signal is taken twice."""
    sim = Sim()
    ids = iter(range(1000))
    sim.history += [signal(n, f"s{next(ids)}") for n in before]
    model = [(e.name, e.signal_id) for e in sim.history if isinstance(e, SignalReceived)]
    m = sim.activate()
    arrivals = list(during)
    done = 0
    for i, (key, wanted) in enumerate(WAITS):
        if reactivate[i]:
            sim.store()
            m = sim.activate()
            for k, ns in WAITS[:done]:
                assert isinstance(m.wait(k, signals=ns), RecordedWait)
        turn = m.wait(key, signals=wanted)
        assert isinstance(turn, WaitTurn)
        action = turn.next(sim.now)
        while isinstance(action, Park):
            sim.store(*([action.event] if action.event else []))
            if not arrivals:
                break
            event = signal(arrivals.pop(0), f"s{next(ids)}")
            model.append((event.name, event.signal_id))
            sim.arrive(event)
            action = turn.next(sim.now)
        expected = next(((n, sid) for n, sid in model if n in wanted), None)
        if not isinstance(action, RecordedWait):
            assert expected is None  # parked with nothing matching left
            break
        assert expected is not None
        model.remove(expected)
        assert action.signal == expected[0]
        done += 1
    sim.store()
    taken = [e.signal_id for e in sim.history if isinstance(e, WaitCompleted)]
    assert len(taken) == len(set(taken)) == done
    assert {r.signal_id for r in sim.state.signals} == {sid for _, sid in model}
