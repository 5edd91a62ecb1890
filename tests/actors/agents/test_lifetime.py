"""A maximum lifetime per run (``@agent(lifetime=...)``): a run past it ends ``cancelled`` with
the lifetime named, its compensation run and its children cancelled; in a step loop (the
running step interrupted) and parked on a long wait with no worker alive (a broker timer at
``started_at + lifetime`` wakes it)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from sojourn.actors import Client, Context, Worker, agent
from sojourn.broker import EmbeddedServer
from sojourn.broker import headers as h
from sojourn.schemas import CancelTaken, RunCancelled, RunEvent, StepFailed
from sojourn.schemas.config import Settings
from tests.conftest import wait_for

ran: list[str] = []


async def tick(i: int) -> int:
    ran.append(f"tick {i}")
    # A few quick ticks, then one that would run for an hour: the lifetime's deadline lands
    # while a tick runs however loaded the machine is (not between two ticks, in an append).
    await asyncio.sleep(0.1 if i < 3 else 3600)
    return i


async def cleanup(ctx: Context, _: None) -> None:
    await ctx.step(record_cleanup)


async def record_cleanup() -> str:
    ran.append("cleanup")
    return "clean"


async def kid_forever() -> str:
    ran.append("kid")
    await asyncio.sleep(3600)
    return "never"


@agent("lifetime_kid")
async def lifetime_kid(ctx: Context, _: None) -> str:
    return await ctx.step(kid_forever)


@agent("looper", lifetime=1.5, on_cancel=cleanup)
async def looper(ctx: Context, _: None) -> None:
    await ctx.start_child(lifetime_kid)
    i = 0
    while True:  # a runaway loop
        await ctx.step(tick, i)
        i += 1


@agent("sleeper", lifetime=timedelta(seconds=2))
async def sleeper(ctx: Context, _: None) -> str:
    await ctx.sleep(timedelta(hours=1))
    return "woke after an hour"


async def events_of(client: Client, run_id: str) -> list[RunEvent]:
    return [e for d in await client.history(run_id) for e in d.events]


async def cancelled(client: Client, run_id: str, timeout: float = 30.0) -> RunCancelled:
    async def ended() -> bool:
        return await client.status(run_id) == "cancelled"

    await wait_for(ended, timeout=timeout, what=f"run {run_id} to end cancelled")
    end = (await events_of(client, run_id))[-1]
    assert isinstance(end, RunCancelled)
    return end


async def test_a_runaway_loop_ends_at_its_lifetime_compensated_and_with_its_children(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    ran.clear()
    async with Worker([looper, lifetime_kid], nats=nats_server.url, settings=settings):
        run_id = await client.start("looper", None, run_id="loop", wait=True)
        end = await cancelled(client, run_id)
        kid_end = await cancelled(client, f"{run_id}-c0")
    assert end.reason == "lifetime of 1.5s exceeded" and not end.terminated
    events = await events_of(client, run_id)
    st = await client.state(run_id)
    assert end.at >= st.started_at + 1.5
    assert [e.reason for e in events if isinstance(e, CancelTaken)] == [end.reason]
    assert ran.count("cleanup") == 1
    assert sum(r.startswith("tick") for r in ran) >= 3  # it did loop until then
    # The tick in flight at the deadline was interrupted, not waited for.
    interrupted = [e for e in events if isinstance(e, StepFailed)]
    assert [e.error.type for e in interrupted] == ["Cancelled"]
    assert "lifetime of 1.5s exceeded" in interrupted[0].error.message
    assert run_id in kid_end.reason


async def test_a_run_parked_past_its_lifetime_is_woken_by_a_broker_timer_and_ended(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    names = client.names
    async with Worker([sleeper], nats=nats_server.url, settings=settings):
        run_id = await client.start("sleeper", None, run_id="nap", wait=True)

        async def waiting() -> bool:
            return await client.status(run_id) == "waiting"

        await wait_for(waiting, what="the hour's sleep to be recorded")
    # No worker from here on. The broker keeps a timer at the end of the run's lifetime.
    st = await client.state(run_id)
    timer = await client.broker.direct_get_last(names.wake_stream, names.timer(run_id, "lifetime"))
    assert timer is not None
    assert timer.header(h.SCHEDULE).startswith("@at ")

    async def fired() -> bool:
        wake = names.wake(run_id, "sleeper")
        m = await client.broker.direct_get_last(names.wake_stream, wake)
        return m is not None and m.header(h.SCHEDULER) == names.timer(run_id, "lifetime")

    await wait_for(fired, timeout=30, what="the broker to fire the lifetime timer")
    assert await client.status(run_id) == "waiting"  # nobody ran it yet
    # A worker started now finds only that wake (the sleep's own timer is an hour away).
    async with Worker([sleeper], nats=nats_server.url, settings=settings):
        end = await cancelled(client, run_id)
    assert end.reason == "lifetime of 2s exceeded"
    assert end.at >= st.started_at + 2
    # The run's timers are gone with it (the hour's sleep and the lifetime's).
    for timer_id in ("0", "lifetime"):
        left = await client.broker.direct_get_last(names.wake_stream, names.timer(run_id, timer_id))
        assert left is None, timer_id


def test_a_lifetime_must_be_positive() -> None:
    for bad in (0, -5, timedelta(0), float("inf")):
        with pytest.raises(ValueError, match="lifetime"):
            agent("bad_lifetime", lifetime=bad)(sleeper.fn)
