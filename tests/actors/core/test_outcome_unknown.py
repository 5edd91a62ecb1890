"""An attempt that raises ``OutcomeUnknown`` (what it called went away mid-call: an MCP server
died before answering), with no event loop and no server: under ``retry`` it is a recorded,
retried failure; under ``ask`` or a reconcile function nothing is recorded and the attempt is
settled in doubt, as if its worker had died, live and after a new activation alike."""

from __future__ import annotations

from sojourn.actors.core.actions import Attempt, InDoubtPolicy, Reconcile, Return, Suspend
from sojourn.actors.core.retry import RetryPolicy
from sojourn.actors.core.steps import StepTurn
from sojourn.schemas.errors import OutcomeUnknown
from sojourn.schemas.events import StepCompleted, StepFailed, StepStarted
from tests.actors.core.test_machine import Sim, attempt, decide, raw

LOST = OutcomeUnknown("the server went away mid-call")


def turn_of(sim: Sim, policy: InDoubtPolicy, retry: RetryPolicy | None = None) -> StepTurn:
    turn = sim.machine.step("mcp:s.t", policy, retry, "tool")
    assert isinstance(turn, StepTurn)
    return turn


def test_under_retry_a_lost_call_is_a_recorded_failure_retried_within_the_policy() -> None:
    sim = Sim()
    turn = turn_of(sim, "retry")
    attempt(sim, turn)
    assert turn.raised(LOST, 1.0, sim.now) is None  # a RetryableError: 3 attempts by default
    sim.store()
    (failed,) = [e for e in sim.history if isinstance(e, StepFailed)]
    assert failed.error.type == "OutcomeUnknown" and failed.retry_at is not None
    sim.now = failed.retry_at
    again = turn.next(sim.now)
    assert isinstance(again, Attempt) and again.attempt == 2 and not again.in_doubt


def test_under_ask_nothing_is_recorded_and_the_run_suspends_in_doubt() -> None:
    sim = Sim()
    turn = turn_of(sim, "ask")
    attempt(sim, turn)
    assert turn.raised(LOST, 1.0, sim.now) is None
    assert sim.machine.pending == []  # no end: the attempt stays started
    action = turn.next(sim.now)
    assert isinstance(action, Suspend) and action.event.reason == "in_doubt"
    assert "'mcp:s.t'" in (action.event.detail or "")
    sim.store(action.event)
    assert [type(e) for e in sim.history[1:]] == [StepStarted, type(action.event)]

    # After the suspension, a new activation finds the same in-doubt step; "skip" records the
    # operator's result for attempt 1 and never runs the call again.
    sim.history.append(decide("skip", "ch_1"))
    sim.activate()
    turn = turn_of(sim, "ask")
    done = turn.next(sim.now)
    assert isinstance(done, Return) and done.result == raw("ch_1")
    sim.store()
    (completed,) = [e for e in sim.history if isinstance(e, StepCompleted)]
    assert completed.attempt == 1


def test_under_a_reconcile_function_the_lost_call_is_reconciled_by_its_key() -> None:
    sim = Sim()
    turn = turn_of(sim, "reconcile")
    attempt(sim, turn)
    assert turn.raised(LOST, 1.0, sim.now) is None
    action = turn.next(sim.now)
    assert isinstance(action, Reconcile) and action.key == turn.key
    turn.reconciled(None, sim.now)  # not done: call again, as attempt 2, in doubt
    again = turn.next(sim.now)
    assert isinstance(again, Attempt) and again.attempt == 2 and again.in_doubt


def test_other_errors_under_ask_are_plain_failures() -> None:
    sim = Sim()
    turn = turn_of(sim, "ask")
    attempt(sim, turn)
    assert turn.raised(ValueError("bad"), 1.0, sim.now) is not None  # no policy: fails
    sim.store()
    assert [type(e) for e in sim.history[1:]] == [StepStarted, StepFailed]
