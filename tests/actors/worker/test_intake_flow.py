"""The intake keeps flowing while many runs execute: a worker holds at most
``HELD_TRIGGERS_MAX`` inbox messages of runs it is executing, so the intake consumer's
unacknowledged messages stay bounded however long steps take."""

from __future__ import annotations

import asyncio

from sojourn.actors import Client, Context, Worker, agent
from sojourn.actors.worker.worker import HELD_TRIGGERS_MAX
from sojourn.broker import EmbeddedServer
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
        held = (await client.broker.api(info, {}))["num_ack_pending"]
        assert held <= HELD_TRIGGERS_MAX, held
        # The intake still takes a signal, and the run it wakes completes, while all block.
        await client.signal(waiter, "ping", "pong")
        assert await client.result(waiter, timeout=60) == "pong"
        release.set()
        results = await asyncio.gather(
            *(client.result(f"flow-{n}", timeout=60) for n in range(RUNS))
        )
        assert results == list(range(RUNS))
