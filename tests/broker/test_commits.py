"""Group commit (``broker/commits.py``): the appends of many runs that wait at the same time
go as one atomic batch, and each caller still gets its own answer."""

from __future__ import annotations

import asyncio

import pytest

from sojourn.broker import EventStore
from sojourn.broker.topology import ensure_topology
from sojourn.schemas import ConcurrencyConflict, RunEvent, StepStarted
from sojourn.schemas.config import Settings
from tests.broker import test_eventstore
from tests.broker.test_eventstore import started

store = test_eventstore.store  # a connection with the deployment's topology, and its store


def opened(run_id: str) -> list[RunEvent]:
    return [started(run_id)]


def step(position: int) -> list[RunEvent]:
    return [StepStarted(position=position, name="s")]


async def open_runs(store: EventStore, runs: list[str]) -> dict[str, int]:
    seqs = await asyncio.gather(
        *(store.append(r, opened(r), expected_seq=0, writer="w") for r in runs)
    )
    return dict(zip(runs, seqs, strict=True))


async def test_appends_waiting_together_go_as_one_batch_each_with_its_own_sequence(
    store: EventStore,
) -> None:
    runs = [f"g{i}" for i in range(60)]
    first = await open_runs(store, runs)
    assert store.commits.batches >= 1  # 59 starts waited for the first one
    seqs = await asyncio.gather(
        *(store.append(r, step(0), expected_seq=first[r], writer="w") for r in runs)
    )
    assert len(set(seqs)) == len(runs)
    assert store.commits.batched >= len(runs)
    for r, seq in zip(runs, seqs, strict=True):
        history = await store.load(r)
        assert [d.seq for d in history] == [first[r], seq]  # what each caller was told
        assert history[1].events == tuple(step(0))


async def test_a_lone_append_goes_alone(store: EventStore) -> None:
    seq = await store.append("alone", opened("alone"), expected_seq=0, writer="w")
    await store.append("alone", step(0), expected_seq=seq, writer="w")
    assert (store.commits.batches, store.commits.batched) == (0, 0)


async def test_a_broken_fence_refuses_only_its_own_append(store: EventStore) -> None:
    runs = [f"f{i}" for i in range(20)]
    first = await open_runs(store, runs)
    # Someone else appended to f7 since: its writer's fence is stale.
    await store.append("f7", step(0), expected_seq=first["f7"], writer="other")
    refused = store.commits.refused
    results = await asyncio.gather(
        *(store.append(r, step(0), expected_seq=first[r], writer="w") for r in runs),
        return_exceptions=True,
    )
    assert store.commits.refused == refused + 1  # the batch holding f7, as a whole
    for r, result in zip(runs, results, strict=True):
        if r == "f7":
            assert isinstance(result, ConcurrencyConflict)
        else:
            assert isinstance(result, int), (r, result)
            assert [d.seq for d in await store.load(r)] == [first[r], result]
    assert [d.writer for d in await store.load("f7")] == ["w", "other"]


async def test_an_append_that_landed_in_a_batch_is_recognized_when_retried(
    store: EventStore,
) -> None:
    runs = [f"d{i}" for i in range(10)]
    first = await open_runs(store, runs)
    landed, earlier = await store.append_once(
        "d5", step(0), expected_seq=first["d5"], writer="w", msg_id="m-d5"
    )
    assert not earlier
    # The same append again (its ack was lost), waiting with others: a batch with a
    # Nats-Msg-Id the stream holds is refused whole, and each is sent again on its own.
    results = await asyncio.gather(
        *(
            store.append_once(r, step(0), expected_seq=first[r], writer="w", msg_id=f"m-{r}")
            for r in runs
        )
    )
    for r, (seq, again) in zip(runs, results, strict=True):
        assert again == (r == "d5")
        assert [d.seq for d in await store.load(r)][-1] == seq
    assert results[5][0] == landed
    assert len(await store.load("d5")) == 2  # stored once


async def test_a_stream_without_atomic_publish_gets_its_appends_one_by_one(
    store: EventStore, settings: Settings
) -> None:
    b, names = store.broker, store.names
    config = await b.stream_config(names.events_stream)
    assert config is not None and config.get("allow_atomic")
    await b.api(f"$JS.API.STREAM.UPDATE.{names.events_stream}", {**config, "allow_atomic": False})
    # An events stream created before group commit: a worker still starts on it...
    found = await ensure_topology(b, names, settings)
    events = next(f for f in found if f.stream == names.events_stream and f.consumer is None)
    assert events.state == "drift" and [d.key for d in events.diffs] == ["allow_atomic"]
    # ...and its appends go one by one.
    runs = [f"n{i}" for i in range(20)]
    first = await open_runs(store, runs)
    seqs = await asyncio.gather(
        *(store.append(r, step(0), expected_seq=first[r], writer="w") for r in runs)
    )
    assert not store.commits.batching and store.commits.batches == 0
    for r, seq in zip(runs, seqs, strict=True):
        assert [d.seq for d in await store.load(r)] == [first[r], seq]


async def test_an_append_whose_caller_is_cancelled_while_it_waits_is_never_sent(
    store: EventStore,
) -> None:
    first = await open_runs(store, ["c1", "c2"])
    one = asyncio.create_task(store.append("c1", step(0), expected_seq=first["c1"], writer="w"))
    two = asyncio.create_task(store.append("c2", step(0), expected_seq=first["c2"], writer="w"))
    await asyncio.sleep(0)  # both ran up to their wait: c1's in flight, c2's queued
    assert [w.subject for w in store.commits._queue] == [store.names.events("c2")]
    two.cancel()
    await one
    with pytest.raises(asyncio.CancelledError):
        await two
    seq = await store.append("c1", step(1), expected_seq=await store.last_seq("c1"), writer="w")
    assert seq > first["c2"]
    assert [d.seq for d in await store.load("c2")] == [first["c2"]]  # nothing more
