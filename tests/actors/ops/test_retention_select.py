"""Retention's pure selection (``sojourn.projections.retention``): which views are candidates,
and the verdict on a run's own history. Property-based: no server."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from sojourn.projections.retention import VERDICTS, cutoff, ended_at, judge, select
from sojourn.projections.summary import RunSummary, summarize_all
from sojourn.schemas.codec import decode_run_view, to_raw
from sojourn.schemas.events import (
    ErrorInfo,
    RunCancelled,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunStarted,
    StepCompleted,
    StepStarted,
    WaitStarted,
)
from sojourn.schemas.views import RunView
from sojourn.schemas.vocabulary import RUN_STATUSES, TERMINAL

DAY = 86_400.0
NOW = 1_900_000_000.0
RETAIN = 30 * DAY

times = st.floats(min_value=NOW - 90 * DAY, max_value=NOW + DAY, allow_nan=False)
views = st.builds(
    lambda i, status, updated, ended, archived: RunView(
        run_id=f"r{i}",
        agent="a",
        status=status,
        updated_at=updated,
        ended_at=ended if status in TERMINAL else None,
        archived=archived,
    ),
    st.integers(0, 10_000),
    st.sampled_from(RUN_STATUSES),
    times,
    st.none() | times,
    st.booleans(),
)


@settings(max_examples=300)
@given(st.lists(views, max_size=40, unique_by=lambda v: v.run_id), st.none() | st.integers(0, 50))
def test_select_is_exactly_the_ended_unarchived_runs_past_the_cutoff(
    vs: list[RunView], limit: int | None
) -> None:
    chosen = select(vs, now=NOW, retain_ended=RETAIN, limit=limit)
    cut = cutoff(NOW, RETAIN)
    due = sorted(
        (ended_at(v), v.run_id)
        for v in vs
        if v.status in TERMINAL and not v.archived and ended_at(v) <= cut
    )
    expected = [r for _, r in due]
    assert chosen == (expected if limit is None else expected[:limit])
    by_id = {v.run_id: v for v in vs}
    for run_id in chosen:  # never a live run, never one already archived, never a young one
        v = by_id[run_id]
        assert v.status in TERMINAL and not v.archived and ended_at(v) <= cut


def history(
    started: float, steps: int, end: str | None, end_at: float, parent: str | None
) -> list[tuple[int, int, list[RunEvent]]]:
    out: list[tuple[int, int, list[RunEvent]]] = [
        (
            1,
            0,
            [RunStarted(run_id="r", agent="a", input=to_raw(1), at=started, parent_run_id=parent)],
        )
    ]
    for i in range(steps):
        out.append(
            (
                len(out) + 1,
                0,
                [
                    StepStarted(position=i, name="s", at=started),
                    StepCompleted(position=i, name="s", result=to_raw(i), at=started),
                ],
            )
        )
    last: RunEvent | None = {
        "completed": RunCompleted(output=to_raw(0), at=end_at),
        "failed": RunFailed(error=ErrorInfo(type="E", message="m"), at=end_at),
        "cancelled": RunCancelled(at=end_at),
        "waiting": WaitStarted(position=steps, key="sleep", deadline=end_at, at=end_at),
        None: None,
    }[end]
    if last is not None:
        out.append((len(out) + 1, 0, [last]))
    return out


summaries = st.builds(
    lambda started, steps, end, end_at, parent: summarize_all(
        history(started, steps, end, max(started, end_at), parent)
    ),
    times,
    st.integers(0, 3),
    st.sampled_from(["completed", "failed", "cancelled", "waiting", None]),
    times,
    st.none() | st.just("parent"),
)


@settings(max_examples=400)
@given(summaries, times, st.floats(0, 60 * DAY), times, st.none() | st.booleans())
def test_judge_archives_only_ended_old_runs_with_ended_parents(
    s: RunSummary, stored: float, retain: float, now: float, parent_ended: bool | None
) -> None:
    verdict = judge(
        s, last_stored_at=stored, now=now, retain_ended=retain, parent_ended=parent_ended
    )
    assert verdict in VERDICTS
    cut = cutoff(now, retain)
    if verdict == "archive":
        assert s.status in TERMINAL
        assert s.ended_at is not None and s.ended_at <= cut
        assert s.last_event_at <= cut and stored <= cut
        assert s.parent_run_id is None or parent_ended is True
    if s.status not in TERMINAL:
        assert verdict == "live"  # a live run is never touched, however old
    # Later is never less due: what may leave now may leave at any later time.
    if verdict == "archive":
        later = judge(
            s, last_stored_at=stored, now=now + DAY, retain_ended=retain, parent_ended=parent_ended
        )
        assert later == "archive"


def test_a_live_run_30_days_old_is_live_and_a_stale_view_does_not_decide() -> None:
    old = NOW - 31 * DAY
    waiting = summarize_all(history(old, 2, "waiting", old, None))
    assert judge(waiting, last_stored_at=old, now=NOW, retain_ended=RETAIN) == "live"
    # the view claims it completed long ago: it is a candidate, but the history says no
    stale = RunView(run_id="r", agent="a", status="completed", updated_at=old, ended_at=old)
    assert select([stale], now=NOW, retain_ended=RETAIN) == ["r"]


def test_either_clock_keeps_a_run() -> None:
    old, young = NOW - 31 * DAY, NOW - DAY
    s = summarize_all(history(old, 1, "completed", old, None))
    assert judge(s, last_stored_at=old, now=NOW, retain_ended=RETAIN) == "archive"
    # stored recently (a writer's clock far behind): young by the server's clock
    assert judge(s, last_stored_at=young, now=NOW, retain_ended=RETAIN) == "young"
    child = summarize_all(history(old, 1, "completed", old, "parent"))
    assert judge(child, last_stored_at=old, now=NOW, retain_ended=RETAIN) == "parent_live"
    assert (
        judge(child, last_stored_at=old, now=NOW, retain_ended=RETAIN, parent_ended=False)
        == "parent_live"
    )
    assert (
        judge(child, last_stored_at=old, now=NOW, retain_ended=RETAIN, parent_ended=True)
        == "archive"
    )
    assert judge(RunSummary(), last_stored_at=old, now=NOW, retain_ended=RETAIN) == "empty"


def test_an_old_view_without_the_field_reads_as_not_archived() -> None:
    old = msgspec.json.encode({"run_id": "r", "agent": "a", "status": "completed"})
    assert decode_run_view(old).archived is False
    assert b'"archived":true' in msgspec.json.encode(
        msgspec.structs.replace(decode_run_view(old), archived=True)
    )
