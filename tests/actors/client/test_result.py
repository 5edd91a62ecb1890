"""``Client.result``: how it waits for a run's end (``actors/client/reading.py``).

It subscribes to the run's subject and looks at the last stored message in the same write: an
end published once the server has the subscription is heard, one stored before the look is
read. These tests hold it to that, against a real server, with the ends written by another
connection as a worker would."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

from sojourn.actors import Client
from sojourn.actors.client import reading
from sojourn.broker import Broker, Names
from sojourn.broker.eventstore import EventStore
from sojourn.schemas.codec import to_raw
from sojourn.schemas.config import Settings
from sojourn.schemas.events import RunCompleted
from tests.actors.ops import test_retention
from tests.actors.ops.test_retention import append_run

broker = test_retention.broker  # a connection with the deployment's topology


async def test_an_ended_run_answers_with_one_look_and_no_flush(
    broker: Broker, client: Client, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run ended before ``result`` was called: one look at the last stored message answers,
    with no round trip for the subscription before it (the server reads the SUB first)."""
    store = EventStore(broker, Names(settings.prefix), settings)
    await append_run(store, "ended-1")
    calls: list[str] = []
    real_flush, real_last = client.broker.flush, client.broker.direct_get_last

    async def flush(*args: Any, **kwargs: Any) -> None:
        calls.append("flush")
        await real_flush(*args, **kwargs)

    async def last(*args: Any, **kwargs: Any) -> Any:
        calls.append("look")
        return await real_last(*args, **kwargs)

    monkeypatch.setattr(client.broker, "flush", flush)
    monkeypatch.setattr(client.broker, "direct_get_last", last)
    assert await client.result("ended-1", timeout=10) == {"ok": "ended-1"}
    assert calls == ["look"]


async def test_an_end_stored_while_result_subscribes_is_never_missed(
    broker: Broker, client: Client, settings: Settings
) -> None:
    """Ends appended by another connection at random moments around ``result``'s subscription
    and first look (before, during, just after): each ``result`` answers the stored end, and
    well before the 5 s re-read that would be the only way left to see one it missed."""
    store = EventStore(broker, Names(settings.prefix), settings)
    rng = random.Random(27)
    slowest = 0.0
    for i in range(40):
        run_id = f"race-{i}"
        history = await append_run(store, run_id, end="waiting")
        delay = rng.choice([0.0, 0.0002, 0.0005, 0.001, 0.002, 0.004])

        async def end(
            run_id: str = run_id, seq: int = history[-1].seq, delay: float = delay
        ) -> None:
            await asyncio.sleep(delay)
            done = RunCompleted(output=to_raw({"ok": run_id}))
            await store.append(run_id, [done], expected_seq=seq, writer="w-end")

        t0 = time.monotonic()
        writer = asyncio.create_task(end())
        assert await client.result(run_id, timeout=30) == {"ok": run_id}
        slowest = max(slowest, time.monotonic() - t0)
        await writer
    assert slowest < 2.5, f"a result took {slowest:.2f}s: an end was missed until a re-read"


async def test_a_run_not_stored_yet_is_not_polled_while_it_starts(
    broker: Broker, client: Client, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``result`` of a run nothing of which is stored yet (it is starting): its end can only be
    published after that first look, so the subscription hears it. No look again 2, 4, 8 ms
    later while the run's first appends are on their way, and no archive read: between the
    first look and the run's first append (20 ms later), nothing."""
    store = EventStore(broker, Names(settings.prefix), settings)
    looks: list[tuple[float, str]] = []
    real_last = client.broker.direct_get_last

    async def last(*args: Any, **kwargs: Any) -> Any:
        looks.append((time.monotonic(), "look"))
        return await real_last(*args, **kwargs)

    async def archived(run_id: str) -> None:
        looks.append((time.monotonic(), "archive"))

    monkeypatch.setattr(client.broker, "direct_get_last", last)
    monkeypatch.setattr(client, "_archived_end", archived)
    for i in range(5):
        run_id = f"starting-{i}"
        looks.clear()
        began: list[float] = []

        async def run(run_id: str = run_id, began: list[float] = began) -> None:
            await asyncio.sleep(0.02)  # the run's first append, well after the first look
            began.append(time.monotonic())
            await append_run(store, run_id)

        writer = asyncio.create_task(run())
        assert await client.result(run_id, timeout=30) == {"ok": run_id}
        await writer
        before = [what for at, what in looks if at < began[0]]
        assert before == ["look"], looks


def _counted_looks(client: Client, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When ``client`` looked at a run's last stored message (``time.monotonic()``)."""
    looks: list[float] = []
    real_last = client.broker.direct_get_last

    async def last(*args: Any, **kwargs: Any) -> Any:
        looks.append(time.monotonic())
        return await real_last(*args, **kwargs)

    monkeypatch.setattr(client.broker, "direct_get_last", last)
    return looks


async def test_a_run_this_client_just_started_is_looked_at_once_its_end_is_heard(
    broker: Broker, client: Client, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``result`` right after this client's own ``start`` (the inbox stored it as new) makes
    no look while the run starts: its end, published after the subscription, is heard, then
    read back with one look (``FRESH_FIRST_LOOK``, here stretched to 60 s to see it)."""
    monkeypatch.setattr(reading, "FRESH_FIRST_LOOK", 60.0)
    store = EventStore(broker, Names(settings.prefix), settings)
    looks = _counted_looks(client, monkeypatch)
    run_id = await client.start("kept", run_id="fresh-1")  # no worker: nothing runs it
    waiting = asyncio.create_task(client.result(run_id, timeout=30))
    await asyncio.sleep(0.3)  # a window in which the old code looked (at once, then 32 ms on)
    assert looks == [] and not waiting.done()
    ended = time.monotonic()
    await append_run(store, run_id)  # as a worker would: its end is published as stored
    assert await waiting == {"ok": run_id}
    assert len(looks) == 1 and looks[0] >= ended


async def test_an_end_stored_before_a_fresh_starts_subscription_is_read_by_the_later_look(
    broker: Broker, client: Client, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backstop: a run this client just started whose end was stored before ``result``
    subscribed (nothing to hear) is answered by the look ``FRESH_FIRST_LOOK`` later (0.2 s
    here), not by the 5 s re-read."""
    monkeypatch.setattr(reading, "FRESH_FIRST_LOOK", 0.2)
    store = EventStore(broker, Names(settings.prefix), settings)
    looks = _counted_looks(client, monkeypatch)
    run_id = await client.start("kept", run_id="fresh-2")
    await append_run(store, run_id)  # it ended before result is called
    t0 = time.monotonic()
    assert await client.result(run_id, timeout=30) == {"ok": run_id}
    took = time.monotonic() - t0
    assert 0.2 <= took < 4.0, took
    assert len(looks) == 1


async def test_only_a_start_the_inbox_stored_as_new_waits_to_look(
    broker: Broker, client: Client, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run started by another client, a ``result`` asked a second time, a start the inbox
    called a duplicate of one stored before: looked at at once (with ``FRESH_FIRST_LOOK`` at
    60 s, an answer within 10 s shows it). A waiting look is bounded by ``result``'s own
    timeout."""
    monkeypatch.setattr(reading, "FRESH_FIRST_LOOK", 60.0)
    store = EventStore(broker, Names(settings.prefix), settings)

    async def answered_within(run_id: str, timeout: float = 30) -> float:
        t0 = time.monotonic()
        assert await client.result(run_id, timeout=timeout) == {"ok": run_id}
        return time.monotonic() - t0

    other = await Client.connect(broker.url, settings=settings)
    try:
        await other.start("kept", run_id="fresh-3")
    finally:
        await other.close()
    await append_run(store, "fresh-3")
    assert await answered_within("fresh-3") < 10
    # this client's own start: the look waits, but no longer than the timeout
    await client.start("kept", run_id="fresh-4")
    await append_run(store, "fresh-4")
    assert 0.5 <= await answered_within("fresh-4", timeout=0.5) < 10
    assert await answered_within("fresh-4") < 10  # asked again: forgotten, looked at at once
    await client.start("kept", run_id="fresh-4")  # the same trigger: a duplicate
    assert await answered_within("fresh-4") < 10
