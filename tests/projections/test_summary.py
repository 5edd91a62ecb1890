"""The compact run summary agrees with the full fold wherever both describe the same thing."""

from __future__ import annotations

import functools
import itertools

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from sojourn.actors.core.state import fold
from sojourn.projections.summary import (
    PendingSignal,
    RunSummary,
    close_decision,
    summarize,
    summarize_all,
)
from sojourn.schemas.codec import to_raw
from sojourn.schemas.events import (
    ChildStarted,
    ErrorInfo,
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
from sojourn.schemas.views import CHILDREN_SHOWN, ERROR_MESSAGE_MAX
from sojourn.schemas.wire import CHILD_SIGNAL
from tests.strategies import Expected, any_histories, signal_histories, valid_histories


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
    # what a view shows
    assert s.steps_done == full.steps_completed
    assert s.children == full.children[:CHILDREN_SHOWN]
    assert s.children_count == len(full.children)
    assert s.code_version == full.code_version
    assert s.budget_grants == 1 + full.budget_resumes
    if full.status == "failed":
        assert full.error is not None and s.error is not None
        assert s.error.type == full.error.type[:ERROR_MESSAGE_MAX]
        assert s.error.message == full.error.message[:ERROR_MESSAGE_MAX]
    if s.step is not None:
        assert s.step_position is not None
        op = full.op(s.step_position)
        assert op is not None and op.status == "started" and s.step_attempt == op.attempts
    else:
        assert s.step_attempt == 0


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


def _one_by_one(decisions: list[tuple[int, int, list[RunEvent]]], s: RunSummary) -> RunSummary:
    """What ``summarize_all`` must equal: each event applied, each decision closed."""
    for seq, size, events in decisions:
        for e in events:
            s = summarize(s, e)
        s = close_decision(s, seq, size)
    return s


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.one_of(any_histories, signal_histories()), st.data())
def test_summarize_all_equals_summarizing_event_by_event(
    events: list[RunEvent], data: st.DataObject
) -> None:
    # cut into decisions (a few events each), and into two calls at a decision boundary
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(events))), max_size=8))))
    bounds = [0, *[c for c in cuts if c < len(events)], len(events)]
    pairs = enumerate(itertools.pairwise(bounds))
    decisions = [(i + 1, 10 * i, events[a:b]) for i, (a, b) in pairs]
    want = _one_by_one(decisions, RunSummary())
    assert summarize_all(decisions) == want
    k = data.draw(st.integers(0, len(decisions)), label="split")
    assert summarize_all(decisions[k:], summarize_all(decisions[:k])) == want
    assert summarize_all(decisions[k:], _one_by_one(decisions[:k], RunSummary())) == want


def test_summarize_all_with_a_start_holding_an_id_twice_is_still_exact() -> None:
    # Not something ``summarize`` builds (it buffers an id once), but a caller may pass it.
    twice = RunSummary(
        status="waiting",
        signals=(PendingSignal("s1", "go", 1.0), PendingSignal("s1", "go", 2.0)),
    )
    decisions: list[tuple[int, int, list[RunEvent]]] = [
        (1, 5, [SignalReceived(name="go", payload=to_raw(1), signal_id="s2", at=3.0)]),
        (2, 5, [SignalReceived(name="go", payload=to_raw(1), signal_id="s1", at=4.0)]),
    ]
    assert summarize_all(decisions, twice) == _one_by_one(decisions, twice)


def test_a_child_wait_takes_only_the_child_s_end_notice() -> None:
    notice = f"{CHILD_SIGNAL}.c0"
    events: list[RunEvent] = [
        RunStarted(run_id="r", agent="a", input=to_raw(None)),
        SignalReceived(name=notice, payload=to_raw(1), signal_id="x"),
        WaitCompleted(
            position=0, key="k", outcome="signal", payload=to_raw(1), signal=notice, signal_id="x"
        ),
        SignalReceived(name="approve", payload=to_raw(2), signal_id="x"),  # the id, reused
        SignalReceived(name=notice, payload=to_raw(3), signal_id="child-end:c0"),
        WaitStarted(position=1, key="child:c0", signals=(notice,), children=("c0",)),
        WaitCompleted(position=1, key="child:c0", outcome="child", payload=to_raw(3)),
    ]
    decisions = [(i + 1, 1, [e]) for i, e in enumerate(events)]
    s = summarize_all(decisions)
    assert s == _one_by_one(decisions, RunSummary())
    assert [(x.signal_id, x.name) for x in s.signals] == [("x", "approve")]


def test_twenty_thousand_buffered_signals_are_summarized_in_order() -> None:
    """No time assertion (see ``python -m bench.folds``): the result, for a run that buffered
    20,000 signals (one decision each, as the intake writes them), some of them twice."""
    n = 20_000
    start = RunStarted(run_id="r", agent="a", input=to_raw(None), at=0.0)
    received = [
        SignalReceived(name="go", payload=to_raw(i), signal_id=f"s{i}", at=float(i + 1))
        for i in range(n)
    ]
    again = received[:100]  # redelivered: a pending id counts once
    history: list[RunEvent] = [start, *received, *again]
    decisions = [(i + 1, 80, [e]) for i, e in enumerate(history)]
    s = summarize_all(decisions)
    assert [x.signal_id for x in s.signals] == [e.signal_id for e in received]
    assert (s.events, s.decisions, s.bytes) == (n + 101, n + 101, 80 * (n + 101))
    # waits take the even ones by id
    taken = [
        WaitCompleted(
            position=k,
            key="signal:go",
            outcome="signal",
            payload=e.payload,
            signal="go",
            signal_id=e.signal_id,
        )
        for k, e in enumerate(received[0::2])
    ]
    s = summarize_all([(n + 102, 80, taken)], s)
    assert [x.signal_id for x in s.signals] == [e.signal_id for e in received[1::2]]
    assert s.due_signal() is None  # not waiting
    # one event at a time (the watchdog's path) agrees, from a state holding 10,000
    one = summarize(s, taken[0])
    assert one.signals == s.signals
    more = SignalReceived(name="go", payload=to_raw(0), signal_id="s0", at=1e9)
    assert [x.signal_id for x in summarize(s, more).signals][-1] == "s0"
    assert summarize(s, received[1]).signals == s.signals  # pending already: once
    ended = summarize_all([(n + 103, 80, [RunCompleted(output=to_raw(1))])], s)
    assert ended.signals == () and ended.terminal


def test_budget_grants_children_errors_and_attempts_are_what_a_view_shows() -> None:
    boom = ErrorInfo(type="ValueError", message="x" * (ERROR_MESSAGE_MAX + 10))
    events: list[RunEvent] = [
        RunStarted(
            run_id="r", agent="a", input=to_raw(None), code_version="v7", budget_usd=2.0, at=1.0
        ),
        *[
            ChildStarted(position=i, child_run_id=f"r-c{i}", agent="kid")
            for i in range(CHILDREN_SHOWN + 5)
        ],
        StepStarted(position=200, name="call", attempt=1, at=2.0),
        StepFailed(position=200, name="call", attempt=1, error=boom, retry_at=3.0, at=2.5),
        StepStarted(position=200, name="call", attempt=2, at=3.0),
    ]
    s = _summary(events)
    assert (s.code_version, s.budget_usd, s.budget_tokens, s.budget_grants) == ("v7", 2.0, None, 1)
    assert s.children_count == CHILDREN_SHOWN + 5 and len(s.children) == CHILDREN_SHOWN
    assert s.children[0] == "r-c0"
    assert (s.step, s.step_attempt, s.step_attempts, s.steps_done) == ("call", 2, 2, 0)
    assert s.error is not None and len(s.error.message) == ERROR_MESSAGE_MAX  # the attempt before
    s = _summary(
        [
            *events,
            StepCompleted(position=200, name="call", attempt=2, result=to_raw(1)),
            RunSuspended(reason="budget", detail="spent"),
            RunResumed(),
            RunSuspended(reason="cap", detail="polls"),
            RunResumed(),  # a cap resume grants no budget
        ]
    )
    assert (s.steps_done, s.step_attempt, s.error, s.budget_grants) == (1, 0, None, 2)
    failed = summarize(s, RunFailed(error=ErrorInfo(type="E", message="m"), at=9.0))
    assert failed.error is not None and (failed.error.type, failed.error.message) == ("E", "m")
    assert summarize(s, RunCompleted(output=to_raw(1))).error is None
