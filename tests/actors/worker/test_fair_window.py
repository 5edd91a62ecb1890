"""The fetch window (``actors/worker/fairness.py``, decision 0049) against a real server: a
key's late message is not stuck behind another key's burst, weights share what is taken, held
messages are kept alive past the ack wait, the byte bound holds, hostile headers change
nothing but their message's key."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import pytest
import pytest_asyncio

from sojourn.actors.worker.fairness import FairWindow
from sojourn.actors.worker.tenancy import times_delivered
from sojourn.broker import Broker, EmbeddedServer, PullConsumer
from sojourn.broker.delivery import Delivery
from sojourn.schemas.fairness import FAIRNESS_KEY, FAIRNESS_WEIGHT, Fairness
from tests.conftest import wait_for

DEADLINE = 60.0

Make = Callable[[float], Awaitable[tuple[PullConsumer, str]]]


@pytest_asyncio.fixture
async def broker(nats_server: EmbeddedServer) -> AsyncIterator[Broker]:
    b = await Broker.connect(nats_server.url)
    try:
        yield b
    finally:
        await b.close()


@pytest_asyncio.fixture
async def make(broker: Broker) -> AsyncIterator[Make]:
    """``make(ack_wait)``: a stream ``<name>.>`` with a durable pull consumer, pulled."""
    made: list[tuple[str, PullConsumer]] = []

    async def _make(ack_wait: float = 30.0) -> tuple[PullConsumer, str]:
        name = f"fair{uuid.uuid4().hex[:10]}"
        await broker.ensure_stream({"name": name, "subjects": [f"{name}.>"], "storage": "memory"})
        await broker.ensure_consumer(
            name,
            {
                "durable_name": "c",
                "ack_policy": "explicit",
                "ack_wait": int(ack_wait * 1e9),
                "max_ack_pending": 10_000,  # the default, 1000, would cap the look-ahead
            },
        )
        pc = await broker.pull(name, "c")
        made.append((name, pc))
        return pc, name

    try:
        yield _make
    finally:
        for name, pc in made:
            await pc.close()
            await broker.api(f"$JS.API.STREAM.DELETE.{name}")


def keyed(key: str, weight: int = 1) -> dict[str, str]:
    return {FAIRNESS_KEY: key, FAIRNESS_WEIGHT: str(weight)}


async def publish_all(
    broker: Broker, subject: str, messages: list[tuple[bytes, dict[str, str]]]
) -> None:
    for data, headers in messages:
        await broker.publish(subject, data, headers)


async def drain(win: FairWindow, n: int, batch: int = 50) -> list[Delivery]:
    """``n`` messages from ``win``, fetched ``batch`` at a time; fails on a stall."""
    got: list[Delivery] = []

    async def loop() -> None:
        while len(got) < n:
            got.extend(await win.fetch(batch=batch, timeout=1.0))

    await asyncio.wait_for(loop(), DEADLINE)
    return got


async def read_all(win: FairWindow, total: int) -> list[Delivery]:
    """Take one at a time until the window has read all ``total`` messages (a loaded server
    may deliver the look-ahead in several pieces); returns what was taken meanwhile."""
    taken: list[Delivery] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while win.held + len(taken) < total:
        taken += await win.fetch(batch=1, timeout=5.0)
        await asyncio.sleep(0.02)  # past the window's quiet spell: the next look-ahead
        assert loop.time() < deadline, (win.held, len(taken))
    return taken


async def test_a_late_key_overtakes_a_burst(broker: Broker, make: Make) -> None:
    pc, name = await make(30.0)
    await publish_all(broker, f"{name}.x", [(b"a", keyed("A"))] * 2000 + [(b"b", keyed("B"))])
    win = FairWindow(pc, keep_alive=10.0)
    try:
        # Once the window has read the whole burst and B, B is at most one take away.
        first = await read_all(win, 2001)
        if b"b" not in [d.data for d in first]:
            first += [d for _ in range(2) for d in await win.fetch(batch=1, timeout=5.0)]
        assert [d.data for d in first].count(b"b") == 1, [d.data for d in first]
        assert len(first) < 2001 // 2, len(first)  # far ahead of its place in the stream
        rest = await drain(win, 2001 - len(first), batch=256)
        assert Counter(d.data for d in first + rest) == {b"a": 2000, b"b": 1}
        assert win.held == 0 and win.held_bytes == 0
    finally:
        await win.close()


async def test_weights_share_what_is_taken(broker: Broker, make: Make) -> None:
    pc, name = await make(30.0)
    rng = random.Random(49)
    msgs = [(b"a", keyed("A", 3))] * 200 + [(b"b", keyed("B", 1))] * 200
    rng.shuffle(msgs)  # any arrival order: all within the window
    await publish_all(broker, f"{name}.x", msgs)
    win = FairWindow(pc, keep_alive=10.0)
    try:
        await read_all(win, 400)  # a share is weighted only over what is held
        counts = Counter(d.data for d in await drain(win, 200, batch=10))  # from all held
        assert abs(counts[b"a"] - 150) <= 2 and abs(counts[b"b"] - 50) <= 2, counts
    finally:
        await win.close()


async def test_held_messages_outlive_the_ack_wait(broker: Broker, make: Make) -> None:
    pc, name = await make(2.0)
    await publish_all(broker, f"{name}.x", [(b"%d" % i, keyed("A")) for i in range(20)])
    win = FairWindow(pc, keep_alive=2.0 / 3)
    try:
        first = await win.fetch(batch=1, timeout=5.0)
        await first[0].ack()
        assert win.held == 19
        await asyncio.sleep(5.0)  # 2.5 ack waits: only the keep-alive stops a redelivery
        assert win.kept_alive >= 19 * 3
        rest = await drain(win, 19)
        assert [times_delivered(d) for d in rest] == [1] * 19
        assert [d.data for d in rest] == [b"%d" % i for i in range(1, 20)]  # FIFO in a key
        for d in rest:
            await d.ack()

        async def settled() -> bool:
            info = await broker.api(f"$JS.API.CONSUMER.INFO.{name}.c")
            assert info["num_redelivered"] == 0, info
            return int(info["num_ack_pending"]) == 0

        await wait_for(settled, DEADLINE, what="the acks")
        assert await pc.fetch(batch=10, timeout=0.5) == []  # nothing redelivered later
    finally:
        await win.close()


async def test_close_leaves_held_messages_to_be_redelivered(broker: Broker, make: Make) -> None:
    pc, name = await make(1.0)
    await publish_all(broker, f"{name}.x", [(b"x", {})] * 5)
    win = FairWindow(pc, keep_alive=1.0 / 3)
    assert len(await win.fetch(batch=1, timeout=5.0)) == 1
    assert win.held == 4
    await win.close()
    assert win.held == 0 and win.held_bytes == 0
    with pytest.raises(RuntimeError):
        await win.fetch(batch=1, timeout=1.0)
    again: list[Delivery] = []

    async def redelivered() -> None:
        while len(again) < 4:
            again.extend(await pc.fetch(batch=10, timeout=1.0))

    await asyncio.wait_for(redelivered(), DEADLINE)
    assert all(times_delivered(d) == 2 for d in again if d.data == b"x")


@pytest.mark.parametrize("size", [10_000, 150_000])
async def test_the_byte_bound_holds(broker: Broker, make: Make, size: int) -> None:
    """150 KB messages are each larger than the whole bound: taken one at a time."""
    pc, name = await make(30.0)
    bound, biggest = 100_000, 200_000
    rng = random.Random(size)
    msgs = [
        (bytes([i % 256]) * rng.randint(size // 2, size), keyed(f"k{i % 3}")) for i in range(60)
    ]
    await publish_all(broker, f"{name}.x", msgs)
    win = FairWindow(pc, window_bytes=bound, max_message=biggest, keep_alive=10.0)
    got: list[Delivery] = []
    try:
        while len(got) < len(msgs):
            got.extend(await asyncio.wait_for(win.fetch(batch=2, timeout=1.0), DEADLINE))
            assert win.held_bytes <= bound + size + 200  # a message's body and headers
        assert sorted(d.data for d in got) == sorted(m[0] for m in msgs)
        assert win.held == 0 and win.held_bytes == 0
    finally:
        await win.close()


HOSTILE = [
    {FAIRNESS_KEY: "k" * 5000},
    {FAIRNESS_KEY: "tab\there"},
    {FAIRNESS_KEY: "\x01\x02\x7f"},
    {FAIRNESS_KEY: "\u0661\u0662", FAIRNESS_WEIGHT: "\u0661"},
    {FAIRNESS_KEY: "A", FAIRNESS_WEIGHT: "1e9"},
    {FAIRNESS_KEY: "A", FAIRNESS_WEIGHT: "-1"},
    {FAIRNESS_KEY: "A", FAIRNESS_WEIGHT: "0"},
    {FAIRNESS_KEY: "A", FAIRNESS_WEIGHT: "true"},
    {FAIRNESS_KEY: "A", FAIRNESS_WEIGHT: "9" * 4000},
    {FAIRNESS_KEY: "A", FAIRNESS_WEIGHT: " 7 "},
    {FAIRNESS_WEIGHT: "1000"},
    {FAIRNESS_KEY: ""},
    {"Status": "503"},
    {},
]


async def test_hostile_headers_never_raise_nor_stall(broker: Broker, make: Make) -> None:
    pc, name = await make(30.0)
    rng = random.Random(7)
    msgs = [(b"%d" % i, rng.choice(HOSTILE)) for i in range(300)]
    await publish_all(broker, f"{name}.x", msgs)
    win = FairWindow(pc, keep_alive=10.0)
    try:
        got = await drain(win, len(msgs), batch=7)
        assert sorted(d.data for d in got) == sorted(m[0] for m in msgs)
        assert win.held == 0 and await win.fetch(batch=5, timeout=0.2) == []
    finally:
        await win.close()


async def test_a_classify_that_raises_puts_messages_on_the_default_key(
    broker: Broker, make: Make
) -> None:
    pc, name = await make(30.0)
    await publish_all(broker, f"{name}.x", [(b"%d" % i, keyed("A")) for i in range(30)])

    def broken(headers: Mapping[str, str]) -> Fairness:
        if int(headers.get("n", "0") or 0) >= 0:
            raise RuntimeError("classify broke")
        return Fairness()

    win = FairWindow(pc, keep_alive=10.0, classify=broken)
    try:
        got = await drain(win, 30, batch=4)
        assert [d.data for d in got] == [b"%d" % i for i in range(30)]  # one key: FIFO
    finally:
        await win.close()


async def test_a_lone_message_into_an_empty_window_is_handed_out_unweighed(
    broker: Broker, make: Make
) -> None:
    """A quiet worker's every start: one message, nothing to be fair to; the next chunk of
    several is weighed as before."""
    pc, name = await make(30.0)
    weighed: list[str] = []

    def counting(headers: Mapping[str, str]) -> Fairness:
        weighed.append(headers.get(FAIRNESS_KEY, ""))
        return Fairness(key=headers.get(FAIRNESS_KEY, ""), weight=1)

    win = FairWindow(pc, keep_alive=10.0, classify=counting)
    try:
        await publish_all(broker, f"{name}.x", [(b"lone", keyed("A"))])
        assert [d.data for d in await drain(win, 1)] == [b"lone"]
        assert weighed == [] and win.held == 0 and win.held_bytes == 0
        await publish_all(broker, f"{name}.x", [(b"%d" % i, keyed("B")) for i in range(5)])
        got = await drain(win, 5)
        assert sorted(d.data for d in got) == [b"%d" % i for i in range(5)]
        assert win.held == 0 and win.held_bytes == 0
    finally:
        await win.close()
