"""Timers kept in the worker's process, with the broker's copy as the backstop
(docs/decisions/0019-timers-in-process.md).

- ``InProcessTimers`` keeps time: due timers come out in deadline order; replacing, dropping,
  the horizon, the cap and ``timer_backstop = 0`` are honoured.
- A run that sleeps is woken by its worker at the deadline, without the broker firing anything;
  the broker's copy (written ``timer_backstop`` later) is removed once the wait ended, whether
  the run then ends or parks on the next timer.
- A wait ended by a signal first leaves no timer anywhere, in process or in the broker.
- With ``timer_backstop = 0`` the broker fires every timer at its deadline, as before.
(The backstop waking a run whose worker was SIGKILLed is ``test_waits.py``'s
``test_sleep_fires_while_no_worker_process_exists``.)
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any

import msgspec

from sojourn.actors import Agent, Client, Context, Worker, agent
from sojourn.actors.worker import timers as _timers
from sojourn.actors.worker.timers import InProcessTimers
from sojourn.broker import EmbeddedServer
from sojourn.broker import headers as h
from sojourn.broker.wake import publish_wake
from sojourn.schemas import WaitCompleted, WaitStarted
from sojourn.schemas.config import Settings
from tests.conftest import wait_for

# --- keeping time --------------------------------------------------------------------------


async def test_due_timers_come_out_in_deadline_order_and_dropped_ones_never() -> None:
    timers = InProcessTimers(backstop=2.0)
    now = time.time()
    assert timers.keep("r3", "a", 0, now + 0.15)
    assert timers.keep("r1", "a", 0, now + 0.05)
    assert timers.keep("r2", "a", 4, now + 0.10)
    assert timers.keep("r2", "a", 4, now + 0.12)  # replaced, not added
    assert timers.keep("gone", "a", 1, now + 0.01)
    assert len(timers) == 4
    timers.drop("gone")
    assert len(timers) == 3
    got = [await asyncio.wait_for(timers.due(), 10) for _ in range(3)]
    assert [(t.run_id, t.position) for t in got] == [("r1", 0), ("r2", 4), ("r3", 0)]
    assert all(time.time() >= t.deadline - 0.01 for t in got)
    assert len(timers) == 0
    timers.put_back(got[0], 0.01)
    again = await asyncio.wait_for(timers.due(), 10)
    assert (again.run_id, again.tries) == ("r1", 1)
    # Too far ahead, switched off, closed: the broker keeps those alone.
    assert not timers.keep("far", "a", 0, time.time() + _timers.IN_PROCESS_HORIZON + 60)
    assert not InProcessTimers(backstop=0.0).keep("off", "a", 0, time.time() + 1)
    timers.keep("late", "a", 0, time.time() + 0.01)
    timers.close()
    assert len(timers) == 0 and not timers.keep("x", "a", 0, time.time() + 1)


async def test_at_most_the_cap_is_kept(monkeypatch: Any) -> None:
    monkeypatch.setattr(_timers, "IN_PROCESS_MAX", 3)
    timers = InProcessTimers(backstop=2.0)
    deadline = time.time() + 60
    assert [timers.keep(f"r{i}", "a", 0, deadline) for i in range(5)] == [True] * 3 + [False] * 2
    assert timers.keep("r0", "a", 0, deadline + 1)  # replacing one is not adding one
    timers.drop("r1")
    assert timers.keep("r4", "a", 0, deadline)
    assert len(timers) == 3
    timers.close()


# --- real runs -----------------------------------------------------------------------------


def note(x: int) -> int:
    return x


@agent("tip_napper")
async def tip_napper(ctx: Context, seconds: float) -> str:
    await ctx.sleep(seconds)
    return "rested"


@agent("tip_two_naps")
async def tip_two_naps(ctx: Context, seconds: float) -> int:
    await ctx.sleep(seconds)
    n = await ctx.step(note, 1)
    await ctx.sleep(seconds)
    return await ctx.step(note, n + 1)


@agent("tip_signed")
async def tip_signed(ctx: Context, timeout: float) -> Any:
    return await ctx.wait_for("signed", timeout=timeout)


AGENTS: list[Agent[Any, Any]] = [tip_napper, tip_two_naps, tip_signed]


async def stored_timer(client: Client, run_id: str, position: int) -> Any:
    names = client.names
    return await client.broker.direct_get_last(
        names.wake_stream, names.timer(run_id, str(position))
    )


async def fired_wake(client: Client, run_id: str, agent_name: str) -> bool:
    """Whether the broker fired a timer of the run (its wake is stored with the header)."""
    names = client.names
    m = await client.broker.direct_get_last(names.wake_stream, names.wake(run_id, agent_name))
    return m is not None and bool(m.header(h.SCHEDULER))


async def events(client: Client, run_id: str) -> list[Any]:
    return [e for d in await client.history(run_id) for e in d.events]


async def test_a_sleeping_run_is_woken_in_process_and_the_broker_copy_removed(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    async with Worker(AGENTS, nats=nats_server.url, settings=settings) as w:
        run_id = await client.start("tip_napper", 1.0, run_id="tip-1")

        async def parked() -> bool:
            return any(isinstance(e, WaitStarted) for e in await events(client, run_id))

        await wait_for(parked, timeout=30, what="the run to park")
        started = next(e for e in await events(client, run_id) if isinstance(e, WaitStarted))
        timer = await stored_timer(client, run_id, 0)
        # The broker's copy fires timer_backstop after the deadline.
        assert timer is not None and started.deadline is not None
        fires = datetime.fromisoformat(timer.header(h.SCHEDULE).removeprefix("@at "))
        assert abs(fires.timestamp() - (started.deadline + settings.timer_backstop)) < 0.01
        assert len(w.timers) == 1
        assert await client.result(run_id, timeout=30) == "rested"
        assert w.timers_fired == 1
        done = [e for e in await events(client, run_id) if isinstance(e, WaitCompleted)]
        assert [d.outcome for d in done] == ["timeout"] and done[0].at >= started.deadline
        await wait_for(
            lambda: _none(stored_timer(client, run_id, 0)),
            timeout=30,
            what="the broker's copy to be removed",
        )
        assert not await fired_wake(client, run_id, "tip_napper")
        assert len(w.timers) == 0


async def test_a_wake_for_a_run_that_ended_here_is_acked_without_an_activation(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    """A timer's broker copy that fires after the run ended (its worker fell behind by more
    than ``timer_backstop``) wakes nothing: the worker that ended the run acks the wake at
    once, without loading the history to find the end."""
    async with Worker(AGENTS, nats=nats_server.url, settings=settings) as w:
        run_id = await client.start("tip_napper", 0.05, run_id="tip-ended")
        assert await client.result(run_id, timeout=30) == "rested"
        await wait_for(lambda: asyncio.sleep(0, w.activations_completed >= 2), what="the end")
        done = w.activations_completed
        await publish_wake(client.broker, client.names, run_id, "timer", agent="tip_napper")
        await wait_for(lambda: asyncio.sleep(0, w.wakes.ended_acked == 1), what="the ack")
        assert w.activations_completed == done

        async def settled() -> bool:
            info = await client.broker.api(
                f"$JS.API.CONSUMER.INFO.{client.names.wake_stream}."
                f"{client.names.agent_wake_consumer('tip_napper')}"
            )
            return bool(info["num_ack_pending"] == 0 and info["num_pending"] == 0)

        await wait_for(settled, what="the wake acked")


async def test_a_run_parking_on_its_next_timer_keeps_only_that_one(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    async with Worker(AGENTS, nats=nats_server.url, settings=settings) as w:
        run_id = await client.start("tip_two_naps", 0.5, run_id="tip-2")
        assert await client.result(run_id, timeout=30) == 2
        assert w.timers_fired == 2
        positions = [e.position for e in await events(client, run_id) if isinstance(e, WaitStarted)]
        assert len(positions) == 2
        for p in positions:
            await wait_for(
                lambda p=p: _none(stored_timer(client, run_id, p)),  # type: ignore[misc]
                timeout=30,
                what=f"timer {p} to be removed",
            )
        assert not await fired_wake(client, run_id, "tip_two_naps")


async def test_a_wait_ended_by_a_signal_leaves_no_timer_anywhere(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    async with Worker(AGENTS, nats=nats_server.url, settings=settings) as w:
        run_id = await client.start("tip_signed", 30.0, run_id="tip-3")

        async def kept() -> bool:
            return len(w.timers) == 1

        await wait_for(kept, timeout=30, what="the worker to keep the timer")
        await client.signal(run_id, "signed", {"by": "ann"})
        assert await client.result(run_id, timeout=30) == {"by": "ann"}
        assert len(w.timers) == 0 and w.timers_fired == 0
        await wait_for(
            lambda: _none(stored_timer(client, run_id, 0)), timeout=30, what="no broker timer"
        )


async def test_without_a_backstop_the_broker_fires_at_the_deadline(
    nats_server: EmbeddedServer, settings: Settings, client: Client
) -> None:
    off = msgspec.structs.replace(settings, timer_backstop=0.0)
    async with Worker(AGENTS, nats=nats_server.url, settings=off) as w:
        run_id = await client.start("tip_napper", 0.5, run_id="tip-4")
        assert await client.result(run_id, timeout=30) == "rested"
        assert w.timers_fired == 0 and len(w.timers) == 0
        assert await fired_wake(client, run_id, "tip_napper")


async def _none(value: Any) -> bool:
    return (await value) is None


async def test_a_due_timer_of_a_run_dropped_before_it_was_taken_is_skipped() -> None:
    timers = InProcessTimers(backstop=2.0)
    now = time.time()
    timers.keep("r1", "a", 0, now)
    timers.keep("r2", "a", 0, now)
    await asyncio.sleep(0)  # both fire (call_later(0)) and are queued
    await asyncio.sleep(0)
    timers.drop("r1")  # an activation of r1 began: its queued timer is stale
    timers.keep("r1", "a", 3, time.time())  # and it parked again on a new one
    got = [await asyncio.wait_for(timers.due(), 10) for _ in range(2)]
    assert [(t.run_id, t.position) for t in got] == [("r2", 0), ("r1", 3)]
    timers.close()


async def test_kept_histories_are_bounded_in_all(monkeypatch: Any) -> None:
    monkeypatch.setattr(_timers, "KEPT_DECISIONS_MAX", 5)
    timers = InProcessTimers(backstop=2.0)
    deadline = time.time() + 0.01
    history: list[Any] = [object(), object(), object()]  # stands for three decisions
    timers.keep("r1", "a", 0, deadline, history)
    timers.keep("r2", "a", 0, deadline, history)  # 6 > 5: kept without its history
    history.append(object())  # the parking activation's last append, after the keep
    got = {t.run_id: t for t in [await asyncio.wait_for(timers.due(), 10) for _ in range(2)]}
    assert got["r1"].history is history and got["r2"].history is None
    assert timers._kept == 0  # what was counted is given back, however the list grew
    timers.keep("r3", "a", 0, deadline + 60, history[:5])
    timers.drop("r3")
    assert timers._kept == 0 and len(timers) == 0
    timers.close()


async def test_a_timer_the_loop_fires_early_waits_for_its_deadline() -> None:
    timers = InProcessTimers(backstop=2.0)
    deadline = time.time() + 0.2
    timers.keep("r1", "a", 0, deadline)
    # Fire it by hand before its deadline, as a loop clock running ahead would.
    handle = timers._handles["r1"][0]
    handle.cancel()
    timers._fire(_timers.DueTimer("r1", "a", 0, deadline))
    assert len(timers) == 1  # still kept, not queued
    got = await asyncio.wait_for(timers.due(), 10)
    assert got.run_id == "r1" and time.time() >= deadline and len(timers) == 0
    timers.close()
