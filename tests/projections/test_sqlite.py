"""The SQLite read model: exactly-once application from an at-least-once feed, the rebuild
equality, listing filters and pagination against Python, and the file's safeguards."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sqlite3
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from sojourn.projections.sqlite import (
    Applied,
    InvalidQuery,
    SqliteModel,
    StepRow,
    decode_cursor,
    encode_cursor,
    validate_query,
)
from sojourn.schemas.errors import InvalidName, SojournError
from sojourn.schemas.events import (
    ErrorInfo,
    RunEvent,
    StepCompleted,
    StepFailed,
    StepStarted,
    WaitStarted,
)
from sojourn.schemas.health import LIVENESS_STATES, LivenessState
from sojourn.schemas.views import QUERY_LIMIT_MAX, RunsQuery, RunView, ViewError
from sojourn.schemas.vocabulary import RUN_STATUSES, RunStatus

STREAM = "T_EVENTS"
RUN_IDS = tuple(f"r{i}" for i in range(6))
AGENTS = ("alpha", "beta", "gamma")
NULL = msgspec.Raw(b"null")

# --- strategies -------------------------------------------------------------------------------

# Few distinct times, so that ties in updated_at (ordered by run id) are common.
times = st.sampled_from([0.0, 1.0, 1.5, 2.0, 1e9, 1.7e9 + 0.25])
view_errors = st.none() | st.builds(
    ViewError, type=st.sampled_from(["ValueError", "KeyError"]), message=st.text(max_size=5)
)


@st.composite
def views(draw: st.DrawFn, run_id: str, seq: int) -> RunView:
    return RunView(
        run_id=run_id,
        agent=draw(st.sampled_from(AGENTS)),
        status=draw(st.sampled_from([s for s in RUN_STATUSES if s != "new"])),
        liveness=draw(st.none() | st.sampled_from(LIVENESS_STATES)),
        parent_run_id=draw(st.none() | st.sampled_from(RUN_IDS[:2])),
        step=draw(st.none() | st.sampled_from(["fetch", "send"])),
        steps_done=draw(st.integers(0, 5)),
        attempts=draw(st.integers(0, 9)),
        spent_usd=draw(st.sampled_from([0.0, 0.5])),
        error=draw(view_errors),
        started_at=draw(times),
        updated_at=draw(times),
        ended_at=draw(st.none() | times),
        last_seq=seq,
        events=draw(st.integers(1, 50)),
    )


positions = st.integers(0, 3)
attempts = st.integers(1, 3)
step_names = st.sampled_from(["fetch", "send"])
errors = st.builds(ErrorInfo, type=st.just("ValueError"), message=st.text(max_size=5))
step_events: st.SearchStrategy[RunEvent] = st.one_of(
    st.builds(StepStarted, position=positions, name=step_names, attempt=attempts, at=times),
    st.builds(
        StepCompleted,
        position=positions,
        name=step_names,
        attempt=attempts,
        result=st.just(NULL),
        duration=st.sampled_from([0.0, 0.25]),
        at=times,
    ),
    st.builds(
        StepFailed,
        position=positions,
        name=step_names,
        attempt=attempts,
        error=errors,
        duration=st.sampled_from([0.0, 0.25]),
        retry_at=st.none() | times,
        at=times,
    ),
    st.builds(WaitStarted, position=positions, key=st.just("sleep"), at=times),
)


@st.composite
def decisions(draw: st.DrawFn) -> list[Applied]:
    """Decisions in stream order: increasing sequences (with gaps: other runs' decisions
    the model never sees are fine), each with its run's view after it."""
    out: list[Applied] = []
    seq = 0
    for _ in range(draw(st.integers(1, 14))):
        seq += draw(st.integers(1, 3))
        run_id = draw(st.sampled_from(RUN_IDS))
        events = tuple(draw(st.lists(step_events, max_size=3)))
        out.append(Applied(seq, draw(views(run_id, seq)), events))
    return out


def batches_of(items: list[Applied], cuts: list[int]) -> list[list[Applied]]:
    points = sorted({c % (len(items) + 1) for c in cuts} | {0, len(items)})
    return [items[a:b] for a, b in itertools.pairwise(points) if b > a]


Mishap = st.sampled_from(["none", "again", "older", "reopen", "crash"])

# --- helpers ----------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def model(tmp_path: Path) -> AsyncIterator[SqliteModel]:
    m = await SqliteModel.open(tmp_path / "runs.sqlite3", events_stream=STREAM)
    try:
        yield m
    finally:
        await m.close()


def poisoned(a: Applied) -> Applied:
    """A decision whose run row violates the table's CHECK: the write fails mid-transaction
    (after the steps of the batch were written)."""
    bad = msgspec.structs.replace(a.view, status="bogus")
    return Applied(a.seq, bad, a.events)


async def rebuilt(path: Path, items: list[Applied]) -> dict[str, list[tuple[Any, ...]]]:
    m = await SqliteModel.open(path, events_stream=STREAM)
    try:
        await m.apply(items)
        return await m.dump()
    finally:
        await m.close()


# --- exactly once, and the rebuild equality ---------------------------------------------------


@hsettings(max_examples=120, deadline=None, derandomize=True)
@given(
    items=decisions(),
    cuts=st.lists(st.integers(0, 20), max_size=6),
    mishaps=st.lists(Mishap, min_size=8, max_size=8),
    olders=st.lists(st.integers(0, 20), min_size=8, max_size=8),
)
def test_redeliveries_crashes_and_reopens_give_the_rebuilt_model(
    items: list[Applied], cuts: list[int], mishaps: list[str], olders: list[int]
) -> None:
    async def body(root: Path) -> None:
        path = root / "live.sqlite3"
        batches = batches_of(items, cuts)
        m = await SqliteModel.open(path, events_stream=STREAM)
        try:
            for k, batch in enumerate(batches):
                mishap = mishaps[k % len(mishaps)]
                if mishap == "crash":  # the batch fails in its transaction, then comes again
                    before = await m.dump()
                    with pytest.raises(sqlite3.IntegrityError):
                        await m.apply([*batch, poisoned(batch[-1])._replace(seq=10**6)])
                    assert await m.dump() == before
                    assert m.position == (batches[k - 1][-1].seq if k else 0)
                applied = await m.apply(batch)
                assert applied == len(batch)
                assert m.position == batch[-1].seq
                if mishap == "again":
                    assert await m.apply(batch) == 0
                elif mishap == "older":  # redelivered from an older position
                    start = olders[k % len(olders)] % (k + 1)
                    assert await m.apply([a for b in batches[start : k + 1] for a in b]) == 0
                elif mishap == "reopen":
                    await m.close()
                    m = await SqliteModel.open(path, events_stream=STREAM)
                    assert m.position == batch[-1].seq
            live = await m.dump()
        finally:
            await m.close()
        assert live == await rebuilt(root / "fresh.sqlite3", items)

    with tempfile.TemporaryDirectory() as root:
        asyncio.run(body(Path(root)))


async def test_a_failing_transaction_applies_nothing(model: SqliteModel) -> None:
    good = Applied(
        1,
        RunView(run_id="a", agent="alpha", status="running", last_seq=1),
        (StepStarted(position=0, name="fetch", at=1.0),),
    )
    assert await model.apply([good]) == 1
    before = await model.dump()
    second = Applied(
        2,
        RunView(run_id="b", agent="alpha", status="running", last_seq=2),
        (StepStarted(position=0, name="send", at=2.0),),
    )
    third = poisoned(Applied(3, RunView(run_id="c", agent="beta", status="running"), ()))
    with pytest.raises(sqlite3.IntegrityError):
        await model.apply([second, third])
    assert await model.dump() == before  # neither b's step nor b's row, nor the position
    assert model.position == 1
    assert await model.get("b") is None and await model.steps("b") == []
    assert await model.apply([second]) == 1  # and the model goes on
    assert model.position == 2


def _started(n: int) -> list[Applied]:
    """Decisions 1..n, each run ``r<i>`` starting its first step."""
    return [
        Applied(
            i,
            RunView(run_id=f"r{i}", agent="alpha", status="running", last_seq=i),
            (StepStarted(position=0, name="fetch", at=1.0),),
        )
        for i in range(1, n + 1)
    ]


async def test_a_cancelled_apply_applies_nothing(model: SqliteModel) -> None:
    many = _started(3000)
    task = asyncio.ensure_future(model.apply(many))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    dump = await model.dump()
    if model.position == 0:  # cancelled inside the transaction: nothing of it
        assert dump["runs"] == [] and dump["steps"] == []
    else:  # it had committed already: all of it
        assert len(dump["runs"]) == 3000


@pytest.mark.parametrize("ticks", range(8))
async def test_an_apply_cancelled_at_any_point_leaves_the_model_usable(
    model: SqliteModel, ticks: int
) -> None:
    """A cancel can land while ``BEGIN`` is still queued on the database thread: it runs
    anyway, and the transaction it opens must be rolled back, or every later write (a
    projector's last one at its stop) fails with "cannot start a transaction within a
    transaction"."""
    batch = _started(50)
    task = asyncio.ensure_future(model.apply(batch))
    for _ in range(ticks):
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    dump = await model.dump()
    assert (model.position, len(dump["runs"])) in {(0, 0), (50, 50)}
    after = Applied(
        51,
        RunView(run_id="after", agent="alpha", status="running", last_seq=51),
        (StepStarted(position=0, name="fetch", at=2.0),),
    )
    fresh = 51 if model.position == 0 else 1
    assert await model.apply([*batch, after]) == fresh
    assert model.position == 51
    assert len((await model.dump())["runs"]) == 51


@pytest.mark.parametrize("ticks", range(8))
async def test_a_query_cancelled_at_any_point_leaves_the_reader_usable(
    model: SqliteModel, ticks: int
) -> None:
    """A cancel (a caller's timeout, a closing connection's callbacks) that lands while the
    read's ``BEGIN`` is queued must not leave the reader inside a transaction: every later
    listing would fail, and its old snapshot would keep the WAL from checkpointing."""
    batch = _started(50)
    assert await model.apply(batch) == 50
    task = asyncio.ensure_future(model.query(RunsQuery(limit=100)))
    for _ in range(ticks):
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    page = await model.query(RunsQuery(limit=100))
    assert (len(page.runs), page.position) == (50, 50)
    later = Applied(51, RunView(run_id="later", agent="alpha", status="running", last_seq=51), ())
    assert await model.apply([later]) == 1
    page = await model.query(RunsQuery(limit=100))  # a fresh snapshot, not the old one
    assert (len(page.runs), page.position) == (51, 51)


async def test_steps_rows_follow_attempts(model: SqliteModel) -> None:
    err = ErrorInfo(type="Timeout", message="slow")
    await model.apply(
        [
            Applied(
                1,
                RunView(run_id="a", agent="x", status="running", last_seq=1),
                (StepStarted(position=0, name="fetch", at=10.0),),
            ),
            Applied(
                2,
                RunView(run_id="a", agent="x", status="waiting", last_seq=2),
                (
                    StepFailed(
                        position=0, name="fetch", error=err, duration=1.0, retry_at=20.0, at=11.0
                    ),
                ),
            ),
        ]
    )
    assert await model.steps("a") == [
        StepRow(
            run_id="a",
            position=0,
            name="fetch",
            status="retrying",
            attempts=1,
            started_at=10.0,
            ended_at=11.0,
            duration=1.0,
            error=ViewError(type="Timeout", message="slow"),
        )
    ]
    await model.apply(
        [
            Applied(
                3,
                RunView(run_id="a", agent="x", status="running", last_seq=3),
                (StepStarted(position=0, name="fetch", attempt=2, at=20.0),),
            ),
            Applied(
                4,
                RunView(run_id="a", agent="x", status="running", last_seq=4),
                (
                    StepCompleted(
                        position=0, name="fetch", attempt=2, result=NULL, duration=0.5, at=20.5
                    ),
                    StepStarted(position=1, name="send", at=20.5),
                ),
            ),
        ]
    )
    rows = await model.steps("a")
    assert [(r.position, r.status, r.attempts, r.started_at, r.ended_at) for r in rows] == [
        (0, "completed", 2, 10.0, 20.5),
        (1, "running", 1, 20.5, None),
    ]
    assert rows[0].error == ViewError(type="Timeout", message="slow")  # the last error stays


# --- pending runs and liveness ----------------------------------------------------------------


async def test_pending_rows_give_way_to_applied_views(model: SqliteModel) -> None:
    pending = RunView(run_id="p", agent="alpha", status="pending", updated_at=5.0)
    assert await model.put_pending(pending)
    assert not await model.put_pending(pending)  # present already
    assert model.position == 0
    assert await model.get("p") == pending
    assert await model.drop_pending("p")
    assert await model.get("p") is None
    assert await model.put_pending(pending)
    started = RunView(run_id="p", agent="alpha", status="running", updated_at=6.0, last_seq=7)
    await model.apply([Applied(7, started, ())])
    assert await model.get("p") == started
    assert not await model.put_pending(pending)  # a run further along is never pending again
    assert not await model.drop_pending("p")
    resumed = msgspec.structs.replace(started, status="pending", last_seq=9)
    await model.apply([Applied(9, resumed, ())])
    assert not await model.drop_pending("p")  # pending after a resume: a real run
    with pytest.raises(ValueError):
        await model.put_pending(started)


async def test_liveness_changes_the_column_and_the_view(model: SqliteModel) -> None:
    view = RunView(run_id="a", agent="alpha", status="running", updated_at=3.0, last_seq=1)
    await model.apply([Applied(1, view, ())])
    await model.set_liveness([("a", "stalled"), ("nobody", "orphaned")])
    got = await model.get("a")
    assert got == msgspec.structs.replace(view, liveness="stalled")
    page = await model.query(RunsQuery(liveness=("stalled",)))
    assert [v.run_id for v in page.runs] == ["a"]
    assert model.position == 1


# --- the file ---------------------------------------------------------------------------------


async def test_wal_and_the_stream_guard(tmp_path: Path) -> None:
    path = tmp_path / "m.sqlite3"
    m = await SqliteModel.open(path, events_stream=STREAM)
    await m.apply([Applied(4, RunView(run_id="a", agent="x", status="running", last_seq=4), ())])
    await m.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with pytest.raises(SojournError, match="OTHER_EVENTS"):
        await SqliteModel.open(path, events_stream="OTHER_EVENTS")
    m = await SqliteModel.open(path, events_stream=STREAM)
    try:
        assert m.position == 4
        await m.reset()
        assert m.position == 0
        dump = await m.dump()
        assert dump["runs"] == [] and dump["steps"] == []
        assert ("position", 0) in dump["meta"]
    finally:
        await m.close()
    m = await SqliteModel.open(path, events_stream=STREAM)
    assert m.position == 0
    await m.close()


async def test_a_file_that_is_not_a_model_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(SojournError, match="read model"):
        await SqliteModel.open(junk, events_stream=STREAM)


# --- queries ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Filters:
    agent: str | None
    status: tuple[RunStatus, ...]
    liveness: tuple[LivenessState, ...]
    parent: str | None
    since: float | None


filters = st.builds(
    Filters,
    agent=st.none() | st.sampled_from(AGENTS),
    status=st.lists(st.sampled_from(RUN_STATUSES), max_size=3).map(tuple),
    liveness=st.lists(st.sampled_from(LIVENESS_STATES), max_size=3).map(tuple),
    parent=st.none() | st.sampled_from(RUN_IDS[:2]),
    since=st.none() | times,
)


def matches(v: RunView, f: Filters) -> bool:
    return (
        (f.agent is None or v.agent == f.agent)
        and (not f.status or v.status in f.status)
        and (not f.liveness or v.liveness in f.liveness)
        and (f.parent is None or v.parent_run_id == f.parent)
        and (f.since is None or v.updated_at >= f.since)
    )


@st.composite
def many_views(draw: st.DrawFn) -> list[RunView]:
    n = draw(st.integers(0, 30))
    return [draw(views(f"run{i:02d}", i + 1)) for i in range(n)]


@hsettings(max_examples=100, deadline=None, derandomize=True)
@given(items=many_views(), f=filters, limit=st.integers(1, 7))
def test_query_pages_agree_with_python(items: list[RunView], f: Filters, limit: int) -> None:
    expected = sorted(
        (v for v in items if matches(v, f)), key=lambda v: (v.updated_at, v.run_id), reverse=True
    )

    async def body(root: Path) -> None:
        m = await SqliteModel.open(root / "q.sqlite3", events_stream=STREAM)
        try:
            await m.apply([Applied(v.last_seq, v, ()) for v in items])
            got: list[RunView] = []
            after: str | None = None
            for _ in range(len(items) + 2):
                q = RunsQuery(
                    agent=f.agent,
                    status=f.status,
                    liveness=f.liveness,
                    parent_run_id=f.parent,
                    since=f.since,
                    after=after,
                    limit=limit,
                )
                page = await m.query(q)
                assert len(page.runs) <= limit
                assert page.position == m.position
                got.extend(page.runs)
                if page.next is None:
                    break
                assert len(page.runs) == limit
                after = page.next
            assert got == expected
        finally:
            await m.close()

    with tempfile.TemporaryDirectory() as root:
        asyncio.run(body(Path(root)))


@given(
    at=st.floats(allow_nan=False, allow_infinity=False),
    run_id=st.from_regex(r"[A-Za-z0-9_-]{1,128}", fullmatch=True),
)
def test_cursors_round_trip(at: float, run_id: str) -> None:
    assert decode_cursor(encode_cursor(at, run_id)) == (at, run_id)


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "x" * 300,
        "not base64!",
        "' OR 1=1 --",
        encode_cursor(1.0, "a")[:-2] + "==",
        "bm90aGluZw",  # "nothing": no separator
        "MS4wL2E",  # "1.0/a": not the canonical hex float
        "MHgxLjBwKzAvYSBi",  # "0x1.0p+0/a b": not a run id
        "aW5mL2E",  # "inf/a"
    ],
)
def test_malformed_cursors_are_refused(cursor: str) -> None:
    with pytest.raises(InvalidQuery):
        decode_cursor(cursor)
    with pytest.raises(InvalidQuery):
        validate_query(RunsQuery(after=cursor))


@pytest.mark.parametrize(
    "q",
    [
        RunsQuery(limit=0),
        RunsQuery(limit=QUERY_LIMIT_MAX + 1),
        RunsQuery(status=("sleeping",)),  # type: ignore[arg-type]
        RunsQuery(liveness=("dead",)),  # type: ignore[arg-type]
        RunsQuery(since=float("nan")),
    ],
)
def test_invalid_queries_are_refused(q: RunsQuery) -> None:
    with pytest.raises(InvalidQuery):
        validate_query(q)


def test_names_in_queries_are_tokens() -> None:
    with pytest.raises(InvalidName):
        validate_query(RunsQuery(agent="a.b"))
    with pytest.raises(InvalidName):
        validate_query(RunsQuery(parent_run_id="*"))


async def test_queries_use_indexes(model: SqliteModel) -> None:
    """Every filter has an index that gives the listing order: no query scans the table."""
    for q in [
        RunsQuery(),
        RunsQuery(agent="a"),
        RunsQuery(status=("waiting",)),
        RunsQuery(agent="a", status=("waiting",)),
        RunsQuery(liveness=("stalled",)),
        RunsQuery(parent_run_id="p"),
        RunsQuery(since=5.0, after=encode_cursor(9.0, "z")),
    ]:
        plan = await model.explain(q)
        assert plan and all("INDEX" in step for step in plan), (q, plan)
        assert not any("TEMP B-TREE" in step for step in plan), (q, plan)
