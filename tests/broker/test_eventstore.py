"""The event store against a real server: fencing, landed retries, deny delete/purge."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import msgspec
import pytest
import pytest_asyncio

from sojourn.broker import Broker, EmbeddedServer, EventStore, Names, Progress, ProgressStore
from sojourn.broker.connection import JetStreamError
from sojourn.broker.eventstore import Decision
from sojourn.broker.topology import ensure_topology
from sojourn.schemas import (
    ConcurrencyConflict,
    RunEvent,
    RunStarted,
    StepCompleted,
    StepStarted,
    to_raw,
)
from sojourn.schemas.config import Settings


@pytest_asyncio.fixture
async def store(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[EventStore]:
    broker = await Broker.connect(nats_server.url)
    names = Names(settings.prefix)
    await ensure_topology(broker, names, settings)
    try:
        yield EventStore(broker, names, settings)
    finally:
        await broker.close()


def started(run_id: str) -> RunStarted:
    return RunStarted(run_id=run_id, agent="a", input=to_raw({"x": 1}))


async def test_append_read_and_fence(store: EventStore) -> None:
    s1 = await store.append("r1", [started("r1")], expected_seq=0, writer="w")
    s2 = await store.append(
        "r1",
        [StepStarted(position=0, name="s"), StepStarted(position=1, name="t")],
        expected_seq=s1,
        writer="w",
    )
    history = await store.load("r1")
    assert [d.seq for d in history] == [s1, s2]
    assert [len(d.events) for d in history] == [1, 2]  # one message per decision
    assert history[1].writer == "w"
    assert await store.last_seq("r1") == s2
    assert await store.load("r1", after_seq=s1) == history[1:]
    with pytest.raises(ConcurrencyConflict) as info:
        await store.append("r1", [StepStarted(position=2, name="u")], expected_seq=s1, writer="x")
    assert info.value.expected == s1 and info.value.run_id == "r1"
    assert await store.last_seq("never") == 0 and await store.load("never") == []


async def test_a_retried_append_that_landed_is_not_a_conflict(store: EventStore) -> None:
    """The NATS trap: a retry with both Msg-Id and Expected-seq gets 10071, not duplicate."""
    s1 = await store.append("r2", [started("r2")], expected_seq=0, writer="w")
    ev: list[RunEvent] = [StepStarted(position=0, name="s")]
    first, earlier = await store.append_once("r2", ev, expected_seq=s1, writer="w", msg_id="m-1")
    again, earlier2 = await store.append_once("r2", ev, expected_seq=s1, writer="w", msg_id="m-1")
    assert (earlier, earlier2) == (False, True)
    assert again == first
    assert len(await store.load("r2")) == 2  # stored once
    # Even when someone appended after it, the retry is still recognized as landed...
    s3 = await store.append(
        "r2", [StepStarted(position=1, name="t")], expected_seq=first, writer="other"
    )
    assert await store.append_once("r2", ev, expected_seq=s1, writer="w", msg_id="m-1") == (
        first,
        True,
    )
    # ...while a different writer at the same position is a conflict.
    with pytest.raises(ConcurrencyConflict):
        await store.append("r2", ev, expected_seq=s1, writer="w", msg_id="m-2")
    assert await store.last_seq("r2") == s3


async def test_racing_appenders_exactly_one_wins(store: EventStore) -> None:
    seq = await store.append("r3", [started("r3")], expected_seq=0, writer="w")
    for round_no in range(200):
        ev: list[RunEvent] = [StepStarted(position=round_no, name="s")]
        results = await asyncio.gather(
            store.append("r3", ev, expected_seq=seq, writer="A"),
            store.append("r3", ev, expected_seq=seq, writer="B"),
            return_exceptions=True,
        )
        wins = [r for r in results if isinstance(r, int)]
        assert len(wins) == 1, results
        assert sum(isinstance(r, ConcurrencyConflict) for r in results) == 1
        seq = wins[0]
    assert len(await store.load("r3")) == 201


async def test_events_stream_denies_deleting_a_message(store: EventStore) -> None:
    """No one may take one decision out of a history. Purging a whole run's subject is what
    retention does, and only the watchdog role may (tests/broker/test_auth.py)."""
    seq = await store.append("r4", [started("r4")], expected_seq=0, writer="w")
    stream = store.names.events_stream
    with pytest.raises(JetStreamError):
        await store.broker.api(f"$JS.API.STREAM.MSG.DELETE.{stream}", {"seq": seq})
    assert len(await store.load("r4")) == 1


async def test_topology_is_idempotent(store: EventStore, settings: Settings) -> None:
    await ensure_topology(store.broker, store.names, settings)
    await ensure_topology(store.broker, store.names, settings)
    info = await store.broker.api(f"$JS.API.STREAM.INFO.{store.names.events_stream}")
    assert info["config"]["deny_delete"] and not info["config"]["deny_purge"]


async def test_a_progress_record_keeps_the_last_report_of_a_run(store: EventStore) -> None:
    reports = ProgressStore(store.broker, store.names, worker="w1")
    assert await reports.last("run-l") is None
    progress = Progress(step="fetch", step_started_at=5.0, details=msgspec.Raw(b'{"page":1}'))
    progress.changed = True
    await reports.report("run-l", "w1.1", 4.0, progress)
    assert not progress.changed
    progress.details = msgspec.Raw(b'{"page":2}')
    await reports.report("run-l", "w1.1", 4.0, progress)
    last = await reports.last("run-l")
    assert last is not None
    assert (last.owner, last.worker, last.acquired_at, last.step) == ("w1.1", "w1", 4.0, "fetch")
    assert bytes(last.details) == b'{"page":2}'
    assert await reports.last("run-m") is None  # one run's report is not another's


async def test_the_history_cache_reads_only_what_came_after_and_stays_exact(
    store: EventStore,
) -> None:
    cached = EventStore(store.broker, store.names, store.settings, cache_decisions=5)
    seq = await store.append("c1", [started("c1")], expected_seq=0, writer="other")
    assert await cached.history("c1") == await store.load("c1")  # a miss: read it all
    # another writer appends; this store appends too: both are seen, in order, exactly
    seq = await store.append(
        "c1", [StepStarted(position=0, name="a")], expected_seq=seq, writer="o"
    )
    assert (await cached.history("c1")) == await store.load("c1")
    seq = await cached.append(
        "c1", [StepStarted(position=1, name="b")], expected_seq=seq, writer="me"
    )
    mine = await cached.history("c1")
    assert mine == await store.load("c1") and mine[-1].writer == "me"
    assert cached.cache_hits == 2
    mine.clear()  # callers get a copy: the cache is not theirs to change
    assert len(await cached.history("c1")) == 3

    # bounded: at most 5 decisions in all, least recently used out first
    s2 = await store.append("c2", [started("c2")], expected_seq=0, writer="o")
    await store.append("c2", [StepStarted(position=0, name="a")], expected_seq=s2, writer="o")
    await cached.history("c2")  # 3 + 2 = 5 decisions: both fit
    hits = cached.cache_hits
    await cached.history("c1")
    assert cached.cache_hits == hits + 1
    s3 = await store.append("c3", [started("c3")], expected_seq=0, writer="o")
    await cached.history("c3")  # 6 > 5: c2, the least recently used, goes
    hits = cached.cache_hits
    assert await cached.history("c2") == await store.load("c2")
    assert cached.cache_hits == hits  # c2 had to be read again
    cached.forget("c3")
    assert await cached.history("c3") == await store.load("c3") and s3 > 0


async def test_short_histories_are_not_cached(store: EventStore) -> None:
    cached = EventStore(store.broker, store.names, store.settings, cache_decisions=100, cache_min=3)
    seq = await store.append("m1", [started("m1")], expected_seq=0, writer="o")
    await cached.history("m1")
    await cached.history("m1")
    assert cached.cache_hits == 0  # one decision: read again each time
    for p in range(2):
        seq = await store.append(
            "m1", [StepStarted(position=p, name="s")], expected_seq=seq, writer="o"
        )
    await cached.history("m1")  # three now: kept
    assert await cached.history("m1") == await store.load("m1") and cached.cache_hits == 1


# --- the history cache's byte bound -----------------------------------------------------------

KIB = 1024


def output(p: int, kib: int) -> StepCompleted:
    """A step's completion carrying about ``kib`` KiB (an LLM's answer, say)."""
    return StepCompleted(position=p, name="llm", result=to_raw("x" * (kib * KIB)))


async def grow(store: EventStore, run_id: str, steps: int, kib: int) -> int:
    """A new run: ``RunStarted`` plus ``steps`` decisions of about ``kib`` KiB; its last seq."""
    last = await store.append(run_id, [started(run_id)], expected_seq=0, writer="o")
    for p in range(steps):
        last = await store.append(run_id, [output(p, kib)], expected_seq=last, writer="o")
    return last


def same(a: list[Decision], b: list[Decision]) -> bool:
    """The same messages, sizes included (``Decision`` equality leaves the size out)."""
    return a == b and [d.size for d in a] == [d.size for d in b]


async def test_the_history_cache_is_bounded_by_bytes(store: EventStore) -> None:
    bound = 320 * KIB
    cached = EventStore(
        store.broker, store.names, store.settings, cache_decisions=10_000, cache_bytes=bound
    )
    for r in ("b1", "b2", "b3", "b4"):
        await grow(store, r, 2, 50)  # ~100 KiB each
    for r in ("b1", "b2", "b3"):
        assert same(await cached.history(r), await store.load(r))
    sizes = {r: sum(d.size for d in await store.load(r)) for r in ("b1", "b2", "b3", "b4")}
    assert all(100 * KIB < n < 101 * KIB for n in sizes.values())
    assert (cached.cached_decisions, cached.cached_bytes) == (
        9,
        sizes["b1"] + sizes["b2"] + sizes["b3"],
    )

    await cached.history("b4")  # 4 x ~100 KiB > 320 KiB: b1, the least recently used, goes
    assert cached.cached_bytes == sizes["b2"] + sizes["b3"] + sizes["b4"] <= bound
    hits = cached.cache_hits
    assert same(await cached.history("b2"), await store.load("b2"))
    assert cached.cache_hits == hits + 1  # still cached
    assert same(await cached.history("b1"), await store.load("b1"))
    assert cached.cache_hits == hits + 1  # read again (and b3 made room for it)
    assert cached.cached_bytes <= bound

    # A history larger than the bound on its own is never cached, and evicts nothing.
    await grow(store, "huge", 8, 50)  # ~400 KiB
    before = (cached.cached_decisions, cached.cached_bytes)
    for _ in range(2):
        hits = cached.cache_hits
        assert same(await cached.history("huge"), await store.load("huge"))
        assert cached.cache_hits == hits
        assert (cached.cached_decisions, cached.cached_bytes) == before

    # Appends through the store grow a cached history and count its bytes; once it alone
    # exceeds the bound it is dropped rather than kept growing.
    seq = (await cached.history("b2"))[-1].seq
    for p in range(2, 8):  # ~100 KiB + 6 x 50 KiB
        seq = await cached.append("b2", [output(p, 50)], expected_seq=seq, writer="me")
        assert cached.cached_bytes <= bound
        want = await store.load("b2")
        hits = cached.cache_hits
        assert same(await cached.history("b2"), want)
        assert (cached.cache_hits == hits + 1) == (sum(d.size for d in want) <= bound)
    assert cached.cache_hits == hits  # the last read: ~400 KiB, not cached any more
    assert cached.cached_bytes <= bound


async def test_decision_sizes_are_the_stored_message_bodies(store: EventStore) -> None:
    cached = EventStore(store.broker, store.names, store.settings, cache_decisions=100)
    seq = await grow(store, "z1", 1, 3)
    await cached.history("z1")
    seq = await cached.append("z1", [output(1, 7)], expected_seq=seq, writer="me")
    # the decision appended through the cache counts what was sent; a read, what was stored
    assert same(await cached.history("z1"), await store.load("z1"))
    raw = await store.broker.direct_get_range(
        store.names.events_stream, store.names.events("z1"), 1
    )
    assert [d.size for d in await store.load("z1")] == [len(m.data) for m in raw]
    assert cached.cached_bytes == sum(len(m.data) for m in raw)


async def test_the_history_cache_stays_within_both_bounds_and_exact(store: EventStore) -> None:
    """A seeded walk of appends (by another writer and through the cache), reads, concurrent
    reads of one run and forgets, with decisions of 0-60 KiB: after every step both bounds hold,
    the cache's counts add up, and every read is exactly what the stream holds."""
    rng = random.Random(20261130)
    cached = EventStore(
        store.broker,
        store.names,
        store.settings,
        cache_decisions=12,
        cache_min=2,
        cache_bytes=200 * KIB,
    )
    runs = [f"w{i}" for i in range(6)]
    last = {r: await store.append(r, [started(r)], expected_seq=0, writer="o") for r in runs}
    steps = dict.fromkeys(runs, 0)
    for _ in range(150):
        r = rng.choice(runs)
        what = rng.choice(["other", "mine", "read", "read", "both", "forget"])
        if what in ("other", "mine"):
            writer = store if what == "other" else cached
            kib = rng.choice([0, 1, 5, 20, 60])
            last[r] = await writer.append(
                r, [output(steps[r], kib)], expected_seq=last[r], writer=what
            )
            steps[r] += 1
        elif what == "read":
            assert same(await cached.history(r), await store.load(r))
        elif what == "both":
            a, b = await asyncio.gather(cached.history(r), cached.history(r))
            want = await store.load(r)
            assert same(a, want) and same(b, want)
        else:
            cached.forget(r)
        assert cached.cached_decisions <= 12
        assert cached.cached_bytes <= 200 * KIB
        entries = list(cached._cache.values())  # the accounting, checked from the inside
        assert cached.cached_decisions == sum(len(e.decisions) for e in entries)
        assert cached.cached_bytes == sum(e.size for e in entries)
        assert all(e.size == sum(d.size for d in e.decisions) for e in entries)
    assert cached.cache_hits > 0
