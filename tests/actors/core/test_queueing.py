"""The fold of a run queued on its concurrency key (decision 0048), with hypothesis: a run
started with a ticket is ``pending`` waiting on ``queue:<key>`` until its ``RunAdmitted``,
whatever signals, updates and cancel requests come meanwhile; the full fold and the watchdog's
summary agree; an admission that does not fit is an anomaly; the slots record's rules."""

from __future__ import annotations

from functools import reduce

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from sojourn.actors.core.state import RunState, evolve, fold
from sojourn.projections.liveness import Thresholds, classify
from sojourn.projections.queues import depths, positions
from sojourn.projections.summary import RunSummary, summarize
from sojourn.schemas.concurrency import (
    ConcurrencyBody,
    SlotHolder,
    SlotsRecord,
    concurrency_fault,
    limit_fault,
    queued_detail,
    with_holder,
    without_holder,
)
from sojourn.schemas.events import (
    CancelRequested,
    ConcurrencyInfo,
    RunAdmitted,
    RunCancelled,
    RunCompleted,
    RunEvent,
    RunStarted,
    SignalReceived,
    StepCompleted,
    StepStarted,
)
from sojourn.schemas.lifecycle import queued_on
from tests.strategies import any_event

KEYS = st.sampled_from(["tenant-1", "t:2", "k é"])
PAYLOADS = st.sampled_from([msgspec.Raw(b"null"), msgspec.Raw(b'{"a": [1, "x"]}')])

meanwhile = st.one_of(
    # the payload plays no part in queueing: a cheap one keeps generation fast on a busy CI
    st.builds(SignalReceived, name=st.just("go"), payload=PAYLOADS, signal_id=st.uuids().map(str)),
    st.builds(CancelRequested, reason=st.sampled_from(["", "x"])),
)


@st.composite
def queued_histories(draw: st.DrawFn) -> tuple[list[RunEvent], str, int, bool]:
    """A run queued at its start, then what may come while it waits, then maybe its
    admission and a step: the events, its key, its ticket, whether it was admitted."""
    key = draw(KEYS)
    ticket = draw(st.integers(1, 10**6))
    started = RunStarted(
        run_id="r1",
        agent="a",
        input=msgspec.Raw(b"1"),
        concurrency=ConcurrencyInfo(key=key, limit=draw(st.integers(1, 5)), ticket=ticket),
        at=1.0,
    )
    events: list[RunEvent] = [started, *draw(st.lists(meanwhile, max_size=5))]
    admitted = draw(st.booleans())
    if admitted:
        events.append(RunAdmitted(key=key, ticket=ticket, at=2.0))
        events += draw(st.lists(meanwhile, max_size=2))
        events += [
            StepStarted(position=0, name="s", at=3.0),
            StepCompleted(position=0, name="s", result=msgspec.Raw(b"1"), at=4.0),
        ]
    return events, key, ticket, admitted


@given(queued_histories())
def test_a_queued_run_is_pending_on_its_key_until_admitted(
    h: tuple[list[RunEvent], str, int, bool],
) -> None:
    events, key, _, admitted = h
    for n in range(1, len(events) + 1):
        s = fold(events[:n])
        assert s == reduce(evolve, events[:n], RunState())
        assert not s.anomalies
        before = not any(isinstance(e, RunAdmitted) for e in events[:n])
        assert s.queued == before
        if before:
            assert s.status == "pending" and s.waiting_on == (f"queue:{key}",)
            assert queued_on(s.waiting_on) == key and s.deadline is None
        summary = reduce(summarize, events[:n], RunSummary())
        assert summary.status == s.status and summary.waiting_on == s.waiting_on
        # the watchdog never judges a queued run orphaned, however long it waits
        judged = classify(
            summary, None, now=10**6, limits=Thresholds(stall_after=10.0, overdue_after=10.0)
        )
        if before:
            assert judged.state == "pending"
        else:  # admitted: it has work, and nobody holding it that long is an orphan
            assert judged.state == "orphaned"
    final = fold(events)
    assert final.status == ("running" if admitted else "pending")
    assert final.concurrency is not None and final.concurrency.key == key


@given(queued_histories(), st.sampled_from(["cancel", "complete"]))
def test_an_end_takes_a_run_out_of_the_queue(
    h: tuple[list[RunEvent], str, int, bool], how: str
) -> None:
    events, _, _, _ = h
    end: RunEvent = (
        RunCancelled(at=9.0) if how == "cancel" else RunCompleted(output=msgspec.Raw(b"1"), at=9.0)
    )
    s = fold([*events, end])
    assert s.terminal and not s.queued
    assert not s.anomalies


@given(queued_histories(), KEYS)
def test_an_admission_that_does_not_fit_is_an_anomaly(
    h: tuple[list[RunEvent], str, int, bool], other: str
) -> None:
    events, key, ticket, admitted = h
    s = fold([*events, RunAdmitted(key=other, ticket=ticket, at=5.0)])
    fits = not admitted and other == key
    assert (not s.anomalies) == fits
    assert s.queued == (not admitted and not fits)


@given(st.lists(any_event, max_size=12))
def test_queued_only_with_a_ticket_and_never_after_the_end(events: list[RunEvent]) -> None:
    s = fold(events)
    if s.queued:
        assert s.concurrency is not None and s.concurrency.ticket > 0
        assert s.status == "pending"
    if s.terminal:
        assert not s.queued
    assert fold(events) == reduce(evolve, events, RunState())


def test_a_run_not_queued_at_its_start_waits_on_nothing() -> None:
    started = RunStarted(
        run_id="r",
        agent="a",
        input=msgspec.Raw(b"1"),
        concurrency=ConcurrencyInfo(key="k", limit=1),
    )
    s = fold([started])
    assert s.status == "pending" and not s.queued and s.waiting_on == ()


# --- the slots record -------------------------------------------------------------------------

ops = st.lists(st.tuples(st.booleans(), st.sampled_from(["a", "b", "c", "d"])), max_size=30)


@given(ops, st.integers(1, 3))
def test_slots_taken_within_the_limit_never_exceed_it(
    steps: list[tuple[bool, str]], limit: int
) -> None:
    """Taking (only when a slot is free, as the intake and the pump do) and giving back in any
    order: at most ``limit`` holders, each once; a holder taking again keeps its one slot."""
    rec = SlotsRecord(agent="a", key="k", limit=limit)
    for take, run in steps:
        if take:
            if rec.holds(run) or len(rec.holders) < limit:
                rec = with_holder(rec, SlotHolder(run, 0, 0.0), limit, 1.0)
                assert rec.holds(run)
        else:
            rec = without_holder(rec, run, 1.0)
            assert not rec.holds(run)
        ids = [h.run_id for h in rec.holders]
        assert len(ids) == len(set(ids)) <= limit


@given(st.text(max_size=300), st.integers(-5, 2000) | st.booleans())
def test_keys_and_limits_are_checked_totally(key: str, limit: int) -> None:
    why = concurrency_fault(ConcurrencyBody(key=key, limit=limit))
    good_key = (
        0 < len(key.encode("utf-8", "surrogatepass")) <= 256
        and not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in key)
        and not any(0xD800 <= ord(c) <= 0xDFFF for c in key)
    )
    good_limit = not isinstance(limit, bool) and 1 <= limit <= 1000
    assert (why is None) == (good_key and good_limit)
    assert (limit_fault(limit) is None) == good_limit


def test_the_detail_names_the_key_and_the_position() -> None:
    assert queued_detail("tenant-1", 3) == "queued on key tenant-1, position 3"
    assert queued_detail("x" * 100, 1).startswith("queued on key " + "x" * 61 + "...")
    assert queued_detail("k", None) == "queued on key k"


# --- the read side's count of queues ----------------------------------------------------------

summaries = st.lists(
    st.builds(
        RunSummary,
        run_id=st.uuids().map(str),
        agent=st.sampled_from(["a", "b"]),
        status=st.sampled_from(["pending", "running", "waiting"]),
        waiting_on=st.sampled_from([(), ("queue:k1",), ("queue:k2",), ("timer",)]),
        queue_ticket=st.integers(0, 50),
    ),
    max_size=30,
)


@given(summaries)
def test_positions_and_depths_count_each_key_s_queued_runs_in_ticket_order(
    runs: list[RunSummary],
) -> None:
    where = positions(runs)
    queued = [
        s
        for s in runs
        if s.status == "pending" and queued_on(s.waiting_on) is not None and s.queue_ticket
    ]
    assert set(where) == {s.run_id for s in queued}
    for s in queued:
        key, position = where[s.run_id]
        ahead = [
            o
            for o in queued
            if o.agent == s.agent
            and queued_on(o.waiting_on) == key
            and (o.queue_ticket, o.run_id) < (s.queue_ticket, s.run_id)
        ]
        assert position == len(ahead) + 1
    counted = depths(runs)
    for agent in ("a", "b"):
        mine = [
            s
            for s in runs
            if s.agent == agent and s.status == "pending" and queued_on(s.waiting_on)
        ]
        total, deepest = counted.get(agent, (0, 0))
        assert total == len(mine)
        per_key = [sum(1 for s in mine if s.waiting_on == (k,)) for k in ("queue:k1", "queue:k2")]
        assert deepest == max(per_key)
