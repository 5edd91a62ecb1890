"""Wakes routed by agent: a worker receives only wakes of runs it can execute.

Two workers serve different agents. Every run parks on a signal, so each is woken once by the
intake (the signal) after it started: 1,000 runs give 1,000 routed wakes, and a wake taken by
the wrong worker would be counted (``Worker.misrouted``) and seen in the histories (the
decisions after the wake would be written by the other worker). A wake that names no agent
still reaches a worker, which hands back what it does not serve: that is what is counted.
"""

from __future__ import annotations

import asyncio
import functools

from sojourn.actors import Client, Context, RunNotFound, Worker, agent
from sojourn.broker import EmbeddedServer, publish_wake
from sojourn.broker.eventstore import Decision
from sojourn.schemas.config import Settings
from tests.conftest import wait_for

RUNS_PER_AGENT = 500


def ping(n: int) -> int:
    return n + 1


@agent("route_a")
async def route_a(ctx: Context, n: int) -> int:
    m = await ctx.step(ping, n)
    await ctx.wait_for("go")
    return await ctx.step(ping, m)


@agent("route_b")
async def route_b(ctx: Context, n: int) -> int:
    m = await ctx.step(ping, n)
    await ctx.wait_for("go")
    return await ctx.step(ping, m)


def writers(history: list[Decision]) -> set[str]:
    """The workers whose activations wrote a history (the intake's appends left out)."""
    return {d.writer.rsplit(".", 1)[0] for d in history if not d.writer.startswith("intake:")}


async def all_waiting(client: Client, run_ids: list[str]) -> bool:
    try:
        states = await asyncio.gather(*(client.state(r) for r in run_ids))
    except RunNotFound:  # not started yet
        return False
    return all(s.status == "waiting" for s in states)


async def test_two_workers_serving_different_agents_take_only_their_own_wakes(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    runs = {
        "route_a": [f"ra-{i}" for i in range(RUNS_PER_AGENT)],
        "route_b": [f"rb-{i}" for i in range(RUNS_PER_AGENT)],
    }
    url = nats_server.url
    every = [r for ids in runs.values() for r in ids]
    # Each agent's runs are started while only its worker is up: a start taken by an intake
    # that does not serve its agent is handed back (the intake is not routed), which would
    # only make this test slow.
    for name, fn in (("route_a", route_a), ("route_b", route_b)):
        async with Worker([fn], nats=url, settings=settings, worker_id=f"w{name[-1]}"):
            ids = runs[name]
            await asyncio.gather(*(client.start(name, i, run_id=r) for i, r in enumerate(ids)))
            await wait_for(
                functools.partial(all_waiting, client, ids), timeout=120, what="the runs to park"
            )
    async with (
        Worker([route_a], nats=url, settings=settings, worker_id="wa") as wa,
        Worker([route_b], nats=url, settings=settings, worker_id="wb") as wb,
    ):
        # Every signal is a wake of its run's agent, with both workers pulling.
        await asyncio.gather(*(client.signal(r, "go") for r in every))
        results = await asyncio.gather(*(client.result(r, timeout=180) for r in every))
        assert results == [i + 2 for ids in runs.values() for i in range(len(ids))]
        assert (wa.misrouted, wb.misrouted) == (0, 0)
        owner = {"route_a": "wa", "route_b": "wb"}
        for name, ids in runs.items():
            histories = await asyncio.gather(*(client.history(r) for r in ids))
            for r, history in zip(ids, histories, strict=True):
                assert writers(history) == {owner[name]}, (r, writers(history))


async def test_a_wake_that_names_no_agent_is_handed_back_by_a_worker_that_does_not_serve_it(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    url = nats_server.url
    async with Worker([route_b], nats=url, settings=settings, worker_id="wb"):
        run_id = await client.start("route_b", 1, run_id="unrouted-b", wait=True)
        await wait_for(lambda: all_waiting(client, [run_id]), what="the run to park")
    async with Worker([route_a], nats=url, settings=settings, worker_id="wa") as wa:
        # The only worker up serves route_a; a wake without the agent reaches it anyway.
        await publish_wake(client.broker, client.names, run_id, "rewake", agent=None)
        await wait_for(lambda: _counted(wa), what="the wake to be taken and handed back")
        await client.signal(run_id, "go")  # recorded by wa's intake, woken for route_b
    async with Worker([route_b], nats=url, settings=settings, worker_id="wb2"):
        assert await client.result(run_id, timeout=60) == 3
    assert writers(await client.history(run_id)) == {"wb", "wb2"}


async def _counted(w: Worker) -> bool:
    return w.misrouted >= 1
