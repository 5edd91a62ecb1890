"""Priorities and fairness keys (decision 0049) against a real nats-server: a run of priority
1 started behind a queue of priority-5 runs runs next, not last; its children and its timers
stay on its lane; its fairness key is recorded and carried by its wakes; hostile lanes and
fairness headers are refused with a typed answer or never stored."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from prometheus_client import REGISTRY

from sojourn.actors import Client, Worker
from sojourn.broker import Broker, EmbeddedServer, Names
from sojourn.broker import headers as h
from sojourn.broker.connection import JetStreamError
from sojourn.schemas.config import Settings
from sojourn.schemas.errors import InvalidName
from sojourn.schemas.events import RunStarted
from sojourn.schemas.fairness import Fairness
from tests.actors.worker.test_bad_input import send_raw
from tests.apps import laned as app
from tests.conftest import wait_for


@pytest_asyncio.fixture
async def broker(nats_server: EmbeddedServer) -> AsyncIterator[Broker]:
    b = await Broker.connect(nats_server.url)
    try:
        yield b
    finally:
        await b.close()


async def _started(client: Client, run_id: str) -> RunStarted:
    history = await client.history(run_id)
    first = history[0].events[0]
    assert isinstance(first, RunStarted)
    return first


async def test_an_urgent_run_behind_a_bulk_queue_runs_next_not_last(
    nats_server: EmbeddedServer, client: Client, settings: Settings
) -> None:
    app.BEGUN.clear()
    async with Worker([app.laned], nats=nats_server.url, settings=settings, concurrency=1):
        # each step 0.2 s: the urgent start's few round trips fit in one, even on a busy machine
        bulk = [f"bulk{i}" for i in range(30)]
        for rid in bulk:  # each stored (the intake answered); one runs, the rest wait on lane 5
            await client.start("laned", 0.2, run_id=rid, priority=5, wait=True)

        async def moving() -> bool:
            return len(app.BEGUN) >= 2

        await wait_for(moving, timeout=30, what="the bulk queue to move")
        ahead = len(app.BEGUN)
        await client.start("laned", 0.0, run_id="urgent", priority=1, wait=True)
        await client.result("urgent", timeout=60)
        place = app.BEGUN.index("urgent")
        # Started when `ahead` bulk steps had begun: it takes one of the next slots (the one
        # a bulk wake fetched just before may go first), not the 31st.
        assert place <= ahead + 2, (place, ahead, app.BEGUN)
        for rid in bulk:
            await client.result(rid, timeout=120)
        assert app.BEGUN.index("urgent") < len(bulk) - 10
        started = await _started(client, "urgent")
        assert started.priority == 1 and (await _started(client, "bulk3")).priority == 5
        assert (await client.state("urgent")).priority == 1


async def test_one_keys_burst_does_not_starve_another_keys_start(
    nats_server: EmbeddedServer, client: Client, settings: Settings
) -> None:
    app.BEGUN.clear()
    async with Worker([app.laned], nats=nats_server.url, settings=settings, concurrency=1):
        burst = [f"a{i}" for i in range(40)]
        for rid in burst:  # tenant A's burst: one runs, the rest wait for the slot
            await client.start("laned", 0.2, run_id=rid, fairness_key="tenant:a", wait=True)

        async def moving() -> bool:
            return len(app.BEGUN) >= 2

        await wait_for(moving, timeout=30, what="tenant A's burst to move")
        ahead = len(app.BEGUN)
        await client.start("laned", 0.0, run_id="b0", fairness_key="tenant:b", wait=True)
        await client.result("b0", timeout=60)
        place = app.BEGUN.index("b0")
        # Tenant B's first start takes one of the next slots, not the one after A's burst.
        assert place <= ahead + 3, (place, ahead, app.BEGUN)
        for rid in burst:
            await client.result(rid, timeout=120)
        started = await _started(client, "b0")
        assert started.fairness == Fairness(key="tenant:b")
        assert (await client.state("a7")).fairness == Fairness(key="tenant:a")


async def test_a_runs_children_and_timers_stay_on_its_lane_and_its_key_is_carried(
    nats_server: EmbeddedServer, client: Client, settings: Settings, broker: Broker
) -> None:
    names = Names(settings.prefix)
    async with Worker([app.laned, app.laned_parent], nats=nats_server.url, settings=settings):
        await client.start(
            "laned_parent", 30.0, run_id="p", priority=2, fairness_key="tenant-a",
            fairness_weight=3, wait=True,
        )  # fmt: skip

        async def sleeping() -> bool:
            return (await client.status("p")) == "waiting"

        await wait_for(sleeping, timeout=30, what="the parent to sleep on its timer")
        started = await _started(client, "p")
        assert started.priority == 2
        assert started.fairness == Fairness(key="tenant-a", weight=3)
        (child_id,) = (await client.state("p")).children
        assert (await _started(client, child_id)).priority == 2  # inherited
        # the sleep's broker timer fires on lane 2, carrying the key
        timer = await broker.direct_get_last(names.wake_stream, f"{names.prefix}.timer.p.*")
        assert timer is not None
        assert timer.headers[h.SCHEDULE_TARGET] == names.wake("p", "laned_parent", 2)
        assert timer.headers["Sojourn-Fairness-Key"] == "tenant-a"
        assert timer.headers["Sojourn-Fairness-Weight"] == "3"
        await client.cancel("p")


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({"Sojourn-Fairness-Key": "tenant a"}, "invalid_fairness"),  # a space
        ({"Sojourn-Fairness-Key": "x" * 129}, "invalid_fairness"),
        ({"Sojourn-Fairness-Weight": "2"}, "invalid_fairness"),  # a weight without a key
        ({"Sojourn-Fairness-Key": "t", "Sojourn-Fairness-Weight": "0"}, "invalid_fairness"),
        ({"Sojourn-Fairness-Key": "t", "Sojourn-Fairness-Weight": "1001"}, "invalid_fairness"),
        ({"Sojourn-Fairness-Key": "t", "Sojourn-Fairness-Weight": "1e3"}, "invalid_fairness"),
        ({"Sojourn-Fairness-Key": "t", "Sojourn-Fairness-Weight": "\u0661"}, "invalid_fairness"),
    ],
)
async def test_hostile_fairness_headers_are_refused_with_a_typed_answer(
    nats_server: EmbeddedServer, settings: Settings, broker: Broker,
    headers: dict[str, str], code: str,
) -> None:  # fmt: skip
    names = Names(settings.prefix)
    async with Worker([app.laned], nats=nats_server.url, settings=settings):
        inbox = broker.new_inbox()
        sub = await broker.subscribe(inbox, max_msgs=1)
        try:
            subject = names.start("laned", None, "hostile", 1)
            await broker.publish(subject, b'{"input": 0.0}', {h.REPLY_TO: inbox, **headers})
            msg = await sub.next_msg(timeout=15)
        finally:
            await sub.unsubscribe()
        answer = json.loads(msg.data)
        assert answer["error"]["code"] == code, answer
        # and the next start on that lane is not held up by it
        ok = await send_raw(broker, names.start("laned", None, "fine", 1), b'{"input": 0.0}')
        assert ok.get("run_id") == "fine", ok


async def test_lanes_that_do_not_exist_are_stored_nowhere(
    nats_server: EmbeddedServer, settings: Settings, broker: Broker, client: Client
) -> None:
    async with Worker([app.laned], nats=nats_server.url, settings=settings):
        p = settings.prefix
        for subject in (
            f"{p}.p3.start.laned.r1",  # priority 3 is the default lane: no token
            f"{p}.p9.start.laned.r2",
            f"{p}.p1.signal.r1.go",  # only starts and spawns have a lane
            f"{p}.as.alice.p1.cancel.r1",
        ):
            # no stream captures it: no ack, a 503 "no responders"
            answer = await broker.try_publish(subject, b'{"input": 0}', timeout=10)
            assert isinstance(answer, JetStreamError) and answer.code == 503, (subject, answer)
        with pytest.raises(InvalidName):
            await client.start("laned", 0.0, priority=7)
        with pytest.raises(InvalidName):
            await client.start("laned", 0.0, fairness_weight=2)
        assert await client.pending("r1") is None
        # a start stored on a lane and not yet taken shows as pending, with its lane
    await client.start("laned", 0.0, run_id="later", priority=4)
    pending = await client.pending("later")
    assert pending is not None and pending.priority == 4


async def test_a_start_that_waited_on_its_lane_is_timed_from_when_the_broker_stored_it(
    nats_server: EmbeddedServer, client: Client, settings: Settings
) -> None:
    """``sojourn_lane_wait_seconds{lane,kind="start"}``: stored -> taken by a worker, read from
    the delivery's ack subject (the broker's own stamp), for each lane."""

    def seen(lane: str) -> tuple[float, float]:
        labels = {"lane": lane, "kind": "start"}
        count = REGISTRY.get_sample_value("sojourn_lane_wait_seconds_count", labels) or 0.0
        total = REGISTRY.get_sample_value("sojourn_lane_wait_seconds_sum", labels) or 0.0
        return count, total

    before = {lane: seen(lane) for lane in ("2", "4")}
    # Stored while no worker runs: each waits at least a second on its lane.
    await client.start("laned", 0.0, run_id="waited2", priority=2)
    await client.start("laned", 0.0, run_id="waited4", priority=4)
    stored = time.monotonic()
    await asyncio.sleep(1.0)
    async with Worker([app.laned], nats=nats_server.url, settings=settings):
        for rid in ("waited2", "waited4"):
            await client.result(rid, timeout=60)
        waited = time.monotonic() - stored
    for lane in ("2", "4"):
        count, total = seen(lane)
        assert count - before[lane][0] == 1, (lane, count, before[lane])
        # At least the second it waited; at most the whole test's time since the start.
        assert 0.9 <= total - before[lane][1] <= waited + 5.0, (lane, total, before[lane])
