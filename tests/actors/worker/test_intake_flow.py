"""The intake keeps flowing while many runs execute: a new run's trigger is acked once its run
is stored (decision 0051), so the intake consumer holds no message of the runs executing,
however many and however long their steps take, and more than ``HELD_TRIGGERS_MAX`` of them
(the bound on messages held until their runs rest) start at once without a wake each."""

from __future__ import annotations

import asyncio
from typing import Any

from sojourn.actors import Client, Context, Worker, agent
from sojourn.actors.worker.worker import HELD_TRIGGERS_MAX
from sojourn.broker import EmbeddedServer
from sojourn.broker.connection import JetStreamError
from sojourn.schemas.config import Settings
from tests.conftest import wait_for

RUNS = HELD_TRIGGERS_MAX + 40
release = asyncio.Event()
holding: set[int] = set()


async def hold(n: int) -> int:
    holding.add(n)
    await release.wait()
    return n


def echo(text: str) -> str:
    return text


@agent("flow_hold")
async def flow_hold(ctx: Context, n: int) -> int:
    return await ctx.step(hold, n)


@agent("flow_signal")
async def flow_signal(ctx: Context, _: None) -> str:
    text = await ctx.wait_for("ping", type=str)
    return await ctx.step(echo, text)


async def test_signals_flow_while_more_runs_than_the_held_bound_execute(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    release.clear()
    holding.clear()
    names = client.names
    info = f"$JS.API.CONSUMER.INFO.{names.inbox_stream}.{names.intake_consumer}"
    async with Worker([flow_hold, flow_signal], nats=nats_server.url, settings=settings):
        waiter = await client.start("flow_signal", None, run_id="flow-signal", wait=True)
        await asyncio.gather(
            *(client.start("flow_hold", n, run_id=f"flow-{n}") for n in range(RUNS))
        )

        async def all_holding() -> bool:
            return len(holding) == RUNS

        await wait_for(all_holding, timeout=60, what="every run to be inside its step")

        async def none_held() -> bool:
            pending: int = (await client.broker.api(info, {}))["num_ack_pending"]
            return pending == 0

        await wait_for(none_held, timeout=30, what="every trigger acked while its run executes")
        # Each run was stored with its first step by the worker that created it: none was
        # stored alone and woken (what the runs beyond the held bound were before).
        for n in range(RUNS):
            first = (await client.history(f"flow-{n}"))[0]
            assert [type(e).__name__ for e in first.events] == ["RunStarted", "StepStarted"]
        # The intake still takes a signal, and the run it wakes completes, while all block.
        await client.signal(waiter, "ping", "pong")
        assert await client.result(waiter, timeout=60) == "pong"
        release.set()
        results = await asyncio.gather(
            *(client.result(f"flow-{n}", timeout=60) for n in range(RUNS))
        )
        assert results == list(range(RUNS))


def done_soon(n: int) -> int:
    return n + 1


@agent("flow_two")
async def flow_two(ctx: Context, n: int) -> int:
    first = await ctx.step(done_soon, n)
    return await ctx.step(done_soon, first)


async def test_a_new_run_whose_activation_fails_after_it_was_stored_is_retried_by_its_own_wake(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    """Its trigger was acked when the run was stored: no redelivery brings it back, so the
    worker wakes it itself, a second later, and it resumes from its last recorded event."""
    names = client.names
    info = f"$JS.API.CONSUMER.INFO.{names.inbox_stream}.{names.intake_consumer}"
    async with Worker([flow_two], nats=nats_server.url, settings=settings) as worker:
        appends = 0
        append = worker.store.append

        async def refused_once(run_id: str, *args: Any, **kwargs: Any) -> int:
            nonlocal appends
            if run_id == "flow-flaky":
                appends += 1
                if appends == 1:  # the append after the opening one: the activation fails
                    raise JetStreamError("refused on purpose", code=500, err_code=0)
            return await append(run_id, *args, **kwargs)

        worker.store.append = refused_once  # type: ignore[method-assign]
        await client.start("flow_two", 1, run_id="flow-flaky")
        assert await client.result("flow-flaky", timeout=60) == 3
        assert appends >= 2  # refused once, then the retry's appends went through
    consumer = await client.broker.api(info, {})
    # The trigger, the only message of the intake consumer, was delivered once and acked.
    assert consumer["delivered"]["consumer_seq"] == 1, consumer
    assert consumer["num_ack_pending"] == 0
