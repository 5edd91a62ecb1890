"""The intake keeps flowing while many runs execute: a worker holds at most
``HELD_TRIGGERS_MAX`` inbox messages of runs it is executing, so the intake consumer's
unacknowledged messages stay bounded however long steps take."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

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


@agent("flow_once")
async def flow_once(ctx: Context, n: int) -> int:
    return await ctx.step(echo_n, n)


async def echo_n(n: int) -> int:
    return n


async def test_a_lone_starts_first_append_goes_out_before_the_next_pull_request(
    nats_server: EmbeddedServer,
    settings: Settings,
    client: Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Watching what this process writes to the server: after a lone start is delivered, its
    run's first append is written before (or in one write with, ahead of) the intake's next
    pull request, which would otherwise take the loop and the socket first (``_first_writes``).
    A pull request renewed on its own timer may land in between now and then: most runs, not
    all, are counted."""
    ops: list[str] = []
    write = asyncio.StreamWriter.writelines

    def watched(self: asyncio.StreamWriter, data: Any) -> None:
        chunks = list(data)
        for line in b"".join(chunks).split(b"\r\n"):
            if line.startswith((b"PUB ", b"HPUB ")):
                ops.append(line.split(b" ")[1].decode(errors="replace"))
        write(self, chunks)

    monkeypatch.setattr(asyncio.StreamWriter, "writelines", watched)
    names = client.names
    next_request = f"$JS.API.CONSUMER.MSG.NEXT.{names.inbox_stream}.{names.intake_consumer}"
    async with Worker([flow_once], nats=nats_server.url, settings=settings):
        await client.start("flow_once", 0, run_id="lone-warm", wait=True)
        first = 0
        for i in range(20):
            run_id = f"lone-{i}"
            ops.clear()
            await client.start("flow_once", i, run_id=run_id)
            assert await client.result(run_id, timeout=30) == i
            start = names.start("flow_once", None, run_id)
            after = ops[next(k for k, o in enumerate(ops) if o == start) :]
            append = next(k for k, o in enumerate(after) if o == names.events(run_id))
            pulls = [k for k, o in enumerate(after) if o == next_request]
            first += not pulls or append < pulls[0]
    assert first >= 15, f"the first append went out first in {first} of 20 runs"
