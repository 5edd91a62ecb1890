"""Two writers on one run: the sequence fence lets exactly one history through."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from sojourn.actors import Agent, Context, Worker, agent
from sojourn.actors.core.state import fold
from sojourn.actors.worker.activation import Activation
from sojourn.broker import Broker, EmbeddedServer, EventStore, Names, publish_wake
from sojourn.schemas import RunCompleted, RunEvent, RunStarted, StepCompleted, StepStarted, to_raw
from sojourn.schemas.config import Settings
from tests.conftest import wait_for

effects: Counter[str] = Counter()


async def touch(tag: str) -> str:
    effects[tag] += 1
    await asyncio.sleep(0)  # let the other writer interleave
    return tag


@agent("racer")
async def racer(ctx: Context, n: int) -> list[str]:
    return [await ctx.step(touch, f"{ctx.run_id}:{i}") for i in range(n)]


def check_history(events: list[RunEvent], n: int) -> None:
    starts = [e for e in events if isinstance(e, StepStarted)]
    dones = [e for e in events if isinstance(e, StepCompleted)]
    assert [e.position for e in dones] == list(range(n))
    assert sorted({e.position for e in starts}) == list(range(n))
    assert sum(isinstance(e, RunCompleted) for e in events) == 1
    state = fold(events)
    assert state.status == "completed" and state.anomalies == ()


async def test_two_activations_race_on_one_run(
    nats_server: EmbeddedServer, settings: Settings
) -> None:
    broker = await Broker.connect(nats_server.url)
    names = Names(settings.prefix)
    from sojourn.broker.topology import ensure_topology

    await ensure_topology(broker, names, settings)
    store = EventStore(broker, names, settings)
    outcomes: Counter[str] = Counter()
    # ``Activation`` takes ``Agent[object, object]``; the worker passes its ``Agent[Any, Any]``.
    any_racer: Agent[Any, Any] = racer
    try:
        for round_no in range(50):
            run_id = f"race-{round_no}"
            await store.append(
                run_id,
                [RunStarted(run_id=run_id, agent="racer", input=to_raw(4))],
                expected_seq=0,
                writer="t",
            )
            history = await store.load(run_id)
            a = Activation(agent=any_racer, run_id=run_id, store=store, history=history, writer="A")
            b = Activation(agent=any_racer, run_id=run_id, store=store, history=history, writer="B")
            results = await asyncio.gather(a.run(), b.run())
            outcomes.update(results)
            assert sorted(results) == ["completed", "fenced"], results
            events = [e for d in await store.load(run_id) for e in d.events]
            check_history(events, 4)
            writers = {d.writer for d in await store.load(run_id)} - {"t"}
            assert len(writers) == 1  # one activation wrote everything after the start
    finally:
        await broker.close()
    assert outcomes == Counter({"completed": 50, "fenced": 50})
    # The loser is fenced before its first step runs: no effect happened twice.
    assert {k: v for k, v in effects.items() if k.startswith("race-")} == {
        f"race-{r}:{i}": 1 for r in range(50) for i in range(4)
    }


async def test_two_workers_flooded_with_wakes_make_one_history(
    nats_server: EmbeddedServer, settings: Settings
) -> None:
    from sojourn.actors import Client

    client = await Client.connect(nats_server.url, settings=settings)
    broker = await Broker.connect(nats_server.url)
    names = Names(settings.prefix)
    w1 = Worker([racer], nats=nats_server.url, settings=settings, worker_id="w1")
    w2 = Worker([racer], nats=nats_server.url, settings=settings, worker_id="w2")
    try:
        await w1.start()
        await w2.start()
        run_ids = [await client.start("racer", 6, run_id=f"flood-{i}") for i in range(20)]
        for _ in range(3):  # duplicate wakes: both workers see the same runs at once
            for run_id in run_ids:
                await publish_wake(broker, names, run_id, "rewake", agent=None)

        async def all_done() -> bool:
            for r in run_ids:
                history = await client.history(r)
                if not history or fold(e for d in history for e in d.events).status != "completed":
                    return False
            return True

        await wait_for(all_done, timeout=60, what="all runs to complete")
        for run_id in run_ids:
            events = [e for d in await client.history(run_id) for e in d.events]
            check_history(events, 6)
    finally:
        await w1.stop()
        await w2.stop()
        await client.close()
        await broker.close()
