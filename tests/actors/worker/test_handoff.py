"""A start that reaches a worker not serving its agent (intakes share one consumer): handed on
at once when another live worker serves the agent, with pauses growing by a second per
delivery when none does (``Starts.hand_back``).

The server hands a message to the oldest pull request waiting, and a worker idle for another
agent waits longest: with one worker per agent it took nearly every start of the busier agent
first, and each such start waited a second or two for the hand-back (``python -m
bench.mixed_fleet``: p50 1.46 s before, 3 ms after). Real server, two workers in this process;
the pauses are read off the hand-backs themselves."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sojourn.actors import Client, Context, Worker, agent
from sojourn.actors.worker.starts import HANDBACK_MAX_DELAY, handback_delay, handoff_delay
from sojourn.broker import EmbeddedServer
from sojourn.broker.delivery import Delivery
from sojourn.schemas.config import Settings
from tests.conftest import wait_for


def one() -> int:
    return 1


@agent("hand_a")
async def hand_a(ctx: Context) -> int:
    return await ctx.step(one)


@agent("hand_b")
async def hand_b(ctx: Context) -> int:
    return await ctx.step(one)


@pytest.fixture
def handed_back(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, float | None]]]:
    """Every hand-back in this process: (subject, pause)."""
    seen: list[tuple[str, float | None]] = []
    nak = Delivery.nak

    async def recording(self: Delivery, delay: float | None = None) -> None:
        seen.append((self.subject, delay))
        await nak(self, delay)

    monkeypatch.setattr(Delivery, "nak", recording)
    yield seen


def test_the_handoff_pause_is_none_at_first_then_doubles_to_the_cap() -> None:
    assert handoff_delay(1) == 0.0
    for n in range(2, 40):
        base = min(HANDBACK_MAX_DELAY, 0.01 * 2 ** min(n - 2, 16))
        assert base <= handoff_delay(n) <= base * 1.5
    assert sum(min(HANDBACK_MAX_DELAY, 0.01 * 2 ** (n - 2)) for n in range(2, 14)) < 45
    for n in range(1, 40):  # the pending-agent pause is never the shorter one
        assert handback_delay(n) >= min(HANDBACK_MAX_DELAY, n)


async def test_a_start_for_an_agent_a_live_worker_serves_is_handed_on_at_once(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    handed_back: list[tuple[str, float | None]],
) -> None:
    wa = await Worker([hand_a], nats=nats_server.url, settings=settings).start()
    wb = await Worker([hand_b], nats=nats_server.url, settings=settings).start()
    try:
        # Each knows the other from its beats before the starts come.
        async def known() -> bool:
            return wb.heartbeats.served_elsewhere("hand_a") and wa.heartbeats.served_elsewhere(
                "hand_b"
            )

        await wait_for(known, timeout=30, what="the workers seeing each other")
        for i in range(20):
            rid = await client.start("hand_a", None, run_id=f"ha{i}")
            assert await client.result(rid, timeout=60) == 1
        starts = [d for s, d in handed_back if ".start.hand_a." in s]
        # The idle worker of the other agent took some (as it did every time before) and
        # handed each on with no pause, or a first doubling one should the other be busy.
        assert starts, "no start reached the other agent's worker: nothing was tested"
        assert all(d is None or d <= 0.015 for d in starts), starts
    finally:
        await wa.stop()
        await wb.stop()


async def test_a_start_for_an_agent_no_live_worker_serves_waits_with_growing_pauses(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    handed_back: list[tuple[str, float | None]],
) -> None:
    wa = await Worker([hand_a], nats=nats_server.url, settings=settings).start()
    await wa.stop()  # the agent is known (registered), no worker of it is up
    wb = await Worker([hand_b], nats=nats_server.url, settings=settings).start()
    try:
        rid = await client.start("hand_a", None, run_id="pending-a")

        async def handed() -> bool:
            return any(".start.hand_a." in s for s, _ in handed_back)

        await wait_for(handed, timeout=30, what="the start handed back")
        pauses = [d for s, d in handed_back if ".start.hand_a." in s]
        assert all(d is not None and d >= 1.0 for d in pauses), pauses
        assert await client.status(rid) == "pending"
    finally:
        await wb.stop()
