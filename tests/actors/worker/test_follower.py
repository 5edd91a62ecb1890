"""Following records a worker keeps a copy of (``RecordFollower``): every record read at start,
each change heard as a notice and everything read again every ``REFRESH_EVERY`` seconds (a
failed read logged, the next round reading again), and a stop that ends the refresher and the
background tasks, one that swallowed its cancel too, within a bound."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio

from sojourn.actors.worker import follower as follower_module
from sojourn.actors.worker.follower import RecordFollower
from sojourn.broker import EmbeddedServer
from sojourn.broker.connection import Broker
from sojourn.broker.delivery import Delivery, StoredMessage
from sojourn.broker.follow import read_all as real_read_all
from sojourn.broker.names import Names
from sojourn.broker.topology import ensure_topology
from sojourn.schemas.config import Settings
from tests.conftest import wait_for


@pytest_asyncio.fixture
async def broker(nats_server: EmbeddedServer, settings: Settings) -> AsyncIterator[Broker]:
    """A connection to the session's server, the test deployment's streams made."""
    b = await Broker.connect(nats_server.url)
    try:
        await ensure_topology(b, Names(settings.prefix), settings)
        yield b
    finally:
        await b.close()


class Keeper:
    """What a follower handed over: the records read (subject, body) and the notices heard."""

    def __init__(self) -> None:
        self.stored: list[tuple[str, bytes]] = []
        self.notices: list[tuple[str, bytes]] = []

    def on_stored(self, m: StoredMessage) -> None:
        self.stored.append((m.subject, m.data))

    async def on_notice(self, msg: Delivery) -> None:
        self.notices.append((msg.subject, msg.data))


async def eventually(cond: Callable[[], bool], what: str) -> None:
    async def check() -> bool:
        return cond()

    await wait_for(check, timeout=10.0, what=what)


def follow(broker: Broker, names: Names, keeper: Keeper) -> RecordFollower:
    return RecordFollower(
        broker,
        names.agents_stream,
        names.holds_all,
        on_stored=keeper.on_stored,
        on_notice=keeper.on_notice,
        what="test records",
    )


async def test_records_are_read_at_start_followed_by_notices_and_read_again(
    broker: Broker, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(follower_module, "REFRESH_EVERY", 0.1)
    names = Names(settings.prefix)
    await broker.publish(names.hold("a"), b"a1")
    await broker.publish(names.hold("b"), b"b1")
    keeper = Keeper()
    records = follow(broker, names, keeper)
    await records.start()
    try:
        assert keeper.stored == [(names.hold("a"), b"a1"), (names.hold("b"), b"b1")]
        await broker.publish(names.hold("a"), b"a2")  # one message per subject: a1 replaced
        await eventually(lambda: (names.hold("a"), b"a2") in keeper.notices, "the notice")
        keeper.stored.clear()
        await eventually(lambda: len(keeper.stored) >= 2, "the next round")  # reads them all
        assert keeper.stored[:2] == [(names.hold("b"), b"b1"), (names.hold("a"), b"a2")]
    finally:
        await records.stop()


async def test_a_failed_read_is_logged_and_the_next_round_reads_again(
    broker: Broker,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(follower_module, "REFRESH_EVERY", 0.1)
    names = Names(settings.prefix)
    await broker.publish(names.hold("a"), b"a1")
    keeper = Keeper()
    records = follow(broker, names, keeper)
    await records.start()
    failures = [1]

    async def read_all(b: Broker, stream: str, subject_filter: str) -> list[StoredMessage]:
        # Only this follower's read fails: another test's follower still winding down in this
        # process (a worker's holds or limits) must not take the one failure (seen once).
        if failures[0] > 0 and (stream, subject_filter) == (names.agents_stream, names.holds_all):
            failures[0] -= 1
            raise ConnectionError("the broker is away")
        return await real_read_all(b, stream, subject_filter)

    monkeypatch.setattr(follower_module, "read_all", read_all)  # the reads after the first
    keeper.stored.clear()
    try:
        with caplog.at_level(logging.DEBUG, logger="sojourn.actors.worker.follower"):
            await eventually(lambda: keeper.stored == [(names.hold("a"), b"a1")], "a read")
        assert failures == [0]
        assert "reading test records: the broker is away" in caplog.text
    finally:
        await records.stop()


async def test_stop_unsubscribes_and_ends_the_refresher_and_the_background_tasks(
    broker: Broker, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(follower_module, "REFRESH_EVERY", 0.05)
    names = Names(settings.prefix)
    keeper = Keeper()
    records = follow(broker, names, keeper)
    await records.start()
    ended: list[str] = []

    async def swallows_one_cancel() -> None:
        try:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                asyncio.current_task().uncancel()  # type: ignore[union-attr]
            await asyncio.sleep(60)  # goes on until it is cancelled again
        finally:
            ended.append("ended")

    records.later(swallows_one_cancel())
    await asyncio.sleep(0.01)
    began = asyncio.get_running_loop().time()
    await records.stop()
    assert asyncio.get_running_loop().time() - began < follower_module.STOP_GRACE
    assert ended == ["ended"]
    keeper.stored.clear()
    await broker.publish(names.hold("a"), b"after the stop")
    await asyncio.sleep(0.3)  # several refresh rounds, had the refresher gone on
    assert keeper.stored == [] and keeper.notices == []
