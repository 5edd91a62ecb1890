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
