"""``plan_fork``: where a fork cuts an old run's history, what it copies, what it refuses
(pure; the runs themselves: ``tests/actors/agents/test_fork.py``)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sojourn.actors.core.fork import COPIED, ForkRefused, plan_fork
from sojourn.actors.core.journal import Execute, Journal, Recorded
from sojourn.actors.core.state import fold
from sojourn.schemas.events import (
    Budget,
    BudgetChanged,
    CancelRequested,
    CancelTaken,
    ErrorInfo,
    RunEvent,
    RunFailed,
    RunStarted,
    SignalReceived,
    StepCompleted,
    StepFailed,
    StepStarted,
    ValueRecorded,
)

NULL = msgspec.Raw(b"null")
START = RunStarted(run_id="r", agent="a", input=NULL)
BOOM = ErrorInfo(type="StepError", message="boom")


def steps(n: int) -> list[RunEvent]:
    out: list[RunEvent] = []
    for p in range(n):
        out += [
            StepStarted(position=p, name=f"s{p}"),
            StepCompleted(position=p, name=f"s{p}", result=msgspec.Raw(b"%d" % p)),
        ]
    return out


def failed_at(n: int) -> list[RunEvent]:
    """``n`` steps completed, then step ``n`` failing for good and the run with it."""
    return [
        START,
        *steps(n),
        StepStarted(position=n, name=f"s{n}"),
        StepFailed(position=n, name=f"s{n}", error=BOOM),
        RunFailed(error=BOOM),
    ]


@given(st.integers(1, 12), st.data())
def test_a_fork_copies_exactly_the_positions_before_its_own_and_replays_them(
    n: int, data: st.DataObject
) -> None:
    history = failed_at(n)
    at = data.draw(st.integers(0, n))
    plan = plan_fork("r", history, from_step=at, from_failure=False)
    assert plan.position == at and plan.started == START
    assert all(isinstance(e, COPIED) for e in plan.copied)
    assert plan.copied == tuple(steps(at))
    # Replayed, the fork returns the recorded results before ``at`` and executes ``at``.
    journal = Journal(fold([START, *plan.copied]))
    for p in range(at):
        assert journal.step(f"s{p}") == Recorded(position=p, result=msgspec.Raw(b"%d" % p))
    assert journal.step(f"s{at}") == Execute(position=at, attempt=1, in_doubt=False)


def test_from_failure_is_the_failed_step_or_the_position_after_the_last() -> None:
    assert plan_fork("r", failed_at(7), from_step=None, from_failure=True).position == 7
    raised = [START, *steps(3), RunFailed(error=BOOM)]  # the code raised outside any step
    assert plan_fork("r", raised, from_step=None, from_failure=True).position == 3
    caught = [  # step 1 failed, the code caught it, went on and raised after step 2
        START,
        *steps(1),
        StepStarted(position=1, name="s1"),
        StepFailed(position=1, name="s1", error=BOOM),
        StepStarted(position=2, name="s2"),
        StepCompleted(position=2, name="s2", result=NULL),
        RunFailed(error=BOOM),
    ]
    plan = plan_fork("r", caught, from_step=None, from_failure=True)
    assert plan.position == 3 and len(plan.copied) == 6


def test_requests_and_signals_before_the_cut() -> None:
    """Signals are copied; the old run's cancel, budget change and end are not."""
    signal = SignalReceived(name="go", payload=NULL, signal_id="s-1")
    budget = BudgetChanged(budget=Budget(usd=5.0))
    history = [
        START,
        *steps(2),
        signal,
        budget,
        CancelRequested(reason="stop"),
        RunFailed(error=BOOM),
    ]
    plan = plan_fork("r", history, from_step=2, from_failure=False)
    assert plan.copied == (*steps(2), signal)
    assert fold([START, *plan.copied]).status == "running"


@pytest.mark.parametrize(
    ("history", "at", "failure", "code", "words"),
    [
        ([], 0, False, "unknown_run", "no history"),
        ([START, *steps(3)], 4, False, "invalid_fork", "positions 0 to 2"),
        ([START, *steps(3)], None, True, "invalid_fork", "has not failed"),
        ([START, *steps(3)], None, False, "invalid_fork", "from_step"),
        ([START, *steps(3)], 1, True, "invalid_fork", "from_step"),
        (  # two steps run together (ctx.gather): position 0 ends after position 1 began
            [
                START,
                StepStarted(position=0, name="a"),
                StepStarted(position=1, name="b"),
                StepCompleted(position=1, name="b", result=NULL),
                StepCompleted(position=0, name="a", result=NULL),
            ],
            1,
            False,
            "invalid_fork",
            "position 0 was still open",
        ),
        (  # within a cancelled run's compensation
            [
                START,
                *steps(2),
                CancelRequested(reason="stop"),
                CancelTaken(stopped_at=2, compensate_at=2),
                ValueRecorded(position=2, kind="now", value=NULL),
            ],
            3,
            False,
            "invalid_fork",
            "stopped for a cancel",
        ),
    ],
)
def test_refusals(
    history: list[RunEvent], at: int | None, failure: bool, code: str, words: str
) -> None:
    with pytest.raises(ForkRefused, match=words) as refused:
        plan_fork("r", history, from_step=at, from_failure=failure)
    assert refused.value.code == code


def test_a_step_in_flight_is_open_at_the_frontier() -> None:
    live = [START, *steps(2), StepStarted(position=2, name="s2")]
    with pytest.raises(ForkRefused, match="position 2 was still open"):
        plan_fork("r", live, from_step=3, from_failure=False)
    assert plan_fork("r", live, from_step=2, from_failure=False).copied == tuple(steps(2))
