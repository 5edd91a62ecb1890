"""``PullConsumer.fetch`` (broker/pull.py) against a real server: a message is handed over as
soon as it is there, never held for a batch to fill or a request to expire; a status answers
only its own request; a message for a request given up on is served next, not lost.

The "as soon as" tests give their fetch an hour: under the fault they guard against (a fetch
that waits for its batch or its request's expiry) they would not end, and the generous
deadline around them fails them instead."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from sojourn.broker import Broker, EmbeddedServer, JetStreamError, PullConsumer
from tests.conftest import wait_for

HOUR = 3600.0
DEADLINE = 120.0  # for a fetch that should end at once: only a hang reaches it


@pytest_asyncio.fixture
async def stream(nats_server: EmbeddedServer) -> AsyncIterator[tuple[Broker, str]]:
    """A stream ``<p>`` on subjects ``<p>.>`` with a durable pull consumer ``c``."""
    broker = await Broker.connect(nats_server.url)
    name = f"pull{uuid.uuid4().hex[:10]}"
    await broker.ensure_stream({"name": name, "subjects": [f"{name}.>"], "storage": "memory"})
    await broker.ensure_consumer(
        name, {"durable_name": "c", "ack_policy": "explicit", "ack_wait": 30 * 10**9}
    )
    try:
        yield broker, name
    finally:
        await broker.api(f"$JS.API.STREAM.DELETE.{name}")
        await broker.close()


@pytest_asyncio.fixture
async def pulling(stream: tuple[Broker, str]) -> AsyncIterator[tuple[Broker, str, PullConsumer]]:
    """``stream`` with a ``PullConsumer`` of its consumer, closed at the end."""
    broker, name = stream
    pc = await broker.pull(name, "c")
    try:
        yield broker, name, pc
    finally:
        await pc.close()


async def waiting_requests(broker: Broker, stream: str) -> int:
    info = await broker.api(f"$JS.API.CONSUMER.INFO.{stream}.c")
    return int(info.get("num_waiting", 0))


async def pending_fetch(
    broker: Broker, stream: str, pc: PullConsumer, batch: int = 64
) -> asyncio.Task[list[bytes]]:
    """A fetch of ``batch`` with an hour's timeout, once its request is waiting at the server."""

    async def fetch() -> list[bytes]:
        return [d.data for d in await pc.fetch(batch=batch, timeout=HOUR)]

    task = asyncio.create_task(fetch())

    async def request_is_in() -> bool:
        return await waiting_requests(broker, stream) >= 1

    await wait_for(request_is_in, 60, what="the fetch's pull request at the server")
    return task


async def test_one_message_to_an_idle_consumer_ends_a_fetch_of_64_at_once(
    pulling: tuple[Broker, str, PullConsumer],
) -> None:
    broker, name, pc = pulling
    task = await pending_fetch(broker, name, pc)
    await broker.publish(f"{name}.x", b"one")
    assert await asyncio.wait_for(task, DEADLINE) == [b"one"]


async def test_a_status_for_an_earlier_request_does_not_end_the_current_fetch(
    pulling: tuple[Broker, str, PullConsumer],
) -> None:
    """The late ``408`` of a request the client gave up on arrives during the next fetch: it
    ends nothing (nats-py's shared reply subject took it for the next fetch's own answer and
    then held the next message until that fetch's request expired)."""
    broker, name, pc = pulling
    assert await pc.fetch(batch=64, timeout=0.05) == []  # request 1, over
    task = await pending_fetch(broker, name, pc)  # request 2
    inbox = pc._inbox  # the requests' reply subjects are <inbox>.<n>
    for status in ("408", "404", "409"):
        await broker.publish_core(f"{inbox}.1", b"", {"Status": status})
    await broker.flush()
    assert not task.done()
    await broker.publish(f"{name}.x", b"after")
    assert await asyncio.wait_for(task, DEADLINE) == [b"after"]


async def test_a_message_for_a_request_given_up_on_is_served_by_the_next_fetch(
    pulling: tuple[Broker, str, PullConsumer],
) -> None:
    broker, _, pc = pulling
    assert await pc.fetch(batch=8, timeout=0.05) == []
    await broker.publish_core(f"{pc._inbox}.1", b"late")  # as a late delivery would come
    await broker.flush()
    got = await asyncio.wait_for(pc.fetch(batch=8, timeout=HOUR), DEADLINE)
    assert [d.data for d in got] == [b"late"]


async def test_the_batch_bounds_each_fetch_and_every_message_comes_once_in_order(
    pulling: tuple[Broker, str, PullConsumer],
) -> None:
    broker, name, pc = pulling
    for i in range(10):
        await broker.publish(f"{name}.x", str(i).encode())
    seen: list[bytes] = []
    while len(seen) < 10:
        got = await pc.fetch(batch=3, timeout=5.0)
        assert 1 <= len(got) <= 3
        for d in got:
            await d.ack()
        seen += [d.data for d in got]
    assert seen == [str(i).encode() for i in range(10)]
    assert await pc.fetch(batch=3, timeout=0.1) == []


async def test_a_deleted_consumer_ends_the_waiting_fetch_with_its_status(
    pulling: tuple[Broker, str, PullConsumer],
) -> None:
    broker, name, pc = pulling
    task = await pending_fetch(broker, name, pc)
    await broker.api(f"$JS.API.CONSUMER.DELETE.{name}.c")
    with pytest.raises(JetStreamError) as e:
        await asyncio.wait_for(task, DEADLINE)
    assert e.value.code == 409


async def test_bad_arguments_are_refused(pulling: tuple[Broker, str, PullConsumer]) -> None:
    _, _, pc = pulling
    for batch, timeout in ((0, 1.0), (1, 0.0), (1, -1.0)):
        with pytest.raises(ValueError):
            await pc.fetch(batch=batch, timeout=timeout)
