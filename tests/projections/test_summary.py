"""The compact run summary agrees with the full fold wherever both describe the same thing."""

from __future__ import annotations

import functools

import msgspec
from hypothesis import given, settings

from sojourn.actors.state import fold
from sojourn.projections.summary import RunSummary, summarize, summarize_all
from sojourn.schemas.codec import to_raw
from sojourn.schemas.events import (
    RunEvent,
    RunStarted,
    SignalReceived,
    StepStarted,
    ValueRecorded,
    WaitCompleted,
    WaitStarted,
)
from tests.actors.test_state import Expected, any_histories, valid_histories


def _summary(events: list[RunEvent]) -> RunSummary:
    return functools.reduce(summarize, events, RunSummary())


@settings(max_examples=400, deadline=None)
@given(valid_histories())
def test_the_summary_of_a_valid_history_agrees_with_the_full_fold(
    history: tuple[list[RunEvent], Expected],
) -> None:
    events, _ = history
    full = fold(events)
    s = _summary(events)
    assert s.status == full.status
    if not full.terminal:  # an ended run's leftover waits and signals do not matter to liveness
        assert s.waiting_on == full.waiting_on
        assert s.deadline == full.deadline
        assert [x.signal_id for x in s.signals] == [r.signal_id for r in full.signals]
    assert s.step_attempts == full.step_attempts
    assert s.events == full.events
    assert s.terminal == full.terminal
    assert s.anomalies == 0


@settings(max_examples=400, deadline=None)
@given(any_histories)
def test_the_summary_is_total_and_ends_where_the_full_fold_ends(events: list[RunEvent]) -> None:
    s = _summary(events)  # never raises, whatever the events
    full = fold(events)
    assert s.events == full.events
    assert s.terminal == full.terminal


def test_idle_polls_retries_in_doubt_and_spend_are_counted() -> None:
    events: list[RunEvent] = [
        RunStarted(run_id="r", agent="a", input=to_raw(None), at=1.0),
        StepStarted(position=0, name="check", attempt=1, at=2.0),
        StepStarted(position=0, name="check", attempt=2, at=3.0),  # in doubt: re-run
        WaitStarted(position=1, key="poll", deadline=10.0, at=4.0),
        WaitCompleted(position=1, key="poll", outcome="timeout", payload=to_raw(None), at=10.0),
        ValueRecorded(position=2, kind="spend", value=to_raw({"usd": 0.5, "tokens": 10})),
        WaitStarted(position=3, key="signal", signals=("go",), at=11.0),
        SignalReceived(name="go", payload=to_raw(1), signal_id="s1", at=12.0),
    ]
    s = _summary(events)
    assert (s.idle_polls, s.in_doubt, s.retries) == (1, 1, 0)
    assert (s.spent_usd, s.spent_tokens) == (0.5, 10)
    assert s.status == "waiting" and s.due_signal() is not None
    assert s.due_signal().name == "go"  # type: ignore[union-attr]
    folded = summarize_all([(7, 100, events[:3]), (9, 50, events[3:])])
    assert (folded.last_seq, folded.decisions, folded.bytes) == (9, 2, 150)
    assert msgspec.structs.replace(folded, last_seq=0, decisions=0, bytes=0) == s
