"""The read side's step list and spend (decision 0040), pure: folded decision by decision it
equals what the console's timeline folds from the whole history, it stays within its bound,
and its decoder refuses whatever bytes are not a record."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sojourn.actors.console.timeline import Item, timeline_of
from sojourn.actors.core.state import fold
from sojourn.broker.eventstore import Decision
from sojourn.projections.steplist import clip, steps_of
from sojourn.projections.summary import RunSummary, close_decision, summarize, summarize_all
from sojourn.schemas import events as ev
from sojourn.schemas.codec import decode_run_steps, encode, to_raw
from sojourn.schemas.steps import (
    STEP_ERROR_MAX,
    STEP_NAME_MAX,
    STEPS_KEPT,
    STEPS_RECORD_MAX,
    RunSteps,
    StepRecord,
)
from sojourn.schemas.vocabulary import BUDGET_LIMITS
from sojourn.schemas.wire import InDoubtDecision, decide_signal
from tests.strategies import Expected, valid_histories

T0 = 1_700_000_000.0
RAW = msgspec.Raw(b"null")


def _expected(item: Item) -> StepRecord:
    """What the read side keeps of a timeline's step item."""
    last = item.attempts[-1]
    failed = [a for a in item.attempts if a.error is not None]
    error = failed[-1].error if failed else None
    if error is not None:
        error = msgspec.structs.replace(
            error,
            type=clip(error.type, STEP_NAME_MAX),
            message=clip(error.message, STEP_ERROR_MAX),
        )
    outcomes = [a.outcome for a in item.attempts]
    return StepRecord(
        position=item.position or 0,
        name=clip(item.name, STEP_NAME_MAX),
        kind=item.step_kind or "step",
        started_at=item.at,
        ended_at=item.end,
        duration=last.duration,
        attempts=len(item.attempts),
        retries=sum(1 for a, _ in itertools.pairwise(outcomes) if a == "failed"),
        in_doubt=outcomes.count("in_doubt"),
        outcome=last.outcome,
        error=error,
        retry_at=last.retry_at if last.outcome == "failed" else None,
        usage=item.usage,
        attempt=last.attempt,
        attempt_started_at=last.started_at if len(item.attempts) > 1 else None,
    )


def _fold(decisions: list[Decision]) -> RunSummary:
    return summarize_all((d.seq, d.size, d.events) for d in decisions)


def _undecided(r: StepRecord) -> StepRecord:
    return msgspec.structs.replace(r, decision=None, decided_by=None)


@st.composite
def step_histories(draw: st.DrawFn) -> list[Decision]:
    """A run's start, then step attempts, ends, spends and in-doubt decisions in any order a
    worker (and its crashes) could store them, a few events per decision."""
    budget = draw(
        st.none()
        | st.builds(
            ev.Budget,
            usd=st.none() | st.just(5.0),
            steps=st.none() | st.just(40),
            polls=st.none() | st.just(3),
        )
    )
    carried = draw(st.none() | st.builds(ev.Carried, steps=st.integers(0, 5), usd=st.just(1.0)))
    events: list[ev.RunEvent] = [
        ev.RunStarted(run_id="r1", agent="a", input=RAW, at=T0, budget=budget, carried=carried)
    ]
    open_: dict[int, int] = {}  # position -> its last attempt
    names: dict[int, str] = {}
    ended: set[tuple[int, int]] = set()
    positions = 0
    t = T0
    for _ in range(draw(st.integers(0, 60))):
        t += draw(st.sampled_from([0.0, 0.5, 2.0]))
        op = draw(st.sampled_from(["new", "new", "again", "end", "end", "spend", "decide"]))
        name = draw(st.sampled_from(["fetch", "llm:m", "x" * 300]))
        if op == "spend":
            value = to_raw(ev.SpendValue(usd=0.5, tokens=3))
            events.append(ev.ValueRecorded(position=positions, kind="spend", value=value, at=t))
            positions += 1
            continue
        if op == "new" or not open_:
            kind = draw(st.sampled_from(["step", "llm", "tool", "other"]))
            open_[positions] = 1
            names[positions] = name
            events.append(ev.StepStarted(position=positions, name=name, kind=kind, at=t))
            positions += 1
            continue
        pos = draw(st.sampled_from(sorted(open_)))
        if draw(st.integers(0, 9)):  # now and then, a name no worker would write
            name = names[pos]
        if op == "again":
            open_[pos] += 1
            events.append(ev.StepStarted(position=pos, name=name, attempt=open_[pos], at=t))
        elif op == "end":
            usage = draw(st.none() | st.builds(ev.Usage, input_tokens=st.integers(0, 9)))
            # an attempt ends once; an end naming an attempt never started is a stranger's
            attempt = draw(st.sampled_from([open_[pos], open_[pos] + 7]))
            if (pos, attempt) in ended:
                attempt = open_[pos] + 7
            ended.add((pos, attempt))
            if draw(st.booleans()):
                events.append(
                    ev.StepCompleted(
                        position=pos,
                        name=name,
                        attempt=attempt,
                        result=RAW,
                        at=t,
                        usage=usage,
                        duration=draw(st.sampled_from([0.0, 0.25])),
                    )
                )
            else:
                events.append(
                    ev.StepFailed(
                        position=pos,
                        name=name,
                        attempt=attempt,
                        at=t,
                        usage=usage,
                        error=ev.ErrorInfo(
                            type="Boom", message=draw(st.sampled_from(["no", "y" * 900]))
                        ),
                        retry_at=draw(st.none() | st.just(t + 1)),
                    )
                )
        else:
            payload = to_raw(InDoubtDecision(action="skip", by="ada"))
            events.append(
                ev.SignalReceived(
                    name=decide_signal(pos, open_[pos]),
                    payload=payload,
                    signal_id=f"s{len(events)}",
                    sent_by="ada",
                    at=t,
                )
            )
    if draw(st.booleans()):
        events.append(ev.RunCompleted(output=RAW, at=t + 1))
    out, i, seq = [], 0, 0
    while i < len(events):
        n = draw(st.integers(1, 3))
        seq += 1
        out.append(
            Decision(seq=seq, events=tuple(events[i : i + n]), writer="w.1", msg_id=str(seq))
        )
        i += n
    return out


def _agrees(decisions: list[Decision]) -> RunSteps:
    s = _fold(decisions)
    record = steps_of(s)
    tl = timeline_of("r1", decisions, now=s.last_event_at)
    items = [i for i in tl.items if i.kind == "step"]
    assert record.steps_total == len(items)
    want = [_expected(i) for i in items][-STEPS_KEPT:]
    assert [_undecided(r) for r in record.steps] == want
    assert [b.limit for b in record.spend] == list(BUDGET_LIMITS)
    if not fold([e for d in decisions for e in d.events]).anomalies:
        # every budget kind as the timeline reckons them (from the full fold, which counts
        # nothing of an event out of place: compared where there is none)
        assert record.spend == tuple(
            msgspec.convert(msgspec.to_builtins(x), type(record.spend[0])) for x in tl.spend
        )
        assert (record.model_calls, record.tool_calls) == (tl.model_calls, tl.tool_calls)
    assert len(record.steps) <= STEPS_KEPT
    assert decode_run_steps(encode(record)) == record
    return record


@settings(max_examples=300, deadline=None)
@given(step_histories())
def test_the_step_list_folded_decision_by_decision_is_the_timeline_s(
    decisions: list[Decision],
) -> None:
    _agrees(decisions)


@settings(max_examples=200, deadline=None)
@given(valid_histories())
def test_on_any_valid_history_the_step_list_is_the_timeline_s(
    history: tuple[list[ev.RunEvent], Expected],
) -> None:
    events, _ = history
    decisions = [
        Decision(seq=i + 1, events=(e,), writer="w", msg_id=str(i)) for i, e in enumerate(events)
    ]
    s = _fold(decisions)
    if s.anomalies:
        return  # the summary ignored an event the timeline draws: not comparable
    _agrees(decisions)


def test_one_event_at_a_time_equals_the_whole_fold() -> None:
    d = [
        Decision(
            seq=1,
            events=(ev.RunStarted(run_id="r1", agent="a", input=RAW, at=T0),),
            writer="w",
            msg_id="1",
        ),
        Decision(
            seq=2, events=(ev.StepStarted(position=0, name="a", at=T0 + 1),), writer="w", msg_id="2"
        ),
    ]
    s = RunSummary()
    for x in d:
        for e in x.events:
            s = summarize(s, e)
        s = close_decision(s, x.seq, 0)
    assert steps_of(s) == steps_of(_fold(d))


def test_a_run_of_100_000_steps_keeps_a_bounded_record_of_its_latest_steps() -> None:
    s = summarize(RunSummary(), ev.RunStarted(run_id="r1", agent="a", input=RAW, at=T0))
    big = "e" * 10_000
    for p in range(100_000):
        s = summarize(s, ev.StepStarted(position=p, name="n" * 1000, at=T0 + p))
        err = ev.ErrorInfo(type="T" * 1000, message=big)
        s = summarize(s, ev.StepFailed(position=p, name="n", at=T0 + p + 0.5, error=err))
    record = steps_of(s)
    assert record.steps_total == 100_000
    assert [r.position for r in record.steps] == list(range(100_000 - STEPS_KEPT, 100_000))
    data = encode(record)
    assert len(data) < STEPS_RECORD_MAX
    assert decode_run_steps(data) == record
    last = record.steps[-1]
    assert last.outcome == "failed" and last.error is not None
    assert len(last.error.message) == STEP_ERROR_MAX and len(last.name) == STEP_NAME_MAX


def test_every_budget_kind_used_and_granted() -> None:
    usage = ev.Usage(input_tokens=10, output_tokens=5, usd=0.25, requests=1)
    budget = ev.Budget(usd=1.0, tokens=100, steps=10, tool_calls=8, polls=4, wall_seconds=60)
    events: list[ev.RunEvent] = [
        ev.RunStarted(
            run_id="r1",
            agent="a",
            input=RAW,
            at=T0,
            budget=budget,
            carried=ev.Carried(steps=2, model_calls=1, polls=1, usd=0.5, started_at=T0 - 10),
        ),
        ev.StepStarted(position=0, name="llm:m", kind="llm", at=T0 + 1),
        ev.StepCompleted(position=0, name="llm:m", result=RAW, usage=usage, at=T0 + 2),
        ev.StepStarted(position=1, name="tool", kind="tool", at=T0 + 2),
        ev.StepCompleted(position=1, name="tool", result=RAW, at=T0 + 3),
        ev.WaitStarted(position=2, key="poll", at=T0 + 3),
        ev.BudgetChanged(budget=ev.Budget(output_tokens=7, steps=20), at=T0 + 4),
        ev.RunSuspended(reason="budget", detail="", limit="usd", at=T0 + 5),
        ev.RunResumed(grant=True, at=T0 + 6),
        ev.RunCompleted(output=RAW, at=T0 + 20),
    ]
    s = RunSummary()
    for e in events:
        s = summarize(s, e)
    got = {b.limit: (b.used, b.granted) for b in steps_of(s).spend}
    assert got == {
        "usd": (0.75, 2.0),
        "tokens": (15, 200),
        "input_tokens": (10, None),
        "output_tokens": (5, 14),
        "steps": (4, 40),
        "tool_calls": (2, 16),
        "polls": (2, 8),
        "wall_seconds": (30.0, 120),
    }
    decisions = [
        Decision(seq=i + 1, events=(e,), writer="w", msg_id=str(i)) for i, e in enumerate(events)
    ]
    _agrees(decisions)


def test_an_in_doubt_decision_is_shown_on_its_step() -> None:
    payload = to_raw(InDoubtDecision(action="retry", by="ignored"))
    events: list[ev.RunEvent] = [
        ev.RunStarted(run_id="r1", agent="a", input=RAW, at=T0),
        ev.StepStarted(position=0, name="charge", at=T0 + 1),
        ev.StepStarted(position=0, name="charge", attempt=2, at=T0 + 9),
        ev.SignalReceived(
            name=decide_signal(0, 2), payload=payload, signal_id="d", sent_by="ops", at=T0 + 10
        ),
        ev.SignalReceived(name=decide_signal(7, 1), payload=payload, signal_id="e", at=T0 + 10),
        ev.SignalReceived(name="sojourn-decide.x.1", payload=payload, signal_id="f", at=T0 + 10),
        ev.SignalReceived(
            name=decide_signal(0, 2), payload=to_raw({"action": "maybe"}), signal_id="g", at=T0 + 11
        ),
    ]
    s = RunSummary()
    for e in events:
        s = summarize(s, e)
    (step,) = steps_of(s).steps
    assert (step.decision, step.decided_by, step.in_doubt, step.outcome) == (
        "retry",
        "ops",
        1,
        "running",
    )


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"null",
        b"[]",
        b'{"steps": []}',
        b'{"run_id": 5}',
        b'{"run_id": "r", "steps": [{"position": "x", "name": "n"}]}',
        b'{"run_id": "r", "steps": [{"position": 1, "name": "n", "outcome": "exploded"}]}',
        b'{"run_id": "r", "spend": [{"limit": "rubies", "used": 1}]}',
        b'{"run_id": "r", "steps": [{"position": 1, "name": "n", "kind": "robot"}]}',
        b"[" * 100_000,
        b'{"run_id": "r", "x": ' + b"[" * 5_000 + b"]" * 5_000 + b"}",
        b'{"run_id": "' + b"r" * STEPS_RECORD_MAX + b'"}',
        encode(
            {"run_id": "r", "steps": [{"position": i, "name": "n"} for i in range(STEPS_KEPT + 1)]}
        ),
        b"\xff\xfe",
    ],
)
def test_the_decoder_refuses_what_is_not_a_record(data: bytes) -> None:
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        decode_run_steps(data)


def test_the_decoder_reads_a_newer_writer_s_record() -> None:
    data = (
        b'{"run_id": "r", "future": {"a": [1]}, "steps": [{"position": 3, "name": "n", "new": 1}]}'
    )
    record = decode_run_steps(data)
    assert record.steps[0].position == 3 and record.steps_total == 0
