"""An activation's tenancy against a real server: the trigger or wake it works on is kept from
being redelivered however long the activation lasts, a step's progress is recorded at once and
then at most once a second, and an activation that ends before anything is due costs no task."""

from __future__ import annotations

import asyncio

from sojourn.actors.worker.tenancy import PROGRESS_EVERY, Tenancy
from sojourn.broker import Broker, Delivery, Names, headers
from sojourn.broker.progress import ProgressStore, decode_lease
from sojourn.broker.pull import PullConsumer
from sojourn.schemas.config import Settings
from tests.broker import test_delivery

deployment = test_delivery.deployment  # the fixture: a deployment's streams and consumers


async def _trigger(broker: Broker, names: Names) -> tuple[Delivery, PullConsumer]:
    await broker.publish(names.start("greeter"), b"{}", {headers.MSG_ID: "tenancy-1"})
    consumer = await broker.pull(names.inbox_stream, names.intake_consumer)
    [d] = await consumer.fetch(batch=1, timeout=5.0)
    assert isinstance(d, Delivery) and d.num_delivered == 1
    return d, consumer


async def test_a_trigger_held_past_its_ack_wait_is_not_redelivered_until_let_go(
    deployment: tuple[Broker, Names], settings: Settings
) -> None:
    broker, names = deployment
    d, consumer = await _trigger(broker, names)
    ack_wait = settings.lease_ttl  # the intake consumer's ack wait
    store = ProgressStore(broker, names, worker="w1")
    async with Tenancy(store, "r1", "w1.1", d, period=ack_wait / 4, since=0.0):
        await asyncio.sleep(ack_wait * 2.5)  # the activation runs this long
        # Kept alive all along: nothing comes back while it runs.
        assert await consumer.fetch(batch=1, timeout=0.5) == []
    # Let go without a settlement (a worker that died would do the same): it comes back.
    [again] = await consumer.fetch(batch=1, timeout=ack_wait * 3)
    assert isinstance(again, Delivery) and again.num_delivered == 2
    await again.ack()


async def test_progress_is_recorded_at_once_then_at_most_once_a_second(
    deployment: tuple[Broker, Names], settings: Settings
) -> None:
    broker, names = deployment
    d, _consumer = await _trigger(broker, names)
    seen: list[bytes] = []

    async def on_report(m: Delivery) -> None:
        seen.append(m.data)

    sub = await broker.subscribe(names.lease("r2"), cb=on_report)
    store = ProgressStore(broker, names, worker="w1")
    try:
        async with Tenancy(store, "r2", "w1.1", d, period=30.0, since=12.0) as tenancy:
            loop = asyncio.get_running_loop()
            began = loop.time()
            n = 0
            while loop.time() - began < PROGRESS_EVERY * 1.5:
                n += 1
                tenancy.progress.details = None
                tenancy.progress.step = f"tick {n}"
                tenancy.progress.changed = True
                tenancy.heartbeat()
                if n == 1:
                    # The first report goes out at once.
                    deadline = loop.time() + 5
                    while not seen and loop.time() < deadline:  # noqa: ASYNC110
                        await asyncio.sleep(0.01)
                    assert len(seen) == 1
                await asyncio.sleep(0.02)
            # The second comes a second after the first, with what was reported last.
            deadline = loop.time() + 5
            while len(seen) < 2 and loop.time() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        assert len(seen) == 2, f"{len(seen)} reports for {n} heartbeats in 1.5 s"
        first, second = (decode_lease(b) for b in seen)
        assert first.step == "tick 1" and first.owner == "w1.1" and first.acquired_at == 12.0
        assert second.step is not None and int(second.step.split()[1]) > 40
        assert second.heartbeat_at - first.heartbeat_at >= PROGRESS_EVERY * 0.9
    finally:
        await sub.unsubscribe()
        await d.ack()


async def test_an_activation_that_ends_before_anything_is_due_starts_no_task(
    deployment: tuple[Broker, Names],
) -> None:
    broker, names = deployment
    d, _consumer = await _trigger(broker, names)
    before = {t.get_name() for t in asyncio.all_tasks()}
    tenancy = Tenancy(ProgressStore(broker, names), "r3", "w1.1", d, period=30.0, since=0.0)
    async with tenancy:
        await asyncio.sleep(0.05)
        started = {t.get_name() for t in asyncio.all_tasks()} - before
        assert not [n for n in started if "keepalive" in n]
    # and once closed, nothing fires later
    assert tenancy._timer is None and tenancy._work is None
    await d.ack()
